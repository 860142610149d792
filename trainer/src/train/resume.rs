//! Where training starts: rank 0 reads the newest complete checkpoint into the model and
//! the optimizer (or finds it incompatible), and every rank learns rank 0's decision, its
//! weights and its optimizer moments.

use ferrotrain_api::TrainerConfig;
use tch::Tensor;

use crate::checkpoint::{CheckpointStore, Named, TrainerState};
use crate::dist::{self, Collective, broadcast_u64s};
use crate::error::{Result, TrainError};
use crate::loss_scale::ScaleState;
use crate::optim::AdamW;

/// What rank 0 found in the job's checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResumeStatus {
    Fresh,
    Resumed,
    /// The checkpoint does not fit the config: every rank fails with exit 4.
    Incompatible,
}

/// Where training starts, as rank 0 decided it; every rank learns it from rank 0. Encoded
/// and decoded here only.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ResumeHeader {
    status: ResumeStatus,
    step: u64,
    samples: u64,
    optimizer_steps: u64,
    /// The checkpoint's fp16 loss scale, if it has one.
    loss_scale: Option<ScaleState>,
}

impl ResumeHeader {
    fn encode(&self) -> [u64; 7] {
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
            has_scale,
            scale,
            tracker,
        ] = v
        else {
            return Err(TrainError::Distributed(
                format!("resume header: {} values, expected 7", v.len()).into(),
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
                    format!("resume header: unknown status {other} from rank 0").into(),
                ));
            }
        };
        Ok(ResumeHeader {
            status,
            step,
            samples,
            optimizer_steps,
            loss_scale,
        })
    }

    /// Rank 0's header on every rank.
    fn broadcast(self, comm: &mut dyn Collective) -> Result<Self> {
        Self::decode(&broadcast_u64s(comm, &self.encode())?)
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
    /// Training seconds of the job's earlier runs (rank 0 knows; the others learn rank 0's
    /// clock every step).
    pub(super) earlier_seconds: f64,
    pub(super) resumed_from_step: Option<u64>,
    /// The checkpoint's fp16 loss scale (rank 0's, on every rank).
    pub(super) loss_scale: Option<ScaleState>,
}

/// Resume: rank 0 (the one with a `store`) reads the newest complete checkpoint into the
/// model and the optimizer and tells the others, who take its weights and moments.
pub(super) fn resume(
    store: Option<&CheckpointStore>,
    config: &TrainerConfig,
    params: &[(String, Tensor)],
    optimizer: &mut AdamW,
    comm: &mut dyn Collective,
    bucket_bytes: usize,
) -> Result<Start> {
    let mut resume_state: Option<TrainerState> = None;
    let mut status = ResumeStatus::Fresh;
    let mut incompatible = None;
    let latest = match store {
        Some(store) => store.latest()?,
        None => None,
    };
    if let Some((dir, _)) = latest {
        let loaded = CheckpointStore::load(&dir)?;
        let outcome = if loaded.state.config_digest != config.digest() {
            Err(TrainError::IncompatibleCheckpoint(format!(
                "checkpoint {} was written by a config with digest {}, this config has {} \
                 (model shape, task or vocabulary changed); use a new job name or checkpoint directory",
                dir.display(),
                loaded.state.config_digest,
                config.digest()
            ).into()))
        } else {
            restore_model(params, &loaded.model)
                .and_then(|_| optimizer.load_state(&loaded.optimizer))
        };
        match outcome {
            Ok(()) => {
                tracing::info!(step = loaded.state.step, dir = %dir.display(), "resuming from checkpoint");
                status = ResumeStatus::Resumed;
                resume_state = Some(loaded.state);
            }
            Err(e) => {
                status = ResumeStatus::Incompatible;
                incompatible = Some(e);
            }
        }
    }
    let (mut step, mut samples) = resume_state
        .as_ref()
        .map_or((0, 0), |s| (s.step, s.samples));
    let earlier_seconds = resume_state.as_ref().map_or(0.0, |s| s.train_seconds);
    let mut loss_scale = resume_state.as_ref().and_then(|s| s.loss_scale);
    if comm.world_size() > 1 {
        let header = ResumeHeader {
            status,
            step,
            samples,
            optimizer_steps: optimizer.steps,
            loss_scale,
        }
        .broadcast(comm)?;
        status = header.status;
        step = header.step;
        samples = header.samples;
        optimizer.steps = header.optimizer_steps;
        loss_scale = header.loss_scale;
        if status == ResumeStatus::Incompatible {
            return Err(incompatible.unwrap_or_else(|| {
                TrainError::IncompatibleCheckpoint(
                    "rank 0 found the checkpoint incompatible with the config".into(),
                )
            }));
        }
        // Rank 0's parameters and moments, straight from the optimizer's flat buffers.
        dist::broadcast_buffers(comm, &optimizer.state_buffers(), bucket_bytes)?;
    } else if let Some(e) = incompatible {
        return Err(e);
    }
    let resumed_from_step = (status == ResumeStatus::Resumed).then_some(step);
    Ok(Start {
        step,
        samples,
        earlier_seconds,
        resumed_from_step,
        loss_scale,
    })
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
                loss_scale,
            };
            assert_eq!(ResumeHeader::decode(&h.encode()).unwrap(), h);
            let mut comm = dist::Single {
                device: Device::Cpu,
            };
            assert_eq!(h.broadcast(&mut comm).unwrap(), h);
        }
        assert!(ResumeHeader::decode(&[2, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(ResumeHeader::decode(&[0, 0, 0, 0]).is_err());
    }
}
