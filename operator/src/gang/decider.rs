//! The decision being made: what [`super::decide`] accumulates (the status, the actions, the
//! events, when to look again) and the order of its steps ([`Decider::run`]). Each step is a
//! method in the file of its concern.

use std::time::Duration;

use ferrotrain_api::RestartBudget;
use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::decision::{Action, Decision, EventNote, order};
use super::observed::{Observed, PodView};

/// A decision in the making: starts from the observed status and collects what each step
/// changes.
pub(super) struct Decider<'a, 'o> {
    pub(super) o: &'a Observed<'o>,
    pub(super) status: DistributedTrainingStatus,
    pub(super) actions: Vec<Action>,
    pub(super) events: Vec<EventNote>,
    pub(super) requeue: Option<Duration>,
}

impl<'a, 'o> Decider<'a, 'o> {
    /// Starts from the observed status, at the observed generation.
    pub(super) fn new(o: &'a Observed<'o>) -> Self {
        let mut status = o.status.clone();
        status.observed_generation = o.generation;
        Decider {
            o,
            status,
            actions: Vec::new(),
            events: Vec::new(),
            requeue: None,
        }
    }

    /// The steps, in order: where each pod of the attempt runs; then by phase the end of a
    /// finished job, a suspend, a resume, a fixed spec, or an active job's deadline, backoff,
    /// launch and census; then the cleanup of older attempts and the replica counts.
    pub(super) fn run(mut self) -> Decision {
        let o = self.o;
        self.record_placement();
        // Pods of a newer attempt than the status knows: the status we read predates our own
        // write. Acting on it would double-count a restart; wait for the fresh status.
        if o.pods.iter().any(|p| p.attempt > o.status.attempt) {
            return Decision {
                status: o.status.clone(),
                actions: Vec::new(),
                events: Vec::new(),
                requeue_after: Some(Duration::from_secs(1)),
                restarts_left: self.budget().left(),
            };
        }

        match self.status.phase {
            Phase::Failed if self.invalid_spec_changed() => {
                self.reopen();
                if o.spec.suspend {
                    self.suspend();
                } else {
                    self.active();
                }
            }
            Phase::Succeeded | Phase::Failed => self.finished(),
            _ if o.spec.suspend => self.suspend(),
            Phase::Suspended => {
                self.resume();
                self.active();
            }
            _ => self.active(),
        }
        if !matches!(self.status.phase, Phase::Succeeded | Phase::Failed) {
            self.gang_condition();
        }
        self.admission_seen();
        self.record_placement();
        self.clean_up_old_attempts();
        self.force_delete_stuck();
        self.count_replicas();
        let restarts_left = self.budget().left();
        Decision {
            status: self.status,
            actions: order(self.actions),
            events: self.events,
            requeue_after: self.requeue,
            restarts_left,
        }
    }

    /// restartPolicy.maxRestarts and the restarts the status has spent (gang restarts and
    /// in-place rounds alike; disruptions spend none).
    pub(super) fn budget(&self) -> RestartBudget {
        RestartBudget::of(
            self.o.spec.restart_policy.max_restarts,
            self.status.restarts,
        )
    }

    /// Pending, Starting, Running or Restarting: the deadline, then the backoff, then the
    /// launch, then the census of the attempt's ranks.
    fn active(&mut self) {
        if self.deadline_passed() {
            return;
        }
        if self.status.phase == Phase::Restarting && !self.backoff_over() {
            self.stop_current_pods();
            return;
        }
        if self.status.phase == Phase::Pending && !self.launch() {
            return;
        }
        self.evaluate();
    }

    /// The time of the decision (every step reads this one, never a clock).
    pub(super) fn now(&self) -> Timestamp {
        self.o.now
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
