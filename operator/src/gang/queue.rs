//! Scheduling and queues: condition GangScheduling (how the pods are placed all-or-nothing,
//! or why they are not), phase Queued while scheduling gates hold the attempt's pods (a queue
//! such as Kueue has not admitted it yet), and condition Queued, whose turn to False marks the
//! admission (the start-up timeout counts from there: `census.rs`).

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;

use super::draft::Draft;
use super::observed::{PodState, PodView, WaitCause};
use crate::scheduling;

/// GangScheduling says how the pods are scheduled; a change is an event, a Warning when the
/// gang is not enforced because the native API is not served (once, not per attempt).
pub(super) fn gang_condition(d: &mut Draft<'_, '_>) {
    let replicas = d.o.spec.pod_count();
    let min = d.o.spec.min_replicas();
    // Off by the job's or the operator's choice: nothing to tell.
    let Some((on, why, message)) = scheduling::condition(d.o.gang, replicas, min) else {
        return;
    };
    let known = d
        .status
        .condition(condition::GANG_SCHEDULING)
        .is_some_and(|c| c.reason == why && c.message == message);
    if known {
        return;
    }
    if why == reason::NATIVE_API_NOT_SERVED {
        // A warning when the job asked for it; the default falling back is news, not trouble.
        let asked = matches!(d.o.gang, scheduling::GangMode::NotServed { asked: true });
        d.event(asked, why, message.clone());
    }
    d.set_condition(condition::GANG_SCHEDULING, on, why, message);
}

/// Some of the attempt's pods are held by scheduling gates: phase Queued, condition Queued
/// True and Running False with the gates' names, a Normal event once per attempt. True when
/// so.
pub(super) fn queued(d: &mut Draft<'_, '_>, waiting: &[&PodView]) -> bool {
    let held: Vec<&PodView> = waiting
        .iter()
        .copied()
        .filter(|p| held_by_queue(p))
        .collect();
    let Some(first) = held.first() else {
        admitted(d);
        return false;
    };
    d.status.phase = Phase::Queued;
    let attempt = d.status.attempt;
    let gates = first
        .waiting
        .as_ref()
        .map(|w| w.message.clone())
        .unwrap_or_default();
    let queue = match d.o.gang {
        scheduling::GangMode::Kueue { queue } => format!(" (LocalQueue {queue})"),
        _ => String::new(),
    };
    let message = format!(
        "attempt {attempt}: {} of {} pods wait to be admitted{queue}: {gates}",
        held.len(),
        d.o.spec.pod_count()
    );
    let known = d
        .status
        .condition(condition::RUNNING)
        .is_some_and(|c| c.status == "False" && c.reason == reason::QUEUED);
    if !known {
        d.event(false, reason::QUEUED, message.clone());
    }
    d.set_condition(condition::QUEUED, true, reason::QUEUED, message.clone());
    d.set_condition(condition::RUNNING, false, reason::QUEUED, message);
    true
}

/// A job whose pods ran says it was admitted, even when it went from Queued to Succeeded
/// between two looks; not while a pod of the attempt is held, nor when its pods never ran (a
/// queue timeout fails a job whose pods go away still gated).
pub(super) fn admission_seen(d: &mut Draft<'_, '_>) {
    let ran = d.current_pods().any(|p| {
        p.running_since.is_some()
            || match &p.state {
                PodState::Succeeded => true,
                PodState::Failed(t) => t.exit_code.is_some(),
                _ => false,
            }
    });
    if ran && !d.current_pods().any(held_by_queue) {
        admitted(d);
    }
}

/// Queued turns False once no pod of the attempt is held any more: the queue admitted it.
fn admitted(d: &mut Draft<'_, '_>) {
    if d.status.is_true(condition::QUEUED) {
        let attempt = d.status.attempt;
        d.set_condition(
            condition::QUEUED,
            false,
            reason::ADMITTED,
            format!("attempt {attempt} was admitted: its pods are scheduled and started"),
        );
    }
}

/// A pod held by scheduling gates (a queue has not admitted it).
fn held_by_queue(p: &PodView) -> bool {
    p.waiting
        .as_ref()
        .is_some_and(|w| w.cause == WaitCause::Queued)
}

#[cfg(test)]
mod tests;
