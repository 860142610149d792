//! `spec.checkpoint` and `spec.data`: the volumes checkpoints and the dataset live on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults;

/// Where checkpoints live, only: when to save and which to keep (everySteps, everySeconds,
/// keepLatest, keepBest) is trainer.checkpoint, its one home.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.claimName) && has(self.volumeName))",
        "message": "set at most one of spec.checkpoint.claimName and spec.checkpoint.volumeName"
    }
]))]
pub struct CheckpointSpec {
    /// A PersistentVolumeClaim to write checkpoints to. Only the node-rank-0 pod mounts it (rank 0
    /// alone reads and writes checkpoints; the other pods get an emptyDir at mountPath), so a
    /// ReadWriteOnce claim works. With a custom command every pod mounts it (use ReadWriteMany
    /// for more than one node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// Or: the name of a volume in podTemplate.volumes (any volume source: nfs, csi, ...).
    /// Mounted like claimName: by the node-rank-0 pod only, unless command is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub volume_name: Option<String>,
    /// Where the volume is mounted (FERROTRAIN_CHECKPOINT_DIR); checkpoints go to
    /// `<mountPath>/<job name>/step-<step>/`.
    #[serde(default = "defaults::checkpoint_mount_path")]
    #[schemars(length(min = 2), regex(pattern = r"^/"))]
    pub mount_path: String,
    /// The Secret with the credentials of `trainer.checkpoint.store`'s bucket: keys
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN if the credentials
    /// are temporary), given to the pod that writes checkpoints. Without a claim or volume,
    /// that pod's checkpoint directory is an emptyDir: a local cache of the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub store_secret_name: Option<String>,
}

/// The keys of `spec.checkpoint.storeSecretName`'s Secret (the pod's variables of the same
/// names).
pub use crate::env::{STORE_SECRET_KEYS, STORE_SECRET_SESSION_KEY};

/// The volume holding the dataset.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.claimName) != has(self.volumeName)",
        "message": "set exactly one of spec.data.claimName and spec.data.volumeName"
    }
]))]
pub struct DataSpec {
    /// A PersistentVolumeClaim holding the dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// Or: the name of a volume in podTemplate.volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub volume_name: Option<String>,
    /// Where the volume is mounted; also the trainer's working directory.
    #[serde(default = "defaults::data_mount_path")]
    #[schemars(length(min = 2), regex(pattern = r"^/"))]
    pub mount_path: String,
    /// Mount read-only (default true).
    #[serde(default = "defaults::yes")]
    pub read_only: bool,
}
