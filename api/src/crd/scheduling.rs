//! `spec.scheduling`: how the gang is scheduled all-or-nothing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who schedules a gang all-or-nothing.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GangScheduler {
    /// Kubernetes' own workload-aware scheduling: a PodGroup per attempt
    /// (scheduling.k8s.io/v1alpha2, Kubernetes 1.36 with GenericWorkload and GangScheduling;
    /// or the v1alpha1 Workload of 1.35), found by discovery.
    Kubernetes,
    /// Kueue's plain pod groups: the pods carry the queue and group labels; Kueue admits
    /// the group as one unit.
    Kueue,
    /// Volcano: a scheduling.volcano.sh PodGroup and schedulerName volcano.
    Volcano,
    /// scheduler-plugins' Coscheduling: a scheduling.x-k8s.io PodGroup.
    Coscheduling,
    /// Pods are scheduled one by one.
    None,
}

/// How the gang is scheduled (docs/scheduling.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// kubernetes, kueue, volcano, coscheduling or none. Unset: kueue when the job names a
    /// queue, else kubernetes where the API server serves the native API, else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_scheduler: Option<GangScheduler>,
    /// A node label key (a rack, a zone: `topology.kubernetes.io/zone`): every pod of the gang
    /// in one domain of it (kubernetes; needs TopologyAwareWorkloadScheduling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub topology_key: Option<String>,
    /// The scheduler of volcano and coscheduling gangs (default `volcano` and
    /// `scheduler-plugins-scheduler`; podTemplate.schedulerName wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// How long an attempt may stay Queued (its pods held by scheduling gates) before the job
    /// Fails with QueueTimeout. Unset or 0: as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub queue_timeout_seconds: Option<i64>,
}
