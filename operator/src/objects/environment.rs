//! The trainer container's environment: the torchrun-compatible contract, FERROTRAIN_*, how
//! the launcher restarts its ranks, then the template's extra variables.

use ferrotrain_api::crd::{DistributedTrainingSpec, PodTemplateOverrides};
use ferrotrain_api::env;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

use super::owner::Owner;
use super::settings::{BuildSettings, termination_grace};
use super::storage::checkpoint_mount_path;
use super::store::credentials_env;
use crate::labels;

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
        env_value(env::FERROTRAIN_MAX_RESTARTS, s.restarts_left),
        env_value(env::FERROTRAIN_FIRST_ROUND, s.round),
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
    if spec.is_elastic() {
        let wait = spec.elastic.as_ref().map_or(60, |e| e.wait_seconds);
        vars.push(env_value(env::FERROTRAIN_MIN_NODES, spec.min_replicas()));
        vars.push(env_value(env::FERROTRAIN_ELASTIC_WAIT_SECONDS, wait));
    }
    if spec.pod_count() > spec.replicas.max(1) {
        // More pods than asked for cut the asked-for batch into more shards.
        vars.push(env_value(env::FERROTRAIN_BATCH_WORLD, spec.world_size()));
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
        (env::NNODES, spec.pod_count().to_string()),
        (env::NODE_RANK, node_rank.to_string()),
        (env::NPROC_PER_NODE, spec.procs_per_replica().to_string()),
    ];
    let mut vars: Vec<EnvVar> = torch.iter().map(|(k, v)| env_value(k, v)).collect();
    vars.push(env_value(env::WORLD_SIZE, spec.max_world_size()));
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
    if let Some(p) = spec.pytorch.as_ref().filter(|p| !p.pre_import.is_empty()) {
        vars.push(env_value(
            env::FERROTRAIN_PRE_IMPORT,
            p.pre_import.join(","),
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
    vars.extend(credentials_env(spec, node_rank));
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

/// The env contract, then the template's extra variables (the contract wins).
pub(super) fn pod_env(
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
