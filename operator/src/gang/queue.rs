//! Scheduling and queues: condition GangScheduling (how the pods are placed all-or-nothing,
//! or why they are not), phase Queued while scheduling gates hold the attempt's pods (a queue
//! such as Kueue has not admitted it yet), condition Queued, whose turn to False marks the
//! admission (the start-up timeout counts from there), and the optional queue timeout.

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::decider::Decider;
use super::failure::Failure;
use super::observed::{PodState, PodView, WaitCause};
use crate::scheduling;

impl<'a, 'o> Decider<'a, 'o> {
    /// GangScheduling says how the pods are scheduled; a change is an event, a Warning when
    /// the gang is not enforced because the native API is not served (once, not per attempt).
    pub(super) fn gang_condition(&mut self) {
        let replicas = self.o.spec.pod_count();
        let min = self.o.spec.min_replicas();
        // Off by the job's or the operator's choice: nothing to tell.
        let Some((on, why, message)) = scheduling::condition(self.o.gang, replicas, min) else {
            return;
        };
        let known = self
            .status
            .condition(condition::GANG_SCHEDULING)
            .is_some_and(|c| c.reason == why && c.message == message);
        if known {
            return;
        }
        if why == reason::NATIVE_API_NOT_SERVED {
            // A warning when the job asked for it; the default falling back is news, not trouble.
            let asked = matches!(self.o.gang, scheduling::GangMode::NotServed { asked: true });
            self.event(asked, why, message.clone());
        }
        self.set_condition(condition::GANG_SCHEDULING, on, why, message);
    }

    /// Some of the attempt's pods are held by scheduling gates: phase Queued, condition Queued
    /// True and Running False with the gates' names, a Normal event once per attempt. True
    /// when so.
    pub(super) fn queued(&mut self, waiting: &[&PodView]) -> bool {
        let held: Vec<&PodView> = waiting
            .iter()
            .copied()
            .filter(|p| held_by_queue(p))
            .collect();
        let Some(first) = held.first() else {
            self.admitted();
            return false;
        };
        self.status.phase = Phase::Queued;
        let attempt = self.status.attempt;
        let gates = first
            .waiting
            .as_ref()
            .map(|w| w.message.clone())
            .unwrap_or_default();
        let queue = match self.o.gang {
            scheduling::GangMode::Kueue { queue } => format!(" (LocalQueue {queue})"),
            _ => String::new(),
        };
        let message = format!(
            "attempt {attempt}: {} of {} pods wait to be admitted{queue}: {gates}",
            held.len(),
            self.o.spec.pod_count()
        );
        let known = self
            .status
            .condition(condition::RUNNING)
            .is_some_and(|c| c.status == "False" && c.reason == reason::QUEUED);
        if !known {
            self.event(false, reason::QUEUED, message.clone());
        }
        self.set_condition(condition::QUEUED, true, reason::QUEUED, message.clone());
        self.set_condition(condition::RUNNING, false, reason::QUEUED, message);
        true
    }

    /// A job whose pods ran says it was admitted, even when it went from Queued to Succeeded
    /// between two looks; not while a pod of the attempt is held, nor when its pods never ran
    /// (a queue timeout fails a job whose pods go away still gated).
    pub(super) fn admission_seen(&mut self) {
        let ran = self.current_pods().any(|p| {
            p.running_since.is_some()
                || match &p.state {
                    PodState::Succeeded => true,
                    PodState::Failed(t) => t.exit_code.is_some(),
                    _ => false,
                }
        });
        if ran && !self.current_pods().any(held_by_queue) {
            self.admitted();
        }
    }

    /// Queued turns False once no pod of the attempt is held any more: the queue admitted it.
    fn admitted(&mut self) {
        if self.status.is_true(condition::QUEUED) {
            let attempt = self.status.attempt;
            self.set_condition(
                condition::QUEUED,
                false,
                reason::ADMITTED,
                format!("attempt {attempt} was admitted: its pods are scheduled and started"),
            );
        }
    }

    /// When the start-up clock of `pod` (no longer held) started: its creation, or the
    /// attempt's admission by its queue when that came later (a queue may hold pods for
    /// hours): when Queued turned False, or now if it is still True (the admission is being
    /// seen now).
    pub(super) fn startup_clock(&self, pod: &PodView) -> Option<Timestamp> {
        let admitted = self
            .status
            .condition(condition::QUEUED)
            .map(|c| match c.status.as_str() {
                "True" => self.now(),
                _ => c.last_transition_time.0,
            });
        match (pod.created, admitted) {
            (Some(created), Some(at)) => Some(created.max(at)),
            (created, _) => created,
        }
    }

    /// A pod held past spec.scheduling.queueTimeoutSeconds: the job fails (a new attempt would
    /// queue again); within it, when to look again.
    pub(super) fn queue_timeout(&mut self, pod: &PodView) -> Option<Failure> {
        let timeout = self.o.spec.scheduling.queue_timeout_seconds.unwrap_or(0);
        let created = pod.created.filter(|_| timeout > 0)?;
        let at = created + SignedDuration::from_secs(timeout);
        if self.now() < at {
            self.requeue_at(at);
            return None;
        }
        let message = format!(
            "still queued {timeout}s after its creation (spec.scheduling.queueTimeoutSeconds)"
        );
        let mut f = self.failure(
            pod.node_rank,
            Some(&pod.name),
            reason::QUEUE_TIMEOUT,
            message,
        );
        f.at = Some(at);
        f.permanent = true;
        Some(f)
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
