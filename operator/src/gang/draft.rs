//! The decision in the making: what [`super::decide`] accumulates (the status, the actions,
//! the events, when to look again) and the facts every policy reads of the observation (the
//! current attempt's pods, the restart budget, where a rank runs, whether pods are replaced
//! alone). A leaf: it calls no policy, and every policy may call it.

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingStatus, condition};
use ferrotrain_api::{Recovery, RestartBudget};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::conditions::set_condition_to;
use super::decision::{Action, Decision, EventNote, order};
use super::observed::{Observed, PodView};

/// A decision in the making: starts from the observed status and collects what each step
/// changes.
pub(super) struct Draft<'a, 'o> {
    pub(super) o: &'a Observed<'o>,
    pub(super) status: DistributedTrainingStatus,
    pub(super) actions: Vec<Action>,
    pub(super) events: Vec<EventNote>,
    pub(super) requeue: Option<Duration>,
}

impl<'a, 'o> Draft<'a, 'o> {
    /// Starts from the observed status, at the observed generation.
    pub(super) fn new(o: &'a Observed<'o>) -> Self {
        let mut status = o.status.clone();
        status.observed_generation = o.generation;
        Draft {
            o,
            status,
            actions: Vec::new(),
            events: Vec::new(),
            requeue: None,
        }
    }

    /// What was decided.
    pub(super) fn into_decision(self) -> Decision {
        let restarts_left = self.budget().left();
        Decision {
            status: self.status,
            actions: order(self.actions),
            events: self.events,
            requeue_after: self.requeue,
            restarts_left,
        }
    }

    /// The time of the decision (every step reads this one, never a clock).
    pub(super) fn now(&self) -> Timestamp {
        self.o.now
    }

    /// restartPolicy.maxRestarts and the restarts the status has spent (gang restarts and
    /// in-place rounds alike; disruptions spend none).
    pub(super) fn budget(&self) -> RestartBudget {
        RestartBudget::of(
            self.o.spec.restart_policy.max_restarts,
            self.status.restarts,
        )
    }

    /// Look again within `after` (at least 1 s); the earliest of all the steps' asks wins.
    pub(super) fn requeue_in(&mut self, after: Duration) {
        let after = after.max(Duration::from_secs(1));
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    /// Look again at `at`.
    pub(super) fn requeue_at(&mut self, at: Timestamp) {
        let left = at.duration_since(self.now());
        self.requeue_in(Duration::try_from(left).unwrap_or(Duration::ZERO));
    }

    /// Publish an event (Warning or Normal) with one of [`ferrotrain_api::reason`]'s reasons.
    pub(super) fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(EventNote {
            warning,
            reason,
            note,
            round: Some(self.status.round),
        });
    }

    /// The pods of the current attempt.
    pub(super) fn current_pods(&self) -> impl Iterator<Item = &'o PodView> + '_ {
        let attempt = self.status.attempt;
        self.o.pods.iter().filter(move |p| p.attempt == attempt)
    }

    /// Delete the current attempt's pods that still run (terminated ones stay for their logs).
    pub(super) fn stop_current_pods(&mut self) {
        let doomed: Vec<String> = self
            .current_pods()
            .filter(|p| p.deleting_since.is_none() && !p.state.is_terminated())
            .map(|p| p.name.clone())
            .collect();
        self.actions
            .extend(doomed.into_iter().map(Action::DeletePod));
    }

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

    /// Rates and ETA describe the attempt that reported them; once it ended they are no
    /// longer current (step, losses and the last checkpoint stay true).
    pub(super) fn end_attempt_progress(&mut self) {
        if let Some(p) = self.status.progress.as_mut() {
            let r = &mut p.report;
            r.steps_per_second = None;
            r.samples_per_second = None;
            r.tokens_per_second = None;
            r.step_time_seconds = None;
            r.comm_fraction = None;
            r.eta_seconds = None;
            p.eta = None;
            p.estimated_completion_time = None;
        }
    }

    /// The recovery ledger in the status, started on first use.
    pub(super) fn recovery(&mut self) -> &mut Recovery {
        self.status.recovery.get_or_insert_with(Recovery::default)
    }

    /// Elastic: the job may train on fewer pods than it asked for.
    pub(super) fn elastic(&self) -> bool {
        self.o.spec.is_elastic()
    }

    /// A pod that goes away (deleted, evicted, drained) is replaced alone when the launchers
    /// restart in place, node 0's too: the others wait for its replacement's store.
    pub(super) fn replaceable(&self) -> bool {
        self.o.spec.restarts_in_place()
    }

    /// A pod of the current attempt that its launchers fence when its node is lost: in
    /// place and not node 0's (the others' heartbeat ends their round without it, and back
    /// from a partition it finds its node held by its replacement and leaves;
    /// launch/heartbeat.rs, members.rs). Such a pod is replaced alone and force-deleted at
    /// once. Node 0's could still host a gang of its own behind a partition.
    pub(super) fn fenced_when_lost(&self, pod: &PodView) -> bool {
        pod.attempt == self.status.attempt && pod.node_rank != 0 && self.replaceable()
    }

    /// The node rank `rank` of the current attempt runs (or ran) on: its pod's, else the one
    /// recorded in status.placement when the pod was first seen bound (the pod may be gone
    /// before the operator saw it terminate).
    pub(super) fn node_of(&self, rank: i32) -> Option<String> {
        let attempt = self.status.attempt;
        self.current_pods()
            .find(|p| p.node_rank == rank)
            .and_then(|p| p.node.clone())
            .or_else(|| {
                self.status
                    .placement
                    .iter()
                    .find(|p| p.attempt == attempt && p.node_rank == rank)
                    .map(|p| p.node.clone())
            })
    }
}

/// A std Duration as jiff's, for timestamp arithmetic (0 when it does not fit).
pub(super) fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::ZERO)
}

/// The first non-empty line of a message, at most 512 characters: what a condition or an
/// event says of a longer text.
pub(super) fn first_line(s: &str) -> String {
    let line = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut out: String = line.chars().take(512).collect();
    if line.chars().count() > 512 {
        out.push('…');
    }
    out
}
