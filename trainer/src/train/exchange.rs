//! The step's collectives and its one host read: the gradients (their buckets started
//! during backward), then the loss, rank 0's clock, the signals and (some steps) every
//! rank's resources in one all-reduce; on a single rank, the same read without one.

use std::time::Instant;

use ferrotrain_api::progress::GangResources;
use tch::Tensor;

use super::trainer::Trainer;
use crate::error::{Result, TrainError};
use ferrotrain_launch::signals;

/// What `Trainer::exchange` reads at the end of a step's backward, for its gang and
/// single-rank halves.
pub(super) struct StepEnd<'t> {
    /// This rank's summed loss, on the device.
    pub(super) loss_local: &'t Tensor,
    /// The global batch's target tokens (the loss's denominator).
    pub(super) target_tokens: i64,
    /// The signal this rank received, or 0.
    pub(super) signal: i32,
    pub(super) train_seconds: f64,
    /// Whether this step reports resources (every `logEverySteps`).
    pub(super) summarise: bool,
}

/// The step's one host read, the same on every rank.
pub(super) struct Synced {
    pub(super) loss: f64,
    pub(super) grad_norm: f64,
    /// Rank 0's training seconds.
    pub(super) train_seconds: f64,
    pub(super) comm_seconds: f64,
    pub(super) gang_resources: Option<GangResources>,
    /// Set when some rank was signalled.
    pub(super) interrupted_by: Option<i32>,
}

impl Trainer<'_> {
    /// The step's collectives and its one host read: the gradients, loss, clock, signals
    /// and (some steps) resources of every rank.
    pub(super) fn exchange(&mut self, loss_local: &Tensor, target_tokens: i64) -> Result<Synced> {
        if signals::abandoned() {
            return Err(TrainError::Distributed(
                "the round ended elsewhere: the step's exchange abandoned".into(),
            ));
        }
        let signal = signals::received();
        let train_seconds = self.clock.train_seconds();
        // The same on every rank: the step number decides.
        let summarise = self
            .position
            .next_step()
            .is_multiple_of(self.config.log_every_steps.max(1));
        let end = StepEnd {
            loss_local,
            target_tokens,
            signal,
            train_seconds,
            summarise,
        };
        if self.replica.grad_sync.is_some() {
            self.exchange_gang(end)
        } else {
            self.exchange_alone(end)
        }
    }

    /// `exchange` with other ranks: the gradient buckets, then one all-reduce of the
    /// step's scalars.
    pub(super) fn exchange_gang(&mut self, end: StepEnd) -> Result<Synced> {
        let sync = self.replica.grad_sync.as_mut().expect("world > 1");
        let mut comm_seconds = sync.finish(self.comm.as_mut())?;
        let c0 = Instant::now();
        // Sums: the loss, rank 0's clock (the others add 0), how many ranks were signalled,
        // and (some steps) each rank's resources in its own slots.
        // f32 like every collective (the clock to a few ms over weeks).
        let clock = if self.leader { end.train_seconds } else { 0.0 };
        let flag = f32::from(u8::from(end.signal != 0));
        let mut host = vec![0.0, clock as f32, flag];
        if end.summarise {
            host.extend(self.reporting.resource_slots(self.rank, self.world));
        }
        let mut scalars = self.comm.upload(&host)?;
        tch::no_grad(|| {
            scalars
                .narrow(0, 0, 1)
                .f_copy_(&end.loss_local.reshape([1]))
        })?;
        self.comm.all_reduce_sum(&mut scalars)?;
        // The step's one host read: the summed scalars and the (summed) gradients' norm,
        // which lives on the model's device: with the ring on a GPU the scalars are on the
        // CPU, so it joins them there.
        let norm = self.replica.optimizer.grad_norm();
        let mut parts = vec![scalars];
        if let Some(n) = norm {
            parts.push(self.comm.adopt(&n.reshape([1]))?);
        }
        let v = self.comm.download_parts(&parts)?;
        comm_seconds += c0.elapsed().as_secs_f64();
        // On a GPU the host's clock also counted compute still queued: the device's own
        // measure replaces it where the backend has one (NCCL).
        if let Some(on_device) = self.comm.device_exchange_seconds() {
            comm_seconds = on_device;
        }
        Ok(Synced {
            loss: v[0] / end.target_tokens as f64,
            grad_norm: v.get(host.len()).copied().unwrap_or(0.0),
            train_seconds: v[1],
            comm_seconds,
            gang_resources: end
                .summarise
                .then(|| GangResources::from_slots(&v[3..host.len()]))
                .flatten(),
            // Some rank was signalled: all stop here, and exit the way it would.
            interrupted_by: (v[2] > 0.0).then_some(if end.signal != 0 {
                end.signal
            } else {
                libc::SIGTERM
            }),
        })
    }

    /// `exchange` on a single rank: no collective, the same one host read.
    pub(super) fn exchange_alone(&mut self, end: StepEnd) -> Result<Synced> {
        // The step's one host read: the loss and the gradients' norm.
        let mut parts = vec![end.loss_local.reshape([1])];
        parts.extend(self.replica.optimizer.grad_norm().map(|n| n.reshape([1])));
        let v = self.comm.download(Tensor::cat(&parts, 0))?;
        let gang_resources = if end.summarise {
            let mine: Vec<f64> = self
                .reporting
                .resource_slots(0, 1)
                .into_iter()
                .map(f64::from)
                .collect();
            GangResources::from_slots(&mine)
        } else {
            None
        };
        Ok(Synced {
            loss: v[0] / end.target_tokens as f64,
            grad_norm: v.get(1).copied().unwrap_or(0.0),
            train_seconds: end.train_seconds,
            comm_seconds: 0.0,
            gang_resources,
            interrupted_by: (end.signal != 0).then_some(end.signal),
        })
    }
}
