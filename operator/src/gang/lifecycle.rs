//! The phases of a job: Pending after a suspend or a fixed spec, Suspended, Restarting with
//! its backoff, and the end (Succeeded, Failed, the deadline, ttlSecondsAfterFinished).

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingSpec, Phase, condition};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{AttemptEnd, EndCause, restart_wait};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::decision::Action;
use super::draft::{Draft, signed};
use super::failure::{Failure, ended_by, job_failure};

/// Restart backoff after `in_a_row` failures in a row: backoff * 2^(in_a_row-1), capped.
pub fn backoff(spec: &DistributedTrainingSpec, in_a_row: i32) -> Duration {
    let p = &spec.restart_policy;
    let s = |secs: i64| Duration::from_secs(secs.max(0) as u64);
    restart_wait(
        s(p.backoff_seconds),
        s(p.max_backoff_seconds),
        in_a_row.max(1) as u32,
    )
}

/// Succeeded or Failed: the attempt's pods that still run are deleted (terminated ones
/// stay for their logs), and past ttlSecondsAfterFinished the job itself.
pub(super) fn finished(d: &mut Draft<'_, '_>) {
    d.stop_current_pods();
    if let (Some(ttl), Some(done)) = (
        d.o.spec.ttl_seconds_after_finished,
        d.status.completion_time.as_ref(),
    ) {
        let at = done.0 + SignedDuration::from_secs(ttl.max(0));
        if d.now() >= at {
            d.actions.push(Action::DeleteJob);
        } else {
            d.requeue_at(at);
        }
    }
}

/// Failed for an invalid spec, and the spec changed since: a job that never got to run
/// deserves its fixed spec a try (any other failure is final, as a Job's is).
pub(super) fn invalid_spec_changed(d: &Draft<'_, '_>) -> bool {
    d.o.status.condition(condition::FAILED).is_some_and(|c| {
        c.status == "True"
            && c.reason == reason::INVALID_SPEC
            && c.observed_generation != d.o.generation
    })
}

/// Back to Pending after an invalid spec was changed; a new attempt if pods of the
/// failed one still exist (they were made from the old spec).
pub(super) fn reopen(d: &mut Draft<'_, '_>) {
    if d.current_pods().next().is_some() {
        d.status.attempt += 1;
    }
    d.status.phase = Phase::Pending;
    d.status.completion_time = None;
    let generation = d.o.generation.unwrap_or_default();
    d.set_condition(
        condition::FAILED,
        false,
        reason::SPEC_CHANGED,
        format!("generation {generation} of the spec is tried"),
    );
}

/// spec.suspend: the attempt ends (in the ledger, not as a failure), phase Suspended, and
/// its pods are deleted; once, then quietly.
pub(super) fn suspend(d: &mut Draft<'_, '_>) {
    d.end_attempt_progress();
    if d.status.phase != Phase::Suspended {
        let from = d.status.phase;
        let failure = job_failure(d, reason::SUSPENDED, String::new());
        record_end(d, EndCause::Stopped, &failure);
        d.status.phase = Phase::Suspended;
        d.set_condition(
            condition::SUSPENDED,
            true,
            reason::SUSPENDED,
            "spec.suspend is true".into(),
        );
        d.clear_running(reason::SUSPENDED);
        d.set_condition(
            condition::RESTARTING,
            false,
            reason::SUSPENDED,
            String::new(),
        );
        d.event(
            false,
            reason::SUSPENDED,
            format!(
                "suspended in phase {from}: pods of attempt {} are deleted",
                d.status.attempt
            ),
        );
    }
    d.stop_current_pods();
}

/// spec.suspend is false again: Pending, a new attempt if one was launched before, and the
/// deadline's clock restarts.
pub(super) fn resume(d: &mut Draft<'_, '_>) {
    let launched_before = d.status.condition(condition::CREATED).is_some();
    if launched_before {
        d.status.attempt += 1;
    }
    d.status.phase = Phase::Pending;
    d.status.start_time = Some(Time(d.now()));
    d.set_condition(
        condition::SUSPENDED,
        false,
        reason::RESUMED,
        "spec.suspend is false".into(),
    );
    d.event(
        false,
        reason::RESUMED,
        format!(
            "resumed: attempt {} starts from the latest checkpoint",
            d.status.attempt
        ),
    );
}

/// activeDeadlineSeconds since startTime: true (and the job Failed) once it passed, else
/// a requeue at it.
pub(super) fn deadline_passed(d: &mut Draft<'_, '_>) -> bool {
    let (Some(deadline), Some(start)) = (
        d.o.spec.active_deadline_seconds,
        d.status.start_time.as_ref(),
    ) else {
        return false;
    };
    let at = start.0 + SignedDuration::from_secs(deadline.max(0));
    if d.now() < at {
        d.requeue_at(at);
        return false;
    }
    let message = format!("activeDeadlineSeconds {deadline} passed");
    let failure = job_failure(d, reason::DEADLINE_EXCEEDED, message);
    fail(d, failure, reason::DEADLINE_EXCEEDED, reason::FAILED);
    true
}

/// In Restarting: true (and the phase moved to Pending of the next attempt) when the
/// backoff is over.
pub(super) fn backoff_over(d: &mut Draft<'_, '_>) -> bool {
    let since = d
        .status
        .condition(condition::RESTARTING)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
        .unwrap_or(d.now());
    let at = since + signed(restart_backoff(d));
    if d.now() < at {
        d.requeue_at(at);
        return false;
    }
    d.stop_current_pods();
    d.status.attempt += 1;
    d.status.phase = Phase::Pending;
    d.set_condition(
        condition::RESTARTING,
        false,
        reason::RELAUNCHED,
        format!("attempt {} launched", d.status.attempt),
    );
    true
}

/// The wait before the next attempt: the backoff doubled for each failure in a row (since
/// the last attempt or round that saved a checkpoint: a job that trained well before it
/// failed waits only the initial backoff; without a ledger, every restart counts), the
/// initial one after a disruption (nothing went wrong that waiting longer would help).
fn restart_backoff(d: &Draft<'_, '_>) -> Duration {
    let disrupted = d
        .status
        .last_failure
        .as_ref()
        .is_some_and(|f| f.attempt == d.status.attempt && f.reason == reason::DISRUPTED);
    let in_a_row = d
        .status
        .recovery
        .as_ref()
        // A gang restart's new pods start from a checkpoint: only what a checkpoint kept
        // counts (an in-place round's record counts its steps: the next round kept them).
        .and_then(|r| r.failures_in_a_row(false))
        .map_or(d.status.restarts, |n| n as i32);
    backoff(d.o.spec, if disrupted { 1 } else { in_a_row })
}

/// The attempt is over: a permanent failure fails the job, anything else restarts it.
pub(super) fn end_attempt(d: &mut Draft<'_, '_>, failure: Failure) {
    if failure.permanent {
        d.event(true, reason::RANK_FAILED, failure.describe());
        let reason = match failure.info.reason.as_str() {
            reason::PERMANENT_EXIT_CODE => reason::PERMANENT_FAILURE.to_string(),
            other => other.to_string(),
        };
        fail(d, failure, &reason, reason::FAILED);
    } else {
        restart_or_fail(d, failure);
    }
}

/// Training finished: `succeeded` pods exited 0 (elastic: node 0's and the others that had
/// already ended; any still waiting for a place are stopped). Phase Succeeded, the ledger's
/// last attempt closed (rank 0's final report is in the status already).
pub(super) fn succeed(d: &mut Draft<'_, '_>, succeeded: i32) {
    let (replicas, attempt) = (d.o.spec.pod_count(), d.status.attempt);
    let pods = if succeeded >= replicas {
        format!("all {replicas} pods")
    } else {
        format!("{succeeded} of {replicas} pods (node 0's among them; the others stopped)")
    };
    let now = d.now();
    if let Some(r) = d.status.recovery.as_mut() {
        r.end(AttemptEnd {
            cause: EndCause::Succeeded,
            reason: reason::SUCCEEDED.into(),
            rank: None,
            node_rank: None,
            exit_code: Some(0),
            node: None,
            failed_at: now,
            detected_at: now,
        });
    }
    d.status.phase = Phase::Succeeded;
    d.status.completion_time = Some(Time(d.now()));
    d.clear_running(reason::SUCCEEDED);
    let step = d
        .status
        .progress
        .as_ref()
        .map(|p| format!(" at step {}", p.report.step))
        .unwrap_or_default();
    d.set_condition(
        condition::SUCCEEDED,
        true,
        reason::ALL_RANKS_SUCCEEDED,
        format!("{pods} of attempt {attempt} exited 0{step}"),
    );
    d.event(
        false,
        reason::SUCCEEDED,
        format!("training finished: {pods} exited 0{step}"),
    );
    finished(d);
}

/// A gang restart, counted against maxRestarts unless a disruption caused it.
pub(super) fn restart_or_fail(d: &mut Draft<'_, '_>, failure: Failure) {
    let max = d.budget().max;
    let describe = failure.describe();
    d.event(
        true,
        if failure.disruption {
            reason::DISRUPTED
        } else {
            reason::RANK_FAILED
        },
        describe.clone(),
    );
    if !failure.disruption && !d.budget().allows_another() {
        let mut failure = failure;
        failure.info.message = format!("maxRestarts {max} reached; last failure: {describe}");
        fail(d, failure, reason::MAX_RESTARTS_REACHED, reason::FAILED);
        return;
    }
    if !failure.disruption {
        d.status.restarts += 1;
    }
    let cause = failure.info.reason.clone();
    *d.status.restarts_by_cause.entry(cause.clone()).or_default() += 1;
    let ended = if failure.disruption {
        EndCause::Disruption
    } else {
        ended_by(&cause)
    };
    record_end(d, ended, &failure);
    d.status.phase = Phase::Restarting;
    d.set_condition(condition::RESTARTING, true, &cause, describe);
    d.clear_running(&cause);
    d.end_attempt_progress();
    d.status.last_failure = Some(failure.info);
    d.stop_current_pods();
    let wait = restart_backoff(d);
    let next = d.status.attempt + 1;
    let note = if failure.disruption {
        format!(
            "gang restart after a disruption (not counted against maxRestarts {max}): attempt {next} starts in {}s from the latest checkpoint",
            wait.as_secs()
        )
    } else {
        format!(
            "gang restart {}/{max}: attempt {next} starts in {}s from the latest checkpoint",
            d.status.restarts,
            wait.as_secs()
        )
    };
    d.event(true, reason::RESTARTING, note);
    d.requeue_in(wait);
}

/// Phase Failed with `reason` (the Failed condition's) and a Warning event `event`.
pub(super) fn fail(d: &mut Draft<'_, '_>, failure: Failure, reason: &str, event: &'static str) {
    // Whatever the attempt was waiting for, nothing is now (finished() sets the ttl's).
    d.requeue = None;
    let message = failure.describe();
    record_end(d, ended_by(&failure.info.reason), &failure);
    d.status.phase = Phase::Failed;
    d.status.completion_time = Some(Time(d.now()));
    d.clear_running(reason);
    if d.status.is_true(condition::RESTARTING) {
        d.set_condition(condition::RESTARTING, false, reason, String::new());
    }
    d.set_condition(condition::FAILED, true, reason, message.clone());
    d.end_attempt_progress();
    d.status.last_failure = Some(failure.info);
    d.event(true, event, message);
    finished(d);
}

/// Closes the current attempt's record (if one is open) with `failure`.
fn record_end(d: &mut Draft<'_, '_>, cause: EndCause, failure: &Failure) {
    let now = d.now();
    let Some(r) = d.status.recovery.as_mut() else {
        return;
    };
    let i = &failure.info;
    r.end(AttemptEnd {
        cause,
        reason: i.reason.clone(),
        rank: i.rank.map(i64::from),
        node_rank: i.node_rank.map(i64::from),
        exit_code: i.exit_code,
        node: i.node.clone(),
        // A pod that vanished went at the latest when it was missed.
        failed_at: failure.at.filter(|at| *at <= now).unwrap_or(now),
        detected_at: now,
    });
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
