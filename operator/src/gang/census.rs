//! The census of the current attempt's ranks: which run, which succeeded, which failed, which
//! wait (and why, and until when), which go away to be replaced alone, and where each was
//! placed. It says what it found; the conductor (`decider.rs`) decides what that means.

use std::collections::BTreeMap;

use ferrotrain_api::crd::{Placement, condition};
use ferrotrain_api::reason;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::decision::Action;
use super::departure;
use super::draft::{Draft, first_line, signed};
use super::failure::{Failure, disrupted, exited, failure};
use super::observed::{PodState, PodView, Termination, WaitCause};

/// How long an elastic gang's other pods may take to end after node 0's (its launcher waits
/// up to 30 s for the members' goodbyes before it exits, and they exit right after).
const FINISH_GRACE: std::time::Duration = std::time::Duration::from_secs(40);

/// The current attempt's ranks, sorted by what they do.
#[derive(Default)]
pub(super) struct Census<'o> {
    pub(super) rank0: Option<&'o PodView>,
    pub(super) running: i32,
    pub(super) succeeded: i32,
    /// Failures that end the attempt.
    pub(super) failures: Vec<Failure>,
    /// Candidate causes of those failures that end nothing on their own.
    pub(super) suspects: Vec<Failure>,
    /// Pods not running yet.
    pub(super) waiting: Vec<&'o PodView>,
    /// Ranks whose pod goes or went away and is replaced alone (in-place restarts): the other
    /// pods' launchers wait for it in their next round.
    pub(super) replacing: Vec<i32>,
    /// Those of them whose pod is gone: its replacement can be created.
    pub(super) gone: Vec<i32>,
    /// Node 0's pod is among them because its launcher was killed (a failure), not because
    /// the pod was taken away (a disruption).
    pub(super) node0_failed: bool,
}

/// Sorts the current attempt's ranks into running, succeeded, failed and waiting; a pod that
/// left a failed corpse to be replaced alone is deleted (its replacement takes its name).
pub(super) fn take<'o>(d: &mut Draft<'_, 'o>) -> Census<'o> {
    let replicas = d.o.spec.pod_count();
    let by_rank: BTreeMap<i32, &'o PodView> = d
        .current_pods()
        .filter(|p| p.node_rank < replicas)
        .map(|p| (p.node_rank, p))
        .collect();
    let mut census = Census {
        rank0: by_rank.get(&0).copied(),
        ..Census::default()
    };
    for rank in 0..replicas {
        let Some(&pod) = by_rank.get(&rank) else {
            missing(d, rank, &mut census);
            continue;
        };
        match &pod.state {
            PodState::Succeeded => census.succeeded += 1,
            // Deleted, its launcher ended by the signal: it goes away, not fails.
            PodState::Failed(t) if leaving(d, pod, t) => {
                depart(d, pod);
                census.replacing.push(rank);
            }
            // Evicted by its kubelet (node pressure, a storage limit, node shutdown): a
            // disruption, replaced alone as a deleted pod is, once deleted (the kubelet
            // leaves it failed; its replacement takes its name).
            PodState::Failed(t) if evicted(d, pod, t) => {
                depart(d, pod);
                d.actions.push(Action::DeletePod(pod.name.clone()));
                census.replacing.push(rank);
            }
            PodState::Failed(t) if launcher_killed(d, pod, t) => {
                // Deleted first: its replacement takes its name.
                d.actions.push(Action::DeletePod(pod.name.clone()));
                census.replacing.push(rank);
                census.node0_failed |= rank == 0;
            }
            PodState::Failed(t) => census.failures.push(exited(d, pod, t)),
            PodState::Running | PodState::Pending => check_alive(d, pod, &mut census),
        }
    }
    census
}

/// Rank `rank` has no pod: replaced alone in place, else a failure of the attempt.
fn missing(d: &Draft<'_, '_>, rank: i32, census: &mut Census<'_>) {
    if d.replaceable() {
        census.replacing.push(rank);
        census.gone.push(rank);
        return;
    }
    let mut f = failure(d, rank, None, reason::POD_DELETED, "pod was deleted".into());
    f.killed = true;
    census.failures.push(f);
}

/// Node 0's pod, created before the others (launch.rs), waits for a node: past
/// startupTimeoutSeconds, or with a wait no retry helps, the failure that ends the attempt
/// as any pod's would.
pub(super) fn node_0_failed_to_start(d: &mut Draft<'_, '_>) -> Option<Failure> {
    let pod = d.current_pods().find(|p| p.node_rank == 0)?;
    let mut census = Census::default();
    check_startup(d, pod, &mut census);
    super::failure::root_cause(census.failures, Vec::new())
}

/// Elastic: node 0's launcher exits 0 only when the gang finished training. Once no other
/// pod of the attempt runs (the members ended after it, an agent waiting to join ended with
/// them), or [`FINISH_GRACE`] after node 0's end, training is over: pods never placed, or
/// still ending, are stopped. Until then it requeues.
pub(super) fn elastic_finished(d: &mut Draft<'_, '_>, rank0: Option<&PodView>) -> bool {
    let Some(rank0) = rank0.filter(|p| d.elastic() && p.state == PodState::Succeeded) else {
        return false;
    };
    let running = d
        .current_pods()
        .any(|p| p.state == PodState::Running && p.deleting_since.is_none());
    let Some(ended) = rank0.ended_at.filter(|_| running) else {
        return true;
    };
    let at = ended + signed(FINISH_GRACE);
    if d.now() >= at {
        return true;
    }
    d.requeue_at(at);
    false
}

/// Elastic: enough of the current attempt's pods run for the gang to train without the
/// others, node 0's among them (it hosts the rendezvous: nothing trains without it).
pub(super) fn elastic_quorum(d: &Draft<'_, '_>) -> bool {
    let running = |p: &&PodView| p.state == PodState::Running && p.deleting_since.is_none();
    let pods: Vec<&PodView> = d.current_pods().filter(running).collect();
    d.elastic()
        && pods.iter().any(|p| p.node_rank == 0)
        && pods.len() as i32 >= d.o.spec.min_replicas()
}

/// A pod being deleted that in-place restarts replace alone: on a lost node too (the taint
/// manager evicts its pods) when its launcher is fenced.
fn going_away(d: &Draft<'_, '_>, pod: &PodView) -> bool {
    let fenced = match pod.node_lost_since {
        None => d.replaceable(),
        Some(_) => d.fenced_when_lost(pod),
    };
    pod.deleting_since.is_some() && fenced
}

/// A pod [going away](going_away) whose launcher the deletion's signal ended (exit code
/// 128 + n, or none): replaced alone like one still terminating. A pod that exited with its
/// own error is a failure all the same.
fn leaving(d: &Draft<'_, '_>, pod: &PodView, t: &Termination) -> bool {
    going_away(d, pod) && t.exit_code.is_none_or(|c| c >= 128)
}

/// A pod its kubelet failed for a disruption (`Evicted`: node pressure, an ephemeral-storage
/// or emptyDir limit; `Terminated`: graceful node shutdown), its launcher ended by the
/// kubelet's signal or never started: in place it is replaced alone like a deleted pod, and
/// spends no restart.
fn evicted(d: &Draft<'_, '_>, pod: &PodView, t: &Termination) -> bool {
    d.replaceable()
        && pod.disruption.is_some()
        && pod.deleting_since.is_none()
        && pod.node_lost_since.is_none()
        && t.exit_code.is_none_or(|c| c >= 128)
}

/// Remembers that `pod` departed for a disruption, for the end of the round it ended
/// ([`departure`]).
fn depart(d: &mut Draft<'_, '_>, pod: &PodView) {
    let Some(new) = departure::of(pod, d.now()) else {
        return;
    };
    let attempt = i64::from(d.status.attempt);
    let counted_until = d.status.recovery.as_ref().and_then(|r| {
        r.attempts
            .iter()
            .filter(|a| a.attempt == attempt)
            .filter_map(|a| a.end.as_ref().map(|e| e.detected_at))
            .max()
    });
    departure::record(&mut d.status.departures, new, counted_until);
}

/// A pod whose launcher was killed (SIGKILL, the OOM killer: its container exited with a
/// signal's code), not for a lost node, a deletion or a disruption: in place, it is replaced
/// alone like a deleted one, while restarts are left (its rank's failure ended the round the
/// others are in; their launchers take the replacement into the next). A launcher that exits
/// by itself (a permanent code, restarts spent) fails the attempt.
fn launcher_killed(d: &Draft<'_, '_>, pod: &PodView, t: &Termination) -> bool {
    let killed = t.exit_code.is_some_and(|c| c >= 128) || t.reason == "OOMKilled";
    killed
        && d.replaceable()
        && pod.deleting_since.is_none()
        && pod.node_lost_since.is_none()
        && pod.disruption.is_none()
        && d.budget().allows_another()
}

/// A pod that runs or waits: deleted, on a lost node, or not starting in time?
fn check_alive<'o>(d: &mut Draft<'_, 'o>, pod: &'o PodView, census: &mut Census<'o>) {
    let rank = pod.node_rank;
    if pod.state == PodState::Running {
        census.running += 1;
    }
    if going_away(d, pod) {
        depart(d, pod);
        census.replacing.push(rank);
    } else if let Some(since) = pod.deleting_since {
        let message = "pod is being deleted".to_string();
        let mut f = failure(d, rank, Some(&pod.name), reason::POD_DELETED, message);
        (f.at, f.killed) = (Some(since), true);
        if let Some(disruption) = &pod.disruption {
            disrupted(&mut f, disruption);
        }
        census.failures.push(f);
    } else if let Some(since) = pod.node_lost_since {
        node_lost(d, pod, since, census);
    } else if pod.state == PodState::Pending {
        census.waiting.push(pod);
        check_startup(d, pod, census);
    }
}

/// A pod on a node NotReady or gone since `since`: within the grace a suspect; past it,
/// force-deleted and replaced alone when its launcher is fenced, else a failure.
fn node_lost(d: &mut Draft<'_, '_>, pod: &PodView, since: Timestamp, census: &mut Census<'_>) {
    let rank = pod.node_rank;
    let message = "the pod's node is NotReady or gone".to_string();
    let mut f = failure(d, rank, Some(&pod.name), reason::NODE_LOST, message);
    (f.at, f.killed) = (Some(since), true);
    let at = since + signed(d.o.timing.node_lost_grace);
    if d.now() >= at && d.fenced_when_lost(pod) {
        // The others wait for it (elastic: train on without it); it is force-deleted at
        // once, its launcher being fenced (a graceful delete waited for a kubelet that does
        // not answer: one reconcile and one request more per lost pod, 8.6 s of a 400-pod
        // loss on the fleet bench), and created again where it fits.
        d.actions.push(Action::ForceDeletePod(pod.name.clone()));
        let grace = d.o.timing.node_lost_grace.as_secs();
        let note = format!(
            "pod {}'s node has been NotReady or gone for {grace}s; force-deleted (its \
             launcher is fenced) and created again where it fits",
            pod.name
        );
        d.event(true, reason::FORCE_DELETED, note);
        census.replacing.push(rank);
    } else if d.now() >= at {
        census.failures.push(f);
    } else {
        d.requeue_at(at);
        f.suspect = true;
        census.suspects.push(f);
    }
}

/// A pod not running yet: past `startupTimeoutSeconds` (or with an image name no retry
/// parses) it ends the attempt with its own reason; before that, a pod that says why it
/// waits is a suspect should another rank fail meanwhile. A pod a queue holds runs no
/// start-up clock, only the optional queue timeout.
fn check_startup(d: &mut Draft<'_, '_>, pod: &PodView, census: &mut Census<'_>) {
    let cause = pod.waiting.as_ref().map(|w| w.cause);
    let reason = cause.map_or(reason::STARTUP_TIMEOUT, WaitCause::reason);
    let said = pod
        .waiting
        .as_ref()
        .map(|w| match w.message.as_str() {
            "" => w.reason.clone(),
            m => format!("{}: {}", w.reason, first_line(m)),
        })
        .unwrap_or_else(|| "no reason given by the scheduler or the kubelet".into());
    if cause == Some(WaitCause::Queued) {
        census.failures.extend(queue_timeout(d, pod));
        return;
    }
    // Elastic: a pod that waits for capacity ends nothing while enough others train.
    let timeout = if elastic_quorum(d) {
        0
    } else {
        d.o.spec.startup_timeout_seconds
    };
    let deadline = startup_clock(d, pod)
        .filter(|_| timeout > 0)
        .map(|c| c + SignedDuration::from_secs(timeout));
    let mut f = failure(d, pod.node_rank, Some(&pod.name), reason, said.clone());
    f.at = pod.created;
    f.killed = true;
    f.permanent = cause.is_some_and(|c| !c.restart_can_help());
    if cause == Some(WaitCause::InvalidImageName) {
        census.failures.push(f);
    } else if deadline.is_some_and(|at| d.now() >= at) {
        f.info.message = format!("not running {timeout}s after its creation: {said}");
        census.failures.push(f);
    } else {
        if let Some(at) = deadline {
            d.requeue_at(at);
        }
        if cause.is_some_and(WaitCause::is_problem) {
            f.permanent = false;
            f.suspect = true;
            census.suspects.push(f);
        }
    }
}

/// When the start-up clock of `pod` (no longer held) started: its creation, or the
/// attempt's admission by its queue when that came later (a queue may hold pods for hours):
/// when Queued turned False, or now if it is still True (the admission is being seen now).
fn startup_clock(d: &Draft<'_, '_>, pod: &PodView) -> Option<Timestamp> {
    let admitted = d
        .status
        .condition(condition::QUEUED)
        .map(|c| match c.status.as_str() {
            "True" => d.now(),
            _ => c.last_transition_time.0,
        });
    match (pod.created, admitted) {
        (Some(created), Some(at)) => Some(created.max(at)),
        (created, _) => created,
    }
}

/// A pod held past spec.scheduling.queueTimeoutSeconds: the job fails (a new attempt would
/// queue again); within it, when to look again.
fn queue_timeout(d: &mut Draft<'_, '_>, pod: &PodView) -> Option<Failure> {
    let timeout = d.o.spec.scheduling.queue_timeout_seconds.unwrap_or(0);
    let created = pod.created.filter(|_| timeout > 0)?;
    let at = created + SignedDuration::from_secs(timeout);
    if d.now() < at {
        d.requeue_at(at);
        return None;
    }
    let message =
        format!("still queued {timeout}s after its creation (spec.scheduling.queueTimeoutSeconds)");
    let mut f = failure(
        d,
        pod.node_rank,
        Some(&pod.name),
        reason::QUEUE_TIMEOUT,
        message,
    );
    f.at = Some(at);
    f.permanent = true;
    Some(f)
}

/// status.replicas, runningReplicas and succeededReplicas: the current attempt's pods.
pub(super) fn count_replicas(d: &mut Draft<'_, '_>) {
    let replicas = d.o.spec.pod_count();
    let pods: Vec<&PodView> = d
        .current_pods()
        .filter(|p| p.node_rank < replicas)
        .collect();
    d.status.replicas = pods.len() as i32;
    d.status.running_replicas = pods
        .iter()
        .filter(|p| p.state == PodState::Running && p.deleting_since.is_none())
        .count() as i32;
    d.status.succeeded_replicas = pods
        .iter()
        .filter(|p| p.state == PodState::Succeeded)
        .count() as i32;
}

/// Keeps status.placement (and status.departures) to the current attempt and records every
/// pod of it that is bound to a node (a pod seen on another node or with another UID under
/// the same rank replaces the entry). Idempotent: called before deciding and again after,
/// since the decision may start a new attempt.
pub(super) fn record_placement(d: &mut Draft<'_, '_>) {
    let attempt = d.status.attempt;
    let bound: Vec<Placement> = d
        .current_pods()
        .filter_map(|p| {
            Some(Placement {
                node_rank: p.node_rank,
                attempt,
                pod: p.name.clone(),
                uid: p.uid.clone(),
                node: p.node.clone()?,
            })
        })
        .collect();
    d.status.departures.retain(|dep| dep.attempt == attempt);
    let placement = &mut d.status.placement;
    placement.retain(|p| p.attempt == attempt);
    for seen in bound {
        match placement.iter_mut().find(|p| p.node_rank == seen.node_rank) {
            Some(known) => *known = seen,
            None => placement.push(seen),
        }
    }
    placement.sort_by_key(|p| p.node_rank);
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
