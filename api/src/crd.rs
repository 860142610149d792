//! The `DistributedTraining` custom resource (group `ferrotrain.dev`, version `v1alpha1`,
//! short name `dt`): one object = one data-parallel training job run as a gang of pods.
//!
//! The spec embeds [`TrainerConfig`], the very type the trainer parses, so the operator and the
//! trainer cannot drift. Every field carries a doc comment because the generated schema's
//! descriptions are what `kubectl explain dt.spec...` prints. Validation lives in the schema
//! (ranges, enums, CEL rules) so a bad object is refused at `kubectl apply`, naming the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use kube::core::crd::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::TrainerConfig;
use crate::progress::Progress;

mod network;
pub use network::{NetworkPolicySpec, PortRange};

/// API group of the resource.
pub const GROUP: &str = "ferrotrain.dev";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Longest object name: pods are named `<name>-<attempt>-<nodeRank>` and must stay a DNS label
/// (63 characters) for their hostname.
pub const MAX_NAME_LENGTH: usize = 47;

/// A data-parallel training job: `replicas` pods, each running `procsPerReplica` ranks of the
/// ferrotrain trainer (or any image following the torchrun environment contract). The operator
/// restarts the whole gang from the latest checkpoint when any rank fails and reports training
/// progress (step, rate, loss, ETA) in the status.
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
    doc = "A data-parallel training job run as a gang of pods: a failed trainer restarts in place in its pods (restartPolicy.inPlace, the default on more than one pod) and a lost pod is replaced alone, else the whole gang restarts, from the latest checkpoint; training progress and what each restart cost are in its status.",
    // The JSON form: clippy's duplicated-attribute lint misfires on repeated `type_ = ...`.
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the job is in its life cycle"}"#,
    printcolumn = r#"{"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "description": "Optimizer steps completed"}"#,
    printcolumn = r#"{"name": "Steps/s", "type": "number", "jsonPath": ".status.progress.stepsPerSecond", "description": "Optimizer steps per second"}"#,
    printcolumn = r#"{"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "description": "Recent training loss"}"#,
    printcolumn = r#"{"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta", "description": "Time left to maxSteps at the current rate"}"#,
    printcolumn = r#"{"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Gang restarts so far"}"#,
    printcolumn = r#"{"name": "Goodput", "type": "number", "jsonPath": ".status.recovery.goodputPercent", "description": "Percent of wall time spent on training steps that were kept", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.trainer) || has(self.command)",
        "message": "spec.trainer is required unless spec.command runs your own training program",
        "fieldPath": ".trainer"
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
    /// ["torchrun", "train.py"]). Default: `ferrotrain launch` (restarting its ranks in place with restartPolicy.inPlace, else never). The container
    /// gets the same environment contract (MASTER_ADDR, WORLD_SIZE, PET_*, ...) either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub command: Option<Vec<String>>,

    /// Arguments appended to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,

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
    /// again (docs/operator.md, "Elastic world size"). Needs in-place restarts.
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
}

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
    /// Gang restarts allowed before the job Fails; 0 fails on the first retryable failure.
    #[serde(default = "defaults::max_restarts")]
    #[schemars(range(min = 0, max = 10000))]
    pub max_restarts: i32,
    /// Wait before a gang restart; doubles with each failure in a row up to
    /// maxBackoffSeconds. The count starts again after an attempt (or in-place round) that
    /// saved a checkpoint of its own: a job that was training well before it failed waits
    /// only backoffSeconds, and one that keeps failing before it saves anything waits longer
    /// each time. In-place restarts wait nothing after such a failure, then this, doubling.
    #[serde(default = "defaults::backoff_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub backoff_seconds: i64,
    /// Upper bound of the restart backoff.
    #[serde(default = "defaults::max_backoff_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub max_backoff_seconds: i64,
    /// After a retryable failure of a trainer process whose pod stays (a crash, a kill, an
    /// OOM kill inside the container, a hang), restart every pod's ranks in place as a new
    /// round of the same attempt: the pods, their nodes and GPUs are kept, and the next step
    /// comes seconds later. Counted against maxRestarts like a gang restart. A pod that goes
    /// away (deleted, evicted, its launcher killed) is created again alone and joins the
    /// others' next round, and so is one whose node is lost (node rank 0's restarts the
    /// gang): the launchers notice a pod cut off from them (a network partition, a frozen
    /// node) by its missing heartbeats within heartbeatTimeoutSeconds, long before Kubernetes
    /// calls its node NotReady, and train on without it (`elastic`) or wait for its
    /// replacement; back from a partition, a replaced pod leaves the gang. Needs ferrotrain's
    /// own launcher (no custom `command`) and more than one replica; false restarts the whole gang on every failure. A few seconds into each
    /// round every pod starts a spare trainer per rank that waits, libtorch loaded, to be the
    /// next round's rank (about 120 MB of memory each, within the pod's limit; env
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
    /// The fewest pods the job trains on. A pod that is lost and not running again within
    /// waitSeconds is left out: the others train on (each covering the missing ranks' shards
    /// of the same global batch, so the loss curve does not change) until it is back, and the
    /// gang grows again at once. Default: replicas (not elastic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub min_replicas: Option<i32>,
    /// How long the others wait for a lost pod before they train on without it.
    #[serde(default = "defaults::elastic_wait_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub wait_seconds: i64,
}

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

/// Condition types the operator maintains in `status.conditions`; their reasons are in
/// [`crate::reason`] (docs/reasons.md).
pub mod condition {
    /// The current attempt's pods were all created.
    pub const CREATED: &str = "Created";
    /// Every pod of the current attempt runs. While it is False during start-up, its reason
    /// is the reason a pod waits (Unschedulable, ImagePullBackOff, CreateContainerConfigError,
    /// ...) and its message the scheduler's or kubelet's own words.
    pub const RUNNING: &str = "Running";
    /// A gang restart is in progress.
    pub const RESTARTING: &str = "Restarting";
    /// The trainer's progress stopped changing for stallTimeoutSeconds.
    pub const STALLED: &str = "Stalled";
    /// Every rank exited 0.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed for good.
    pub const FAILED: &str = "Failed";
    /// spec.suspend holds the job.
    pub const SUSPENDED: &str = "Suspended";
    /// Rank 0 serves /progress: Unknown while polls fail within the operator's grace period,
    /// False after it (or for images without the endpoint).
    pub const PROGRESS_AVAILABLE: &str = "ProgressAvailable";
    /// The gang is scheduled all-or-nothing: True with the mechanism (NativePodGroup, Kueue,
    /// Volcano, Coscheduling), False when it is not (spec.scheduling.gangScheduler none, or
    /// the API server does not serve the native API), with why.
    pub const GANG_SCHEDULING: &str = "GangScheduling";
    /// True while scheduling gates hold pods of the current attempt (a queue has not admitted
    /// it); False (reason Admitted) from its admission, which restarts the start-up clock.
    pub const QUEUED: &str = "Queued";
    /// True while the job trains on fewer ranks than its gang (elastic.minReplicas), with
    /// which pods are missing and why; False once the whole gang trains again.
    pub const RESIZED: &str = "Resized";
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
    /// The pod that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The trainer container's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The node the failed pod ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Machine-readable cause: ExitCode, PermanentExitCode, PodDeleted, PodFailed, NodeLost,
    /// Disrupted (eviction, preemption, drain, node shutdown), Stalled, DeadlineExceeded,
    /// InvalidSpec, or why a pod did not start: Unschedulable, ImagePullBackOff,
    /// InvalidImageName, CreateContainerConfigError, ContainerCreating, StartupTimeout.
    pub reason: String,
    /// Human-readable detail: the rank's termination message when it wrote one.
    #[serde(default)]
    pub message: String,
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
    /// Time left to totalSteps at the current rate, for humans (for example 2h05m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    /// When training should reach totalSteps at the current rate.
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
    /// Pending, Starting, Running, Restarting, Suspended, Succeeded or Failed.
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
    /// The current attempt: pods are named `<job>-<attempt>-<nodeRank>`; increases with every
    /// restart and resume.
    #[serde(default)]
    pub attempt: i32,
    /// Restarts after failures so far, gang restarts and in-place restarts alike (bounded by
    /// restartPolicy.maxRestarts). Disruptions (eviction, preemption, drain) restart the gang
    /// without counting here.
    #[serde(default)]
    pub restarts: i32,
    /// Ranks training now, when fewer than the gang's (elastic.minReplicas: pods lost and not
    /// back yet); absent when the whole gang trains.
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
    /// ferrotrain's own launcher, on more than one pod; one pod's gang restarts as fast).
    pub fn restarts_in_place(&self) -> bool {
        self.restart_policy.in_place && self.command.is_none() && self.replicas > 1
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

    /// Total ranks over all pods.
    pub fn world_size(&self) -> i32 {
        self.replicas.max(1) * self.procs_per_replica()
    }
}

/// The CRD as installed: the derived definition plus the object-level rule on the name (pods
/// are named `<name>-<attempt>-<nodeRank>` and the name is also the headless Service's).
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    let mut crd = DistributedTraining::crd();
    let rule = ValidationRule {
        rule: format!(
            "size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
        ),
        message: Some(format!(
            "metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters starting with a letter: pods are named <name>-<attempt>-<nodeRank> and the name is the headless Service's"
        )),
        // No fieldPath: the schema does not declare metadata's fields, so the apiserver would
        // refuse ".metadata.name" as a path.
        ..ValidationRule::default()
    };
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(rule.clone());
            let mut value = serde_json::to_value(&*schema).expect("schema serializes");
            kubernetes_integer_formats(&mut value);
            trim_volume_descriptions(&mut value);
            trim_network_peer_descriptions(&mut value);
            readable_descriptions(&mut value);
            *schema = serde_json::from_value(value).expect("schema deserializes");
        }
        for column in version.additional_printer_columns.iter_mut().flatten() {
            if let Some(d) = &mut column.description {
                *d = unwrap_lines(d);
            }
        }
    }
    crd
}

/// The Volume schema is two fifths of the CRD: its nested descriptions would push the CRD past
/// the 256 KiB that client-side `kubectl apply` can store. Each volume source keeps its own
/// description; the fields inside it are documented by `kubectl explain pod.spec.volumes`.
fn trim_volume_descriptions(schema: &mut serde_json::Value) {
    let volumes = schema
        .pointer_mut("/properties/spec/properties/podTemplate/properties/volumes")
        .expect("spec.podTemplate.volumes is in the schema");
    if let Some(d) = volumes.get_mut("description") {
        *d = format!(
            "{} Same schema as a Pod's volumes: `kubectl explain pod.spec.volumes` documents every field.",
            d.as_str().unwrap_or_default()
        )
        .into();
    }
    if let Some(sources) = volumes
        .pointer_mut("/items/properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        for source in sources.values_mut() {
            let description = source.get("description").cloned();
            strip_descriptions(source);
            if let Some(d) = description {
                source["description"] = d;
            }
        }
    }
}

/// The NetworkPolicy peers and egress rules of spec.networkPolicy keep the descriptions of
/// their two fields only: `kubectl explain networkpolicy.spec.ingress.from` and
/// `networkpolicy.spec.egress` document what is inside (the CRD stays well under the 256 KiB
/// client-side apply can store).
fn trim_network_peer_descriptions(schema: &mut serde_json::Value) {
    for field in ["metricsFrom", "egressTo"] {
        let path = format!("/properties/spec/properties/networkPolicy/properties/{field}/items");
        if let Some(items) = schema.pointer_mut(&path) {
            strip_descriptions(items);
        }
    }
}

/// Removes every description under `v` (itself included).
fn strip_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.remove("description");
            map.values_mut().for_each(strip_descriptions);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// Kubernetes knows the integer formats int32 and int64 only (it warns "unrecognized format
/// uint32"), and the API server refuses an integer schema whose minimum or maximum is not an
/// integer of its format ("Maximum boundary value must be of type integer with format int64",
/// kube-openapi's `IsValueValidAgainstRange`), checked on every default and every object.
/// Bounds are f64 in the CRD types, so `i64::MAX` becomes 2^63, which is no int64.
///
/// So: unsigned Rust types become int64 with minimum 0 and the type's maximum where an f64
/// holds it exactly (u8 to u32); u64 gets no maximum (an int64 field cannot exceed int64
/// anyway). Every integer bound is then made an integer of its format: a fractional bound is
/// rounded inwards (the same integers pass), a bound outside the format's range is left out
/// (it constrains nothing).
fn kubernetes_integer_formats(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            let unsigned_max = match map.get("format").and_then(Value::as_str) {
                Some("uint8") => Some(Some(u64::from(u8::MAX))),
                Some("uint16") => Some(Some(u64::from(u16::MAX))),
                Some("uint32") => Some(Some(u64::from(u32::MAX))),
                Some("uint64" | "uint") => Some(None),
                _ => None,
            };
            if let Some(type_max) = unsigned_max {
                map.insert("format".into(), "int64".into());
                let min = map.get("minimum").and_then(Value::as_f64).unwrap_or(0.0);
                map.insert("minimum".into(), Value::from(min.max(0.0)));
                if let Some(type_max) = type_max {
                    let max = map.get("maximum").and_then(Value::as_f64);
                    if max.is_none_or(|m| m > type_max as f64) {
                        map.insert("maximum".into(), Value::from(type_max as f64));
                    }
                }
            }
            if map.get("type").and_then(Value::as_str) == Some("integer") {
                let (lowest, highest) = match map.get("format").and_then(Value::as_str) {
                    Some("int32") => (f64::from(i32::MIN), f64::from(i32::MAX)),
                    // 2^63 is the first f64 past i64::MAX; -2^63 is i64::MIN exactly.
                    _ => (i64::MIN as f64, 9_223_372_036_854_774_784.0),
                };
                for (key, round) in [
                    ("minimum", f64::ceil as fn(f64) -> f64),
                    ("maximum", f64::floor),
                ] {
                    let Some(bound) = map.get(key).and_then(Value::as_f64) else {
                        continue;
                    };
                    let bound = round(bound);
                    if bound.is_finite() && (lowest..=highest).contains(&bound) {
                        map.insert(key.into(), Value::from(bound as i64));
                    } else {
                        map.remove(key);
                    }
                }
            }
            for v in map.values_mut() {
                kubernetes_integer_formats(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(kubernetes_integer_formats),
        _ => {}
    }
}

/// `kubectl explain` prints a description as it is, so the line breaks of wrapped doc
/// comments would show as ragged lines. Every description becomes one line per paragraph;
/// paragraphs that are laid out on purpose (lists, indented lines, as in the embedded
/// Kubernetes descriptions) keep their line breaks.
fn readable_descriptions(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match (key.as_str(), v) {
                    ("description", Value::String(d)) => *d = unwrap_lines(d),
                    // Values, not schemas: a default or enum may hold a "description" key.
                    ("default" | "enum" | "example" | "x-kubernetes-validations", _) => {}
                    (_, v) => readable_descriptions(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(readable_descriptions),
        _ => {}
    }
}

/// Joins the wrapped lines of each paragraph of `text` with a space.
fn unwrap_lines(text: &str) -> String {
    // An indented line or a list item: "- x", "* x", "1. x", "2) x", "c) x".
    fn laid_out(line: &str) -> bool {
        let marker = |line: &str| {
            let digits = line.chars().take_while(char::is_ascii_digit).count();
            let (label, rest) = line.split_at(digits);
            let numbered =
                (1..=2).contains(&digits) && (rest.starts_with(". ") || rest.starts_with(") "));
            let lettered = label.is_empty()
                && line.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && line[1..].starts_with(") ");
            numbered || lettered
        };
        line.starts_with(char::is_whitespace)
            || line.starts_with("- ")
            || line.starts_with("* ")
            || marker(line)
    }
    let mut paragraphs = Vec::new();
    let mut lines: Vec<&str> = Vec::new();
    let mut flush = |lines: &mut Vec<&str>| {
        if lines.is_empty() {
            return;
        }
        let indented = lines.iter().any(|l| l.starts_with(char::is_whitespace));
        let paragraph = if indented || lines.iter().skip(1).any(|l| laid_out(l)) {
            lines.join("\n")
        } else {
            lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
        };
        paragraphs.push(paragraph);
        lines.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            flush(&mut lines);
        } else {
            lines.push(line.trim_end());
        }
    }
    flush(&mut lines);
    paragraphs.join("\n\n")
}

/// The CRD as YAML, exactly as committed under crds/ and the Helm chart.
pub fn custom_resource_definition_yaml() -> String {
    let body = serde_saphyr::to_string(&custom_resource_definition()).expect("CRD serializes");
    format!(
        "# Generated by `ferrotrain-operator crd` (scripts/gen-crds.sh). Do not edit.\n---\n{body}"
    )
}

mod defaults {
    pub fn stall_timeout_seconds() -> i64 {
        1800
    }
    pub fn startup_timeout_seconds() -> i64 {
        600
    }
    pub fn checkpoint_mount_path() -> String {
        "/checkpoints".to_string()
    }
    pub fn data_mount_path() -> String {
        "/data".to_string()
    }
    pub fn yes() -> bool {
        true
    }
    pub fn max_restarts() -> i32 {
        10
    }
    pub fn in_place() -> bool {
        true
    }
    pub fn heartbeat_timeout_seconds() -> i64 {
        10
    }
    pub fn elastic_wait_seconds() -> i64 {
        60
    }
    pub fn backoff_seconds() -> i64 {
        10
    }
    pub fn max_backoff_seconds() -> i64 {
        300
    }
    pub fn permanent_exit_codes() -> Vec<i32> {
        vec![
            crate::exit::INVALID_CONFIG,
            crate::exit::INVALID_DATA,
            crate::exit::INCOMPATIBLE_CHECKPOINT,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrapped_lines_join_and_laid_out_paragraphs_stay() {
        assert_eq!(
            unwrap_lines("Save every this many steps; 0 = only\nat the end.\n\nSecond\n paragraph"),
            "Save every this many steps; 0 = only at the end.\n\nSecond\n paragraph"
        );
        let list = "Valid options are:\n  Localhost - a profile.\n  Unconfined - none.";
        assert_eq!(unwrap_lines(list), list);
        let items = "Use this if: a) one,\nb) two\n- three";
        assert_eq!(unwrap_lines(items), items);
        assert_eq!(
            unwrap_lines("uid\n65532, seccomp. No\nlist"),
            "uid 65532, seccomp. No list"
        );
        let note = "<quantity> ::= <number><suffix>\n\n\t(Note that <suffix> may be empty.)";
        assert_eq!(unwrap_lines(note), note);
    }

    #[test]
    fn integer_bounds_are_integers_of_their_format() {
        let mut schema = json!({"properties": {
            "u64": {"type": "integer", "format": "uint64", "minimum": 1.0},
            "u32": {"type": "integer", "format": "uint32"},
            "i64": {"type": "integer", "format": "int64", "maximum": 9.223372036854776e18, "minimum": -0.5},
            "i32": {"type": "integer", "format": "int32", "maximum": 4294967295.0, "minimum": 1.0},
        }});
        kubernetes_integer_formats(&mut schema);
        assert_eq!(
            schema["properties"],
            json!({
                "u64": {"type": "integer", "format": "int64", "minimum": 1},
                "u32": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295u64},
                "i64": {"type": "integer", "format": "int64", "minimum": 0},
                "i32": {"type": "integer", "format": "int32", "minimum": 1},
            })
        );
    }
}
