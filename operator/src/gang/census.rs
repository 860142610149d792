//! The census of the current attempt's ranks: which run, which succeeded, which failed, which
//! wait (and why), and where each was placed; then what the attempt's state means.

use std::collections::BTreeMap;

use ferrotrain_api::crd::Placement;
use ferrotrain_api::reason;
use k8s_openapi::jiff::SignedDuration;

use super::decider::{Decider, first_line, signed};
use super::departure;
use super::failure::{Failure, disrupted, root_cause};
use super::observed::{PodState, PodView, Termination, WaitCause};

/// How long an elastic gang's other pods may take to end after node 0's (its launcher waits
/// up to 30 s for the members' goodbyes before it exits, and they exit right after).
const FINISH_GRACE: std::time::Duration = std::time::Duration::from_secs(40);

/// The current attempt's ranks, sorted by what they do.
#[derive(Default)]
struct Census<'o> {
    rank0: Option<&'o PodView>,
    running: i32,
    succeeded: i32,
    /// Failures that end the attempt.
    failures: Vec<Failure>,
    /// Candidate causes of those failures that end nothing on their own.
    suspects: Vec<Failure>,
    /// Pods not running yet.
    waiting: Vec<&'o PodView>,
    /// Ranks whose pod goes or went away and is replaced alone (in-place restarts): the other
    /// pods' launchers wait for it in their next round.
    replacing: Vec<i32>,
    /// Those of them whose pod is gone: its replacement can be created.
    gone: Vec<i32>,
    /// Node 0's pod is among them because its launcher was killed (a failure), not because
    /// the pod was taken away (a disruption).
    node0_failed: bool,
}

impl<'a, 'o> Decider<'a, 'o> {
    /// Starting or Running: look at every rank of the current attempt.
    pub(super) fn evaluate(&mut self) {
        let census = self.census();
        let replicas = self.o.spec.pod_count();
        if census.succeeded == replicas || self.elastic_finished(census.rank0) {
            self.succeed(census.rank0, census.succeeded);
            return;
        }
        if self.elastic() && census.rank0.is_some_and(|p| p.state == PodState::Succeeded) {
            // The gang finished; its other pods are ending by themselves.
            return;
        }
        if let Some(failure) = root_cause(census.failures, census.suspects) {
            self.end_attempt(failure);
            return;
        }
        // Elastic: enough pods run for the gang to train without the others (their launchers
        // decided so after elastic.waitSeconds); the missing ones wait for capacity.
        let trains_without_some = self.elastic_quorum() && !census.replacing.contains(&0);
        if !census.replacing.is_empty() && !trains_without_some {
            self.replace_pods(&census.replacing, census.gone, census.node0_failed);
        } else if census.running + census.succeeded == replicas || trains_without_some {
            if !census.gone.is_empty() {
                self.actions.push(super::decision::Action::Launch {
                    attempt: self.status.attempt,
                    node_ranks: census.gone.clone(),
                });
            }
            self.all_running(census.running + census.succeeded);
            self.track_progress(census.rank0);
            self.requeue_in(self.o.timing.progress_interval);
        } else {
            self.starting(&census.waiting);
        }
    }

    /// Node 0's pod, created before the others (launch.rs), waits for a node: past
    /// startupTimeoutSeconds, or with a wait no retry helps, the attempt ends as any pod's
    /// would. True when it did.
    pub(super) fn node_0_ended_the_attempt(&mut self) -> bool {
        let Some(pod) = self.current_pods().find(|p| p.node_rank == 0) else {
            return false;
        };
        let mut census = Census::default();
        self.check_startup(pod, &mut census);
        let Some(failure) = root_cause(census.failures, Vec::new()) else {
            return false;
        };
        self.end_attempt(failure);
        true
    }

    /// Elastic: node 0's launcher exits 0 only when the gang finished training. Once no
    /// other pod of the attempt runs (the members ended after it, an agent waiting to join
    /// ended with them), or [`FINISH_GRACE`] after node 0's end, training is over: pods never
    /// placed, or still ending, are stopped. Until then it requeues.
    fn elastic_finished(&mut self, rank0: Option<&PodView>) -> bool {
        let Some(rank0) = rank0.filter(|p| self.elastic() && p.state == PodState::Succeeded) else {
            return false;
        };
        let running = self
            .current_pods()
            .any(|p| p.state == PodState::Running && p.deleting_since.is_none());
        let Some(ended) = rank0.ended_at.filter(|_| running) else {
            return true;
        };
        let at = ended + signed(FINISH_GRACE);
        if self.now() >= at {
            return true;
        }
        self.requeue_at(at);
        false
    }

    /// Elastic: the job may train on fewer pods than it asked for.
    pub(super) fn elastic(&self) -> bool {
        self.o.spec.is_elastic()
    }

    /// Elastic: enough of the current attempt's pods run for the gang to train without the
    /// others, node 0's among them (it hosts the rendezvous: nothing trains without it).
    fn elastic_quorum(&self) -> bool {
        let running = |p: &&PodView| p.state == PodState::Running && p.deleting_since.is_none();
        let pods: Vec<&PodView> = self.current_pods().filter(running).collect();
        self.elastic()
            && pods.iter().any(|p| p.node_rank == 0)
            && pods.len() as i32 >= self.o.spec.min_replicas()
    }

    /// Sorts the current attempt's ranks into running, succeeded, failed and waiting.
    fn census(&mut self) -> Census<'o> {
        let replicas = self.o.spec.pod_count();
        let by_rank: BTreeMap<i32, &'o PodView> = self
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
                if self.replaceable() {
                    census.replacing.push(rank);
                    census.gone.push(rank);
                    continue;
                }
                let mut f = self.failure(rank, None, reason::POD_DELETED, "pod was deleted".into());
                f.killed = true;
                census.failures.push(f);
                continue;
            };
            match &pod.state {
                PodState::Succeeded => census.succeeded += 1,
                // Deleted, its launcher ended by the signal: it goes away, not fails.
                PodState::Failed(t) if self.leaving(pod, t) => {
                    self.depart(pod);
                    census.replacing.push(rank);
                }
                // Evicted by its kubelet (node pressure, a storage limit, node shutdown): a
                // disruption, replaced alone as a deleted pod is, once deleted (the kubelet
                // leaves it failed; its replacement takes its name).
                PodState::Failed(t) if self.evicted(pod, t) => {
                    self.depart(pod);
                    self.actions
                        .push(super::decision::Action::DeletePod(pod.name.clone()));
                    census.replacing.push(rank);
                }
                PodState::Failed(t) if self.launcher_killed(pod, t) => {
                    // Deleted first: its replacement takes its name.
                    self.actions
                        .push(super::decision::Action::DeletePod(pod.name.clone()));
                    census.replacing.push(rank);
                    census.node0_failed |= rank == 0;
                }
                PodState::Failed(t) => census.failures.push(self.exited(pod, t)),
                PodState::Running | PodState::Pending => self.check_alive(pod, &mut census),
            }
        }
        census
    }

    /// A pod being deleted that in-place restarts replace alone: on a lost node too (the
    /// taint manager evicts its pods) when its launcher is fenced.
    fn going_away(&self, pod: &PodView) -> bool {
        let fenced = match pod.node_lost_since {
            None => self.replaceable(),
            Some(_) => self.fenced_when_lost(pod),
        };
        pod.deleting_since.is_some() && fenced
    }

    /// A pod [going away](Self::going_away) whose launcher the deletion's signal ended (exit
    /// code 128 + n, or none): replaced alone like one still terminating. A pod that exited
    /// with its own error is a failure all the same.
    fn leaving(&self, pod: &PodView, t: &Termination) -> bool {
        self.going_away(pod) && t.exit_code.is_none_or(|c| c >= 128)
    }

    /// A pod its kubelet failed for a disruption (`Evicted`: node pressure, an
    /// ephemeral-storage or emptyDir limit; `Terminated`: graceful node shutdown), its
    /// launcher ended by the kubelet's signal or never started: in place it is replaced
    /// alone like a deleted pod, and spends no restart.
    fn evicted(&self, pod: &PodView, t: &Termination) -> bool {
        self.replaceable()
            && pod.disruption.is_some()
            && pod.deleting_since.is_none()
            && pod.node_lost_since.is_none()
            && t.exit_code.is_none_or(|c| c >= 128)
    }

    /// Remembers that `pod` departed for a disruption, for the end of the round it ended
    /// ([`departure`]).
    fn depart(&mut self, pod: &PodView) {
        let Some(new) = departure::of(pod, self.now()) else {
            return;
        };
        let attempt = i64::from(self.status.attempt);
        let counted_until = self.status.recovery.as_ref().and_then(|r| {
            r.attempts
                .iter()
                .filter(|a| a.attempt == attempt)
                .filter_map(|a| a.end.as_ref().map(|e| e.detected_at))
                .max()
        });
        departure::record(&mut self.status.departures, new, counted_until);
    }

    /// A pod whose launcher was killed (SIGKILL, the OOM killer: its container exited with a
    /// signal's code), not for a lost node, a deletion or a disruption: in place, it is
    /// replaced alone like a deleted one, while restarts are left (its rank's failure ended
    /// the round the others are in; their launchers take the replacement into the next). A
    /// launcher that exits by itself (a permanent code, restarts spent) fails the attempt.
    fn launcher_killed(&self, pod: &PodView, t: &Termination) -> bool {
        let killed = t.exit_code.is_some_and(|c| c >= 128) || t.reason == "OOMKilled";
        killed
            && self.replaceable()
            && pod.deleting_since.is_none()
            && pod.node_lost_since.is_none()
            && pod.disruption.is_none()
            && self.budget().allows_another()
    }

    /// A pod that runs or waits: deleted, on a lost node, or not starting in time?
    fn check_alive(&mut self, pod: &'o PodView, census: &mut Census<'o>) {
        let rank = pod.node_rank;
        if pod.state == PodState::Running {
            census.running += 1;
        }
        if self.going_away(pod) {
            self.depart(pod);
            census.replacing.push(rank);
        } else if let Some(since) = pod.deleting_since {
            let message = "pod is being deleted".to_string();
            let mut f = self.failure(rank, Some(&pod.name), reason::POD_DELETED, message);
            (f.at, f.killed) = (Some(since), true);
            if let Some(d) = &pod.disruption {
                disrupted(&mut f, d);
            }
            census.failures.push(f);
        } else if let Some(since) = pod.node_lost_since {
            let message = "the pod's node is NotReady or gone".to_string();
            let mut f = self.failure(rank, Some(&pod.name), reason::NODE_LOST, message);
            (f.at, f.killed) = (Some(since), true);
            let at = since + signed(self.o.timing.node_lost_grace);
            if self.now() >= at && self.fenced_when_lost(pod) {
                // The others wait for it (elastic: train on without it); it is force-deleted
                // at once, its launcher being fenced (a graceful delete waited for a kubelet
                // that does not answer: one reconcile and one request more per lost pod, 8.6 s
                // of a 400-pod loss on the fleet bench), and created again where it fits.
                self.actions
                    .push(super::decision::Action::ForceDeletePod(pod.name.clone()));
                let grace = self.o.timing.node_lost_grace.as_secs();
                let note = format!(
                    "pod {}'s node has been NotReady or gone for {grace}s; force-deleted (its \
                     launcher is fenced) and created again where it fits",
                    pod.name
                );
                self.event(true, reason::FORCE_DELETED, note);
                census.replacing.push(rank);
            } else if self.now() >= at {
                census.failures.push(f);
            } else {
                self.requeue_at(at);
                f.suspect = true;
                census.suspects.push(f);
            }
        } else if pod.state == PodState::Pending {
            census.waiting.push(pod);
            self.check_startup(pod, census);
        }
    }

    /// A pod not running yet: past `startupTimeoutSeconds` (or with an image name no retry
    /// parses) it ends the attempt with its own reason; before that, a pod that says why it
    /// waits is a suspect should another rank fail meanwhile.
    fn check_startup(&mut self, pod: &PodView, census: &mut Census<'o>) {
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
            // A queue holds it: no start-up clock runs, only the optional queue timeout.
            census.failures.extend(self.queue_timeout(pod));
            return;
        }
        // Elastic: a pod that waits for capacity ends nothing while enough others train.
        let timeout = if self.elastic_quorum() {
            0
        } else {
            self.o.spec.startup_timeout_seconds
        };
        let deadline = self
            .startup_clock(pod)
            .filter(|_| timeout > 0)
            .map(|c| c + SignedDuration::from_secs(timeout));
        let mut f = self.failure(pod.node_rank, Some(&pod.name), reason, said.clone());
        f.at = pod.created;
        f.killed = true;
        f.permanent = cause.is_some_and(|c| !c.restart_can_help());
        if cause == Some(WaitCause::InvalidImageName) {
            census.failures.push(f);
        } else if deadline.is_some_and(|at| self.now() >= at) {
            f.info.message = format!("not running {timeout}s after its creation: {said}");
            census.failures.push(f);
        } else {
            if let Some(at) = deadline {
                self.requeue_at(at);
            }
            if cause.is_some_and(WaitCause::is_problem) {
                f.permanent = false;
                f.suspect = true;
                census.suspects.push(f);
            }
        }
    }

    /// status.replicas, runningReplicas and succeededReplicas: the current attempt's pods.
    pub(super) fn count_replicas(&mut self) {
        let replicas = self.o.spec.pod_count();
        let pods: Vec<&PodView> = self
            .current_pods()
            .filter(|p| p.node_rank < replicas)
            .collect();
        self.status.replicas = pods.len() as i32;
        self.status.running_replicas = pods
            .iter()
            .filter(|p| p.state == PodState::Running && p.deleting_since.is_none())
            .count() as i32;
        self.status.succeeded_replicas = pods
            .iter()
            .filter(|p| p.state == PodState::Succeeded)
            .count() as i32;
    }

    /// Keeps status.placement to the current attempt and records every pod of it that is
    /// bound to a node (a pod seen on another node or with another UID under the same rank
    /// replaces the entry). Idempotent: called before deciding and again after, since the
    /// decision may start a new attempt.
    pub(super) fn record_placement(&mut self) {
        let attempt = self.status.attempt;
        let bound: Vec<Placement> = self
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
        self.status.departures.retain(|d| d.attempt == attempt);
        let placement = &mut self.status.placement;
        placement.retain(|p| p.attempt == attempt);
        for seen in bound {
            match placement.iter_mut().find(|p| p.node_rank == seen.node_rank) {
                Some(known) => *known = seen,
                None => placement.push(seen),
            }
        }
        placement.sort_by_key(|p| p.node_rank);
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

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
