//! One group of local ranks: spawned with the env contract, supervised until all finish, one
//! fails, the launcher is signalled or a peer elsewhere failed; stopped with a signal, then
//! SIGKILL after a grace. Dropping a group kills what is left of it.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{EndKind, RankEnd, exit};
use serde::{Deserialize, Serialize};

use crate::files::RankFiles;
use crate::output::{self, Output};
use crate::signals;
use crate::spare::Spares;
use crate::spawn::{Spawn, rank_command, rank_env};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOutcome {
    /// Every rank exited 0.
    Finished,
    /// The launcher itself was asked to stop.
    Signalled(i32),
    /// A rank failed first; the others were stopped.
    Failed(RankFailure),
    /// A rank on another node failed (the caller said so): the local ranks were stopped.
    /// `frozen`: those that were stopped (SIGSTOP) rather than running at that moment.
    PeerFailed { frozen: Vec<usize> },
    /// A local rank stayed stopped (SIGSTOP, a debugger) for the frozen limit: its peers
    /// would only notice at their collective timeout. The ranks were stopped.
    Frozen { rank: usize, seen_at: Timestamp },
}

/// How the gang ended elsewhere, as the caller of [`Group::supervise_with`] learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEnd {
    /// A rank elsewhere failed (or the round ends to resize): the local ranks get their stop
    /// grace, in which rank 0 saves a checkpoint when the gang agrees to stop.
    Failed,
    /// A member node was lost (no heartbeat): every collective waits on it, so no rank can
    /// save; they are stopped within [`LOST_GRACE`].
    Lost,
}

/// How long ranks get to exit once a member node was lost, or a rank did not answer its
/// peers in a collective: every collective waits on it, so no rank can save; told to abandon
/// their collectives, the others leave their state and exit in well under a second, and a
/// longer grace would only wait for the hung one and delay the next round.
const LOST_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFailure {
    pub rank: usize,
    /// The exit code, or 128 + signal for a rank killed by a signal.
    pub code: i32,
    /// The rank's termination message, or a description of its exit.
    pub reason: String,
    /// When the launcher saw it exit (before stopping the others).
    pub seen_at: Timestamp,
    /// Why it ended, as the rank recorded it (FERROTRAIN_END_FILE), or as its exit status
    /// says where it could not (killed by a signal, or a rank program that keeps no record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<RankEnd>,
}

/// The last lines of output of each local rank (by global rank) when a round ended.
pub type Tails = std::collections::BTreeMap<usize, Vec<String>>;

/// A running rank of the group: its process, the files it leaves and its output.
struct Member {
    rank: usize,
    child: Child,
    files: RankFiles,
    output: Output,
}

impl RankFailure {
    /// The kind of its end, when known.
    pub fn kind(&self) -> Option<EndKind> {
        self.end.as_ref().map(|e| e.kind)
    }

    /// The peer it names as not answering in a collective (a hang), if it does.
    pub fn silent_peer(&self) -> Option<usize> {
        self.end
            .as_ref()
            .filter(|e| e.kind == EndKind::PeerSilent)
            .and_then(|e| e.peer)
    }
}

/// The record of a rank that ended with `status` and left `recorded` (none: it could not, or
/// its program keeps none). A signal's death is `Killed` whatever the rank last wrote.
pub fn end_of(status: ExitStatus, recorded: Option<RankEnd>, reason: &str) -> Option<RankEnd> {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), recorded) {
        (Some(_), _) => Some(RankEnd::new(EndKind::Killed, reason)),
        (None, recorded) => recorded,
    }
}

pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => exit::RETRYABLE,
    }
}

pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signals::name(s)),
        (None, None) => "ended".into(),
    }
}

/// The running ranks of one attempt on this node. Dropping it kills what is left.
pub struct Group {
    children: Vec<Member>,
    grace: Duration,
    /// How many of its ranks were spares (launch/spare.rs).
    pub from_spares: usize,
}

impl Group {
    fn signal_all(&self, signal: i32) {
        for m in &self.children {
            // SAFETY: signalling our own child by pid; it is not reaped before we drop it.
            unsafe {
                libc::kill(m.child.id() as i32, signal);
            }
        }
    }

    /// `signal` (and SIGCONT, so a stopped rank handles it), then SIGKILL after the grace.
    /// One signal only: a rank that gets a second one exits without saving.
    pub fn stop(&mut self, signal: i32) {
        self.stop_within(signal, self.grace);
    }

    /// [`Self::stop`] with a grace of `grace`.
    fn stop_within(&mut self, signal: i32, grace: Duration) {
        self.signal_all(signal);
        self.signal_all(libc::SIGCONT);
        let deadline = Instant::now() + grace;
        loop {
            let mut running = 0;
            for m in &mut self.children {
                if c_try_wait(&mut m.child).is_none() {
                    running += 1;
                }
            }
            if running == 0 {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal_all(libc::SIGKILL);
        for m in &mut self.children {
            let _ = m.child.wait();
        }
    }

    /// Each local rank's last lines of output (by global rank), once what its process wrote
    /// came through.
    pub fn tails(&self) -> Tails {
        self.children
            .iter()
            .map(|m| (m.rank, m.output.last_lines()))
            .collect()
    }

    /// Kills (SIGKILL) the local ranks that are stopped (SIGSTOP, a debugger) rather than
    /// running or waiting, and returns them: a frozen rank is the likely cause when its peers
    /// time out in a collective. Nothing is lost with it: its peers leave the state of the
    /// last step the gang completed. Resumed instead ([`Self::stop`] sends SIGCONT), it would
    /// first finish the step it was stopped in, on cores the next round needs (0.45 s of the
    /// round's end here, seconds on a loaded node).
    pub fn kill_frozen(&mut self) -> Vec<usize> {
        let mut frozen = Vec::new();
        for m in &mut self.children {
            if c_try_wait(&mut m.child).is_none() && process_state(m.child.id()) == Some('T') {
                let _ = m.child.kill();
                frozen.push(m.rank);
            }
        }
        frozen
    }

    /// The first running rank stopped (state T) for at least `limit`, tracking since when
    /// each one is.
    fn frozen_for(
        &self,
        limit: Duration,
        done: &[bool],
        stopped_since: &mut [Option<Instant>],
    ) -> Option<usize> {
        for (i, m) in self.children.iter().enumerate() {
            let stopped = !done[i] && process_state(m.child.id()) == Some('T');
            stopped_since[i] = stopped.then(|| stopped_since[i].unwrap_or_else(Instant::now));
            if stopped_since[i].is_some_and(|since| since.elapsed() >= limit) {
                return Some(m.rank);
            }
        }
        None
    }

    /// Marks the ranks that ended since the last poll in `done`; the failure to report when
    /// any of them failed (one killed by a signal before one that exited: the peers that
    /// noticed its death in the same instant exit with a code).
    fn reap(&mut self, done: &mut [bool]) -> Option<RankFailure> {
        let mut failures = Vec::new();
        for (i, m) in self.children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Some(status) = c_try_wait(&mut m.child) {
                done[i] = true;
                if !status.success() {
                    failures.push((m.rank, status, m.files.clone()));
                }
            }
        }
        failures.sort_by_key(|(rank, status, _)| (status.code().is_some(), *rank));
        let (rank, status, files) = failures.into_iter().next()?;
        let seen_at = Timestamp::now();
        let message = files.message();
        let reason = if message.is_empty() {
            format!("rank {rank} {}", describe_exit(status))
        } else {
            format!("rank {rank} {}: {message}", describe_exit(status))
        };
        let recorded = RankEnd::read(&files.end)
            .inspect_err(|why| tracing::warn!("launch: rank {rank}'s end record: {why}"))
            .ok()
            .flatten();
        Some(RankFailure {
            rank,
            code: exit_code(status),
            end: end_of(status, recorded, &reason),
            reason,
            seen_at,
        })
    }

    /// Polls the ranks until all finish, one fails, or the launcher gets a signal; also
    /// stops the ranks (SIGTERM) and returns [`GroupOutcome::PeerFailed`] as soon as
    /// `peer_failed` says how the gang ended elsewhere, and [`GroupOutcome::Frozen`] when a
    /// rank stays stopped for `frozen_after`. Calls `tick` at every poll while the ranks run
    /// (on this thread: a process it starts dies with this thread, PR_SET_PDEATHSIG). What a
    /// poll means is [`poll`]'s to say.
    pub fn supervise_with(
        &mut self,
        peer_failed: &dyn Fn() -> Option<PeerEnd>,
        frozen_after: Option<Duration>,
        tick: &mut dyn FnMut(),
    ) -> GroupOutcome {
        let mut done = vec![false; self.children.len()];
        let mut stopped_since: Vec<Option<Instant>> = vec![None; self.children.len()];
        loop {
            let seen = Seen {
                signal: signals::take(),
                failure: self.reap(&mut done),
                peer: peer_failed(),
                all_done: done.iter().all(|&d| d),
                frozen: frozen_after
                    .and_then(|limit| self.frozen_for(limit, &done, &mut stopped_since)),
            };
            match poll(seen) {
                Poll::Signalled(signal) => {
                    tracing::warn!("launch: received signal {signal}; stopping the ranks");
                    self.stop(signal);
                    return GroupOutcome::Signalled(signal);
                }
                Poll::Failed(failure) if failure.silent_peer().is_some() => {
                    // A rank hangs: the others cannot save, and the hung one will not stop.
                    self.kill_frozen();
                    self.signal_all(signals::ABANDON);
                    self.stop_within(libc::SIGTERM, self.grace.min(LOST_GRACE));
                    return GroupOutcome::Failed(failure);
                }
                Poll::Failed(failure) => {
                    self.stop(libc::SIGTERM);
                    return GroupOutcome::Failed(failure);
                }
                Poll::PeerEnded(end) => {
                    let frozen = self.kill_frozen();
                    let grace = match end {
                        PeerEnd::Failed => self.grace,
                        PeerEnd::Lost => self.grace.min(LOST_GRACE),
                    };
                    // The round ended elsewhere: the ranks stop waiting in their collectives
                    // and leave their state for the next round.
                    self.signal_all(signals::ABANDON);
                    self.stop_within(libc::SIGTERM, grace);
                    return GroupOutcome::PeerFailed { frozen };
                }
                Poll::Finished => return GroupOutcome::Finished,
                Poll::Frozen(rank) => {
                    let seen_at = Timestamp::now();
                    // Its peers wait in a collective on it: they give up waiting and leave
                    // their state at once, rather than finish the step to stop together.
                    self.kill_frozen();
                    self.signal_all(signals::ABANDON);
                    self.stop(libc::SIGTERM);
                    return GroupOutcome::Frozen { rank, seen_at };
                }
                Poll::Running => {
                    tick();
                    std::thread::sleep(Duration::from_millis(25));
                }
            }
        }
    }
}

/// What one poll of a group's ranks saw.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    /// The signal the launcher got since the last poll (0: none).
    pub signal: i32,
    /// The first of its ranks that failed since the last poll.
    pub failure: Option<RankFailure>,
    /// How the gang ended elsewhere, if it did.
    pub peer: Option<PeerEnd>,
    /// Every rank has exited.
    pub all_done: bool,
    /// A rank stopped (state T) for the frozen limit.
    pub frozen: Option<usize>,
}

/// What a poll means, in the order it is decided ([`poll`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Poll {
    Signalled(i32),
    Failed(RankFailure),
    PeerEnded(PeerEnd),
    Finished,
    Frozen(usize),
    Running,
}

/// What a poll means. The launcher's own signal first (its pod goes away); then a local rank's
/// own end, even when a peer's failure reached this agent in the same poll (this node's report
/// must carry it: it is likely the cause, not a rank stopped for a peer); then the peer's end;
/// then success; then a frozen rank.
pub fn poll(seen: Seen) -> Poll {
    if seen.signal != 0 {
        return Poll::Signalled(seen.signal);
    }
    if let Some(failure) = seen.failure {
        return Poll::Failed(failure);
    }
    if let Some(end) = seen.peer {
        return Poll::PeerEnded(end);
    }
    if seen.all_done {
        return Poll::Finished;
    }
    match seen.frozen {
        Some(rank) => Poll::Frozen(rank),
        None => Poll::Running,
    }
}

fn c_try_wait(child: &mut Child) -> Option<ExitStatus> {
    child.try_wait().ok().flatten()
}

impl Drop for Group {
    fn drop(&mut self) {
        for m in &mut self.children {
            if c_try_wait(&mut m.child).is_none() {
                let _ = m.child.kill();
                let _ = m.child.wait();
            }
        }
    }
}

/// The state letter of /proc/PID/stat (R, S, D, T, t, Z, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A new process for rank `rank` with environment `vars`, its output forwarded into `dir`.
fn fresh(
    a: &Spawn<'_>,
    vars: &[(&'static str, String)],
    dir: &Path,
    rank: usize,
) -> std::io::Result<(Child, Output)> {
    let mut child = rank_command(a, vars).spawn()?;
    let output = Output::of_rank(&mut child, dir, a.round, rank);
    Ok((child, output))
}

/// Starts the group's ranks; a local rank with a live spare in `spares` is that spare, handed
/// the round's environment (launch/spare.rs), instead of a new process.
pub fn start_group_with(a: &Spawn<'_>, mut spares: Option<Spares>) -> std::io::Result<Group> {
    let output_dir = output::dir();
    let mut group = Group {
        children: Vec::new(),
        grace: Duration::from_secs_f64(a.args.stop_grace_seconds.max(0.0)),
        from_spares: 0,
    };
    for local_rank in 0..a.args.nproc_per_node {
        let (rank, files, vars) = rank_env(a, local_rank);
        files.clear();
        let spare = spares.as_mut().and_then(|s| s.take(local_rank));
        let (child, output) = match spare.map(|s| s.go(&vars)) {
            Some(Ok((child, output))) => {
                group.from_spares += 1;
                output.assign(&output_dir, a.round, rank);
                (child, output)
            }
            Some(Err(e)) => {
                tracing::warn!("launch: the spare of rank {rank} is gone ({e}); starting it anew");
                fresh(a, &vars, &output_dir, rank)?
            }
            None => fresh(a, &vars, &output_dir, rank)?,
        };
        tracing::debug!("launch: started rank {rank} (pid {})", child.id());
        group.children.push(Member {
            rank,
            child,
            files,
            output,
        });
    }
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of one rank that killed itself (SIGKILL) and has ended by the first poll.
    fn group_of_one_killed() -> Group {
        let child = std::process::Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .spawn()
            .expect("sh");
        // Ended, but not reaped: the group's poll reaps it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_state(child.id()) != Some('Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(process_state(child.id()), Some('Z'), "the rank ended");
        let mut child = child;
        let output = Output::of_rank(&mut child, &std::env::temp_dir(), Some(0), 1);
        Group {
            children: vec![Member {
                rank: 1,
                child,
                files: RankFiles::of(Path::new("/nonexistent"), 1),
                output,
            }],
            grace: Duration::from_secs(1),
            from_spares: 0,
        }
    }

    #[test]
    fn a_killed_rank_is_killed_whatever_it_last_recorded_and_a_record_is_kept_otherwise() {
        use std::os::unix::process::ExitStatusExt;
        let silent = RankEnd {
            peer: Some(2),
            ..RankEnd::new(EndKind::PeerSilent, "rank 2 did not answer")
        };
        let killed = end_of(
            ExitStatus::from_raw(9),
            Some(silent.clone()),
            "rank 1 was killed",
        );
        assert_eq!(killed.map(|e| e.kind), Some(EndKind::Killed));
        let exited = ExitStatus::from_raw(1 << 8);
        assert_eq!(end_of(exited, Some(silent.clone()), "x"), Some(silent));
        assert_eq!(
            end_of(exited, None, "x"),
            None,
            "no record: nothing made up"
        );
    }

    /// A group of two ranks (0 and 1) running `sh -c script` each.
    fn group_of_two(script: &str) -> Group {
        let children = (0..2)
            .map(|rank| {
                let mut child = std::process::Command::new("sh")
                    .args(["-c", script])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                let output = Output::of_rank(&mut child, &std::env::temp_dir(), None, rank);
                Member {
                    rank,
                    child,
                    files: RankFiles::of(Path::new("/nonexistent"), rank),
                    output,
                }
            })
            .collect();
        Group {
            children,
            grace: Duration::from_secs(10),
            from_spares: 0,
        }
    }

    #[test]
    fn a_frozen_rank_is_killed_not_resumed_and_its_peer_stopped_with_a_signal() {
        use std::os::unix::process::ExitStatusExt;
        // Rank 0 exits on SIGTERM (after ABANDON, SIGUSR1, which it ignores); rank 1 would
        // too, were it resumed to handle it.
        let mut group =
            group_of_two("trap '' USR1; trap 'exit 7' TERM; while :; do sleep 0.05; done");
        let frozen_pid = group.children[1].child.id() as i32;
        // SAFETY: our own child.
        unsafe {
            libc::kill(frozen_pid, libc::SIGSTOP);
        }
        let started = Instant::now();
        let outcome = group.supervise_with(&|| None, Some(Duration::from_millis(200)), &mut || {});
        assert!(
            matches!(outcome, GroupOutcome::Frozen { rank: 1, .. }),
            "{outcome:?}"
        );
        let statuses: Vec<ExitStatus> = group
            .children
            .iter_mut()
            .map(|m| m.child.wait().unwrap())
            .collect();
        assert_eq!(statuses[1].signal(), Some(libc::SIGKILL), "{statuses:?}");
        assert_eq!(
            statuses[0].code(),
            Some(7),
            "its peer got SIGTERM: {statuses:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no stop grace waited out: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_rank_that_died_is_reported_even_when_a_peers_failure_arrives_in_the_same_poll() {
        let mut group = group_of_one_killed();
        let outcome = group.supervise_with(&|| Some(PeerEnd::Failed), None, &mut || {});
        let GroupOutcome::Failed(f) = outcome else {
            panic!("the local rank's own death, not a peer's failure: {outcome:?}");
        };
        assert_eq!((f.rank, f.code), (1, 137), "{f:?}");
        assert!(f.reason.contains("SIGKILL"), "{}", f.reason);
    }
}
