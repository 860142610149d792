//! The observed state: phase, conditions, failures, placement, progress and recovery.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::progress::Progress;

/// Where the job is in its life cycle.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The current attempt's pods are being created.
    #[default]
    Pending,
    /// All pods of the attempt exist; some are not running yet (scheduling, pulling, ...).
    Starting,
    /// The attempt's pods wait for a queue to admit them (held by scheduling gates, e.g.
    /// Kueue's): nothing is wrong and the start-up timeout does not run.
    Queued,
    /// Every pod of the attempt runs.
    Running,
    /// A rank failed: the attempt's pods are being deleted and the next attempt waits out the
    /// backoff.
    Restarting,
    /// spec.suspend is true: no pods.
    Suspended,
    /// Every rank exited 0.
    Succeeded,
    /// A permanent failure, maxRestarts exhausted or activeDeadlineSeconds passed.
    Failed,
}

impl Phase {
    /// All phases, in life-cycle order.
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::Starting,
        Phase::Queued,
        Phase::Running,
        Phase::Restarting,
        Phase::Suspended,
        Phase::Succeeded,
        Phase::Failed,
    ];

    /// The name shown in `status.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Starting => "Starting",
            Phase::Queued => "Queued",
            Phase::Running => "Running",
            Phase::Restarting => "Restarting",
            Phase::Suspended => "Suspended",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    /// Succeeded or Failed: nothing runs any more.
    pub fn is_finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rank's failure: what the status keeps of the last one.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailureInfo {
    /// Attempt the failure ended.
    pub attempt: i32,
    /// Node rank (pod index) that failed first, when a pod is to blame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<i32>,
    /// The global rank the launchers blamed for an in-place restart (one of the pod's
    /// procsPerReplica ranks), when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<i32>,
    /// The pod that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The trainer container's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The node the failed pod ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Machine-readable cause: of an in-place restart Killed, Frozen, Unresponsive,
    /// AgentLost, PodLeaving or ExitCode; of a gang restart ExitCode, PermanentExitCode,
    /// PodDeleted, PodFailed, NodeLost, Disrupted (eviction, preemption, drain, node
    /// shutdown), Stalled, DeadlineExceeded, InvalidSpec, or why a pod did not start:
    /// Unschedulable, ImagePullBackOff, InvalidImageName, CreateContainerConfigError,
    /// ContainerCreating, StartupTimeout (docs/reasons.md).
    pub reason: String,
    /// Human-readable detail: the rank's termination message when it wrote one.
    #[serde(default)]
    pub message: String,
    /// The blamed rank's last lines of output (at most 10) for an in-place restart: why its
    /// round ended, kept after the round was replaced (`kubectl ferrotrain logs` has the rest
    /// while the pod lives).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub last_lines: Vec<String>,
    /// When the operator saw it.
    pub time: Time,
    /// Other pods of the attempt that failed after this one (usually because this one's
    /// failure broke their collective).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub secondary_failures: i32,
}

/// Where one pod of the current attempt was placed (status.placement).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The pod's node rank.
    pub node_rank: i32,
    /// The attempt the pod belongs to.
    pub attempt: i32,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The node the scheduler bound the pod to.
    pub node: String,
}

/// A pod taken away by a disruption, waiting for its round's end to be counted
/// (status.departures).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Departure {
    /// The attempt of the pod.
    pub attempt: i32,
    /// The pod's node rank.
    pub node_rank: i32,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID (a replacement has another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The disruption's reason as Kubernetes gave it: the failed pod's (Evicted, Terminated,
    /// Preempting, NodeShutdown) or its DisruptionTarget condition's (EvictionByEvictionAPI,
    /// PreemptionByScheduler, DeletionByTaintManager, TerminationByKubelet).
    pub reason: String,
    /// Kubernetes' message (the kubelet's: which resource ran low, which limit was passed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the operator first saw it.
    pub seen_at: Time,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Training progress as reported by rank 0's /progress, with the operator's derived values.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingProgress {
    /// The trainer's report, rates rounded to 3 significant digits.
    #[serde(flatten)]
    pub report: Progress,
    /// etaSeconds for humans (for example 2h05m): the time left until training ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    /// When training should end: etaSeconds after the operator stored the report (updatedAt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_completion_time: Option<Time>,
    /// When the operator last saw the report change (the stall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
}

/// Observed state of a DistributedTraining.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DistributedTrainingStatus {
    /// Where the job is in its life cycle: Pending (the attempt's pods are being created),
    /// Starting (they exist, some do not run yet), Queued (a queue has not admitted them),
    /// Running, Restarting (a gang restart waits out its backoff), Suspended, Succeeded or
    /// Failed.
    #[serde(default)]
    pub phase: Phase,
    /// Created, Running, Restarting, Stalled, Succeeded, Failed, Suspended, ProgressAvailable,
    /// GangScheduling, Queued, Resized.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The generation of the spec this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The current attempt: pods are named `<job>-<attempt>-<nodeRank>`. A gang restart
    /// (every pod created again) and a resume start a new attempt; an in-place restart does
    /// not: its ranks restart in the same pods, in the next `round` of the attempt.
    #[serde(default)]
    pub attempt: i32,
    /// Restarts after failures so far, gang restarts and in-place restarts alike (bounded by
    /// restartPolicy.maxRestarts). Disruptions (eviction, preemption, drain) restart the gang
    /// without counting here.
    #[serde(default)]
    pub restarts: i32,
    /// Ranks training now, when not the number asked for (replicas x procsPerReplica): fewer
    /// (elastic.minReplicas: pods lost or not placed yet) or more (elastic.maxReplicas: pods
    /// beyond replicas that found a place); absent when the gang asked for trains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_world_size: Option<i32>,
    /// The in-place round of the current attempt: 0 until its ranks first restart in place
    /// (restartPolicy.inPlace), then 1, 2, ...; back to 0 with every new attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: i32,
    /// Every gang restart by its cause (lastFailure.reason: ExitCode, NodeLost, Disrupted,
    /// Unschedulable, ...), including the disruptions that restarts does not count.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub restarts_by_cause: BTreeMap<String, i32>,
    /// The most recent failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureInfo>,
    /// When the job started (or last resumed); activeDeadlineSeconds counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Pods of the current attempt that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Pods of the current attempt whose trainer runs.
    #[serde(default)]
    pub running_replicas: i32,
    /// Pods of the current attempt that exited 0.
    #[serde(default)]
    pub succeeded_replicas: i32,
    /// Training progress (absent for images without /progress). Rates and ETA belong to the
    /// attempt that reported them: they are cleared when it ends (restart, suspend, failure)
    /// and return with the next attempt's first report; step, losses and lastCheckpoint stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<TrainingProgress>,
    /// Where each pod of the current attempt runs: its node rank, pod, UID and node, recorded
    /// when the operator first sees the pod bound to a node and kept after the pod is gone, so
    /// that a failure names the node even when the pod vanished before the operator saw it
    /// terminate (and after an operator restart or a change of leader). Cleared when a new
    /// attempt starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["nodeRank"]))]
    pub placement: Vec<Placement>,
    /// Pods of the current attempt taken away by a disruption (the kubelet's eviction or
    /// node shutdown, the Eviction API, a preemption, a drain) and replaced alone, as the
    /// operator saw them: the end of the round each one ended is recorded with this cause
    /// (reason `Disrupted`, the disruption's own reason and message) and spends no restart,
    /// whatever the launchers could tell. Kept until that round is counted; cleared when a new
    /// attempt starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub departures: Vec<Departure>,
    /// Recovery accounting: the last 10 attempts (why and when each ended, when the operator
    /// saw it, time to the next attempt's first step, steps resumed from and lost) and over
    /// the whole job the wall time, productive training time and goodput (docs/observability.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<crate::Recovery>,
}

impl DistributedTrainingStatus {
    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// True when the condition of `type_` has status "True".
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// status.phase's description names every phase (it once left Queued out).
    #[test]
    fn the_phase_description_names_every_phase() {
        let schema =
            serde_json::to_value(schemars::schema_for!(DistributedTrainingStatus)).unwrap();
        let description = schema["properties"]["phase"]["description"]
            .as_str()
            .unwrap();
        for phase in Phase::ALL {
            assert!(
                description.contains(phase.as_str()),
                "{phase} is not in {description:?}"
            );
        }
    }
}
