//! The resource itself: its group, version and kind, and the spec a user writes.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults;
use super::network::NetworkPolicySpec;
use super::pod_template::PodTemplateOverrides;
use super::restart::{ElasticSpec, RestartPolicy};
use super::scheduling::SchedulingSpec;
use super::status::DistributedTrainingStatus;
use super::storage::{CheckpointSpec, DataSpec};
use crate::config::TrainerConfig;

/// API group of the resource.
pub const GROUP: &str = "ferrotrain.dev";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Longest object name: pods are named `<name>-<attempt>-<nodeRank>` and must stay a DNS label
/// (63 characters) for their hostname.
pub const MAX_NAME_LENGTH: usize = 47;

/// A data-parallel training job: `replicas` pods, each running `procsPerReplica` ranks of the
/// ferrotrain trainer, of your PyTorch script under ferrotrain's launcher (`pytorch`), or of
/// any image following the torchrun environment contract (`command`). When a rank
/// fails, ferrotrain's launcher restarts every rank in place (restartPolicy.inPlace, the
/// default) from the last step the gang completed, which the surviving ranks hand over, and a
/// pod that goes away is replaced alone; other failures, and every failure of a custom
/// `command`, restart the whole gang from the latest checkpoint. The
/// status reports training progress (step, rate, loss, ETA) and what every restart cost.
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "ferrotrain.dev",
    version = "v1alpha1",
    kind = "DistributedTraining",
    plural = "distributedtrainings",
    singular = "distributedtraining",
    shortname = "dt",
    category = "ferrotrain",
    namespaced,
    status = "DistributedTrainingStatus",
    derive = "PartialEq",
    doc = "A data-parallel training job run as a gang of pods: a failed trainer restarts in place in its pods from the last step the gang completed (restartPolicy.inPlace, the default) and a lost pod is replaced alone, else the whole gang restarts from the latest checkpoint; training progress and what each restart cost are in its status.",
    // The JSON form: clippy's duplicated-attribute lint misfires on repeated `type_ = ...`.
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the job is in its life cycle"}"#,
    printcolumn = r#"{"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "description": "Optimizer steps completed"}"#,
    printcolumn = r#"{"name": "Steps/s", "type": "number", "jsonPath": ".status.progress.stepsPerSecond", "description": "Optimizer steps per second"}"#,
    printcolumn = r#"{"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "description": "Recent training loss"}"#,
    printcolumn = r#"{"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta", "description": "Time left until training ends: the steps to maxSteps at the current rate and the evaluations to come, within maxSeconds"}"#,
    printcolumn = r#"{"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Restarts so far, in place or of the whole gang (disruptions not counted)"}"#,
    printcolumn = r#"{"name": "Goodput", "type": "number", "jsonPath": ".status.recovery.goodputPercent", "description": "Percent of wall time spent on training steps that were kept", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.trainer) || has(self.command) || has(self.pytorch)",
        "message": "spec.trainer is required unless spec.pytorch or spec.command runs your own training program",
        "fieldPath": ".trainer"
    },
    {
        "rule": "!has(self.pytorch) || (!has(self.command) && !has(self.args) && !has(self.trainer))",
        "message": "spec.pytorch excludes spec.command, spec.args and spec.trainer: it runs your command (spec.pytorch.command, with its arguments) under ferrotrain's launcher, which spec.command would replace",
        "fieldPath": ".pytorch"
    },
    {
        "rule": "!has(self.pytorch) || has(self.image)",
        "message": "spec.pytorch needs spec.image: an image with Python, torch and ferrotrain-launch (for example ferrotrain/pytorch, scripts/images.sh)",
        "fieldPath": ".image"
    },
    {
        "rule": "!has(self.procsPerReplica) || self.gpusPerReplica == 0 || self.procsPerReplica <= self.gpusPerReplica",
        "message": "spec.procsPerReplica must not exceed spec.gpusPerReplica on GPU pods (one rank per GPU at most)",
        "fieldPath": ".procsPerReplica"
    },
    {
        "rule": "!has(self.elastic) || !has(self.elastic.minReplicas) || self.elastic.minReplicas <= self.replicas",
        "message": "spec.elastic.minReplicas must not exceed spec.replicas",
        "fieldPath": ".elastic.minReplicas"
    },
    {
        "rule": "!has(self.elastic) || !has(self.elastic.maxReplicas) || self.elastic.maxReplicas >= self.replicas",
        "message": "spec.elastic.maxReplicas must be at least spec.replicas",
        "fieldPath": ".elastic.maxReplicas"
    },
    {
        "rule": "!has(self.checkpoint) || !has(self.checkpoint.storeSecretName) || (has(self.trainer) && has(self.trainer.checkpoint) && has(self.trainer.checkpoint.store))",
        "message": "spec.checkpoint.storeSecretName needs spec.trainer.checkpoint.store: the bucket its credentials are for",
        "fieldPath": ".checkpoint.storeSecretName"
    }
]))]
pub struct DistributedTrainingSpec {
    /// Number of pods (nodes) in the gang. Each pod runs `procsPerReplica` ranks, so the world
    /// size is replicas * procsPerReplica.
    #[schemars(range(min = 1, max = 4096))]
    pub replicas: i32,

    /// Ranks (processes) per pod. Defaults to gpusPerReplica on GPU pods, 1 on CPU pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub procs_per_replica: Option<i32>,

    /// GPUs (nvidia.com/gpu) requested by each pod; 0 trains on CPU.
    #[serde(default)]
    #[schemars(range(min = 0, max = 64))]
    pub gpus_per_replica: i32,

    /// Give the trainer container the IPC_LOCK capability, the one capability a job may add:
    /// RDMA (InfiniBand, RoCE, AWS EFA) pins its buffers in memory. Request the network's
    /// devices in resources (rdma/..., vpc.amazonaws.com/efa) and see docs/gpu.md. Pod
    /// Security `restricted` refuses such pods; `baseline` admits them.
    #[serde(default)]
    pub ipc_lock: bool,

    /// CPU and memory requests/limits of each pod's trainer container. GPUs are added from
    /// gpusPerReplica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Container image. Defaults to the operator's trainer image (--trainer-image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,

    /// Image pull policy of the trainer container: Always, IfNotPresent or Never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Entrypoint override for a bring-your-own image (for example
    /// ["torchrun", "train.py"]). Default: `ferrotrain launch` (restarting its ranks in place
    /// with restartPolicy.inPlace, else never). The container gets the same environment
    /// contract (MASTER_ADDR, WORLD_SIZE, PET_*, ...) either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub command: Option<Vec<String>>,

    /// Arguments appended to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,

    /// Your own PyTorch script, run by ferrotrain's launcher (`ferrotrain-launch`, which
    /// `image` must carry) as every rank with torchrun's environment: in-place restarts from
    /// warm spares, the gang's /progress and /metrics, the same restart budget, ledger and
    /// events as ferrotrain's trainer (docs/pytorch.md). Excludes `command`, `args` and
    /// `trainer`; needs `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<PyTorchSpec>,

    /// Pod-level customisation: labels, annotations, scheduling, extra env and volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateOverrides>,

    /// The trainer configuration (task, model, data, batch, optimizer, schedule, precision,
    /// maxSteps, eval, seed), mounted into every pod as the file FERROTRAIN_CONFIG. Optional only
    /// with a custom `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerConfig>,

    /// Where checkpoints are written; when to save and which to keep is trainer.checkpoint.
    /// Without a volume checkpoints go to a pod-local emptyDir and a gang restart starts from
    /// scratch. Only the node-rank-0 pod mounts the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,

    /// The volume holding the dataset; the trainer's working directory, so relative paths in
    /// trainer.data resolve against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSpec>,

    /// How gang restarts are bounded and paced.
    #[serde(default)]
    pub restart_policy: RestartPolicy,

    /// Elastic world size: train on with fewer pods when some are lost and cannot be placed
    /// again (docs/elastic.md). Needs in-place restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticSpec>,

    /// How the gang is scheduled all-or-nothing (docs/scheduling.md).
    #[serde(default)]
    pub scheduling: SchedulingSpec,

    /// Who may reach the gang's pods: a NetworkPolicy per job, on by default, and the pods'
    /// listening ports pinned to a declared range (docs/security.md).
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

    /// The Kueue LocalQueue that admits the job (as the `kueue.x-k8s.io/queue-name` label
    /// of the job does): the pods carry it and wait, Queued, until Kueue admits the gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub queue_name: Option<String>,

    /// True stops the job: its pods are deleted and none are created until it is set back to
    /// false, which starts a new attempt from the latest checkpoint (Kueue's convention).
    #[serde(default)]
    pub suspend: bool,

    /// Delete the object (and its pods) this many seconds after it Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Fail the job when it has been running (since it started or last resumed) this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,

    /// When the trainer's reported progress (step or phase) does not change for this many
    /// seconds while all pods run, the job is marked Stalled and the gang restarted. 0 disables
    /// stall detection (it also never fires for images without a /progress endpoint).
    #[serde(default = "defaults::stall_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub stall_timeout_seconds: i64,

    /// Seconds each pod of an attempt may take from its creation to a running trainer
    /// (scheduling, image pull, volume attach). A pod still not running then ends the attempt
    /// with its own reason: a gang restart when a restart can help (Unschedulable, a volume
    /// that does not attach), phase Failed when it cannot (the image cannot be pulled, a
    /// missing ConfigMap or Secret). 0 waits forever; the reason is shown in the Running
    /// condition either way.
    #[serde(default = "defaults::startup_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub startup_timeout_seconds: i64,
}

/// A PyTorch script run by ferrotrain's launcher (spec.pytorch).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchSpec {
    /// The command every rank runs, with its arguments, as torchrun would run it (for example
    /// ["python3", "/workspace/train.py", "--epochs", "3"]). A Python script or module
    /// (`python3 script.py`, `python3 -m module`) gets warm spares: the next round's ranks
    /// have Python started and torch imported.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,

    /// Python modules a spare rank imports while it waits, besides torch (for example
    /// ["transformers", "datasets"]): what the script's first lines import, which a restart
    /// then does not pay for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_import: Vec<String>,
}

/// Container image pull policy.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull on every pod start.
    Always,
    /// Pull when the node does not have the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

impl DistributedTrainingSpec {
    /// Ranks per pod: procsPerReplica, else one per GPU, else 1.
    pub fn procs_per_replica(&self) -> i32 {
        self.procs_per_replica
            .unwrap_or(if self.gpus_per_replica > 0 {
                self.gpus_per_replica
            } else {
                1
            })
            .max(1)
    }

    /// Whether the pods' launchers restart their ranks in place (restartPolicy.inPlace with
    /// ferrotrain's launcher: its trainer or spec.pytorch, not a custom command), on one pod
    /// as on many: a rank's crash costs the step in flight, not the steps since the last
    /// checkpoint.
    pub fn restarts_in_place(&self) -> bool {
        self.restart_policy.in_place && self.command.is_none()
    }

    /// The fewest pods the job may train on: elastic.minReplicas with in-place restarts,
    /// else every pod.
    pub fn min_replicas(&self) -> i32 {
        let min = self.elastic.as_ref().and_then(|e| e.min_replicas);
        match min {
            Some(m) if self.restarts_in_place() => m.clamp(1, self.replicas.max(1)),
            _ => self.replicas.max(1),
        }
    }

    /// The PriorityClass of node rank `node_rank`'s pod: elastic.surplusPriorityClassName for
    /// the pods beyond minReplicas, else the template's.
    pub fn priority_class_of(&self, node_rank: i32) -> Option<String> {
        let surplus = self
            .elastic
            .as_ref()
            .and_then(|e| e.surplus_priority_class_name.clone())
            .filter(|_| node_rank >= self.min_replicas());
        let template = self.pod_template.as_ref();
        surplus.or_else(|| template.and_then(|t| t.priority_class_name.clone()))
    }

    /// Total ranks over the pods asked for (`replicas`): the world the global batch is sized
    /// for.
    pub fn world_size(&self) -> i32 {
        self.replicas.max(1) * self.procs_per_replica()
    }

    /// The pods the job creates: `replicas`, or elastic.maxReplicas when it grows beyond them
    /// (with in-place restarts; the pods beyond `replicas` train when they find a place).
    pub fn pod_count(&self) -> i32 {
        let max = self.elastic.as_ref().and_then(|e| e.max_replicas);
        match max {
            Some(m) if self.restarts_in_place() => m.max(self.replicas.max(1)),
            _ => self.replicas.max(1),
        }
    }

    /// Ranks over all the pods the job creates ([`Self::pod_count`]): the most that train at
    /// once, and the shards each step's batch is cut into.
    pub fn max_world_size(&self) -> i32 {
        self.pod_count() * self.procs_per_replica()
    }

    /// Whether the job trains on a changing number of pods (fewer than it asked for, or more).
    pub fn is_elastic(&self) -> bool {
        self.min_replicas() < self.pod_count()
    }
}
