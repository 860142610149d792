//! `spec.restartPolicy` and `spec.elastic`: how failures are retried, and on how few pods.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults;

/// How gang restarts are bounded and paced.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.maxBackoffSeconds >= self.backoffSeconds",
        "message": "spec.restartPolicy.maxBackoffSeconds must be at least spec.restartPolicy.backoffSeconds",
        "fieldPath": ".maxBackoffSeconds"
    }
]))]
pub struct RestartPolicy {
    /// Restarts allowed before the job Fails, in place or of the whole gang; a disruption
    /// spends none (an eviction, a preemption, a drain, and in place any pod taken away). 0
    /// fails on the first retryable failure.
    #[serde(default = "defaults::max_restarts")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_restarts: i32,
    /// Wait before a gang restart; doubles with each failure in a row up to
    /// maxBackoffSeconds. The count starts again after an attempt that saved a checkpoint of
    /// its own, or an in-place round that trained a step (the next round starts from the
    /// state it left): a job that was training well before it failed waits only
    /// backoffSeconds, and one that keeps failing before it keeps anything waits longer each
    /// time. In-place restarts wait nothing after such a failure, then this, doubling.
    #[serde(default = "defaults::backoff_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub backoff_seconds: i64,
    /// Upper bound of the restart backoff.
    #[serde(default = "defaults::max_backoff_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub max_backoff_seconds: i64,
    /// After a retryable failure of a trainer process whose pod stays (a crash, a kill, an OOM kill
    /// inside the container, a hang), restart every pod's ranks in place as a new round of the same
    /// attempt, from the last step the gang completed (the surviving ranks hand it over): the pods,
    /// their nodes and GPUs are kept, and the next step comes seconds later. Counted against
    /// maxRestarts like a gang restart. A pod that goes away (deleted, evicted, its launcher
    /// killed) is created again alone and joins the others' next round (one taken away spends no
    /// restart), and so is one whose node is lost (node rank 0's restarts the gang): the launchers
    /// notice a pod cut off from them (a network partition, a frozen node) by its missing
    /// heartbeats within heartbeatTimeoutSeconds, long before Kubernetes calls its node NotReady,
    /// and train on without it (`elastic`) or wait for its replacement; back from a partition, a
    /// replaced pod leaves the gang. A job of one pod restarts its ranks in place too (any rank's
    /// crash: the others hand over their state); only when its one pod goes away does it start
    /// again from the latest checkpoint. Needs ferrotrain's own launcher (no custom `command`);
    /// false restarts the whole gang on every failure. A few seconds into each
    /// round every pod starts a spare trainer per rank that waits, libtorch loaded, to be the next
    /// round's rank (about 120 MB of memory each, within the pod's limit; env
    /// FERROTRAIN_SPARE_RANKS=false in podTemplate.env turns them off).
    #[serde(default = "defaults::in_place")]
    pub in_place: bool,
    /// In-place restarts: a pod whose launcher sends node rank 0's no heartbeat (one a second)
    /// for this long is cut off: the round ends without it, and a launcher whose heartbeats
    /// do not get through for this long stops its own ranks. Lower detects a partition
    /// sooner; keep it above the longest pause a busy node's launcher may take.
    #[serde(default = "defaults::heartbeat_timeout_seconds")]
    #[schemars(range(min = 2, max = 600))]
    pub heartbeat_timeout_seconds: i64,
    /// Container exit codes that no restart can fix: the job Fails with the rank's termination
    /// message. Default: 2 (invalid config), 3 (invalid data), 4 (incompatible checkpoint).
    #[serde(default = "defaults::permanent_exit_codes")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub permanent_exit_codes: Vec<i32>,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: defaults::max_restarts(),
            backoff_seconds: defaults::backoff_seconds(),
            max_backoff_seconds: defaults::max_backoff_seconds(),
            in_place: defaults::in_place(),
            heartbeat_timeout_seconds: defaults::heartbeat_timeout_seconds(),
            permanent_exit_codes: defaults::permanent_exit_codes(),
        }
    }
}

/// Elastic world size.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ElasticSpec {
    /// The fewest pods the job trains on (and, with a gang scheduler, the group's minimum:
    /// the job starts once this many fit). A pod known to be gone (deleted, evicted, its
    /// launcher killed, cut off) is left out at once, and one that does not come to a round
    /// after waitSeconds: the others train on (each covering the missing ranks' shards
    /// of the same global batch, so the loss curve does not change) until it is back, and the
    /// gang grows again at once. Default: replicas (not elastic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub min_replicas: Option<i32>,
    /// The most pods the job trains on: above `replicas` (the size asked for), the job
    /// creates pods up to this many, and those that find a place join at the next round
    /// (those that do not wait without a start-up timeout and end with the job). The global
    /// batch stays the one of `replicas` pods: each step's batch is cut into shards for
    /// maxReplicas pods' ranks, each rank computing its share, so more pods make steps
    /// faster, not larger, and the loss curve stays the same. Default: replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_replicas: Option<i32>,
    /// How long the others wait for a pod that does not come to a round before they train on
    /// without it (one known to be gone is not waited for).
    #[serde(default = "defaults::elastic_wait_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub wait_seconds: i64,
    /// The PriorityClass of the pods beyond minReplicas (node ranks minReplicas and up). A
    /// class below the job's makes them the scheduler's first victims when a higher-priority
    /// pod needs room, so preemption shrinks the gang (no step lost) instead of taking a pod
    /// it cannot train without (node 0's, which hosts the rendezvous, or another of the first
    /// minReplicas); they are also placed after those. Default: the job's own
    /// (podTemplate.priorityClassName). Kueue, Volcano and Coscheduling judge a group by one
    /// priority: leave it unset with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub surplus_priority_class_name: Option<String>,
}
