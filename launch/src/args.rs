//! What a launcher is told (flags and their env twins), and what every attempt or round
//! starts its ranks with.

use std::path::PathBuf;

use ferrotrain_api::{env, exit};

use crate::program::{RankProgram, Trainer, UserCommand};
use crate::report::GangReport;

/// MASTER_PORT when none is given: torchrun's.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The gang's flags, whatever the ranks run.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
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
    #[arg(long, env = env::MASTER_PORT, default_value_t = DEFAULT_MASTER_PORT)]
    pub master_port: u16,
    /// How many times the ranks are restarted in a new round after a retryable failure (on
    /// several nodes with --restart-in-place; the operator hands its pods what is left of
    /// restartPolicy.maxRestarts). A pod taken away spends none.
    #[arg(
        long,
        env = env::FERROTRAIN_MAX_RESTARTS,
        default_value_t = ferrotrain_api::DEFAULT_MAX_RESTARTS
    )]
    pub max_restarts: u32,
    /// Wait before a restart after the second failure in a row (the first restarts at once),
    /// doubling with each more; the count starts again after a round that trained a step the
    /// next one kept.
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
    /// launcher then hosts the rendezvous store (docs/in-place-restarts.md).
    /// One node always does.
    #[arg(long, env = env::FERROTRAIN_RESTART_IN_PLACE, default_value_t = false)]
    pub restart_in_place: bool,
    /// Start a spare trainer per local rank a few seconds into each round, which loads
    /// libtorch and waits; the next round's ranks are those spares, so a restart skips
    /// libtorch's start-up (about 0.4 s of CPU a process). Costs about 120 MB of memory a
    /// spare. Only for this executable's own ranks (not --rank-program) and for a Python
    /// command (`ferrotrain-launch python train.py`: a spare has torch imported); not on
    /// several nodes without --restart-in-place (the operator restarts that gang).
    #[arg(
        long,
        env = env::FERROTRAIN_SPARE_RANKS,
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub spare_ranks: bool,
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
    /// In-place restarts: a node whose agent sends node 0 no heartbeat for this long is
    /// lost (a partition, a frozen node): node 0 ends the round without it, and a node whose
    /// heartbeats do not reach node 0 for this long stops its own ranks.
    #[arg(
        long,
        env = env::FERROTRAIN_HEARTBEAT_TIMEOUT_SECONDS,
        default_value_t = 10.0
    )]
    pub heartbeat_timeout_seconds: f64,
    /// In-place restarts: how long every node's launcher waits for the others to join a round.
    #[arg(
        long,
        env = env::FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS,
        default_value_t = 600.0
    )]
    pub rendezvous_timeout_seconds: f64,
    /// Node 0: the round to start at, at least (the operator sets the gang's round on a pod
    /// that replaces node 0's; the other nodes say where they left off too).
    #[arg(long, env = env::FERROTRAIN_FIRST_ROUND, default_value_t = 0)]
    pub first_round: u64,
}

/// `ferrotrain launch`: every rank is ferrotrain's trainer.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainerLaunchArgs {
    /// The trainer config (YAML) every rank runs.
    #[arg(long, env = env::FERROTRAIN_CONFIG)]
    pub config: PathBuf,
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// The program each rank runs (default: this executable). For tests and wrappers.
    #[arg(long, env = env::FERROTRAIN_RANK_PROGRAM, hide = true)]
    pub rank_program: Option<PathBuf>,
    /// Extra arguments passed to every rank after `run --config <path>`.
    #[arg(last = true)]
    pub rank_args: Vec<String>,
}

impl TrainerLaunchArgs {
    /// The ranks' program: --rank-program, else this executable.
    pub fn program(&self) -> std::io::Result<RankProgram> {
        let program = match &self.rank_program {
            Some(p) => p.clone(),
            None => std::env::current_exe()?,
        };
        Ok(RankProgram::Trainer(Trainer {
            program,
            config: self.config.clone(),
            args: self.rank_args.clone(),
            own_binary: self.rank_program.is_none(),
        }))
    }
}

/// `ferrotrain-launch`: every rank is your command, with torchrun's environment.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "ferrotrain-launch",
    version,
    about = "Runs your command (a PyTorch script written for torchrun) as the local ranks of a \
             ferrotrain gang: torchrun's environment, in-place restarts from warm spares, the \
             gang's /progress and /metrics. No libtorch of its own"
)]
pub struct CommandLaunchArgs {
    #[command(flatten)]
    pub launch: LaunchArgs,
    /// Python modules a spare rank imports while it waits, besides torch (comma-separated;
    /// spec.pytorch.preImport).
    #[arg(long, env = env::FERROTRAIN_PRE_IMPORT, value_delimiter = ',')]
    pub pre_import: Vec<String>,
    /// The command every rank runs, with its arguments (`python train.py --epochs 3`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl CommandLaunchArgs {
    /// The ranks' program.
    pub fn program(&self) -> RankProgram {
        RankProgram::Command(UserCommand {
            argv: self.command.clone(),
            pre_import: self.pre_import.clone(),
        })
    }
}

/// What every attempt or round of this launcher starts its ranks with.
pub struct Launch {
    /// What each rank runs.
    pub program: RankProgram,
    /// The rendezvous token.
    pub token: String,
    /// FERROTRAIN_ATTEMPT as given (the operator's attempt).
    pub base_attempt: u64,
    /// OMP_NUM_THREADS for each rank, unless the environment sets it.
    pub omp_threads: Option<String>,
    /// The launcher's scratch directory (termination logs, rank 0's progress file).
    pub logs: PathBuf,
    /// What node 0's launcher reports of the gang (report.rs).
    pub report: GangReport,
}

/// After a successful run, global rank 0's termination message is its final progress report
/// (on node 0 only; a command's, its last progress report): with the rounds' ends and the refused connections only the launcher
/// knows, it becomes the launcher's, which is the container's.
pub fn forward_final_report(l: &Launch) {
    let log = crate::files::RankFiles::of(&l.logs, 0).termination_log;
    let message = std::fs::read_to_string(log).unwrap_or_default();
    let report = ferrotrain_api::Progress::from_termination_message(&message).or_else(|| {
        // A command's rank 0 leaves no final report: its last progress report is, finished.
        let last = l.report.now();
        (l.program.is_command() && last.step > 0).then_some(ferrotrain_api::Progress {
            phase: ferrotrain_api::TrainerPhase::Finished,
            eta_seconds: Some(0.0),
            ..last
        })
    });
    if let Some(report) = report {
        let report = l.report.completed(report);
        crate::termination::write_termination_message(&report.to_termination_message());
    }
}
