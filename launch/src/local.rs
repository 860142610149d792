//! Supervision without in-place restarts: one node restarts its group (a new attempt each
//! time, with backoff) from the freshest state its ranks left, else the latest checkpoint; on
//! several nodes a failure ends the launcher with the failing rank's code and the operator
//! restarts the gang.

use std::time::{Duration, Instant};

use ferrotrain_api::exit;

use crate::args::{Launch, LaunchArgs, forward_final_report};
use crate::error::LaunchError;
use crate::group::{GroupOutcome, start_group_with};
use crate::ledger::Ledger;
use crate::signals;
use crate::spare::{SpareStart, Spares};
use crate::spawn::Spawn;
use crate::termination::write_termination_message;

pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

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

/// Why the launcher itself could not run the group. The ranks' own failures are not
/// errors of the launcher: `run` returns their exit code.
pub fn supervise_attempts(args: &LaunchArgs, l: &Launch) -> Result<i32, LaunchError> {
    let (program, token, base_attempt, logs) = (&l.program, &l.token, l.base_attempt, &l.logs);
    let multi_node = args.nnodes > 1;
    let mut ledger = Ledger::new(logs, args.recovery_file.iter().cloned().collect());
    let mut restarts: u32 = 0;
    let mut spares: Option<Spares> = None;
    loop {
        let attempt = base_attempt + if multi_node { 0 } else { restarts as u64 };
        let port = if args.master_port == 0 {
            free_port().map_err(LaunchError::io("no free port"))?
        } else {
            args.master_port
        };
        let a = Spawn {
            args,
            program,
            attempt,
            port,
            token,
            logs,
            omp_threads: l.omp_threads.clone(),
            round: None,
            place: None,
        };
        tracing::info!(
            "launch: starting {} rank(s), attempt {attempt}, rendezvous {}:{port}",
            args.nproc_per_node,
            args.master_addr
        );
        // Before the ranks exist: the last attempt's progress file must be gone before the
        // new rank 0 can write its own.
        ledger.started(attempt, None);
        // A single node restarts here: its next attempt's ranks can be spares.
        let want_spares = args.spare_ranks && l.own_binary && !multi_node;
        let outcome = run_attempt(&a, &mut spares, want_spares)?;
        ledger.ended(&outcome);
        match outcome {
            GroupOutcome::Finished => {
                forward_final_report(logs);
                return Ok(exit::SUCCESS);
            }
            GroupOutcome::Signalled(s) => return Ok(128 + s),
            GroupOutcome::PeerFailed { .. } | GroupOutcome::Frozen { .. } => {
                unreachable!("run_attempt supervises without peers or a frozen limit")
            }
            GroupOutcome::Failed(f) => {
                tracing::warn!("launch: {}", f.reason);
                write_termination_message(&f.reason);
                if args.permanent_exit_codes.contains(&f.code) {
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
                // Doubled for each failure in a row since an attempt that kept progress.
                let in_a_row = ledger.recovery.failures_in_a_row(true).unwrap_or(restarts);
                let backoff = args.restart_wait(in_a_row);
                tracing::warn!(
                    "launch: restarting the group in {:.1} s (restart {restarts} of \
                     {}); ranks resume from the state a surviving rank left, else the latest \
                     checkpoint",
                    backoff.as_secs_f64(),
                    args.max_restarts
                );
                if let Some(s) = sleep_unless_signalled(backoff) {
                    return Ok(128 + s);
                }
            }
        }
    }
}

/// Runs attempt `a`'s group to its end. Its ranks are `spares` where there are some (taken);
/// with `want_spares`, the next attempt's spares start a few seconds in and are left in
/// `spares` when this attempt fails (launch/spare.rs).
fn run_attempt(
    a: &Spawn<'_>,
    spares: &mut Option<Spares>,
    want_spares: bool,
) -> Result<GroupOutcome, LaunchError> {
    let mut group = start_group_with(a, spares.take()).map_err(LaunchError::io(format!(
        "cannot start {}",
        a.program.display()
    )))?;
    if group.from_spares > 0 {
        tracing::info!(
            "launch: attempt {}: started {} rank(s), {} of them spares",
            a.attempt,
            a.args.nproc_per_node,
            group.from_spares
        );
    }
    // The next attempt's likely environment: the spares are handed the real one.
    let next = Spawn {
        attempt: a.attempt + 1,
        omp_threads: a.omp_threads.clone(),
        ..*a
    };
    let mut start = SpareStart::new(want_spares);
    let outcome = group.supervise_with(&|| None, None, &mut || start.when_due(&next));
    drop(group);
    if matches!(outcome, GroupOutcome::Failed(_)) {
        *spares = start.started;
    }
    Ok(outcome)
}
