//! `ferrotrain launch` and `ferrotrain-launch`: torchrun's job for ferrotrain. Starts the
//! local ranks, forwards signals, and when one fails stops the others and restarts them in a
//! new round.
//!
//! Each rank is the trainer's executable (`run --config <path>`, `ferrotrain launch`) or the
//! user's command (`ferrotrain-launch python train.py`, this crate's own binary, which a
//! PyTorch image carries: [`program`]) with the env contract set: RANK, LOCAL_RANK,
//! WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FERROTRAIN_ATTEMPT,
//! OMP_NUM_THREADS, the trainer's FERROTRAIN_RDZV_TOKEN, the rest of torchrun's environment
//! for a command ([`torchrun`]). Ranks resume on their own; the
//! launcher only restarts them. A permanent exit code (2, 3, 4) is never restarted. One node,
//! and every node with `--restart-in-place`, is run by the pod's agent ([`agent`]): it
//! restarts the ranks in a new round (with every other node's agent), ruled and decided the
//! same way for any number of nodes. On several nodes without it a failure ends the launcher
//! with the failing rank's code (the operator restarts the gang: [`run_once`]).
//!
//! This crate has no libtorch: the launcher, the rendezvous store and its handshake build and
//! test in seconds, and the trainer (which links libtorch) depends on it for the store, the
//! handshake and the signals.
//!
//! Rooms, from the top: `agent` (carries out the in-place rounds), `round` (what the agent
//! does after each event: pure), `host` (node 0's duties: the store, ruling a round's end),
//! `gather` (node 0 waiting for reports: pure), `blame` (which rank ended a round: pure),
//! `run_once` (one run, no rounds), `group` (spawn, supervise and stop the local ranks),
//! `members` (who trains in a round: elastic world size), `watch` (threads that end a round),
//! `heartbeat` (a node cut off ends the round within the heartbeat timeout), `rejoin` and
//! `link` (node 0's store, and its replacement's), `ledger` (what each attempt or round cost),
//! `spawn` (a rank's environment and command), `output` (every rank's output, labelled and
//! kept per round), `spare` (ranks started ahead of the next round), `program`, `python` and
//! `torchrun` (what a rank runs: the trainer, or a command with torchrun's environment; a
//! Python script through a runner that can wait as a spare), `ports` (the port range),
//! `endpoint` (the pod's /progress and /metrics), `keys` (every store key), `store`, `auth`,
//! `listen` and `refused` (the rendezvous store, its handshake, its port and what it
//! refused), `signals`, `termination`, `error`.

mod agent;
mod args;
pub mod auth;
pub mod blame;
pub mod endpoint;
pub mod error;
mod files;
mod gather;
pub mod group;
mod heartbeat;
mod host;
pub mod keys;
mod ledger;
mod link;
pub mod listen;
pub mod logging;
mod members;
pub mod output;
pub mod ports;
pub mod program;
pub mod python;
pub mod refused;
mod rejoin;
pub mod report;
pub mod round;
mod run_once;
pub mod signals;
pub mod spare;
mod spawn;
pub mod store;
pub mod termination;
pub mod torchrun;
mod watch;

use ferrotrain_api::env;

use crate::auth::random_token;
pub use args::{CommandLaunchArgs, DEFAULT_MASTER_PORT, Launch, LaunchArgs, TrainerLaunchArgs};
pub use error::LaunchError;
pub use group::{GroupOutcome, RankFailure};
pub use ledger::recovery_lines;
pub use program::RankProgram;
pub use report::GangReport;

/// Runs the local ranks to completion; returns the launcher's exit code (0, a rank's failure
/// code, or 128 + a signal), or why the launcher could not run them. Node 0's launcher serves
/// the gang's report on `metrics_port` when one is given (the ranks then serve none).
pub fn run(
    args: LaunchArgs,
    program: RankProgram,
    metrics_port: Option<u16>,
) -> Result<i32, LaunchError> {
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
    let token = match auth::token_from(|k| std::env::var(k).ok())? {
        Some(t) => t,
        None if multi_node => return Err(LaunchError::MissingToken),
        None => random_token(),
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
    let report = match program.is_command() {
        true => GangReport::new(&logs).of_command(),
        false => GangReport::new(&logs),
    };
    let _served = metrics_port
        .filter(|_| args.node_rank == 0)
        .and_then(|port| endpoint::serve_gang(port, report.clone()));
    let launch = Launch {
        program,
        token,
        base_attempt,
        omp_threads,
        logs,
        report,
    };
    let code = if args.restart_in_place || !multi_node {
        agent::run(&args, &launch)
    } else {
        run_once::run_once(&args, &launch)
    };
    let _ = std::fs::remove_dir_all(&launch.logs);
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ferrotrain_api::exit;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }

    fn args(flags: &[&str]) -> LaunchArgs {
        let mut argv = vec!["launch"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).expect("flags parse").launch
    }

    fn program() -> RankProgram {
        RankProgram::Command(program::UserCommand {
            argv: vec!["true".into()],
            pre_import: Vec::new(),
        })
    }

    #[test]
    fn an_impossible_gang_is_a_typed_permanent_error() {
        let err = run(
            args(&["--nnodes", "2", "--node-rank", "2"]),
            program(),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(err, LaunchError::InvalidGang { node_rank: 2, .. }),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::INVALID_CONFIG);
        let err = run(
            args(&["--nnodes", "2", "--node-rank", "0", "--master-port", "0"]),
            program(),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(err, LaunchError::EphemeralPortNeedsOneNode),
            "{err}"
        );
        assert_eq!(err.exit_code(), exit::INVALID_CONFIG);
    }
}
