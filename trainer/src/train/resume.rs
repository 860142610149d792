//! Where training starts, agreed by every rank: the freshest state any rank holds (its pod's
//! snapshot of the last round: `heal`), else rank 0's newest complete checkpoint (or its
//! finding that the checkpoint does not fit the config), else a fresh start. The rank that
//! holds it sends every other rank its weights, its optimizer moments and where training
//! stood; then every rank checks that it holds the very same state.

use std::path::Path;

use ferrotrain_api::TrainerConfig;
use tch::Tensor;

use crate::checkpoint::{CheckpointStore, Named, TrainerState};
use crate::distributed::{self, Collective, all_gather_u64s, broadcast_u64s_from};
use crate::error::{Reason, Result, TrainError};
use crate::heal::{self, HealState, Offer, Source};
use crate::loss_scale::ScaleState;
use crate::optim::AdamW;

/// What the source found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResumeStatus {
    Fresh,
    Resumed,
    /// The checkpoint does not fit the config: every rank fails with exit 4.
    Incompatible,
}

/// Where training starts, as the source decided it; every rank learns it from the source.
/// Encoded and decoded here only.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ResumeHeader {
    status: ResumeStatus,
    step: u64,
    samples: u64,
    optimizer_steps: u64,
    /// The job's training seconds so far (rank 0's clock: a new rank 0 goes on with it).
    train_seconds: f64,
    /// The state's fp16 loss scale, if it has one.
    loss_scale: Option<ScaleState>,
}

impl ResumeHeader {
    const FRESH: ResumeHeader = ResumeHeader {
        status: ResumeStatus::Fresh,
        step: 0,
        samples: 0,
        optimizer_steps: 0,
        train_seconds: 0.0,
        loss_scale: None,
    };

    fn encode(&self) -> [u64; 8] {
        let status = match self.status {
            ResumeStatus::Fresh => 0,
            ResumeStatus::Resumed => 1,
            ResumeStatus::Incompatible => 4,
        };
        let (has_scale, scale, tracker) = self
            .loss_scale
            .map_or((0, 0, 0), |s| (1, s.scale.to_bits(), s.growth_tracker));
        [
            status,
            self.step,
            self.samples,
            self.optimizer_steps,
            self.train_seconds.to_bits(),
            has_scale,
            scale,
            tracker,
        ]
    }

    fn decode(v: &[u64]) -> Result<Self> {
        let &[
            status,
            step,
            samples,
            optimizer_steps,
            train_seconds,
            has_scale,
            scale,
            tracker,
        ] = v
        else {
            return Err(TrainError::Distributed(
                format!("resume header: {} values, expected 8", v.len()).into(),
            ));
        };
        let loss_scale = (has_scale == 1).then(|| ScaleState {
            scale: f64::from_bits(scale),
            growth_tracker: tracker,
        });
        let status = match status {
            0 => ResumeStatus::Fresh,
            1 => ResumeStatus::Resumed,
            4 => ResumeStatus::Incompatible,
            other => {
                return Err(TrainError::Distributed(
                    format!("resume header: unknown status {other}").into(),
                ));
            }
        };
        Ok(ResumeHeader {
            status,
            step,
            samples,
            optimizer_steps,
            train_seconds: f64::from_bits(train_seconds),
            loss_scale,
        })
    }

    /// The header of `root` on every rank.
    fn broadcast(self, comm: &mut dyn Collective, root: usize) -> Result<Self> {
        Self::decode(&broadcast_u64s_from(comm, &self.encode(), root)?)
    }

    fn of_snapshot(s: &HealState) -> Self {
        ResumeHeader {
            status: ResumeStatus::Resumed,
            step: s.step,
            samples: s.samples,
            optimizer_steps: s.optimizer_steps,
            train_seconds: s.train_seconds,
            loss_scale: s.loss_scale,
        }
    }

    fn of_checkpoint(s: &TrainerState, optimizer_steps: u64) -> Self {
        ResumeHeader {
            status: ResumeStatus::Resumed,
            step: s.step,
            samples: s.samples,
            optimizer_steps,
            train_seconds: s.train_seconds,
            loss_scale: s.loss_scale,
        }
    }
}

/// Copies checkpointed tensors into the model's variables, by name.
pub fn restore_model(vars: &[(String, Tensor)], saved: &Named) -> Result<()> {
    for (name, var) in vars {
        let src = saved
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                TrainError::IncompatibleCheckpoint(
                    format!("checkpoint has no tensor {name} that the model needs").into(),
                )
            })?;
        if src.size() != var.size() {
            return Err(TrainError::IncompatibleCheckpoint(
                format!(
                    "checkpoint tensor {name} has shape {:?}, the model needs {:?}",
                    src.size(),
                    var.size()
                )
                .into(),
            ));
        }
        let mut dst = var.shallow_clone();
        tch::no_grad(|| dst.copy_(src));
    }
    Ok(())
}

/// Where this run starts, agreed by every rank.
pub(super) struct Start {
    pub(super) step: u64,
    pub(super) samples: u64,
    /// Training seconds of the job's earlier runs (the source knows; the others learn it
    /// from the source, then rank 0's clock every step).
    pub(super) earlier_seconds: f64,
    pub(super) resumed_from_step: Option<u64>,
    /// The state's fp16 loss scale (the source's, on every rank).
    pub(super) loss_scale: Option<ScaleState>,
    /// Where the state came from.
    pub(super) source: Source,
}

/// What a rank resumes from: rank 0's checkpoints, its pod's snapshots.
pub(super) struct Sources<'a> {
    /// Rank 0's checkpoint store (none on the others).
    pub(super) store: Option<&'a CheckpointStore>,
    /// The pod's heal directory (none outside a launcher).
    pub(super) heal_dir: Option<&'a Path>,
    /// The digest of the whole trainer config (`config_digest`).
    pub(super) config: u64,
}

/// A digest of every field of `config`: ranks that differ in any would diverge.
pub(super) fn config_digest(config: &TrainerConfig) -> u64 {
    // FNV-1a 64, as the checkpoint's digest of the model's shape.
    config
        .to_yaml()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// Resume: every rank says what it holds, every rank computes the same plan, the source
/// loads its state and sends it to the others, and every rank checks it holds the same.
pub(super) fn resume(
    from: &Sources<'_>,
    config: &TrainerConfig,
    params: &[(String, Tensor)],
    optimizer: &mut AdamW,
    comm: &mut dyn Collective,
    bucket_bytes: usize,
) -> Result<Start> {
    let buffers = optimizer.state_buffers();
    let layout = heal::layout_of(&buffers);
    let own = from
        .heal_dir
        .and_then(|dir| heal::newest(dir, &layout, from.config));
    let latest = match from.store {
        Some(store) => store.latest()?,
        None => None,
    };
    let offer = Offer {
        snapshot: own.as_ref().map(|(_, s)| s.step),
        checkpoint: latest.as_ref().map(|(_, s)| s.step),
        config: from.config,
    };
    let offers: Vec<Offer> = all_gather_u64s(comm, &offer.encode())?
        .iter()
        .map(|v| Offer::decode(v))
        .collect();
    let source = heal::plan(&offers).map_err(|m| mismatch(&m, comm.rank()))?;
    let root = source.root();
    let mut incompatible = None;
    let header = if comm.rank() != root {
        ResumeHeader::FRESH
    } else {
        match (source, own, latest) {
            (Source::Peer { .. }, Some((path, state)), _) => {
                load_snapshot(&path, &state, &buffers)?;
                ResumeHeader::of_snapshot(&state)
            }
            (Source::Checkpoint { .. }, _, Some((dir, _))) => {
                match load_checkpoint(&dir, config, params, optimizer) {
                    Ok(state) => ResumeHeader::of_checkpoint(&state, optimizer.steps),
                    Err(e) => {
                        incompatible = Some(e);
                        ResumeHeader {
                            status: ResumeStatus::Incompatible,
                            ..ResumeHeader::FRESH
                        }
                    }
                }
            }
            _ => ResumeHeader::FRESH,
        }
    };
    let header = if comm.world_size() > 1 {
        header.broadcast(comm, root)?
    } else {
        header
    };
    if header.status == ResumeStatus::Incompatible {
        return Err(incompatible.unwrap_or_else(|| {
            TrainError::IncompatibleCheckpoint(
                "rank 0 found the checkpoint incompatible with the config".into(),
            )
        }));
    }
    optimizer.steps = header.optimizer_steps;
    if comm.rank() == root
        && matches!(source, Source::Peer { .. })
        && crate::fault::fire_once(crate::fault::HEAL_SOURCE_DIES)
    {
        tracing::warn!("fault injected: the heal source dies before it sends its state");
        std::process::abort();
    }
    if comm.world_size() > 1 {
        // The source's parameters and moments, straight from the optimizer's flat buffers.
        distributed::broadcast_buffers(comm, &buffers, bucket_bytes, root)?;
        same_state_everywhere(comm, &buffers, root)?;
    }
    let resumed = header.status == ResumeStatus::Resumed;
    if let (true, Source::Peer { .. }) = (resumed, source) {
        tracing::info!(
            step = header.step,
            rank = root,
            "resuming from a peer's state"
        );
    }
    Ok(Start {
        step: header.step,
        samples: header.samples,
        earlier_seconds: header.train_seconds,
        resumed_from_step: resumed.then_some(header.step),
        loss_scale: header.loss_scale,
        source: if resumed { source } else { Source::Fresh },
    })
}

/// The error of a rank whose config is not the gang's (permanent: it names the rank), or of
/// a rank of the gang that cannot go on with it (retryable: that rank's pod is the one to fix).
fn mismatch(m: &heal::ConfigMismatch, rank: usize) -> TrainError {
    let message = format!(
        "rank(s) {:?} run a trainer config other than the gang's (digest {:016x}): a pod \
         started after spec.trainer changed cannot join ranks that train with the old one; \
         create the job again to change its config",
        m.ranks, m.gang
    );
    if m.ranks.contains(&rank) {
        TrainError::Config(message.into())
    } else {
        TrainError::Distributed(message.into())
    }
}

/// The source's own snapshot into its buffers; a damaged one is removed (the next round
/// takes another source) and the round ends.
fn load_snapshot(path: &Path, state: &HealState, buffers: &[Tensor]) -> Result<()> {
    heal::load(path, state, buffers).inspect_err(|e| {
        tracing::warn!(dir = %path.display(), error = %e, "heal: removing a damaged snapshot");
        let _ = std::fs::remove_dir_all(path);
    })
}

/// Rank 0 reads the checkpoint in `dir` into the model and the optimizer.
fn load_checkpoint(
    dir: &Path,
    config: &TrainerConfig,
    params: &[(String, Tensor)],
    optimizer: &mut AdamW,
) -> Result<TrainerState> {
    let loaded = CheckpointStore::load(dir)?;
    if loaded.state.config_digest != config.digest() {
        return Err(TrainError::IncompatibleCheckpoint(
            format!(
                "checkpoint {} was written by a config with digest {}, this config has {} \
                 (model shape, task or vocabulary changed); use a new job name or checkpoint directory",
                dir.display(),
                loaded.state.config_digest,
                config.digest()
            )
            .into(),
        ));
    }
    restore_model(params, &loaded.model)?;
    optimizer.load_state(&loaded.optimizer)?;
    tracing::info!(step = loaded.state.step, dir = %dir.display(), "resuming from checkpoint");
    Ok(loaded.state)
}

/// Every rank holds the very state the source sent (a digest of every buffer, compared):
/// otherwise the round ends here, naming the ranks, rather than train diverged replicas.
fn same_state_everywhere(comm: &mut dyn Collective, buffers: &[Tensor], root: usize) -> Result<()> {
    let mine = u64::from(heal::digest(buffers)?);
    let all = all_gather_u64s(comm, &[mine])?;
    let theirs = all[root][0];
    let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r][0] != theirs).collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(TrainError::Distributed(Reason::from(format!(
        "heal: the state of rank(s) {differ:?} differs from rank {root}'s after it was sent \
         (digest {mine:08x} here, {theirs:08x} at rank {root}): the round ends rather than train \
         diverged replicas"
    ))))
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    #[test]
    fn the_resume_header_round_trips_and_refuses_garbage() {
        let scales = [
            None,
            Some(ScaleState {
                scale: 0.125,
                growth_tracker: 1999,
            }),
        ];
        for (status, loss_scale) in [
            ResumeStatus::Fresh,
            ResumeStatus::Resumed,
            ResumeStatus::Incompatible,
        ]
        .into_iter()
        .flat_map(|s| scales.map(|l| (s, l)))
        {
            let h = ResumeHeader {
                status,
                step: u64::MAX - 3,
                samples: 1 << 40,
                optimizer_steps: 17,
                train_seconds: 1234.5678,
                loss_scale,
            };
            assert_eq!(ResumeHeader::decode(&h.encode()).unwrap(), h);
            let mut comm = distributed::Single {
                device: Device::Cpu,
            };
            assert_eq!(h.broadcast(&mut comm, 0).unwrap(), h);
        }
        assert!(ResumeHeader::decode(&[2, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(ResumeHeader::decode(&[0, 0, 0, 0]).is_err());
    }
}
