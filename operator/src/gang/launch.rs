//! Launching an attempt: its pods, one checkpoint writer at a time (no pod of it while a pod
//! of an earlier attempt exists), pods of older attempts deleted, pods stuck on a lost node
//! force-deleted; the API refusing a pod; the termination grace of the pods.

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase, condition};
use ferrotrain_api::reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::decision::Action;
use super::draft::{Draft, first_line, signed};
use super::failure::{Failure, job_failure};
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

/// What launching found (see [`launch`]).
pub(super) enum Launched {
    /// Every pod of the attempt exists: phase Starting.
    All,
    /// Pods are created (a new attempt's, when `new_attempt`) or held back for a reason the
    /// status says; the attempt is looked at again.
    NotYet { new_attempt: bool },
    /// No pod can be created: the job fails with `failure`, condition reason `reason` and
    /// event reason `event`.
    Fails {
        failure: Box<Failure>,
        reason: &'static str,
        event: &'static str,
    },
    /// Node 0's pod waits for a node and the others wait for it: what condition Created
    /// (Node0First) says, unless node 0's wait ends the attempt.
    Node0Waits(String),
}

/// In Pending: creates the attempt's missing pods.
pub(super) fn launch(d: &mut Draft<'_, '_>) -> Launched {
    let replicas = d.o.spec.pod_count();
    let present: Vec<i32> = d.current_pods().map(|p| p.node_rank).collect();
    let missing: Vec<i32> = (0..replicas).filter(|r| !present.contains(r)).collect();
    if missing.is_empty() {
        d.status.phase = Phase::Starting;
        let attempt = d.status.attempt;
        d.set_condition(
            condition::CREATED,
            true,
            reason::PODS_CREATED,
            format!("attempt {attempt}: {replicas} pods created"),
        );
        return Launched::All;
    }
    if !d.o.spec_problems.is_empty() {
        let message = d.o.spec_problems.join("; ");
        let failure = job_failure(
            d,
            reason::INVALID_SPEC,
            format!("no pods created: {message}"),
        );
        return Launched::Fails {
            failure: Box::new(failure),
            reason: reason::INVALID_SPEC,
            event: reason::INVALID_SPEC,
        };
    }
    if let Some(failure) = create_refused_too_long(d) {
        return Launched::Fails {
            failure: Box::new(failure),
            reason: reason::POD_CREATE_REFUSED,
            event: reason::FAILED,
        };
    }
    if earlier_attempt_remains(d) || launch_held_back(d) {
        return Launched::NotYet { new_attempt: false };
    }
    if d.status.start_time.is_none() {
        d.status.start_time = Some(Time(d.now()));
    }
    let create = match in_placement_order(d, &missing) {
        Ok(create) => create,
        Err(waits) => return Launched::Node0Waits(waits),
    };
    let new_attempt = missing.len() as i32 == replicas;
    if new_attempt {
        new_attempt_starts(d);
    }
    d.actions.push(Action::Launch {
        attempt: d.status.attempt,
        node_ranks: create,
    });
    d.requeue_in(Duration::from_secs(30));
    Launched::NotYet { new_attempt }
}

/// A new attempt's pods are created: its record in the ledger, round 0, an event.
fn new_attempt_starts(d: &mut Draft<'_, '_>) {
    let (attempt, now, spec) = (d.status.attempt, d.now(), d.o.spec);
    d.recovery().start(i64::from(attempt), now);
    d.status.round = 0;
    let replicas = spec.pod_count();
    d.event(
        false,
        reason::CREATED,
        format!(
            "attempt {attempt}: creating {replicas} pods x {} ranks (world size {})",
            spec.procs_per_replica(),
            spec.world_size()
        ),
    );
}

/// The pods to create now of the `missing` ones. An elastic job whose pods are placed one by
/// one (no group object) gets node 0's pod first and the others once it has a node: the
/// scheduler could place the others and not node 0's, which hosts the rendezvous, and the gang
/// would hold nodes and train nothing. While node 0's pod waits for a node, what condition
/// Created says of it (the pod's update brings the next reconcile). A gang scheduler places
/// the group together instead.
fn in_placement_order(d: &Draft<'_, '_>, missing: &[i32]) -> Result<Vec<i32>, String> {
    // Not `missing.len() <= 1`: a gang of two whose node 0 waits for a node misses one pod.
    if !(d.elastic() && d.o.gang.places_one_by_one()) {
        return Ok(missing.to_vec());
    }
    if missing.contains(&0) {
        return Ok(vec![0]);
    }
    let Some(pod) = d.current_pods().find(|p| p.node_rank == 0) else {
        return Ok(missing.to_vec());
    };
    if pod.node.is_some() {
        return Ok(missing.to_vec());
    }
    let why = pod.waiting.as_ref().map_or_else(
        || "not scheduled yet".to_string(),
        |w| format!("{}: {}", w.reason, first_line(&w.message)),
    );
    Err(format!(
        "attempt {}: node 0's pod {} is created first and waits for a node ({why}); the \
         other {} pods are created once it has one",
        d.status.attempt,
        pod.name,
        missing.len()
    ))
}

/// The last launch of this attempt stopped ([`LaunchStop`]: the API refused a pod, a name
/// is taken, the store's Secret is missing): condition Created turns False saying why, with a Warning event once per
/// message (not on every retry). True until [`LAUNCH_RETRY`] after the stop, when the
/// launch is tried again.
fn launch_held_back(d: &mut Draft<'_, '_>) -> bool {
    let attempt = d.status.attempt;
    let Some(stop) = d.o.launch_stop.filter(|s| s.attempt == attempt) else {
        return false;
    };
    show_launch_stop(d, stop);
    let retry = stop.at + signed(LAUNCH_RETRY);
    if d.now() < retry {
        d.requeue_at(retry);
        return true;
    }
    false
}

/// Condition Created False with the stop's reason and message; the Warning event only
/// when the condition did not say so already.
fn show_launch_stop(d: &mut Draft<'_, '_>, stop: &LaunchStop) {
    let message = format!("attempt {}: {}", stop.attempt, first_line(&stop.message));
    let known = d
        .status
        .condition(condition::CREATED)
        .is_some_and(|c| c.status == "False" && c.reason == stop.reason && c.message == message);
    d.set_condition(condition::CREATED, false, stop.reason, message.clone());
    if !known {
        d.event(true, stop.reason, message);
    }
}

/// The API has refused the attempt's pods ([`launch_held_back`]) for the start-up timeout:
/// the failure that fails the job with the API's message (the next attempt's pods would be
/// refused alike). Within it, the launch is retried.
fn create_refused_too_long(d: &mut Draft<'_, '_>) -> Option<Failure> {
    let timeout = d.o.spec.startup_timeout_seconds;
    let c = d
        .status
        .condition(condition::CREATED)
        .filter(|c| c.status == "False" && c.reason == reason::POD_CREATE_REFUSED)?;
    if timeout <= 0 {
        return None;
    }
    let at = c.last_transition_time.0 + SignedDuration::from_secs(timeout);
    if d.now() < at {
        d.requeue_at(at);
        return None;
    }
    let message = format!("pods not created within {timeout}s: {}", c.message);
    Some(job_failure(d, reason::POD_CREATE_REFUSED, message))
}

/// One checkpoint writer at a time: no pod of this attempt is created while a pod of an
/// earlier one exists (its rank 0 may still be saving on SIGTERM, for up to its
/// termination grace). [`clean_up_old_attempts`] deletes them; one stuck on a lost
/// node is force-deleted after its grace (the trainer's fence stops it writing, should
/// it still run behind a partition). True while they remain; Created says so.
fn earlier_attempt_remains(d: &mut Draft<'_, '_>) -> bool {
    let attempt = d.status.attempt;
    let mut earlier: Vec<i32> =
        d.o.pods
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
    d.set_condition(
        condition::CREATED,
        false,
        reason::PREVIOUS_ATTEMPT_TERMINATING,
        format!(
            "attempt {attempt}: waiting for {count} {pods} of {of} to terminate (one checkpoint writer at a time)"
        ),
    );
    // Their deletion wakes the controller; this is the fallback.
    d.requeue_in(Duration::from_secs(5));
    true
}

/// Pods of older attempts are deleted, terminated ones too: the next attempt starts
/// only when they are gone ([`earlier_attempt_remains`]), and a pod whose status
/// says terminated may still run behind a partition (the pod GC marks pods of a vanished
/// node Failed). `lastFailure` keeps the failed rank's message.
pub(super) fn clean_up_old_attempts(d: &mut Draft<'_, '_>) {
    let current = d.status.attempt;
    let mut doomed = Vec::new();
    for p in d.o.pods.iter().filter(|p| p.attempt < current) {
        if p.deleting_since.is_none() {
            doomed.push(p.name.clone());
        }
    }
    for name in doomed {
        if !d.actions.contains(&Action::DeletePod(name.clone())) {
            d.actions.push(Action::DeletePod(name));
        }
    }
}

/// A pod on a lost node never finishes terminating (the kubelet cannot confirm), which
/// would keep its GPUs booked and its name taken: force-delete it after a grace period.
/// A pod whose launcher is fenced ([`fenced_when_lost`]) is force-deleted at once,
/// so that its replacement can start; a pod of an earlier attempt may hold a rank 0 that
/// still writes checkpoints.
pub(super) fn force_delete_stuck(d: &mut Draft<'_, '_>) {
    let grace =
        SignedDuration::try_from(d.o.timing.force_delete_grace).unwrap_or(SignedDuration::ZERO);
    let now = d.now();
    for p in d.o.pods {
        let (Some(deleting), Some(_)) = (p.deleting_since, p.node_lost_since) else {
            continue;
        };
        let at = if d.fenced_when_lost(p) {
            deleting
        } else {
            deleting + grace
        };
        if now >= at {
            d.actions.push(Action::ForceDeletePod(p.name.clone()));
            d.event(
                true,
                reason::FORCE_DELETED,
                format!(
                    "pod {} was stuck terminating on a lost node; force-deleted",
                    p.name
                ),
            );
        } else {
            d.requeue_at(at);
        }
    }
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
