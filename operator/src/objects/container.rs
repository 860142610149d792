//! The trainer container: image, command, env, ports, mounts, resources and a locked-down
//! security context.

use std::collections::BTreeMap;

use ferrotrain_api::crd::DistributedTrainingSpec;
use ferrotrain_api::env;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, ResourceRequirements, SecurityContext,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::settings::BuildSettings;
use crate::labels;

/// The GPU resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The trainer image's default entrypoint: the pod's launcher. How it restarts its ranks
/// comes from the environment ([`restart_env`](super::environment::restart_env)).
pub const DEFAULT_COMMAND: [&str; 2] = ["ferrotrain", "launch"];
/// spec.pytorch's entrypoint: the launcher alone (the launch crate's binary), which runs the
/// script's command, given after `--`, as the ranks.
pub const PYTORCH_LAUNCHER: &str = "ferrotrain-launch";

/// The container's command and arguments: spec.pytorch's command under the launcher, else
/// spec.command (or the trainer's launcher) with spec.args.
fn entrypoint(spec: &DistributedTrainingSpec) -> (Vec<String>, Option<Vec<String>>) {
    if let Some(p) = &spec.pytorch {
        let args = std::iter::once("--".to_string())
            .chain(p.command.iter().cloned())
            .collect();
        return (vec![PYTORCH_LAUNCHER.to_string()], Some(args));
    }
    let command = spec
        .command
        .clone()
        .unwrap_or_else(|| DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect());
    (command, spec.args.clone())
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
pub(super) fn trainer_container(
    spec: &DistributedTrainingSpec,
    s: &BuildSettings,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    working_dir: Option<String>,
) -> Container {
    let (command, args) = entrypoint(spec);
    Container {
        name: labels::TRAINER_CONTAINER.into(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| s.trainer_image.clone()),
        ),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(command),
        args,
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
