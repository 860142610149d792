//! One group of local ranks: spawned with the env contract, supervised until all finish, one
//! fails, the launcher is signalled or a peer elsewhere failed; stopped with a signal, then
//! SIGKILL after a grace. Dropping a group kills what is left of it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{env, exit};
use serde::{Deserialize, Serialize};

use super::args::LaunchArgs;
use super::files::{PROGRESS_FILE, REFUSED_FILE, ROUNDS_FILE};
use crate::signals;

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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFailure {
    pub rank: usize,
    /// The exit code, or 128 + signal for a rank killed by a signal.
    pub code: i32,
    /// The rank's termination message, or a description of its exit.
    pub reason: String,
    /// When the launcher saw it exit (before stopping the others).
    pub seen_at: Timestamp,
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
    children: Vec<(usize, Child, PathBuf)>,
    grace: Duration,
}

impl Group {
    fn signal_all(&self, signal: i32) {
        for (_, child, _) in &self.children {
            // SAFETY: signalling our own child by pid; it is not reaped before we drop it.
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
        }
    }

    /// `signal` (and SIGCONT, so a stopped rank handles it), then SIGKILL after the grace.
    /// One signal only: a rank that gets a second one exits without saving.
    pub fn stop(&mut self, signal: i32) {
        self.signal_all(signal);
        self.signal_all(libc::SIGCONT);
        let deadline = Instant::now() + self.grace;
        loop {
            let mut running = 0;
            for (_, child, _) in &mut self.children {
                if c_try_wait(child).is_none() {
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
        for (_, child, _) in &mut self.children {
            let _ = child.wait();
        }
    }

    /// The local ranks that are stopped (SIGSTOP, a debugger) rather than running or waiting:
    /// a frozen rank is the likely cause when its peers time out in a collective. Read before
    /// [`Self::stop`], which resumes them.
    pub fn frozen_ranks(&mut self) -> Vec<usize> {
        let mut frozen = Vec::new();
        for (rank, child, _) in &mut self.children {
            if c_try_wait(child).is_none() && process_state(child.id()) == Some('T') {
                frozen.push(*rank);
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
        for (i, (rank, child, _)) in self.children.iter().enumerate() {
            let stopped = !done[i] && process_state(child.id()) == Some('T');
            stopped_since[i] = stopped.then(|| stopped_since[i].unwrap_or_else(Instant::now));
            if stopped_since[i].is_some_and(|since| since.elapsed() >= limit) {
                return Some(*rank);
            }
        }
        None
    }

    /// Polls the ranks until all finish, one fails, or the launcher gets a signal.
    pub fn supervise(&mut self) -> GroupOutcome {
        self.supervise_until(&|| false, None)
    }

    /// As [`Self::supervise`], and also stops the ranks (SIGTERM) and returns
    /// [`GroupOutcome::PeerFailed`] as soon as `peer_failed` says so, and
    /// [`GroupOutcome::Frozen`] when a rank stays stopped for `frozen_after`.
    pub fn supervise_until(
        &mut self,
        peer_failed: &dyn Fn() -> bool,
        frozen_after: Option<Duration>,
    ) -> GroupOutcome {
        let mut done = vec![false; self.children.len()];
        let mut stopped_since: Vec<Option<Instant>> = vec![None; self.children.len()];
        loop {
            let signal = signals::take();
            if signal != 0 {
                tracing::warn!("launch: received signal {signal}; stopping the ranks");
                self.stop(signal);
                return GroupOutcome::Signalled(signal);
            }
            if peer_failed() {
                let frozen = self.frozen_ranks();
                self.stop(libc::SIGTERM);
                return GroupOutcome::PeerFailed { frozen };
            }
            let mut failures = Vec::new();
            for (i, (rank, child, log)) in self.children.iter_mut().enumerate() {
                if done[i] {
                    continue;
                }
                if let Some(status) = c_try_wait(child) {
                    done[i] = true;
                    if !status.success() {
                        failures.push((*rank, status, log.clone()));
                    }
                }
            }
            if !failures.is_empty() {
                let seen_at = Timestamp::now();
                // A rank killed by a signal is the likelier cause than the peers that
                // noticed its death in the same instant.
                failures.sort_by_key(|(rank, status, _)| (status.code().is_some(), *rank));
                let (rank, status, log) = failures.swap_remove(0);
                let message = std::fs::read_to_string(&log).unwrap_or_default();
                let message = message.trim();
                let reason = if message.is_empty() {
                    format!("rank {rank} {}", describe_exit(status))
                } else {
                    format!("rank {rank} {}: {message}", describe_exit(status))
                };
                self.stop(libc::SIGTERM);
                return GroupOutcome::Failed(RankFailure {
                    rank,
                    code: exit_code(status),
                    reason,
                    seen_at,
                });
            }
            if done.iter().all(|&d| d) {
                return GroupOutcome::Finished;
            }
            if let Some(limit) = frozen_after
                && let Some(rank) = self.frozen_for(limit, &done, &mut stopped_since)
            {
                let seen_at = Timestamp::now();
                self.stop(libc::SIGTERM);
                return GroupOutcome::Frozen { rank, seen_at };
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

fn c_try_wait(child: &mut Child) -> Option<ExitStatus> {
    child.try_wait().ok().flatten()
}

impl Drop for Group {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.children {
            if c_try_wait(child).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// What one attempt of the local group needs.
/// The state letter of /proc/PID/stat (R, S, D, T, t, Z, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// What every rank of a group is started with.
pub struct Spawn<'a> {
    pub args: &'a LaunchArgs,
    pub program: &'a Path,
    pub attempt: u64,
    pub port: u16,
    pub token: &'a str,
    pub logs: &'a Path,
    pub omp_threads: Option<String>,
    /// In-place restarts (the agent, [`super::agent`]): the round the ranks belong to; the
    /// agent of node 0 hosts the rendezvous store, so rank 0 must not start one.
    pub round: Option<u64>,
    /// Elastic rounds: this node's position among the round's member nodes and their number
    /// (ranks are renumbered over the members; the gang's full size is the virtual world).
    pub place: Option<(usize, usize)>,
}

pub fn start_group(a: &Spawn<'_>) -> std::io::Result<Group> {
    let args = a.args;
    let (position, nodes) = a.place.unwrap_or((args.node_rank, args.nnodes));
    let world = nodes * args.nproc_per_node;
    let mut group = Group {
        children: Vec::new(),
        grace: Duration::from_secs_f64(args.stop_grace_seconds.max(0.0)),
    };
    for local_rank in 0..args.nproc_per_node {
        let rank = position * args.nproc_per_node + local_rank;
        let log = a.logs.join(format!("rank-{rank}.termination-log"));
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(a.program);
        cmd.arg("run")
            .arg("--config")
            .arg(&args.config)
            .args(&args.rank_args)
            .env(env::RANK, rank.to_string())
            .env(env::LOCAL_RANK, local_rank.to_string())
            .env(env::WORLD_SIZE, world.to_string())
            .env(env::LOCAL_WORLD_SIZE, args.nproc_per_node.to_string())
            .env(env::NNODES, args.nnodes.to_string())
            .env(env::NODE_RANK, args.node_rank.to_string())
            .env(env::NPROC_PER_NODE, args.nproc_per_node.to_string())
            .env(env::MASTER_ADDR, &args.master_addr)
            .env(env::MASTER_PORT, a.port.to_string())
            .env(env::FERROTRAIN_ATTEMPT, a.attempt.to_string())
            .env(env::TORCHELASTIC_RESTART_COUNT, a.attempt.to_string())
            .env(env::FERROTRAIN_CONFIG, &args.config)
            .env(env::FERROTRAIN_TERMINATION_LOG, &log)
            .env(env::FERROTRAIN_PROGRESS_FILE, a.logs.join(PROGRESS_FILE));
        if a.place.is_some() {
            // The trainers cover the shards of the ranks a smaller round lacks.
            cmd.env(
                env::FERROTRAIN_VIRTUAL_WORLD,
                (args.nnodes * args.nproc_per_node).to_string(),
            );
        }
        // A token the pod holds in a file (the operator mounts the job's Secret) stays there:
        // the ranks read the same file (FERROTRAIN_RDZV_TOKEN_FILE, inherited) instead of
        // finding the token in their environment.
        let set = |name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        let from_file = !set(env::FERROTRAIN_RDZV_TOKEN) && set(env::FERROTRAIN_RDZV_TOKEN_FILE);
        if !from_file {
            cmd.env(env::FERROTRAIN_RDZV_TOKEN, a.token);
        }
        if let Some(round) = a.round {
            cmd.env(env::FERROTRAIN_ROUND, round.to_string())
                .env(env::FERROTRAIN_STORE_HOSTED, "1")
                .env(env::FERROTRAIN_ROUNDS_FILE, a.logs.join(ROUNDS_FILE))
                .env(env::FERROTRAIN_REFUSED_FILE, a.logs.join(REFUSED_FILE));
        }
        if let Some(t) = &a.omp_threads {
            cmd.env("OMP_NUM_THREADS", t);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe. A rank dies with its launcher, even a
            // SIGKILLed one, instead of training on as an orphan.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = cmd.spawn()?;
        tracing::debug!("launch: started rank {rank} (pid {})", child.id());
        group.children.push((rank, child, log));
    }
    Ok(group)
}
