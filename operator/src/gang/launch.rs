//! Launching an attempt: its pods, one checkpoint writer at a time (no pod of it while a pod
//! of an earlier attempt exists), pods of older attempts deleted, pods stuck on a lost node
//! force-deleted; the API refusing a pod; the termination grace of the pods.

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase, condition};
use ferrotrain_api::reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::decider::{Decider, first_line, signed};
use super::decision::Action;
use super::observed::LaunchStop;

/// How soon a launch the API refused (quota, LimitRange, webhook), a name conflict or a
/// missing Secret stopped is tried again.
pub const LAUNCH_RETRY: Duration = Duration::from_secs(30);

/// The pods' `terminationGracePeriodSeconds` when the user sets none: long enough for rank 0
/// to save a checkpoint on SIGTERM. From the last save the trainer reported (with a bucket
/// (`checkpoint.store`), until it was durable there; else the whole save, else the part that
/// blocked training): 3x it plus 10 s, at least Kubernetes' default 30 s, at most 10 minutes. The launcher inside the pod gets 5 s less
/// ([`launcher_stop_grace_seconds`]) so it can still report after its ranks stop.
pub fn save_grace_seconds(status: &DistributedTrainingStatus) -> i64 {
    const DEFAULT: i64 = 30;
    const MAX: i64 = 600;
    let report = status.progress.as_ref().map(|p| &p.report);
    let durable = report
        .and_then(|r| r.durable_checkpoint.as_ref())
        .and_then(|d| d.durable_seconds);
    let save = report
        .and_then(|r| r.last_checkpoint.as_ref())
        .and_then(|c| c.save_seconds.or(c.blocking_seconds));
    let save = durable
        .into_iter()
        .chain(save)
        .filter(|s| s.is_finite() && *s >= 0.0)
        .reduce(f64::max);
    match save {
        Some(seconds) => ((3.0 * seconds + 10.0).ceil() as i64).clamp(DEFAULT, MAX),
        None => DEFAULT,
    }
}

/// FERROTRAIN_STOP_GRACE_SECONDS for a pod with `pod_grace_seconds`: how long `ferrotrain
/// launch` waits between forwarding SIGTERM and SIGKILLing its ranks.
pub fn launcher_stop_grace_seconds(pod_grace_seconds: i64) -> i64 {
    (pod_grace_seconds - 5).max(1)
}

impl<'a, 'o> Decider<'a, 'o> {
    /// In Pending: creates the attempt's missing pods. True when all exist (moves to Starting).
    pub(super) fn launch(&mut self) -> bool {
        let replicas = self.o.spec.pod_count();
        let present: Vec<i32> = self.current_pods().map(|p| p.node_rank).collect();
        let missing: Vec<i32> = (0..replicas).filter(|r| !present.contains(r)).collect();
        if missing.is_empty() {
            self.status.phase = Phase::Starting;
            let attempt = self.status.attempt;
            self.set_condition(
                condition::CREATED,
                true,
                reason::PODS_CREATED,
                format!("attempt {attempt}: {replicas} pods created"),
            );
            return true;
        }
        if !self.o.spec_problems.is_empty() {
            let message = self.o.spec_problems.join("; ");
            let failure =
                self.job_failure(reason::INVALID_SPEC, format!("no pods created: {message}"));
            self.fail(failure, reason::INVALID_SPEC, reason::INVALID_SPEC);
            return false;
        }
        if self.create_refused_too_long() {
            return false;
        }
        if self.earlier_attempt_remains() {
            return false;
        }
        if self.launch_held_back() {
            return false;
        }
        if self.status.start_time.is_none() {
            self.status.start_time = Some(Time(self.now()));
        }
        let attempt = self.status.attempt;
        let Some(create) = self.in_placement_order(&missing) else {
            return false;
        };
        if missing.len() as i32 == replicas {
            // A new attempt: what the Running condition said of the last one is history (a
            // fresh job has none, and its first status stays as small as before).
            if self.status.condition(condition::RUNNING).is_some() {
                self.pods_starting();
            }
            let now = self.now();
            self.recovery().start(i64::from(attempt), now);
            self.status.round = 0;
            let spec = self.o.spec;
            self.event(
                false,
                reason::CREATED,
                format!(
                    "attempt {attempt}: creating {replicas} pods x {} ranks (world size {})",
                    spec.procs_per_replica(),
                    spec.world_size()
                ),
            );
        }
        self.actions.push(Action::Launch {
            attempt,
            node_ranks: create,
        });
        self.requeue_in(Duration::from_secs(30));
        false
    }

    /// The pods to create now of the `missing` ones. An elastic job whose pods are placed one
    /// by one (no group object) gets node 0's pod first and the others once it has a node: the
    /// scheduler could place the others and not node 0's, which hosts the rendezvous, and the
    /// gang would hold nodes and train nothing. None while node 0's pod waits for a node
    /// (condition Created False, Node0First, saying why; the pod's update brings the next
    /// reconcile). A gang scheduler places the group together instead.
    fn in_placement_order(&mut self, missing: &[i32]) -> Option<Vec<i32>> {
        if !(self.elastic() && self.o.gang.places_one_by_one()) || missing.len() <= 1 {
            return Some(missing.to_vec());
        }
        if missing.contains(&0) {
            return Some(vec![0]);
        }
        let pod = self.current_pods().find(|p| p.node_rank == 0)?;
        if pod.node.is_some() {
            return Some(missing.to_vec());
        }
        let why = pod.waiting.as_ref().map_or_else(
            || "not scheduled yet".to_string(),
            |w| format!("{}: {}", w.reason, first_line(&w.message)),
        );
        let message = format!(
            "attempt {}: node 0's pod {} is created first and waits for a node ({why}); the \
             other {} pods are created once it has one",
            self.status.attempt,
            pod.name,
            missing.len()
        );
        if !self.node_0_ended_the_attempt() {
            self.set_condition(condition::CREATED, false, reason::NODE_0_FIRST, message);
        }
        None
    }

    /// The last launch of this attempt stopped ([`LaunchStop`]: the API refused a pod, a name
    /// is taken, the store's Secret is missing): condition Created turns False saying why, with a Warning event once per
    /// message (not on every retry). True until [`LAUNCH_RETRY`] after the stop, when the
    /// launch is tried again.
    fn launch_held_back(&mut self) -> bool {
        let attempt = self.status.attempt;
        let Some(stop) = self.o.launch_stop.filter(|s| s.attempt == attempt) else {
            return false;
        };
        self.show_launch_stop(stop);
        let retry = stop.at + signed(LAUNCH_RETRY);
        if self.now() < retry {
            self.requeue_at(retry);
            return true;
        }
        false
    }

    /// Condition Created False with the stop's reason and message; the Warning event only
    /// when the condition did not say so already.
    fn show_launch_stop(&mut self, stop: &LaunchStop) {
        let message = format!("attempt {}: {}", stop.attempt, first_line(&stop.message));
        let known = self.status.condition(condition::CREATED).is_some_and(|c| {
            c.status == "False" && c.reason == stop.reason && c.message == message
        });
        self.set_condition(condition::CREATED, false, stop.reason, message.clone());
        if !known {
            self.event(true, stop.reason, message);
        }
    }

    /// The API has refused the attempt's pods ([`Self::launch_held_back`]) for the start-up
    /// timeout: the job Fails with the API's message (the next attempt's pods would be refused
    /// alike). Within it, the launch is retried.
    fn create_refused_too_long(&mut self) -> bool {
        let timeout = self.o.spec.startup_timeout_seconds;
        let Some(c) = self
            .status
            .condition(condition::CREATED)
            .filter(|c| c.status == "False" && c.reason == reason::POD_CREATE_REFUSED)
        else {
            return false;
        };
        if timeout <= 0 {
            return false;
        }
        let at = c.last_transition_time.0 + SignedDuration::from_secs(timeout);
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        let message = format!("pods not created within {timeout}s: {}", c.message);
        let failure = self.job_failure(reason::POD_CREATE_REFUSED, message);
        self.fail(failure, reason::POD_CREATE_REFUSED, reason::FAILED);
        true
    }

    /// One checkpoint writer at a time: no pod of this attempt is created while a pod of an
    /// earlier one exists (its rank 0 may still be saving on SIGTERM, for up to its
    /// termination grace). [`Self::clean_up_old_attempts`] deletes them; one stuck on a lost
    /// node is force-deleted after its grace (the trainer's fence stops it writing, should
    /// it still run behind a partition). True while they remain; Created says so.
    fn earlier_attempt_remains(&mut self) -> bool {
        let attempt = self.status.attempt;
        let mut earlier: Vec<i32> = self
            .o
            .pods
            .iter()
            .filter(|p| p.attempt < attempt)
            .map(|p| p.attempt)
            .collect();
        if earlier.is_empty() {
            return false;
        }
        let count = earlier.len();
        earlier.sort_unstable();
        earlier.dedup();
        let attempts = earlier
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let of = if earlier.len() == 1 {
            format!("attempt {attempts}")
        } else {
            format!("attempts {attempts}")
        };
        let pods = if count == 1 { "pod" } else { "pods" };
        self.set_condition(
            condition::CREATED,
            false,
            reason::PREVIOUS_ATTEMPT_TERMINATING,
            format!(
                "attempt {attempt}: waiting for {count} {pods} of {of} to terminate (one checkpoint writer at a time)"
            ),
        );
        // Their deletion wakes the controller; this is the fallback.
        self.requeue_in(Duration::from_secs(5));
        true
    }

    /// Pods of older attempts are deleted, terminated ones too: the next attempt starts
    /// only when they are gone ([`Self::earlier_attempt_remains`]), and a pod whose status
    /// says terminated may still run behind a partition (the pod GC marks pods of a vanished
    /// node Failed). `lastFailure` keeps the failed rank's message.
    pub(super) fn clean_up_old_attempts(&mut self) {
        let current = self.status.attempt;
        let mut doomed = Vec::new();
        for p in self.o.pods.iter().filter(|p| p.attempt < current) {
            if p.deleting_since.is_none() {
                doomed.push(p.name.clone());
            }
        }
        for name in doomed {
            if !self.actions.contains(&Action::DeletePod(name.clone())) {
                self.actions.push(Action::DeletePod(name));
            }
        }
    }

    /// A pod on a lost node never finishes terminating (the kubelet cannot confirm), which
    /// would keep its GPUs booked and its name taken: force-delete it after a grace period.
    /// A pod whose launcher is fenced ([`Self::fenced_when_lost`]) is force-deleted at once,
    /// so that its replacement can start; a pod of an earlier attempt may hold a rank 0 that
    /// still writes checkpoints.
    pub(super) fn force_delete_stuck(&mut self) {
        let grace = SignedDuration::try_from(self.o.timing.force_delete_grace)
            .unwrap_or(SignedDuration::ZERO);
        let now = self.now();
        for p in self.o.pods {
            let (Some(deleting), Some(_)) = (p.deleting_since, p.node_lost_since) else {
                continue;
            };
            let at = if self.fenced_when_lost(p) {
                deleting
            } else {
                deleting + grace
            };
            if now >= at {
                self.actions.push(Action::ForceDeletePod(p.name.clone()));
                self.event(
                    true,
                    reason::FORCE_DELETED,
                    format!(
                        "pod {} was stuck terminating on a lost node; force-deleted",
                        p.name
                    ),
                );
            } else {
                self.requeue_at(at);
            }
        }
    }
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
