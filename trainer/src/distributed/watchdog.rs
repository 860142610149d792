//! Bounded waits on work the host cannot interrupt (a GPU stream, an NCCL communicator): poll,
//! nap, give up at a deadline, so that the caller can abort the communicator (ncclCommAbort)
//! instead of blocking forever in a synchronising call.
//!
//! A step's wait goes through its collectives in the order they were queued, each in two
//! phases: the compute queued before it (a slow step, not a hang), then the collective
//! itself, which the collective timeout bounds from the moment its inputs were ready (as
//! PyTorch's NCCL watchdog times a collective from its start, not from its enqueue). Each
//! collective has its own pair of marks: a gradient bucket's all-reduce that hangs while
//! backward's later kernels wait behind it fails at the collective timeout, not at the
//! compute limit.

use std::time::{Duration, Instant};

use crate::error::{CollectiveFault, Result};

/// How long a communicator's abort may take before the rank stops waiting for it and
/// reports its failure. NCCL's abort takes milliseconds when it can stop its kernels, but it
/// waits for the work queued on the stream before its collectives: on an H200 a stream held
/// 20 s by a host function kept ncclCommAbort 10 s past the collective timeout, until the
/// hold ended; a queue that never moves would keep the rank from ever saying why it failed.
pub const ABORT_LIMIT: Duration = Duration::from_secs(15);

/// Runs `abort` on a thread of its own and waits at most `limit` for it; an abort that does
/// not return in time is left running. Returns whether it finished.
pub fn bounded_abort(limit: Duration, abort: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        abort();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}

/// What one poll of asynchronous work found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Poll {
    Ready,
    Pending,
    /// An error the work reported (an NCCL async error, a CUDA error).
    Failed(String),
}

/// Why a bounded wait ended without the work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hang {
    Failed(String),
    /// `phase` was still pending after `after`.
    TimedOut {
        phase: &'static str,
        after: Duration,
    },
    /// The round ended elsewhere while `phase` was pending (the launcher said so:
    /// `signals::ABANDON`).
    Abandoned {
        phase: &'static str,
    },
}

impl Hang {
    /// How the collective broke, as the launcher's blame reads it: a timeout is a peer that
    /// did not answer (NCCL cannot say which), an error the communicator reported a failed
    /// peer, an abandoned wait the round's end elsewhere.
    pub fn fault(&self, what: &str) -> CollectiveFault {
        let message = self.message(what);
        match self {
            Hang::Failed(_) => CollectiveFault::failed(None, message),
            Hang::TimedOut { .. } => CollectiveFault::silent(None, message),
            Hang::Abandoned { .. } => CollectiveFault::abandoned(message),
        }
    }

    /// The message a rank fails with, naming the wait.
    pub fn message(&self, what: &str) -> String {
        match self {
            Hang::Failed(e) => format!("{what} failed: {e}"),
            Hang::TimedOut { phase, after } => format!(
                "{what} did not complete within {:.0} s ({phase}): a peer rank died or hangs",
                after.as_secs_f64()
            ),
            Hang::Abandoned { phase } => {
                format!("{what} abandoned ({phase}): the round ended elsewhere")
            }
        }
    }
}

/// The compute before a step's collectives may take this many collective timeouts (at least
/// `MIN_COMPUTE_LIMIT`) before the wait gives up on it: a GPU that stopped, not a slow step.
pub const COMPUTE_LIMIT_FACTOR: u32 = 10;
pub const MIN_COMPUTE_LIMIT: Duration = Duration::from_secs(600);

/// The limit of the compute phase for a collective timeout.
pub fn compute_limit(collective_timeout: Duration) -> Duration {
    (collective_timeout * COMPUTE_LIMIT_FACTOR).max(MIN_COMPUTE_LIMIT)
}

/// Polls until `poll` is ready or failed, or `limit` passed since the start (then
/// `TimedOut` naming `phase`). Spins briefly (a step's end is usually microseconds away),
/// then naps 50 µs at a time: at most that late, never the 5 ms of a doubling backoff.
pub fn wait(
    phase: &'static str,
    limit: Duration,
    mut poll: impl FnMut() -> Poll,
) -> Result<(), Hang> {
    let start = Instant::now();
    loop {
        match poll() {
            Poll::Ready => return Ok(()),
            Poll::Failed(e) => return Err(Hang::Failed(e)),
            Poll::Pending => {}
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Err(Hang::TimedOut {
                phase,
                after: waited,
            });
        }
        if ferrotrain_launch::signals::abandoned() {
            return Err(Hang::Abandoned { phase });
        }
        if waited > Duration::from_micros(200) {
            std::thread::sleep(Duration::from_micros(50).min(limit - waited));
        } else {
            std::thread::yield_now();
        }
    }
}

/// Where a step's wait stands: before collective `i` (its inputs ready), after it (done),
/// or the work queued after the last collective (the host's own mark).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Ready(usize),
    Done(usize),
    Rest,
}

/// A step's wait over the `collectives` queued since the last one, in order: for each, the
/// compute before it (`Mark::Ready`) within `compute_limit(timeout)`, then the collective
/// (`Mark::Done`) within `timeout` counted from there; then the rest (`Mark::Rest`) within
/// the compute limit.
pub fn wait_collectives(
    timeout: Duration,
    collectives: usize,
    mut poll: impl FnMut(Mark) -> Poll,
) -> Result<(), Hang> {
    let compute = compute_limit(timeout);
    for i in 0..collectives {
        wait("the compute before the collectives", compute, || {
            poll(Mark::Ready(i))
        })?;
        wait("the collectives", timeout, || poll(Mark::Done(i)))?;
    }
    wait("the compute after the collectives", compute, || {
        poll(Mark::Rest)
    })
}

/// A communicator handle that is never waited on without a limit: its waits go through
/// the functions above, and the first failure or hang aborts it (ncclCommAbort, which also
/// ends collectives in flight) and fails this call and every later one with that reason.
/// A handle still live when dropped is aborted too: a destroy would wait for whatever may
/// still be queued (as PyTorch aborts its communicators when a process group is destroyed).
pub struct Abortable<C: Copy> {
    handle: Option<C>,
    broken: Option<CollectiveFault>,
    /// Aborts the handle; false when it gave up waiting for the abort (`bounded_abort`).
    abort: fn(C) -> bool,
}

impl<C: Copy> Abortable<C> {
    pub fn new(handle: C, abort: fn(C) -> bool) -> Self {
        Abortable {
            handle: Some(handle),
            broken: None,
            abort,
        }
    }

    /// The live handle, or the error of the failure that aborted it.
    pub fn live(&self) -> Result<C> {
        const ABORTED: &str = "the communicator was aborted by an earlier failure";
        match (&self.broken, self.handle) {
            (None, Some(h)) => Ok(h),
            (Some(fault), _) => Err(fault.again(ABORTED).into()),
            (None, None) => Err(CollectiveFault::own(format!("{ABORTED}: closed")).into()),
        }
    }

    /// Aborts the handle (once) and fails with `message`, this rank's own failure (a CUDA
    /// call, a refused tensor); later calls fail with it too.
    pub fn fail<T>(&mut self, message: String) -> Result<T> {
        self.fail_with(CollectiveFault::own(message))
    }

    /// Aborts the handle (once) and fails with `fault`; later calls fail with it too.
    pub fn fail_with<T>(&mut self, fault: CollectiveFault) -> Result<T> {
        let message = &fault.message;
        if let Some(h) = self.handle.take() {
            // Logged before the abort, which may itself take a while (NCCL waits for its
            // own threads): the log shows when the failure was seen, then how long the
            // abort took.
            tracing::error!("{message}; aborting the communicator");
            let started = Instant::now();
            if (self.abort)(h) {
                tracing::info!(
                    "communicator aborted in {:.2} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        Err(self.broken.get_or_insert(fault).clone().into())
    }

    /// Aborts a live handle now (a clean end: nothing may be left waiting on it).
    pub fn close(&mut self) {
        if let Some(h) = self.handle.take() {
            (self.abort)(h);
        }
        self.broken
            .get_or_insert_with(|| CollectiveFault::own("closed".into()));
    }

    /// `wait`, aborting on a hang or an error.
    pub fn wait(
        &mut self,
        what: &str,
        phase: &'static str,
        limit: Duration,
        poll: impl FnMut() -> Poll,
    ) -> Result<()> {
        self.live()?;
        wait(phase, limit, poll).or_else(|hang| self.fail_with(hang.fault(what)))
    }

    /// `wait_collectives`, aborting on a hang or an error.
    pub fn wait_step(
        &mut self,
        what: &str,
        timeout: Duration,
        collectives: usize,
        poll: impl FnMut(Mark) -> Poll,
    ) -> Result<()> {
        self.live()?;
        wait_collectives(timeout, collectives, poll)
            .or_else(|hang| self.fail_with(hang.fault(what)))
    }
}

impl<C: Copy> Drop for Abortable<C> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn a_collective_that_never_completes_times_out_within_its_limit() {
        let timeout = Duration::from_millis(300);
        let start = Instant::now();
        let mut polls = 0;
        let hang = wait_collectives(timeout, 1, |mark| match mark {
            Mark::Done(_) => {
                polls += 1;
                Poll::Pending
            }
            _ => Poll::Ready,
        })
        .unwrap_err();
        let took = start.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(1),
            "{took:?}"
        );
        assert!(polls > 10, "it polls, it does not block: {polls}");
        let Hang::TimedOut { phase, .. } = &hang else {
            panic!("{hang:?}")
        };
        assert_eq!(*phase, "the collectives");
        assert!(
            hang.message("NCCL AllReduce")
                .contains("a peer rank died or hangs")
        );
    }

    #[test]
    fn slow_compute_does_not_count_against_the_collective_timeout() {
        // 400 ms of compute, then a collective of 50 ms, under a 200 ms collective timeout.
        let start = Instant::now();
        let compute_done = start + Duration::from_millis(400);
        let mut collective_done = None;
        let result = wait_collectives(Duration::from_millis(200), 1, |mark| match mark {
            Mark::Ready(_) => match Instant::now() >= compute_done {
                true => Poll::Ready,
                false => Poll::Pending,
            },
            Mark::Done(_) => {
                let done =
                    *collective_done.get_or_insert(Instant::now() + Duration::from_millis(50));
                match Instant::now() >= done {
                    true => Poll::Ready,
                    false => Poll::Pending,
                }
            }
            Mark::Rest => Poll::Ready,
        });
        assert_eq!(result, Ok(()));
        assert!(start.elapsed() >= Duration::from_millis(450));
    }

    #[test]
    fn an_error_ends_the_wait_at_once_and_the_compute_limit_has_a_floor() {
        let start = Instant::now();
        let result = wait("the collectives", Duration::from_secs(60), || {
            Poll::Failed("ncclRemoteError".into())
        });
        assert_eq!(result, Err(Hang::Failed("ncclRemoteError".into())));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(compute_limit(Duration::from_secs(5)), MIN_COMPUTE_LIMIT);
        assert_eq!(
            compute_limit(Duration::from_secs(300)),
            Duration::from_secs(3000)
        );
    }

    #[test]
    fn a_hung_bucket_fails_at_the_collective_timeout_though_compute_is_queued_behind_it() {
        // Three collectives (two gradient buckets, then the step's scalars): the first
        // bucket's all-reduce never completes, so the compute queued after it (which waits
        // for it on the GPU) never gets ready either. Timed as compute, this would wait
        // 600 s; it fails at the collective timeout, naming the collectives.
        let timeout = Duration::from_millis(200);
        let start = Instant::now();
        let mut seen = Vec::new();
        let hang = wait_collectives(timeout, 3, |mark| {
            if seen.last() != Some(&mark) {
                seen.push(mark);
            }
            match mark {
                Mark::Ready(0) => Poll::Ready,
                _ => Poll::Pending,
            }
        })
        .unwrap_err();
        assert!(start.elapsed() < timeout + Duration::from_secs(1));
        assert!(
            matches!(
                hang,
                Hang::TimedOut {
                    phase: "the collectives",
                    ..
                }
            ),
            "{hang:?}"
        );
        assert_eq!(seen, [Mark::Ready(0), Mark::Done(0)]);
        // Every collective done: the wait ends with the work queued after the last one.
        let mut order = Vec::new();
        let done = wait_collectives(timeout, 2, |mark| {
            order.push(mark);
            Poll::Ready
        });
        assert_eq!(done, Ok(()));
        assert_eq!(
            order,
            [
                Mark::Ready(0),
                Mark::Done(0),
                Mark::Ready(1),
                Mark::Done(1),
                Mark::Rest
            ]
        );
    }

    #[test]
    fn an_abort_that_does_not_return_is_left_behind_at_its_limit() {
        let t0 = Instant::now();
        assert!(bounded_abort(Duration::from_secs(5), || {}));
        let finished = bounded_abort(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(30));
        });
        assert!(!finished);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_hung_collective_is_aborted_once_and_the_rank_exits_retryable() {
        static ABORTS: AtomicU32 = AtomicU32::new(0);
        fn abort(handle: u32) -> bool {
            assert_eq!(handle, 7);
            ABORTS.fetch_add(1, Ordering::SeqCst);
            true
        }
        let mut comm = Abortable::new(7u32, abort);
        assert_eq!(comm.live().unwrap(), 7);
        let timeout = Duration::from_millis(200);
        let start = Instant::now();
        // The fake collective: its inputs are ready, it never completes.
        let err = comm
            .wait_step("NCCL AllReduce", timeout, 1, |mark| match mark {
                Mark::Done(_) => Poll::Pending,
                _ => Poll::Ready,
            })
            .unwrap_err();
        assert!(start.elapsed() < timeout + Duration::from_secs(1));
        assert_eq!(ABORTS.load(Ordering::SeqCst), 1);
        assert_eq!(err.exit_code(), ferrotrain_api::exit::RETRYABLE);
        assert!(
            err.to_string().contains("NCCL AllReduce did not complete"),
            "{err}"
        );
        // Every later call fails with the first reason, without touching the handle.
        let later = comm.wait("NCCL Broadcast", "enqueue", timeout, || Poll::Ready);
        assert!(
            later
                .unwrap_err()
                .to_string()
                .contains("NCCL AllReduce did not complete")
        );
        drop(comm);
        assert_eq!(
            ABORTS.load(Ordering::SeqCst),
            1,
            "aborted once, not again on drop"
        );
        // A live handle dropped is aborted, never destroyed (a destroy may wait forever).
        drop(Abortable::new(7u32, abort));
        assert_eq!(ABORTS.load(Ordering::SeqCst), 2);
    }
}
