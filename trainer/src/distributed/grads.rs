//! The gradient exchange: every rank's gradients summed in buckets, overlapped with
//! backward.
//!
//! The gradients live in the optimizer's flat buffers (`optim::GradLayout`), laid out in the
//! order backward completes them, so a bucket is a slice of a buffer: it is all-reduced in
//! place, with no copies in or out. A hook on each parameter (`autograd::set_ready_hook`)
//! counts the gradients of the last micro-batch's backward as they complete; a bucket whose
//! gradients are all complete is started on the collective (`start_all_reduce_sum`: the
//! ring's own thread, NCCL's side stream) while backward goes on with the rest. Buckets
//! start strictly in index order on every rank, whatever order their gradients complete in,
//! so every rank issues the same collectives in the same order; a bucket backward never
//! reached (an unused parameter) starts when `finish` is called. The trainer normalizes the
//! loss by the global token count, so the exchange sums rather than averages.

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::time::Instant;

use tch::Tensor;

use super::collective::Collective;
use crate::autograd;
use crate::error::{Result, TrainError};
use crate::optim::GradLayout;

/// The size cap of each gradient buffer's first bucket (PyTorch DDP's
/// `_DEFAULT_FIRST_BUCKET_BYTES`).
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Sums gradients over ranks in buckets of about `bucket_bytes`.
pub struct GradSync {
    /// The hooks' context: its address must not change while the hooks are set.
    shared: Box<Shared>,
    /// The hooked parameters (their hooks are cleared on drop).
    params: Vec<Tensor>,
}

/// What the hooks and `finish` share.
struct Shared {
    /// Slices of the gradient buffers, in the order they are started.
    buckets: Vec<Tensor>,
    /// Per parameter: its bucket.
    bucket_of: Vec<usize>,
    /// Per bucket: how many parameters' gradients it holds.
    members: Vec<usize>,
    armed: Mutex<Option<Armed>>,
}

/// The state of one armed backward pass.
struct Armed {
    /// The collective, borrowed from `arm` until `finish` (the caller uses nothing else of
    /// it in between: it is inside backward).
    comm: *mut (dyn Collective + 'static),
    /// Per bucket: gradients not complete yet.
    missing: Vec<usize>,
    /// The next bucket to start.
    next: usize,
    /// The first failure to start a bucket; no bucket starts after it.
    error: Option<TrainError>,
}

// SAFETY: the collective is Send; the pointer is used by one thread at a time (the one
// running backward, then the caller of `finish`), under the mutex.
unsafe impl Send for Armed {}

impl Shared {
    /// A backward pass's state before any gradient completes.
    fn armed(&self, comm: &mut (dyn Collective + 'static)) -> Armed {
        Armed {
            comm: comm as *mut _,
            missing: self.members.clone(),
            next: 0,
            error: None,
        }
    }

    /// Parameter `index`'s gradient is complete: starts every bucket that is now ready.
    fn ready(&self, index: usize) {
        let mut guard = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(armed) = guard.as_mut() else {
            return; // not the last micro-batch, or no exchange under way
        };
        let b = self.bucket_of[index];
        armed.missing[b] = armed.missing[b].saturating_sub(1);
        self.start_ready(armed, false);
    }

    /// Starts buckets in order while they are complete (all of them with `all`).
    fn start_ready(&self, armed: &mut Armed, all: bool) {
        while armed.next < self.buckets.len()
            && armed.error.is_none()
            && (all || armed.missing[armed.next] == 0)
        {
            // SAFETY: see `Armed::comm`.
            let comm = unsafe { &mut *armed.comm };
            if let Err(e) = comm.start_all_reduce_sum(&self.buckets[armed.next]) {
                armed.error = Some(e);
            }
            armed.next += 1;
        }
    }
}

extern "C" fn gradient_ready(context: *mut c_void, index: usize) {
    // SAFETY: the context is the GradSync's boxed Shared, alive while its hooks are set.
    let shared = unsafe { &*(context as *const Shared) };
    // A panic must not unwind into libtorch; the exchange then fails at `finish`.
    if std::panic::catch_unwind(AssertUnwindSafe(|| shared.ready(index))).is_err()
        && let Some(armed) = shared
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
    {
        armed
            .error
            .get_or_insert(TrainError::Other("the gradient hook panicked".into()));
    }
}

impl GradSync {
    /// `params` are the trainable variables in the order every rank agrees on, `layout` the
    /// optimizer's gradient buffers (whose members index `params`). Buckets never straddle
    /// a parameter, a buffer's first bucket holds at most `FIRST_BUCKET_BYTES` (unless one
    /// parameter is bigger), and buckets start in the order backward completes them: by the latest position
    /// in `completion` (a parameter's place in the order backward completes its gradient)
    /// of their members.
    pub fn new(
        params: &[Tensor],
        layout: &[GradLayout],
        bucket_bytes: usize,
        completion: &[usize],
    ) -> Result<Self> {
        let mut buckets: Vec<(usize, Tensor, Vec<usize>)> = Vec::new();
        for group in layout {
            let elt = group.flat.kind().elt_size_in_bytes();
            let mut current: Vec<(usize, i64, i64)> = Vec::new();
            let mut flush = |current: &mut Vec<(usize, i64, i64)>| {
                if let (Some(first), Some(last)) = (current.first(), current.last()) {
                    let (start, end) = (first.1, last.1 + last.2);
                    let latest = current.iter().map(|m| completion[m.0]).max();
                    buckets.push((
                        latest.unwrap_or(0),
                        group.flat.narrow(0, start, end - start),
                        current.iter().map(|m| m.0).collect(),
                    ));
                }
                current.clear();
            };
            // As in PyTorch DDP, a group's first bucket is small, so the exchange starts
            // early in backward rather than when a whole `bucket_bytes` is complete.
            let mut limit = bucket_bytes.min(FIRST_BUCKET_BYTES);
            for &m in &group.members {
                let bytes: i64 = current.iter().map(|c| c.2).sum::<i64>() + m.2;
                if !current.is_empty() && bytes as usize * elt > limit {
                    flush(&mut current);
                    limit = bucket_bytes;
                }
                current.push(m);
            }
            flush(&mut current);
        }
        buckets.sort_by_key(|b| b.0);
        let mut bucket_of = vec![usize::MAX; params.len()];
        for (b, (_, _, members)) in buckets.iter().enumerate() {
            for &i in members {
                bucket_of[i] = b;
            }
        }
        if bucket_of.contains(&usize::MAX) {
            return Err(TrainError::Other(
                "the gradient layout leaves out a parameter".into(),
            ));
        }
        let shared = Box::new(Shared {
            members: buckets.iter().map(|b| b.2.len()).collect(),
            buckets: buckets.into_iter().map(|b| b.1).collect(),
            bucket_of,
            armed: Mutex::new(None),
        });
        let sync = GradSync {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            shared,
        };
        let context = &*sync.shared as *const Shared as *mut c_void;
        // A parameter that needs no gradient gets no hook: its bucket starts at `finish`.
        for (i, p) in sync
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.requires_grad())
        {
            // SAFETY: `shared` is boxed (a stable address) and outlives the hooks, which
            // `drop` clears; `gradient_ready` only locks it.
            unsafe { autograd::set_ready_hook(p, gradient_ready, context, i)? };
        }
        Ok(sync)
    }

    /// Buckets and their sizes in elements, in the order they start (for logs and tests).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.shared.buckets.iter().map(|b| b.numel()).collect()
    }

    /// Call before the backward pass whose gradients complete the step (the last
    /// micro-batch's): buckets start on `comm` as that backward completes them. Nothing else
    /// may use `comm` until `finish`.
    pub fn arm(&mut self, comm: &mut (dyn Collective + 'static)) {
        let armed = self.shared.armed(comm);
        *self.shared.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(armed);
    }

    /// Starts the buckets not started yet (all of them if `arm` was not called: no overlap)
    /// and waits until every bucket is summed into the gradients. Returns the seconds spent
    /// here: the exchange that backward did not hide.
    pub fn finish(&mut self, comm: &mut (dyn Collective + 'static)) -> Result<f64> {
        let start = Instant::now();
        let taken = self
            .shared
            .armed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let mut armed = match taken {
            Some(mut armed) => {
                armed.comm = comm as *mut _;
                armed
            }
            None => self.shared.armed(comm),
        };
        self.shared.start_ready(&mut armed, true);
        let finished = comm.finish_started();
        if let Some(e) = armed.error {
            return Err(e);
        }
        finished?;
        Ok(start.elapsed().as_secs_f64())
    }
}

impl Drop for GradSync {
    fn drop(&mut self) {
        for p in self.params.iter().filter(|p| p.requires_grad()) {
            let _ = autograd::clear_ready_hook(p);
        }
    }
}

/// Makes `buffers` (flat, on `comm`'s device) equal to rank `root`'s, `bucket_bytes` at a time.
pub fn broadcast_buffers(
    comm: &mut dyn Collective,
    buffers: &[Tensor],
    bucket_bytes: usize,
    root: usize,
) -> Result<()> {
    for buffer in buffers {
        let per = (bucket_bytes / buffer.kind().elt_size_in_bytes()).max(1) as i64;
        let n = buffer.numel() as i64;
        let mut offset = 0;
        while offset < n {
            let len = per.min(n - offset);
            comm.broadcast(&mut buffer.narrow(0, offset, len), root)?;
            offset += len;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tch::{Device, Kind};

    /// Records each started bucket's size and whether backward was still running.
    struct Recorder {
        in_backward: Arc<AtomicBool>,
        started: Vec<(usize, bool)>,
        finished: usize,
    }

    impl Collective for Recorder {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            2
        }
        fn device(&self) -> tch::Device {
            Device::Cpu
        }
        fn all_reduce_sum(&mut self, _: &mut Tensor) -> Result<()> {
            unreachable!("the exchange only starts all-reduces")
        }
        fn start_all_reduce_sum(&mut self, t: &Tensor) -> Result<()> {
            let during = self.in_backward.load(Ordering::SeqCst);
            self.started.push((t.numel(), during));
            Ok(())
        }
        fn finish_started(&mut self) -> Result<()> {
            self.finished += 1;
            Ok(())
        }
        fn broadcast(&mut self, _: &mut Tensor, _: usize) -> Result<()> {
            Ok(())
        }
        fn barrier(&mut self) -> Result<()> {
            Ok(())
        }
    }

    fn layout(sizes: &[i64]) -> (Vec<Tensor>, GradLayout) {
        let flat = Tensor::zeros([sizes.iter().sum::<i64>()], (Kind::Float, Device::Cpu));
        let mut members = Vec::new();
        let mut params = Vec::new();
        let mut offset = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let p = Tensor::ones([n], (Kind::Float, Device::Cpu)).set_requires_grad(true);
            autograd::set_grad(&p, &flat.narrow(0, offset, n)).unwrap();
            members.push((i, offset, n));
            params.push(p);
            offset += n;
        }
        (params, GradLayout { flat, members })
    }

    #[test]
    fn buckets_follow_completion_and_start_while_backward_runs() {
        // Parameter 0 feeds 1, which feeds 2: backward completes 2, then 1, then 0;
        // parameter 3 is not used.
        let in_backward = Arc::new(AtomicBool::new(false));
        let mut comm = Recorder {
            in_backward: in_backward.clone(),
            started: Vec::new(),
            finished: 0,
        };
        let (params, group) = layout(&[4, 4, 4, 2]);
        let mut sync = GradSync::new(&params, &[group], 16, &[2, 1, 0, 3]).unwrap();
        assert_eq!(sync.bucket_sizes(), vec![4, 4, 4, 2]);
        let h0 = (&params[0] * 2.0).tanh();
        let h1 = (&h0 * &params[1]).tanh();
        let loss = (&h1 * &params[2]).sum(Kind::Float);
        sync.arm(&mut comm);
        in_backward.store(true, Ordering::SeqCst);
        loss.backward();
        in_backward.store(false, Ordering::SeqCst);
        sync.finish(&mut comm).unwrap();
        // Parameters 2, 1, 0 started inside backward; unused parameter 3 at `finish`.
        assert_eq!(
            comm.started,
            vec![(4, true), (4, true), (4, true), (2, false)]
        );
        assert_eq!(comm.finished, 1);
        // Not armed (an earlier micro-batch): nothing starts during backward.
        let loss = (&params[0] * &params[1]).sum(Kind::Float);
        in_backward.store(true, Ordering::SeqCst);
        loss.backward();
        in_backward.store(false, Ordering::SeqCst);
        assert_eq!(comm.started.len(), 4);
        sync.finish(&mut comm).unwrap();
        assert!(comm.started[4..].iter().all(|&(_, during)| !during));
    }

    #[test]
    fn a_bucket_waits_for_every_earlier_one() {
        let (params, group) = layout(&[4, 4]);
        // Parameter 1 completes first, but its bucket is second.
        let mut sync = GradSync::new(&params, &[group], 16, &[0, 1]).unwrap();
        let in_backward = Arc::new(AtomicBool::new(false));
        let mut comm = Recorder {
            in_backward: in_backward.clone(),
            started: Vec::new(),
            finished: 0,
        };
        let loss = (&(&params[0] * 2.0).tanh() * &params[1]).sum(Kind::Float);
        sync.arm(&mut comm);
        in_backward.store(true, Ordering::SeqCst);
        loss.backward();
        in_backward.store(false, Ordering::SeqCst);
        sync.finish(&mut comm).unwrap();
        // Bucket 0 (parameter 0) completes last; bucket 1 waited for it, inside backward.
        assert_eq!(comm.started, vec![(4, true), (4, true)]);
    }

    #[test]
    fn the_first_bucket_is_small_so_the_exchange_starts_early() {
        // Three 800 KB parameters with 25 MiB buckets: the first bucket holds one of them.
        let (params, group) = layout(&[200_000, 200_000, 200_000]);
        let sync = GradSync::new(&params, &[group], 25 << 20, &[0, 1, 2]).unwrap();
        assert_eq!(sync.bucket_sizes(), vec![200_000, 400_000]);
    }
}
