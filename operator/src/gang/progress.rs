//! Rank 0's progress: its report copied into the status when a user-visible value changes,
//! condition ProgressAvailable, and stall detection.

use ferrotrain_api::crd::{TrainingProgress, condition};
use ferrotrain_api::reason;
use ferrotrain_api::{Progress, TrainerPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::draft::{Draft, first_line, signed};
use super::failure::{Failure, job_failure};
use super::observed::PodView;
use crate::report;

/// Writes `report` into status.progress when a value a user sees changed (the rounds it says
/// ended are counted first, by `in_place.rs`).
fn store_report(d: &mut Draft<'_, '_>, report: &Progress) {
    refused_connections(d, report);
    checkpoint_saves(d, report);
    let now = d.now();
    let rounded = report::rounded(report);
    let changed = d
        .status
        .progress
        .as_ref()
        .is_none_or(|p| report::changed_for_a_user(&p.report, &rounded));
    if changed {
        let eta = report::eta_seconds(&rounded);
        d.status.progress = Some(TrainingProgress {
            eta: eta.map(report::human_duration),
            estimated_completion_time: eta
                .map(|s| Time(now + SignedDuration::from_secs(s.round() as i64))),
            updated_at: Some(Time(now)),
            report: rounded,
        });
        // With the status written anyway: the ledger's clock moves with the progress.
        if let Some(r) = d.status.recovery.as_mut() {
            r.report(report.step_report(), now);
        }
        if d.status.is_true(condition::STALLED) {
            d.set_condition(
                condition::STALLED,
                false,
                reason::PROGRESS_RESUMED,
                String::new(),
            );
        }
    }
}

/// A Warning event each time the connections the gang refused pass 10, 100, 1000, ...:
/// something that is not this job's ranks is connecting to them (docs/security.md).
fn refused_connections(d: &mut Draft<'_, '_>, report: &Progress) {
    let total = |p: &Progress| p.rejected_connections.values().sum::<u64>();
    let before = d.status.progress.as_ref().map_or(0, |p| total(&p.report));
    let now = total(report);
    let threshold = |n: u64| if n < 10 { 0 } else { n.ilog10() };
    if threshold(now) <= threshold(before) {
        return;
    }
    let by_reason: Vec<String> = report
        .rejected_connections
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    d.event(
        true,
        reason::REJECTED_CONNECTIONS,
        format!(
            "{now} connections to the gang's rendezvous store or ring were refused ({}): \
             something other than this job's ranks connects to them (docs/security.md)",
            by_reason.join(", ")
        ),
    );
}

/// CheckpointsSaved False (a Warning event when it turns so) while rank 0's saves fail, with
/// the disk's words, how many and since when; True again (a Normal event) once one completes.
/// Absent while every save completed: a job's status stays as small as it was.
fn checkpoint_saves(d: &mut Draft<'_, '_>, report: &Progress) {
    let failing = d
        .status
        .condition(condition::CHECKPOINTS_SAVED)
        .is_some_and(|c| c.status == "False");
    let Some(e) = &report.checkpoint_error else {
        if failing {
            let step = report.last_checkpoint.as_ref().map_or(0, |c| c.step);
            let message = format!("the checkpoint of step {step} was saved: saves complete again");
            d.event(false, reason::CHECKPOINT_SAVED, message.clone());
            d.set_condition(
                condition::CHECKPOINTS_SAVED,
                true,
                reason::CHECKPOINT_SAVED,
                message,
            );
        }
        return;
    };
    let newest = report
        .last_checkpoint
        .as_ref()
        .map_or_else(|| "none".to_string(), |c| format!("step {}", c.step));
    let message = format!(
        "{} save(s) failed since {} (the last of step {}): {}; training goes on, the newest \
         checkpoint is {newest}, and the next due save tries again",
        e.failed_saves,
        e.since,
        e.step,
        first_line(&e.message)
    );
    if !failing {
        d.event(true, reason::CHECKPOINT_SAVE_FAILED, message.clone());
    }
    let c = condition::CHECKPOINTS_SAVED;
    d.set_condition(c, false, reason::CHECKPOINT_SAVE_FAILED, message);
}

/// Rank 0 answered: its report stored, ProgressAvailable True (an event only after False).
pub(super) fn reported(d: &mut Draft<'_, '_>, report: &Progress) {
    store_report(d, report);
    let was = d
        .status
        .condition(condition::PROGRESS_AVAILABLE)
        .map(|c| c.status.clone());
    if was.as_deref() != Some("True") {
        // After a blip (Unknown) nothing is news; after False it is.
        if was.as_deref() == Some("False") {
            d.event(
                false,
                reason::PROGRESS_AVAILABLE,
                "rank 0 serves /progress".into(),
            );
        }
        d.set_condition(
            condition::PROGRESS_AVAILABLE,
            true,
            reason::REPORTED,
            "rank 0 serves /progress".into(),
        );
    }
}

/// A poll failed. Never answered: False once rank 0 ran for the grace (an image without
/// the endpoint). Answered before: Unknown at the first failed poll, False when polls
/// kept failing for the grace, and the rates and ETA go (they are no longer current).
/// Stall detection only runs while it is True, so failing polls never restart a gang.
pub(super) fn unavailable(d: &mut Draft<'_, '_>, why: &str, rank0: Option<&PodView>) {
    let now = d.now();
    let grace = d.o.timing.progress_grace;
    let Some(c) = d.status.condition(condition::PROGRESS_AVAILABLE) else {
        let running_since = rank0.and_then(|p| p.running_since).unwrap_or(now);
        let at = running_since + signed(grace);
        if now < at {
            d.requeue_at(at);
            return;
        }
        let message = format!(
            "rank 0 does not serve /progress ({why}); status.progress stays empty and stall detection is off"
        );
        d.event(false, reason::PROGRESS_UNAVAILABLE, message.clone());
        let c = condition::PROGRESS_AVAILABLE;
        d.set_condition(c, false, reason::NO_PROGRESS_ENDPOINT, message);
        return;
    };
    match c.status.as_str() {
        "True" => {
            let message = format!("polling rank 0's /progress failed: {}", first_line(why));
            d.set_condition_to(
                condition::PROGRESS_AVAILABLE,
                "Unknown",
                reason::POLL_FAILED,
                message,
            );
            d.requeue_in(grace);
        }
        "Unknown" => {
            let at = c.last_transition_time.0 + signed(grace);
            if now < at {
                d.requeue_at(at);
                return;
            }
            let message = format!(
                "rank 0's /progress has not answered for {}s ({}); rates and ETA are cleared and stall detection is paused until it answers",
                grace.as_secs(),
                first_line(why)
            );
            d.event(true, reason::PROGRESS_UNAVAILABLE, message.clone());
            let c = condition::PROGRESS_AVAILABLE;
            d.set_condition(c, false, reason::POLLS_FAILING, message);
            d.end_attempt_progress();
        }
        _ => {}
    }
}

/// No change of the report for stallTimeoutSeconds while ProgressAvailable is True: Stalled,
/// and the failure that restarts the gang.
pub(super) fn stalled(d: &mut Draft<'_, '_>) -> Option<Failure> {
    let timeout = d.o.spec.stall_timeout_seconds;
    if timeout <= 0 || !d.status.is_true(condition::PROGRESS_AVAILABLE) {
        return None;
    }
    // A script of your own that reports no steps: its report changes with the rounds only.
    if d.status
        .progress
        .as_ref()
        .is_some_and(|p| p.report.no_step_reports)
    {
        return None;
    }
    let running_since = d
        .status
        .condition(condition::RUNNING)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    let updated = d
        .status
        .progress
        .as_ref()
        .and_then(|p| p.updated_at.as_ref())
        .map(|t| t.0);
    let since = running_since.into_iter().chain(updated).max()?;
    let at = since + SignedDuration::from_secs(timeout);
    if d.now() < at {
        d.requeue_at(at);
        return None;
    }
    let step = d.status.progress.as_ref().map_or(0, |p| p.report.step);
    let message = format!("no progress for {timeout}s (step {step})");
    d.set_condition(
        condition::STALLED,
        true,
        reason::NO_PROGRESS,
        message.clone(),
    );
    d.event(true, reason::STALLED, message.clone());
    Some(job_failure(d, reason::STALLED, message))
}

/// The last poll is up to an interval old when training ends: rank 0's final report (its
/// termination message) has the final step, eval and checkpoint. Without one (an image that
/// writes none) the last polled numbers stay. Either way the phase is Finished, and rates and
/// ETA, which describe a running attempt, go.
pub(super) fn finished(d: &mut Draft<'_, '_>, last: Option<&Progress>) {
    if let Some(report) = last {
        store_report(d, report);
    }
    if let Some(p) = d.status.progress.as_mut() {
        p.report.phase = TrainerPhase::Finished;
    }
    d.end_attempt_progress();
}

#[cfg(test)]
mod tests;
