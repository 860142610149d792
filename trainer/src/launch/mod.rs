//! `ferrotrain launch`: torchrun's job for ferrotrain. Starts the local ranks, forwards
//! signals, and when one fails stops the others and (single node) restarts the group.
//!
//! Each rank is this executable (`run --config <path>`) with the env contract set: RANK,
//! LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FERROTRAIN_ATTEMPT,
//! FERROTRAIN_RDZV_TOKEN, OMP_NUM_THREADS. Ranks resume from the latest checkpoint on their
//! own; the launcher only restarts them. A permanent exit code (2, 3, 4) is never restarted.
//! On several nodes a failure ends the launcher with the failing rank's code (the operator
//! restarts the gang), unless `--restart-in-place`: then the launcher is the pod's agent and
//! restarts its ranks in a new round with every other node's agent ([`agent`]).
//!
//! Rooms: `group` (spawn, supervise and stop the local ranks), `local` (restarts without
//! rounds), `agent` (in-place rounds over the rendezvous store), `members` (who trains in a
//! round: elastic world size), `watch` (threads that end a round), `blame` (which rank caused
//! a round's end), `ledger` (what each attempt or round cost).

mod agent;
pub mod blame;
mod group;
mod ledger;
mod local;
mod members;
mod watch;

use std::path::{Path, PathBuf};

use ferrotrain_api::{env, exit};

use crate::dist::auth::random_token;
use crate::signals;
pub use group::{GroupOutcome, RankFailure};
pub use ledger::recovery_lines;
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
    /// Several nodes: restart the ranks in place (a new round, every node's ranks together)
    /// after a retryable failure instead of exiting; up to --max-restarts rounds. Node 0's
    /// launcher then hosts the rendezvous store (docs/distributed.md, "In-place restarts").
    #[arg(long, env = env::FERROTRAIN_RESTART_IN_PLACE, default_value_t = false)]
    pub restart_in_place: bool,
    /// Exit codes no restart can fix (comma-separated): a rank that exits with one is never
    /// restarted, and the launcher exits with it.
    #[arg(
        long,
        env = env::FERROTRAIN_PERMANENT_EXIT_CODES,
        value_delimiter = ',',
        default_values_t = [exit::INVALID_CONFIG, exit::INVALID_DATA, exit::INCOMPATIBLE_CHECKPOINT]
    )]
    pub permanent_exit_codes: Vec<i32>,
    /// In-place restarts, elastic: a round may start with this many nodes (at least) once the
    /// others have not come for --elastic-wait-seconds (default: every node, not elastic).
    #[arg(long, env = env::FERROTRAIN_MIN_NODES)]
    pub min_nodes: Option<usize>,
    /// In-place restarts, elastic: how long node 0 waits for every node before a round starts
    /// with fewer (at least --min-nodes).
    #[arg(
        long,
        env = env::FERROTRAIN_ELASTIC_WAIT_SECONDS,
        default_value_t = 60.0
    )]
    pub elastic_wait_seconds: f64,
    /// In-place restarts: how long every node's launcher waits for the others to join a round.
    #[arg(
        long,
        env = env::FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS,
        default_value_t = 600.0
    )]
    pub rendezvous_timeout_seconds: f64,
    /// The program each rank runs (default: this executable). For tests and wrappers.
    #[arg(long, env = env::FERROTRAIN_RANK_PROGRAM, hide = true)]
    pub rank_program: Option<PathBuf>,
    /// Extra arguments passed to every rank after `run --config <path>`.
    #[arg(last = true)]
    pub rank_args: Vec<String>,
}

/// How a group of local ranks ended.
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
    #[error("in-place restarts: {0}")]
    Rendezvous(String),
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
            LaunchError::Io { .. } | LaunchError::Rendezvous(_) => exit::RETRYABLE,
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
    let launch = Launch {
        program,
        token,
        base_attempt,
        omp_threads,
        logs,
    };
    let code = if multi_node && args.restart_in_place {
        agent::run(&args, &launch)
    } else {
        local::supervise_attempts(&args, &launch)
    };
    let _ = std::fs::remove_dir_all(&launch.logs);
    code
}

/// What every attempt or round of this launcher starts its ranks with.
pub struct Launch {
    /// The program each rank runs.
    pub program: PathBuf,
    /// The rendezvous token.
    pub token: String,
    /// FERROTRAIN_ATTEMPT as given (the operator's attempt).
    pub base_attempt: u64,
    /// OMP_NUM_THREADS for each rank, unless the environment sets it.
    pub omp_threads: Option<String>,
    /// The launcher's scratch directory (termination logs, progress and rounds files).
    pub logs: PathBuf,
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
