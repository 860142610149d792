//! A launcher without rounds: one of several nodes whose gang the operator restarts as a whole
//! (restartPolicy.inPlace false, or a custom command). It runs its ranks once and exits with
//! the failing rank's code; a single node, and every node in place, is an agent (agent.rs).

use std::time::{Duration, Instant};

use ferrotrain_api::exit;

use crate::args::{Launch, LaunchArgs, forward_final_report};
use crate::error::LaunchError;
use crate::group::{GroupOutcome, start_group_with};
use crate::ledger::Ledger;
use crate::signals;
use crate::spawn::Spawn;
use crate::termination::write_termination_message;

/// Sleeps `d` unless a signal arrives; returns the signal.
pub fn sleep_unless_signalled(d: Duration) -> Option<i32> {
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

/// Runs this node's ranks of the operator's attempt once. Returns the launcher's exit code:
/// 0, the failing rank's code (the operator restarts the gang, or fails it on a permanent
/// code), or 128 + the signal that stopped it. The ranks' own failures are not errors of the
/// launcher; an error is why it could not run them.
pub fn run_once(args: &LaunchArgs, l: &Launch) -> Result<i32, LaunchError> {
    let mut ledger = Ledger::new(&l.logs, args.recovery_file.iter().cloned().collect());
    let a = Spawn {
        master_addr: args.master_addr.clone(),
        args,
        program: &l.program,
        attempt: l.base_attempt,
        port: args.master_port,
        token: &l.token,
        logs: &l.logs,
        omp_threads: l.omp_threads.clone(),
        round: None,
        place: None,
    };
    tracing::info!(
        "launch: starting {} rank(s) of node {} of {}, attempt {}, rendezvous {}:{}",
        args.nproc_per_node,
        args.node_rank,
        args.nnodes,
        l.base_attempt,
        args.master_addr,
        args.master_port
    );
    ledger.started(l.base_attempt, None);
    let mut group = start_group_with(&a, None).map_err(LaunchError::io(format!(
        "cannot start {}",
        l.program.describe()
    )))?;
    let outcome = group.supervise_with(&|| None, None, &mut || {});
    drop(group);
    ledger.ended(&outcome);
    Ok(match outcome {
        GroupOutcome::Finished => {
            forward_final_report(l);
            exit::SUCCESS
        }
        GroupOutcome::Signalled(s) => 128 + s,
        GroupOutcome::Failed(f) => {
            tracing::warn!("launch: {}; the operator restarts the gang", f.reason);
            write_termination_message(&f.reason);
            f.code
        }
        GroupOutcome::PeerFailed { .. } | GroupOutcome::Frozen { .. } => {
            unreachable!("supervised without peers or a frozen limit")
        }
    })
}
