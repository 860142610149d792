//! What phase and condition Running say while an attempt's pods start and once they run.

use std::time::Duration;

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;

use super::draft::{Draft, first_line};
use super::observed::{PodView, WaitCause, Waiting};

/// Every pod of the attempt runs or has finished (or, elastic, enough of them, `present`,
/// train without the others): phase Running, Running=True, a Normal event, and the ledger's
/// clock of the attempt (once); afterwards only the condition's message follows `present`.
pub(super) fn all_running(d: &mut Draft<'_, '_>, present: i32) {
    let (replicas, attempt) = (d.o.spec.pod_count(), d.status.attempt);
    // Elastic: the gang trains while some pods are away; the message follows them.
    let (pods, away) = if present >= replicas {
        (format!("all {replicas} pods"), "")
    } else {
        (
            format!("{present} of {replicas} pods"),
            "; the gang trains without the others (see Resized)",
        )
    };
    let message = format!("{pods} of attempt {attempt} run{away}");
    if d.status.phase == Phase::Running {
        let stale = d
            .status
            .condition(condition::RUNNING)
            .is_none_or(|c| c.message != message);
        if stale {
            d.set_condition(condition::RUNNING, true, reason::ALL_RANKS_RUNNING, message);
        }
        return;
    }
    let now = d.now();
    d.recovery().running(now);
    d.status.phase = Phase::Running;
    d.set_condition(condition::RUNNING, true, reason::ALL_RANKS_RUNNING, message);
    d.event(
        false,
        reason::RUNNING,
        format!("attempt {attempt}: {pods} run"),
    );
}

/// Some pods do not run yet: the phase is Starting (a queue may make it Queued next), and
/// the attempt is looked at again within 30 s.
pub(super) fn starting(d: &mut Draft<'_, '_>) {
    d.status.phase = Phase::Starting;
    d.requeue_in(Duration::from_secs(30));
}

/// Of the pods that do not run yet (none held by a queue), one that says why it waits
/// (Unschedulable, ErrImagePull, ...) is named in the Running condition, and a Warning event
/// carries its reason once per attempt and reason (each attempt's launch resets the condition
/// to PodsStarting).
pub(super) fn waiting(d: &mut Draft<'_, '_>, waiting: &[&PodView]) {
    let mut problems: Vec<(&PodView, &Waiting)> = waiting
        .iter()
        .filter_map(|p| p.waiting.as_ref().map(|w| (*p, w)))
        .filter(|(_, w)| w.cause.is_problem())
        .collect();
    problems.sort_by_key(|(p, w)| (w.cause, p.node_rank));
    let Some(&(pod, w)) = problems.first() else {
        let shows_problem = d.status.condition(condition::RUNNING).is_some_and(|c| {
            c.status == "False" && WaitCause::ALL.iter().any(|w| w.reason() == c.reason)
        });
        if shows_problem {
            pods_starting(d);
        }
        return;
    };
    let reason = w.cause.reason();
    let mut message = format!(
        "pod {} (rank {}) waits: {}",
        pod.name, pod.node_rank, w.reason
    );
    if !w.message.is_empty() {
        message = format!("{message}: {}", first_line(&w.message));
    }
    match problems.len() - 1 {
        0 => {}
        1 => message.push_str(" (and 1 more pod waits)"),
        n => message.push_str(&format!(" (and {n} more pods wait)")),
    }
    let known = d
        .status
        .condition(condition::RUNNING)
        .is_some_and(|c| c.status == "False" && c.reason == reason);
    if !known {
        d.event(true, reason, message.clone());
    }
    d.set_condition(condition::RUNNING, false, reason, message);
}

/// Running=False/PodsStarting: the attempt's pods are on their way, nothing is wrong.
pub(super) fn pods_starting(d: &mut Draft<'_, '_>) {
    let (replicas, attempt) = (d.o.spec.pod_count(), d.status.attempt);
    d.set_condition(
        condition::RUNNING,
        false,
        reason::PODS_STARTING,
        format!("attempt {attempt}: waiting for its {replicas} pods to run"),
    );
}

#[cfg(test)]
mod tests;
