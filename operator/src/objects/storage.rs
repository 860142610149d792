//! A pod's volumes and the trainer's mounts of them: shm, tmp, the rendezvous token, the
//! trainer config, the checkpoints, the data and the template's extra volumes.

use ferrotrain_api::crd::{DistributedTrainingSpec, PodTemplateOverrides};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource,
    SecretVolumeSource, Volume, VolumeMount,
};

use super::owner::Owner;
use crate::labels;

/// Volume names the operator uses itself.
pub const RESERVED_VOLUMES: [&str; 6] = [
    "shm",
    "tmp",
    "trainer-config",
    "rdzv-token",
    "checkpoints",
    "data",
];

pub(super) fn checkpoint_mount_path(spec: &DistributedTrainingSpec) -> String {
    spec.checkpoint
        .as_ref()
        .map(|c| c.mount_path.clone())
        .unwrap_or_else(|| "/checkpoints".into())
}

/// Whether the pod of `node_rank` mounts spec.checkpoint's volume. The ferrotrain trainer
/// reads and writes checkpoints on global rank 0 alone, which runs in the node-rank-0 pod (it
/// broadcasts the weights, the optimizer state and the vocabulary to the other ranks), so the
/// other pods need no access and a ReadWriteOnce claim works. A script of your own
/// (`command`, `pytorch`) may read checkpoints on every rank (PyTorch DDP scripts commonly
/// do), so there every pod mounts it.
pub fn mounts_checkpoint_volume(spec: &DistributedTrainingSpec, node_rank: i32) -> bool {
    node_rank == 0 || spec.command.is_some() || spec.pytorch.is_some()
}

fn pvc(claim: &str, read_only: bool) -> PersistentVolumeClaimVolumeSource {
    PersistentVolumeClaimVolumeSource {
        claim_name: claim.to_string(),
        read_only: read_only.then_some(true),
    }
}

/// The volumes of a pod and the trainer's mounts of them.
pub(super) struct Storage {
    pub(super) volumes: Vec<Volume>,
    pub(super) mounts: Vec<VolumeMount>,
    /// The data directory, when there is one: relative paths in the config resolve there.
    pub(super) working_dir: Option<String>,
}

/// shm, tmp, the trainer config, the checkpoints (rank 0 alone mounts the checkpoint volume),
/// the data and the template's extra volumes.
pub(super) fn storage(
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
