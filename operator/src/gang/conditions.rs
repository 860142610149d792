//! The status conditions: set with their transition times kept, and what Created and Running
//! say while an attempt starts and runs.

use std::time::Duration;

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::decider::{Decider, first_line};
use super::observed::{PodView, WaitCause, Waiting};

/// Sets a condition, keeping its lastTransitionTime unless its status flips.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    set_condition_to(conditions, type_, status, reason, message, now, generation);
}

/// Sets a condition to True, False or Unknown, keeping its lastTransitionTime unless its
/// status changes.
pub fn set_condition_to(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = status.to_string();
    let reason = if reason.is_empty() {
        reason::UNKNOWN
    } else {
        reason
    }
    .to_string();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = Time(now);
        }
        c.status = status;
        c.reason = reason;
        c.message = message;
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason,
            message,
            last_transition_time: Time(now),
            observed_generation: generation,
        });
    }
}

impl<'a, 'o> Decider<'a, 'o> {
    /// Sets condition `type_` True or False at this decision's time and generation.
    pub(super) fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: String,
    ) {
        let status = if status { "True" } else { "False" };
        self.set_condition_to(type_, status, reason, message);
    }

    /// `status`: True, False or Unknown.
    pub(super) fn set_condition_to(
        &mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: String,
    ) {
        set_condition_to(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.o.now,
            self.o.generation,
        );
    }

    /// Running turns False with `reason` (when the job has a Running condition at all).
    pub(super) fn clear_running(&mut self, reason: &str) {
        if self.status.condition(condition::RUNNING).is_some() {
            self.set_condition(condition::RUNNING, false, reason, String::new());
        }
    }

    /// Every pod of the attempt runs or has finished (or, elastic, enough of them,
    /// `present`, train without the others): phase Running, Running=True, a Normal event, and
    /// the ledger's clock of the attempt (once); afterwards only the condition's message
    /// follows `present`.
    pub(super) fn all_running(&mut self, present: i32) {
        let (replicas, attempt) = (self.o.spec.pod_count(), self.status.attempt);
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
        if self.status.phase == Phase::Running {
            let stale = self
                .status
                .condition(condition::RUNNING)
                .is_none_or(|c| c.message != message);
            if stale {
                self.set_condition(condition::RUNNING, true, reason::ALL_RANKS_RUNNING, message);
            }
            return;
        }
        let now = self.now();
        self.recovery().running(now);
        self.status.phase = Phase::Running;
        self.set_condition(condition::RUNNING, true, reason::ALL_RANKS_RUNNING, message);
        self.event(
            false,
            reason::RUNNING,
            format!("attempt {attempt}: {pods} run"),
        );
    }

    /// Some pods do not run yet. The phase stays Starting; a pod that says why it waits
    /// (Unschedulable, ErrImagePull, ...) is named in the Running condition, and a Warning
    /// event carries its reason once per attempt and reason (each attempt's launch resets the
    /// condition to PodsStarting).
    pub(super) fn starting(&mut self, waiting: &[&PodView]) {
        self.status.phase = Phase::Starting;
        self.requeue_in(Duration::from_secs(30));
        if self.queued(waiting) {
            return;
        }
        let mut problems: Vec<(&PodView, &Waiting)> = waiting
            .iter()
            .filter_map(|p| p.waiting.as_ref().map(|w| (*p, w)))
            .filter(|(_, w)| w.cause.is_problem())
            .collect();
        problems.sort_by_key(|(p, w)| (w.cause, p.node_rank));
        let Some(&(pod, w)) = problems.first() else {
            let shows_problem = self.status.condition(condition::RUNNING).is_some_and(|c| {
                c.status == "False" && WaitCause::ALL.iter().any(|w| w.reason() == c.reason)
            });
            if shows_problem {
                self.pods_starting();
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
        let known = self
            .status
            .condition(condition::RUNNING)
            .is_some_and(|c| c.status == "False" && c.reason == reason);
        if !known {
            self.event(true, reason, message.clone());
        }
        self.set_condition(condition::RUNNING, false, reason, message);
    }

    /// Running=False/PodsStarting: the attempt's pods are on their way, nothing is wrong.
    pub(super) fn pods_starting(&mut self) {
        let (replicas, attempt) = (self.o.spec.pod_count(), self.status.attempt);
        self.set_condition(
            condition::RUNNING,
            false,
            reason::PODS_STARTING,
            format!("attempt {attempt}: waiting for its {replicas} pods to run"),
        );
    }
}

#[cfg(test)]
mod tests;
