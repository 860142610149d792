//! Build: the objects of a job, from its spec and the operator's settings. Pure functions:
//! same input, same object (so server-side apply is a no-op when nothing changed).

use std::collections::BTreeMap;

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingSpec, PodTemplateOverrides};
use ferrotrain_api::env;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::labels;
use crate::scheduling::{self, GangMode, GroupObject};

mod network;
pub use network::OperatorPods;

/// Volume names the operator uses itself.
pub const RESERVED_VOLUMES: [&str; 6] = [
    "shm",
    "tmp",
    "trainer-config",
    "rdzv-token",
    "checkpoints",
    "data",
];
/// The non-root user and group the pods run as by default.
pub const RUN_AS: i64 = 65532;
/// The GPU resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The trainer image's default entrypoint: the pod's launcher. How it restarts its ranks
/// comes from the environment ([`restart_env`]).
pub const DEFAULT_COMMAND: [&str; 2] = ["ferrotrain", "launch"];

/// What the builders need besides the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSettings {
    pub trainer_image: String,
    pub master_port: u16,
    pub trainer_metrics_port: u16,
    /// terminationGracePeriodSeconds of pods whose template sets none: sized from the last
    /// checkpoint save (gang::save_grace_seconds), so rank 0 can save before SIGKILL.
    pub termination_grace_seconds: i64,
    /// Restarts of restartPolicy.maxRestarts the job has not spent yet: the pods' launchers
    /// may restart their ranks in place this many times.
    pub restarts_left: i32,
    /// How the job's pods are scheduled all-or-nothing (scheduling::mode).
    pub gang: GangMode,
    /// The operator's own pods, which poll rank 0's progress (the job's NetworkPolicy lets
    /// them in); None: unknown, and the progress port stays open to every pod.
    pub operator_pods: Option<OperatorPods>,
}

/// How the pod's launcher restarts its ranks: in place, up to the restarts left, with the
/// job's backoff and rendezvous timeout; else never (the operator restarts the gang).
fn restart_env(spec: &DistributedTrainingSpec, s: &BuildSettings) -> Vec<EnvVar> {
    if !spec.restarts_in_place() {
        return vec![env_value(env::FERROTRAIN_MAX_RESTARTS, 0)];
    }
    let p = &spec.restart_policy;
    let codes: Vec<String> = p.permanent_exit_codes.iter().map(i32::to_string).collect();
    let mut vars = vec![
        env_value(env::FERROTRAIN_RESTART_IN_PLACE, "true"),
        env_value(env::FERROTRAIN_MAX_RESTARTS, s.restarts_left.max(0)),
        env_value(env::FERROTRAIN_RESTART_BACKOFF_SECONDS, p.backoff_seconds),
        env_value(
            env::FERROTRAIN_RESTART_BACKOFF_MAX_SECONDS,
            p.max_backoff_seconds,
        ),
    ];
    // The agents wait for one another at a round's start as the ranks do at the rendezvous.
    if let Some(t) = &spec.trainer {
        vars.push(env_value(
            env::FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS,
            t.distributed.rendezvous_timeout_seconds,
        ));
    }
    vars.push(env_value(
        env::FERROTRAIN_PERMANENT_EXIT_CODES,
        codes.join(","),
    ));
    vars.push(env_value(
        env::FERROTRAIN_HEARTBEAT_TIMEOUT_SECONDS,
        p.heartbeat_timeout_seconds,
    ));
    if spec.min_replicas() < spec.replicas {
        let wait = spec.elastic.as_ref().map_or(60, |e| e.wait_seconds);
        vars.push(env_value(env::FERROTRAIN_MIN_NODES, spec.min_replicas()));
        vars.push(env_value(env::FERROTRAIN_ELASTIC_WAIT_SECONDS, wait));
    }
    // Who the agent is: a stale agent of a replaced pod is no member of later rounds.
    vars.push(EnvVar {
        name: "POD_UID".into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.uid".into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    });
    vars
}

/// The pods' termination grace: the template's, or the one sized from the save time.
pub fn termination_grace(spec: &DistributedTrainingSpec, s: &BuildSettings) -> i64 {
    spec.pod_template
        .as_ref()
        .and_then(|t| t.termination_grace_period_seconds)
        .unwrap_or(s.termination_grace_seconds)
}

/// Why an object could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the DistributedTraining has no {0}")]
    MissingMetadata(&'static str),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// Name, namespace and controller owner reference of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

impl Owner {
    /// Reads them from the object.
    pub fn of(dt: &DistributedTraining) -> Result<Self> {
        Ok(Owner {
            name: dt
                .metadata
                .name
                .clone()
                .ok_or(Error::MissingMetadata("name"))?,
            namespace: dt.namespace().ok_or(Error::MissingMetadata("namespace"))?,
            reference: dt
                .controller_owner_ref(&())
                .ok_or(Error::MissingMetadata("uid"))?,
        })
    }

    /// True when `meta` names this job as its controller (by uid: a re-created job of the same
    /// name does not adopt its predecessor's objects, and a user's object is never ours).
    pub fn controls(&self, meta: &ObjectMeta) -> bool {
        meta.owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == self.reference.uid)
    }

    fn meta(&self, name: String, extra_labels: BTreeMap<String, String>) -> ObjectMeta {
        // The operator's labels win: they are how it finds its pods.
        let mut labels = extra_labels;
        labels.extend(common_labels(&self.name));
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![self.reference.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// Every object of one attempt's launch, in the order they are applied.
#[derive(Clone, Debug, PartialEq)]
pub struct GangObjects {
    pub service: Service,
    /// None when the job runs its own command without a trainer config.
    pub config_map: Option<ConfigMap>,
    pub secret: Secret,
    /// Who may reach the pods (spec.networkPolicy), applied before any pod exists.
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
    /// The attempt's PodGroup (or Workload), created before its pods.
    pub group: Option<GroupObject>,
    pub pods: Vec<Pod>,
    /// Pod spec fields the typed Pod cannot hold (Kubernetes' own gang API), merged into
    /// every pod's JSON at create.
    pub pod_fields: Option<serde_json::Value>,
}

/// The objects of attempt `attempt` for the node ranks `node_ranks` (the missing ones). `token`
/// is the rendezvous token for a Secret that does not exist yet ([`new_token`]).
pub fn gang(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    attempt: i32,
    node_ranks: &[i32],
    settings: &BuildSettings,
    token: &str,
) -> GangObjects {
    let group = scheduling::group_name(&owner.name, attempt);
    GangObjects {
        service: service(owner, settings),
        config_map: config_map(owner, spec),
        secret: secret(owner, token),
        network_policy: network_policy(owner, spec, settings),
        group: group_object(owner, spec, &settings.gang, attempt),
        pods: node_ranks
            .iter()
            .map(|&rank| pod(owner, spec, attempt, rank, settings))
            .collect(),
        pod_fields: scheduling::native_pod_fields(&settings.gang, &group),
    }
}

/// Who may reach the job's pods (docs/security.md); None when spec.networkPolicy is off.
pub fn network_policy(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    s: &BuildSettings,
) -> Option<k8s_openapi::api::networking::v1::NetworkPolicy> {
    let meta = owner.meta(labels::network_policy_name(&owner.name), BTreeMap::new());
    let ports = network::GangPorts {
        rendezvous: s.master_port,
        progress: s.trainer_metrics_port,
    };
    network::policy(
        &owner.name,
        meta,
        &spec.network_policy,
        ports,
        s.operator_pods.as_ref(),
    )
}

/// The attempt's group object, labelled and owned like every child.
fn group_object(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    gang: &GangMode,
    attempt: i32,
) -> Option<GroupObject> {
    let mut group = scheduling::group_object(&owner.name, &owner.namespace, spec, gang, attempt)?;
    let meta = &mut group.object.metadata;
    meta.labels = Some(common_labels(&owner.name));
    meta.owner_references = Some(vec![owner.reference.clone()]);
    Some(group)
}

/// Labels every child carries.
pub fn common_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::APP_NAME.to_string(), "ferrotrain".to_string()),
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (labels::JOB.to_string(), job.to_string()),
    ])
}

/// The headless Service giving each pod the DNS name `<pod>.<job>.<ns>.svc`. Not-ready
/// addresses are published: rendezvous happens before any readiness.
pub fn service(owner: &Owner, s: &BuildSettings) -> Service {
    Service {
        metadata: owner.meta(labels::service_name(&owner.name), BTreeMap::new()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(BTreeMap::from([(
                labels::JOB.to_string(),
                owner.name.clone(),
            )])),
            ports: Some(vec![
                ServicePort {
                    name: Some("rendezvous".into()),
                    port: s.master_port.into(),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                },
                ServicePort {
                    name: Some("metrics".into()),
                    port: s.trainer_metrics_port.into(),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                },
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The ConfigMap with the trainer config (spec.trainer as written: spec.checkpoint says only
/// where); None when the job runs its own command without a trainer config.
pub fn config_map(owner: &Owner, spec: &DistributedTrainingSpec) -> Option<ConfigMap> {
    let config = spec.trainer.as_ref()?;
    Some(ConfigMap {
        metadata: owner.meta(labels::config_map_name(&owner.name), BTreeMap::new()),
        data: Some(BTreeMap::from([(
            labels::CONFIG_KEY.to_string(),
            config.to_yaml(),
        )])),
        ..ConfigMap::default()
    })
}

/// The Secret with the rendezvous token (created once; never rewritten).
pub fn secret(owner: &Owner, token: &str) -> Secret {
    Secret {
        metadata: owner.meta(labels::secret_name(&owner.name), BTreeMap::new()),
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(
            labels::TOKEN_KEY.to_string(),
            token.to_string(),
        )])),
        ..Secret::default()
    }
}

/// A fresh random rendezvous token (256 bits, hex).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn env_value(name: &str, value: impl ToString) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

/// The environment contract of one pod (torchrun-compatible plus FERROTRAIN_*).
pub fn contract_env(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    attempt: i32,
    node_rank: i32,
    s: &BuildSettings,
) -> Vec<EnvVar> {
    let master_addr = labels::master_addr(&owner.name, attempt, &owner.namespace);
    let torch = [
        (env::MASTER_ADDR, master_addr),
        (env::MASTER_PORT, s.master_port.to_string()),
        (env::NNODES, spec.replicas.to_string()),
        (env::NODE_RANK, node_rank.to_string()),
        (env::NPROC_PER_NODE, spec.procs_per_replica().to_string()),
    ];
    let mut vars: Vec<EnvVar> = torch.iter().map(|(k, v)| env_value(k, v)).collect();
    vars.push(env_value(env::WORLD_SIZE, spec.world_size()));
    vars.extend(
        torch
            .iter()
            .map(|(k, v)| env_value(&format!("{}{k}", env::PET_PREFIX), v)),
    );
    vars.push(env_value(env::TORCHELASTIC_RESTART_COUNT, attempt));
    vars.push(env_value(env::FERROTRAIN_JOB, &owner.name));
    vars.push(env_value(env::FERROTRAIN_ATTEMPT, attempt));
    // The launcher must stop its ranks before the kubelet's SIGKILL.
    vars.push(env_value(
        env::FERROTRAIN_STOP_GRACE_SECONDS,
        crate::gang::launcher_stop_grace_seconds(termination_grace(spec, s)),
    ));
    vars.extend(restart_env(spec, s));
    // A pod given GPUs never trains on the CPU by accident (the trainer exits 2 instead).
    if spec.gpus_per_replica > 0 {
        vars.push(env_value(
            env::FERROTRAIN_EXPECT_GPUS,
            spec.gpus_per_replica,
        ));
    }
    if spec.trainer.is_some() {
        vars.push(env_value(
            env::FERROTRAIN_CONFIG,
            format!("{}/{}", labels::CONFIG_DIR, labels::CONFIG_KEY),
        ));
    }
    vars.push(env_value(
        env::FERROTRAIN_CHECKPOINT_DIR,
        checkpoint_mount_path(spec),
    ));
    vars.push(env_value(
        env::FERROTRAIN_RDZV_TOKEN_FILE,
        format!("{}/{}", labels::TOKEN_DIR, labels::TOKEN_KEY),
    ));
    vars.push(env_value(
        env::FERROTRAIN_METRICS_PORT,
        s.trainer_metrics_port,
    ));
    // The ring binds inside the range the job's NetworkPolicy names (and says so if it cannot).
    if spec.network_policy.enabled {
        vars.push(env_value(
            env::FERROTRAIN_PORT_RANGE,
            spec.network_policy.port_range.env_value(),
        ));
    }
    // The root file system is read-only; libraries that write to $HOME get the tmp volume.
    vars.push(env_value("HOME", "/tmp"));
    vars
}

fn checkpoint_mount_path(spec: &DistributedTrainingSpec) -> String {
    spec.checkpoint
        .as_ref()
        .map(|c| c.mount_path.clone())
        .unwrap_or_else(|| "/checkpoints".into())
}

/// Whether the pod of `node_rank` mounts spec.checkpoint's volume. The ferrotrain trainer
/// reads and writes checkpoints on global rank 0 alone, which runs in the node-rank-0 pod (it
/// broadcasts the weights, the optimizer state and the vocabulary to the other ranks), so the
/// other pods need no access and a ReadWriteOnce claim works. A custom `command` may read
/// checkpoints on every rank (PyTorch DDP scripts commonly do), so there every pod mounts it.
pub fn mounts_checkpoint_volume(spec: &DistributedTrainingSpec, node_rank: i32) -> bool {
    node_rank == 0 || spec.command.is_some()
}

fn pvc(claim: &str, read_only: bool) -> PersistentVolumeClaimVolumeSource {
    PersistentVolumeClaimVolumeSource {
        claim_name: claim.to_string(),
        read_only: read_only.then_some(true),
    }
}

/// The pod of `node_rank` in `attempt`.
pub fn pod(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    attempt: i32,
    node_rank: i32,
    s: &BuildSettings,
) -> Pod {
    let name = labels::pod_name(&owner.name, attempt, node_rank);
    let template = spec.pod_template.clone().unwrap_or_default();
    let metadata = pod_metadata(owner, &template, &name, attempt, node_rank);
    let storage = storage(owner, spec, &template, node_rank);
    let env = pod_env(owner, spec, &template, attempt, node_rank, s);
    let container = trainer_container(spec, s, env, storage.mounts, storage.working_dir);
    let volumes = storage.volumes;
    let security_context = pod_security_context(spec, &template);

    let group = scheduling::group_name(&owner.name, attempt);
    let mut pod = Pod {
        metadata,
        spec: Some(PodSpec {
            hostname: Some(name),
            subdomain: Some(labels::service_name(&owner.name)),
            restart_policy: Some("Never".into()),
            containers: vec![container],
            volumes: Some(volumes),
            security_context: Some(security_context),
            termination_grace_period_seconds: Some(termination_grace(spec, s)),
            // No service-link variables and no API token: a trainer talks to its peers only.
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            service_account_name: template.service_account_name.clone(),
            node_selector: (!template.node_selector.is_empty())
                .then(|| template.node_selector.clone()),
            tolerations: (!template.tolerations.is_empty()).then(|| template.tolerations.clone()),
            affinity: template.affinity.clone(),
            priority_class_name: template.priority_class_name.clone(),
            scheduler_name: template.scheduler_name.clone(),
            image_pull_secrets: (!template.image_pull_secrets.is_empty())
                .then(|| template.image_pull_secrets.clone()),
            ..PodSpec::default()
        }),
        status: None,
    };
    scheduling::join(&mut pod, &s.gang, &group, spec.replicas);
    pod
}

/// Name, labels (the template's, then the operator's), annotations, owner.
fn pod_metadata(
    owner: &Owner,
    template: &PodTemplateOverrides,
    name: &str,
    attempt: i32,
    node_rank: i32,
) -> ObjectMeta {
    let mut pod_labels = template.labels.clone();
    pod_labels.extend([
        (labels::ATTEMPT.to_string(), attempt.to_string()),
        (labels::NODE_RANK.to_string(), node_rank.to_string()),
    ]);
    let mut metadata = owner.meta(name.to_string(), pod_labels);
    if !template.annotations.is_empty() {
        metadata.annotations = Some(template.annotations.clone());
    }

    metadata
}

/// The volumes of a pod and the trainer's mounts of them.
struct Storage {
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    /// The data directory, when there is one: relative paths in the config resolve there.
    working_dir: Option<String>,
}

/// shm, tmp, the trainer config, the checkpoints (rank 0 alone mounts the checkpoint volume),
/// the data and the template's extra volumes.
fn storage(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    template: &PodTemplateOverrides,
    node_rank: i32,
) -> Storage {
    let mut volumes = vec![
        Volume {
            name: "shm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: template.shm_size.clone(),
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    let mut mounts = vec![
        VolumeMount {
            name: "shm".into(),
            mount_path: "/dev/shm".into(),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..VolumeMount::default()
        },
    ];
    // The rendezvous token as a file, not an environment variable (which anything that can
    // read the process's environment, a crash dump or `ps e` would show).
    volumes.push(Volume {
        name: "rdzv-token".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(labels::secret_name(&owner.name)),
            default_mode: Some(0o444),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    mounts.push(VolumeMount {
        name: "rdzv-token".into(),
        mount_path: labels::TOKEN_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    if spec.trainer.is_some() {
        volumes.push(Volume {
            name: "trainer-config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: labels::config_map_name(&owner.name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "trainer-config".into(),
            mount_path: labels::CONFIG_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }

    let unused_user_volume = checkpoint_storage(spec, node_rank, &mut volumes, &mut mounts);
    let working_dir = data_storage(spec, &mut volumes, &mut mounts);
    mounts.extend(template.volume_mounts.iter().cloned());
    // A pod keeps every user volume something mounts: the checkpoint volume of a pod that
    // does not write checkpoints goes, unless data or an extra mount uses it too (a pod
    // referencing a ReadWriteOnce claim could only be scheduled on the claim's node).
    volumes.extend(
        template
            .volumes
            .iter()
            .filter(|v| {
                unused_user_volume.as_deref() != Some(v.name.as_str())
                    || mounts.iter().any(|m| m.name == v.name)
            })
            .cloned(),
    );

    Storage {
        volumes,
        mounts,
        working_dir,
    }
}

/// Checkpoints: a claim, a named user volume, or (no resume across restarts) an emptyDir. A
/// pod that does not write checkpoints gets an emptyDir at the same path; returns the user
/// volume it then does not need.
fn checkpoint_storage(
    spec: &DistributedTrainingSpec,
    node_rank: i32,
    volumes: &mut Vec<Volume>,
    mounts: &mut Vec<VolumeMount>,
) -> Option<String> {
    let checkpoint = spec.checkpoint.clone().unwrap_or_default();
    let checkpoint_path = checkpoint_mount_path(spec);
    let (claim, user_volume, unused_user_volume) = if mounts_checkpoint_volume(spec, node_rank) {
        (checkpoint.claim_name, checkpoint.volume_name, None)
    } else {
        (None, None, checkpoint.volume_name)
    };
    match (claim, user_volume) {
        (Some(claim), _) => {
            volumes.push(Volume {
                name: "checkpoints".into(),
                persistent_volume_claim: Some(pvc(&claim, false)),
                ..Volume::default()
            });
            mounts.push(VolumeMount {
                name: "checkpoints".into(),
                mount_path: checkpoint_path,
                ..VolumeMount::default()
            });
        }
        (None, Some(volume)) => mounts.push(VolumeMount {
            name: volume,
            mount_path: checkpoint_path,
            ..VolumeMount::default()
        }),
        (None, None) => {
            volumes.push(Volume {
                name: "checkpoints".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
            mounts.push(VolumeMount {
                name: "checkpoints".into(),
                mount_path: checkpoint_path,
                ..VolumeMount::default()
            });
        }
    }
    unused_user_volume
}

/// The data volume and its mount; returns the data directory (the working directory).
fn data_storage(
    spec: &DistributedTrainingSpec,
    volumes: &mut Vec<Volume>,
    mounts: &mut Vec<VolumeMount>,
) -> Option<String> {
    if let Some(data) = &spec.data {
        let read_only = data.read_only.then_some(true);
        let volume_name = match (&data.claim_name, &data.volume_name) {
            (Some(claim), _) => {
                volumes.push(Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(pvc(claim, data.read_only)),
                    ..Volume::default()
                });
                Some("data".to_string())
            }
            (None, Some(volume)) => Some(volume.clone()),
            (None, None) => None,
        };
        if let Some(volume_name) = volume_name {
            mounts.push(VolumeMount {
                name: volume_name,
                mount_path: data.mount_path.clone(),
                read_only,
                ..VolumeMount::default()
            });
            return Some(data.mount_path.clone());
        }
    }
    None
}

/// The env contract, then the template's extra variables (the contract wins).
fn pod_env(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    template: &PodTemplateOverrides,
    attempt: i32,
    node_rank: i32,
    s: &BuildSettings,
) -> Vec<EnvVar> {
    let contract = contract_env(owner, spec, attempt, node_rank, s);
    let mut env = contract.clone();
    env.extend(
        template
            .env
            .iter()
            .filter(|e| !contract.iter().any(|c| c.name == e.name))
            .cloned(),
    );
    // Defaults a job's podTemplate.env may override: on GPUs NCCL says why it fails (else a
    // bare "unhandled system error", docs/gpu.md).
    if spec.gpus_per_replica > 0 && !env.iter().any(|e| e.name == "NCCL_DEBUG") {
        env.push(env_value("NCCL_DEBUG", "WARN"));
    }

    env
}

/// spec.resources plus gpusPerReplica GPUs (requests = limits); None when empty.
fn trainer_resources(spec: &DistributedTrainingSpec) -> Option<ResourceRequirements> {
    let mut resources = spec.resources.clone().unwrap_or_default();
    if spec.gpus_per_replica > 0 {
        let gpus = Quantity(spec.gpus_per_replica.to_string());
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert(GPU_RESOURCE.into(), gpus.clone());
        resources
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert(GPU_RESOURCE.into(), gpus);
    }
    (resources != ResourceRequirements::default()).then_some(resources)
}

/// The trainer container: image, command, env, ports, mounts, a locked-down security context.
fn trainer_container(
    spec: &DistributedTrainingSpec,
    s: &BuildSettings,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    working_dir: Option<String>,
) -> Container {
    Container {
        name: labels::TRAINER_CONTAINER.into(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| s.trainer_image.clone()),
        ),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(
            spec.command
                .clone()
                .unwrap_or_else(|| DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()),
        ),
        args: spec.args.clone(),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some("rendezvous".into()),
                container_port: s.master_port.into(),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: s.trainer_metrics_port.into(),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        resources: trainer_resources(spec),
        volume_mounts: Some(mounts),
        working_dir,
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: spec.ipc_lock.then(|| vec!["IPC_LOCK".into()]),
            }),
            ..SecurityContext::default()
        }),
        termination_message_path: Some(env::TERMINATION_LOG.into()),
        // A bring-your-own image may not write the file: its last log lines explain instead.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    }
}

/// The template's pod security context, else non-root 65532 with the default seccomp profile;
/// with spec.networkPolicy, the ephemeral port range pinned to its portRange (a namespaced
/// sysctl every kubelet allows since Kubernetes 1.29), so every listener the kernel places
/// is one the policy names: the ring's, NCCL's, Gloo's.
fn pod_security_context(
    spec: &DistributedTrainingSpec,
    template: &PodTemplateOverrides,
) -> PodSecurityContext {
    let mut context = default_security_context(template);
    let np = &spec.network_policy;
    if np.enabled {
        let sysctls = context.sysctls.get_or_insert_with(Vec::new);
        if !sysctls.iter().any(|s| s.name == PORT_RANGE_SYSCTL) {
            sysctls.push(Sysctl {
                name: PORT_RANGE_SYSCTL.into(),
                value: np.port_range.sysctl_value(),
            });
        }
    }
    context
}

/// The sysctl that pins the ports the kernel picks (listeners bound to port 0 included).
pub const PORT_RANGE_SYSCTL: &str = "net.ipv4.ip_local_port_range";

fn default_security_context(template: &PodTemplateOverrides) -> PodSecurityContext {
    template
        .security_context
        .clone()
        .unwrap_or(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        })
}

/// The kind/apiVersion of a built object, for server-side apply bodies.
pub fn type_meta<K: Resource<DynamicType = ()>>() -> (String, String) {
    (K::api_version(&()).into_owned(), K::kind(&()).into_owned())
}

#[cfg(test)]
mod tests;
