//! `ferrotrain launch`: torchrun's job for ferrotrain. Starts the local ranks, forwards
//! signals, and when one fails stops the others and (single node) restarts the group.
//!
//! Each rank is this executable (`run --config <path>`) with the env contract set: RANK,
//! LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FERROTRAIN_ATTEMPT,
//! FERROTRAIN_RDZV_TOKEN, OMP_NUM_THREADS. Ranks resume from the latest checkpoint on their
//! own; the launcher only restarts them. A permanent exit code (2, 3, 4) is never restarted.
//! On several nodes a failure ends the launcher with the failing rank's code: restarting the
//! gang across nodes is the operator's job.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use ferrotrain_api::recovery::{AttemptEnd, EndCause, StepReport, Timestamp};
use ferrotrain_api::{Progress, Recovery, env, exit};

use crate::dist::auth::random_token;
use crate::signals;

#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// The trainer config (YAML) every rank runs.
    #[arg(long, env = env::FERROTRAIN_CONFIG)]
    pub config: PathBuf,
    /// Nodes in the job.
    #[arg(long, env = env::NNODES, default_value_t = 1)]
    pub nnodes: usize,
    /// Ranks started on this node (one per GPU on GPU nodes).
    #[arg(long, env = env::NPROC_PER_NODE, default_value_t = 1)]
    pub nproc_per_node: usize,
    /// This node's index, 0-based.
    #[arg(long, env = env::NODE_RANK, default_value_t = 0)]
    pub node_rank: usize,
    /// Address of node 0, which hosts the rendezvous store.
    #[arg(long, env = env::MASTER_ADDR, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the rendezvous store; 0 picks a free port (single node only).
    #[arg(long, env = env::MASTER_PORT, default_value_t = crate::dist::DEFAULT_MASTER_PORT)]
    pub master_port: u16,
    /// Single node: how many times the group is restarted after a retryable failure.
    #[arg(long, env = env::FERROTRAIN_MAX_RESTARTS, default_value_t = 3)]
    pub max_restarts: u32,
    /// Wait before the first restart; doubles with each restart.
    #[arg(
        long,
        env = env::FERROTRAIN_RESTART_BACKOFF_SECONDS,
        default_value_t = 1.0
    )]
    pub restart_backoff_seconds: f64,
    /// Longest wait between restarts.
    #[arg(
        long,
        env = env::FERROTRAIN_RESTART_BACKOFF_MAX_SECONDS,
        default_value_t = 30.0
    )]
    pub restart_backoff_max_seconds: f64,
    /// How long ranks get between SIGTERM and SIGKILL: a signalled rank saves a checkpoint
    /// first. Keep it below the pod's terminationGracePeriodSeconds (default 30).
    #[arg(long, env = env::FERROTRAIN_STOP_GRACE_SECONDS, default_value_t = 25.0)]
    pub stop_grace_seconds: f64,
    /// Keep the recovery ledger here (JSON, rewritten after every change): each attempt's
    /// start, first step, end and lost steps, and the run's goodput (docs/observability.md).
    #[arg(long, env = env::FERROTRAIN_RECOVERY_FILE)]
    pub recovery_file: Option<PathBuf>,
    /// The program each rank runs (default: this executable). For tests and wrappers.
    #[arg(long, env = env::FERROTRAIN_RANK_PROGRAM, hide = true)]
    pub rank_program: Option<PathBuf>,
    /// Extra arguments passed to every rank after `run --config <path>`.
    #[arg(last = true)]
    pub rank_args: Vec<String>,
}

/// How a group of local ranks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOutcome {
    /// Every rank exited 0.
    Finished,
    /// The launcher itself was asked to stop.
    Signalled(i32),
    /// A rank failed first; the others were stopped.
    Failed(RankFailure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFailure {
    pub rank: usize,
    /// The exit code, or 128 + signal for a rank killed by a signal.
    pub code: i32,
    /// The rank's termination message, or a description of its exit.
    pub reason: String,
    /// When the launcher saw it exit (before stopping the others).
    pub seen_at: Timestamp,
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => exit::RETRYABLE,
    }
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signals::name(s)),
        (None, None) => "ended".into(),
    }
}

/// The running ranks of one attempt on this node. Dropping it kills what is left.
struct Group {
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
    fn stop(&mut self, signal: i32) {
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

    /// Polls the ranks until all finish, one fails, or the launcher gets a signal.
    fn supervise(&mut self) -> GroupOutcome {
        let mut done = vec![false; self.children.len()];
        loop {
            let signal = signals::take();
            if signal != 0 {
                tracing::warn!("launch: received signal {signal}; stopping the ranks");
                self.stop(signal);
                return GroupOutcome::Signalled(signal);
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
struct Attempt<'a> {
    args: &'a LaunchArgs,
    program: &'a Path,
    attempt: u64,
    port: u16,
    token: &'a str,
    logs: &'a Path,
    omp_threads: Option<String>,
}

fn start_group(a: &Attempt<'_>) -> std::io::Result<Group> {
    let args = a.args;
    let world = args.nnodes * args.nproc_per_node;
    let mut group = Group {
        children: Vec::new(),
        grace: Duration::from_secs_f64(args.stop_grace_seconds.max(0.0)),
    };
    for local_rank in 0..args.nproc_per_node {
        let rank = args.node_rank * args.nproc_per_node + local_rank;
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
            .env(env::FERROTRAIN_RDZV_TOKEN, a.token)
            .env(env::FERROTRAIN_CONFIG, &args.config)
            .env(env::FERROTRAIN_TERMINATION_LOG, &log)
            .env(env::FERROTRAIN_PROGRESS_FILE, a.logs.join(PROGRESS_FILE));
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

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sleeps `d` unless a signal arrives; returns the signal.
fn sleep_unless_signalled(d: Duration) -> Option<i32> {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        let s = signals::received();
        if s != 0 {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(25).min(deadline - Instant::now()));
    }
    None
}

/// Why the launcher itself could not run the group. The ranks' own failures are not
/// errors of the launcher: `run` returns their exit code.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The flags or the environment describe no valid gang (permanent, exit 2).
    #[error(
        "invalid gang: --nnodes {nnodes} --nproc-per-node {nproc_per_node} --node-rank {node_rank}"
    )]
    InvalidGang {
        nnodes: usize,
        nproc_per_node: usize,
        node_rank: usize,
    },
    /// `--master-port 0` (pick a free port) only works when every rank is on this node.
    #[error("--master-port 0 needs a single node")]
    EphemeralPortNeedsOneNode,
    /// Several nodes must share a rendezvous token (permanent, exit 2).
    #[error(
        "{} must be set (the same on every node) when --nnodes > 1",
        env::FERROTRAIN_RDZV_TOKEN
    )]
    MissingToken,
    /// The launcher's own I/O failed (retryable).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl LaunchError {
    /// The launcher's exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::InvalidGang { .. }
            | LaunchError::EphemeralPortNeedsOneNode
            | LaunchError::MissingToken => exit::INVALID_CONFIG,
            LaunchError::Io { .. } => exit::RETRYABLE,
        }
    }

    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }
}

/// Runs the local ranks to completion; returns the group's exit code (0, a rank's failure
/// code, or 128 + a signal), or why the launcher could not run it.
pub fn run(args: LaunchArgs) -> Result<i32, LaunchError> {
    if args.nnodes == 0 || args.nproc_per_node == 0 || args.node_rank >= args.nnodes {
        return Err(LaunchError::InvalidGang {
            nnodes: args.nnodes,
            nproc_per_node: args.nproc_per_node,
            node_rank: args.node_rank,
        });
    }
    let multi_node = args.nnodes > 1;
    if multi_node && args.master_port == 0 {
        return Err(LaunchError::EphemeralPortNeedsOneNode);
    }
    let program = match &args.rank_program {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(LaunchError::io("cannot find own binary"))?,
    };
    let token = match std::env::var(env::FERROTRAIN_RDZV_TOKEN) {
        Ok(t) if !t.is_empty() => t,
        _ if multi_node => return Err(LaunchError::MissingToken),
        _ => random_token(),
    };
    let base_attempt: u64 = std::env::var(env::FERROTRAIN_ATTEMPT)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let omp_threads = match std::env::var("OMP_NUM_THREADS") {
        Ok(_) => None,
        Err(_) => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Some((cores / args.nproc_per_node).max(1).to_string())
        }
    };
    let logs = std::env::temp_dir().join(format!("ferrotrain-launch-{}", std::process::id()));
    std::fs::create_dir_all(&logs)
        .map_err(LaunchError::io(format!("cannot create {}", logs.display())))?;
    signals::install(signals::Mode::Remember);
    let code = supervise_attempts(&args, &program, &token, base_attempt, omp_threads, &logs);
    let _ = std::fs::remove_dir_all(&logs);
    code
}

/// After a successful run, global rank 0's termination message is its final progress report
/// (on node 0 only): it becomes the launcher's, which is the container's.
fn forward_final_report(logs: &Path) {
    let message = std::fs::read_to_string(logs.join("rank-0.termination-log")).unwrap_or_default();
    if ferrotrain_api::Progress::from_termination_message(&message).is_some() {
        crate::error::write_termination_message(&message);
    }
}

/// Rank 0's progress file in the launcher's scratch directory.
const PROGRESS_FILE: &str = "rank-0.progress.json";

/// The launcher's recovery ledger ([`ferrotrain_api::recovery`]): fed with the group's starts
/// and exits and rank 0's progress file, logged at every attempt's end and kept in
/// `--recovery-file`.
struct Ledger {
    recovery: Recovery,
    progress_file: PathBuf,
    out: Option<PathBuf>,
    node: Option<String>,
}

impl Ledger {
    fn new(logs: &Path, out: Option<PathBuf>) -> Self {
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty());
        Ledger {
            recovery: Recovery::default(),
            progress_file: logs.join(PROGRESS_FILE),
            out,
            node,
        }
    }

    fn started(&mut self, attempt: u64) {
        let _ = std::fs::remove_file(&self.progress_file);
        let now = Timestamp::now();
        self.recovery.start(attempt as i64, now);
        // The launcher's ranks run once spawned: no scheduling, no image pull.
        self.recovery.running(now);
        self.save();
    }

    /// The attempt's last report, read when it ended; rank 0 rewrites it after every step,
    /// so its modification time is when the last step completed.
    fn read_progress(&mut self) {
        let report = std::fs::read(&self.progress_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Progress>(&b).ok());
        let written = std::fs::metadata(&self.progress_file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| Timestamp::try_from(t).ok())
            .unwrap_or_else(Timestamp::now);
        if let Some(p) = report {
            self.recovery.report(StepReport::of(&p), written);
        }
    }

    fn ended(&mut self, outcome: &GroupOutcome) {
        self.read_progress();
        let now = Timestamp::now();
        let (cause, reason, rank, code, at) = match outcome {
            GroupOutcome::Finished => (EndCause::Succeeded, "Succeeded", None, Some(0), now),
            GroupOutcome::Signalled(s) => {
                (EndCause::Stopped, "Signalled", None, Some(128 + s), now)
            }
            GroupOutcome::Failed(f) => {
                let reason = if f.code >= 128 { "Killed" } else { "ExitCode" };
                (
                    EndCause::Failure,
                    reason,
                    Some(f.rank as i64),
                    Some(f.code),
                    f.seen_at,
                )
            }
        };
        self.recovery.end(AttemptEnd {
            cause,
            reason: reason.into(),
            rank,
            exit_code: code,
            node: self.node.clone(),
            failed_at: at,
            detected_at: at,
        });
        self.save();
        self.log();
    }

    fn save(&self) {
        let Some(out) = &self.out else { return };
        let tmp = out.with_extension("tmp");
        let written = serde_json::to_vec_pretty(&self.recovery)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(&tmp, json))
            .and_then(|()| std::fs::rename(&tmp, out));
        if let Err(e) = written {
            tracing::warn!(path = %out.display(), error = %e, "recovery file not written");
        }
    }

    /// One line per attempt and one for the run.
    fn log(&self) {
        let r = &self.recovery;
        for line in recovery_lines(r) {
            tracing::info!("launch: {line}");
        }
    }
}

/// The ledger in words: each attempt, then the totals.
pub fn recovery_lines(r: &Recovery) -> Vec<String> {
    let mut lines = Vec::new();
    for a in &r.attempts {
        let to_first = a
            .seconds_to_first_step()
            .map_or("no step".to_string(), |s| {
                format!("first step after {s:.1} s")
            });
        let end = a.end.as_ref().map_or("running".to_string(), |e| {
            let who = e.rank.map_or(String::new(), |r| format!(" rank {r}"));
            let code = e.exit_code.map_or(String::new(), |c| format!(" exit {c}"));
            format!("{:?} ({}{who}{code})", e.cause, e.reason)
        });
        let lost = a
            .lost_steps
            .map_or(String::new(), |l| format!(", {l} steps lost"));
        lines.push(format!(
            "attempt {}: resumed from step {}, {to_first}, reached step {}, {end}{lost}",
            a.attempt,
            a.resumed_from_step.unwrap_or(0),
            a.last_step.unwrap_or(0),
        ));
    }
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2} s"));
    lines.push(format!(
        "recovery: {} attempt(s), {:.1} s in all, {:.1} s productive, goodput {}, {} steps lost, \
         detect {}, failure to next first step {}",
        r.attempts.len() + r.retired.attempts as usize,
        r.total_seconds,
        r.productive_seconds,
        r.goodput_percent
            .map_or("-".to_string(), |g| format!("{g:.1}%")),
        r.lost_steps,
        opt(r.mean_detect_seconds),
        opt(r.mean_recovery_seconds),
    ));
    lines
}

fn supervise_attempts(
    args: &LaunchArgs,
    program: &Path,
    token: &str,
    base_attempt: u64,
    omp_threads: Option<String>,
    logs: &Path,
) -> Result<i32, LaunchError> {
    let multi_node = args.nnodes > 1;
    let mut ledger = Ledger::new(logs, args.recovery_file.clone());
    let mut restarts: u32 = 0;
    let mut backoff = Duration::from_secs_f64(args.restart_backoff_seconds.max(0.0));
    let max_backoff = Duration::from_secs_f64(args.restart_backoff_max_seconds.max(0.0));
    loop {
        let attempt = base_attempt + if multi_node { 0 } else { restarts as u64 };
        let port = if args.master_port == 0 {
            free_port().map_err(LaunchError::io("no free port"))?
        } else {
            args.master_port
        };
        let a = Attempt {
            args,
            program,
            attempt,
            port,
            token,
            logs,
            omp_threads: omp_threads.clone(),
        };
        tracing::info!(
            "launch: starting {} rank(s), attempt {attempt}, rendezvous {}:{port}",
            args.nproc_per_node,
            args.master_addr
        );
        // Before the ranks exist: the last attempt's progress file must be gone before the
        // new rank 0 can write its own.
        ledger.started(attempt);
        let mut group = start_group(&a).map_err(LaunchError::io(format!(
            "cannot start {}",
            program.display()
        )))?;
        let outcome = group.supervise();
        drop(group);
        ledger.ended(&outcome);
        match outcome {
            GroupOutcome::Finished => {
                forward_final_report(logs);
                return Ok(exit::SUCCESS);
            }
            GroupOutcome::Signalled(s) => return Ok(128 + s),
            GroupOutcome::Failed(f) => {
                tracing::warn!("launch: {}", f.reason);
                crate::error::write_termination_message(&f.reason);
                if exit::is_permanent(f.code) {
                    tracing::error!("launch: exit code {} is permanent; not restarting", f.code);
                    return Ok(f.code);
                }
                if multi_node {
                    // The operator restarts the whole gang across nodes.
                    return Ok(f.code);
                }
                if restarts >= args.max_restarts {
                    tracing::error!(
                        "launch: giving up after {restarts} restart(s) (--max-restarts)"
                    );
                    return Ok(f.code);
                }
                restarts += 1;
                tracing::warn!(
                    "launch: restarting the group in {:.1} s (restart {restarts} of \
                     {}); ranks resume from the latest checkpoint",
                    backoff.as_secs_f64(),
                    args.max_restarts
                );
                if let Some(s) = sleep_unless_signalled(backoff) {
                    return Ok(128 + s);
                }
                backoff = (backoff * 2).min(max_backoff);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    fn args(flags: &[&str]) -> LaunchArgs {
        let mut argv = vec!["launch", "--config", "job.yaml"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).expect("flags parse").launch
    }

    #[test]
    fn an_impossible_gang_is_a_typed_permanent_error() {
        let err = run(args(&["--nnodes", "2", "--node-rank", "2"])).unwrap_err();
        assert!(
            matches!(err, LaunchError::InvalidGang { node_rank: 2, .. }),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::INVALID_CONFIG);
        let err = run(args(&[
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-port",
            "0",
        ]))
        .unwrap_err();
        assert!(
            matches!(err, LaunchError::EphemeralPortNeedsOneNode),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::INVALID_CONFIG);
    }

    #[test]
    fn launcher_io_failures_keep_their_source_and_are_retryable() {
        use std::error::Error as _;
        let source = std::io::Error::other("disk full");
        let err = LaunchError::io("cannot create /tmp/x")(source);
        assert_eq!(err.to_string(), "cannot create /tmp/x: disk full");
        assert_eq!(err.source().unwrap().to_string(), "disk full");
        assert_eq!(err.exit_code(), exit::RETRYABLE);
    }
}
