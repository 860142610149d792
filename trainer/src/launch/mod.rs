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
//! round: elastic world size), `watch` (threads that end a round), `heartbeat` (a node cut
//! off ends the round within the heartbeat timeout), `blame` (which rank caused
//! a round's end), `ledger` (what each attempt or round cost), `spawn` (a rank's environment
//! and command), `spare` (trainers started ahead of the next round, so that an in-place
//! restart skips libtorch's start-up).

mod agent;
mod args;
pub mod blame;
mod files;
mod group;
mod heartbeat;
mod ledger;
mod local;
mod members;
mod rejoin;
pub mod spare;
mod spawn;
mod watch;

use ferrotrain_api::env;

use crate::dist::auth::random_token;
use crate::signals;
pub use args::{Launch, LaunchArgs, LaunchError};
pub use group::{GroupOutcome, RankFailure};
pub use ledger::recovery_lines;
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
    let token = match crate::dist::auth::token_from(|k| std::env::var(k).ok()) {
        Ok(Some(t)) => t,
        Ok(None) if multi_node => return Err(LaunchError::MissingToken),
        Ok(None) => random_token(),
        Err(e) => return Err(LaunchError::Token(e.to_string())),
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
        own_binary: args.rank_program.is_none(),
    };
    let code = if multi_node && args.restart_in_place {
        agent::run(&args, &launch)
    } else {
        local::supervise_attempts(&args, &launch)
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
