//! `spec.podTemplate`: what a job may set on its pods beyond the operator's own choices.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pod-level customisation applied to every pod of the gang.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateOverrides {
    /// Extra labels (the operator's own labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Scheduler to use (for example a gang scheduler such as volcano).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// ServiceAccount the pods run as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets for pulling the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Extra environment variables of the trainer container. The operator's contract variables
    /// (MASTER_ADDR, WORLD_SIZE, FERROTRAIN_*, ...) cannot be overridden.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra volumes of the pods (checkpoint.volumeName and data.volumeName may name one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Extra mounts of the trainer container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Replaces the operator's restricted pod security context (non-root uid 65532, fsGroup
    /// 65532, RuntimeDefault seccomp). The container itself always runs without privilege
    /// escalation, with all capabilities dropped (IPC_LOCK added back with spec.ipcLock) and
    /// a read-only root file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Size limit of /dev/shm (a memory-backed emptyDir; it counts against the memory limit).
    /// Unset: bounded by the pod's memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Quantity>,
    /// Seconds a deleted pod gets to exit. On SIGTERM the trainer's ranks stop at the same
    /// step and rank 0 saves a checkpoint of it before exiting, so allow the time a save takes
    /// (a SIGKILL before it completes is safe: the previous checkpoint stays the resume point).
    /// Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub termination_grace_period_seconds: Option<i64>,
}
