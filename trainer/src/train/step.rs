//! One optimizer step, like the paper: the global batch, forward and backward over this
//! rank's shard of it, the exchange (`exchange.rs`), clip, AdamW at the schedule's rate.

use std::time::Instant;

use tch::{Kind, Tensor};

use ferrotrain_api::progress::GangResources;

use super::trainer::Trainer;
use crate::data::{self, Example};
use crate::error::{Result, TrainError};
use crate::loss_scale::{self, LossScaler, MAX_CONSECUTIVE_SKIPS, Update};
use crate::optim;

/// The step's global batch: the plan's `accumulate` micro-batches of the stream (every rank
/// draws all of them and trains on its shard of each).
pub(super) struct GlobalBatch {
    pub(super) micro: Vec<Vec<usize>>,
    /// Target tokens (with EOS): the loss is per target token of the global batch.
    pub(super) target_tokens: i64,
    pub(super) samples: u64,
    /// Source and target tokens, each with its EOS (tokens/s).
    pub(super) tokens: i64,
}

/// What one optimizer step did.
pub(super) struct StepOutcome {
    /// The step just taken (the first is 1).
    pub(super) step: u64,
    /// Per target token of the global batch.
    pub(super) loss: f64,
    pub(super) grad_norm: f64,
    pub(super) lr: f64,
    pub(super) seconds: f64,
    pub(super) comm_seconds: f64,
    /// Source and target tokens of the global batch, each with its EOS.
    pub(super) tokens: i64,
    /// Examples in the global batch.
    pub(super) samples: u64,
    /// Rank 0's training seconds at the step's all-reduce.
    pub(super) train_seconds: f64,
    /// Every rank's resources, on the steps that summarise them (every logEverySteps).
    pub(super) gang_resources: Option<GangResources>,
    /// The run's last step: maxSteps reached, the time budget spent or a signal received.
    pub(super) final_step: bool,
    /// `fp16`: the gradients overflowed, the update was skipped (on every rank).
    pub(super) skipped: bool,
    /// `fp16`: the loss scale after this step.
    pub(super) loss_scale: Option<f64>,
}

impl Trainer<'_> {
    /// One optimizer step, like the paper: batch -> forward -> loss -> backward -> all-reduce
    /// (with the step's one host read) -> clip -> AdamW at the schedule's rate.
    pub(super) fn step(&mut self) -> Result<StepOutcome> {
        let t0 = Instant::now();
        let config = self.config;
        let batch = self.next_batch();
        let loss_scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let loss_local = self.forward_backward(&batch, loss_scale);
        let synced = self.exchange(&loss_local, batch.target_tokens)?;
        if synced.interrupted_by.is_some() {
            self.interrupted_by = synced.interrupted_by;
        }
        self.stop = self.clock.over_budget(synced.train_seconds) || self.interrupted_by.is_some();
        let grad_norm = synced.grad_norm / loss_scale;
        let skipped = self.overflowed(grad_norm.is_finite())?;
        let lr = optim::learning_rate(
            config.optimizer.lr,
            &config.schedule,
            config.max_steps,
            self.step + 1,
            self.clock.time_used(synced.train_seconds),
        );
        if !skipped {
            let optimizer = &mut self.replica.optimizer;
            optimizer.clip_to(grad_norm, config.optimizer.clip_norm);
            optimizer.unscale(loss_scale);
            optimizer.step(lr);
        }
        self.step += 1;
        self.samples += batch.samples;
        self.clock.synced_seconds = synced.train_seconds;
        if synced.loss.is_finite() || !skipped {
            self.train_loss = Some(synced.loss);
        }
        let outcome = StepOutcome {
            step: self.step,
            loss: synced.loss,
            grad_norm,
            lr,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds: synced.comm_seconds,
            tokens: batch.tokens,
            samples: batch.samples,
            train_seconds: synced.train_seconds,
            gang_resources: synced.gang_resources,
            final_step: self.step >= config.max_steps || self.stop,
            skipped,
            loss_scale: self.scaler.as_ref().map(LossScaler::scale),
        };
        self.record(&outcome)?;
        Ok(outcome)
    }

    /// `fp16`: updates the loss scale from whether the step's all-reduced gradients were
    /// `finite` (the same on every rank); true when the update must be skipped. Fails when
    /// the gradients overflowed on `MAX_CONSECUTIVE_SKIPS` steps in a row.
    fn overflowed(&mut self, finite: bool) -> Result<bool> {
        let Some(scaler) = self.scaler.as_mut() else {
            return Ok(false);
        };
        let step = self.step + 1;
        match scaler.update(finite) {
            Update::Kept => Ok(false),
            Update::Grew { from } => {
                tracing::debug!(step, from, to = scaler.scale(), "fp16: loss scale grew");
                Ok(false)
            }
            Update::Skipped { from } => {
                self.skipped_steps += 1;
                tracing::warn!(
                    rank = self.rank,
                    "fp16: gradients overflowed at step {step}: step skipped, loss scale {from} -> {}",
                    scaler.scale()
                );
                if scaler.consecutive_skips >= MAX_CONSECUTIVE_SKIPS {
                    // Permanent (exit 2): a restart from the checkpoint would overflow again.
                    return Err(TrainError::Config(format!(
                        "precision fp16: the gradients overflowed on {MAX_CONSECUTIVE_SKIPS} steps in a \
                         row (loss scale now {:e}): the model's activations overflow fp16 itself; use \
                         precision bf16 or fp32, or lower optimizer.lr",
                        scaler.scale()
                    ).into()));
                }
                Ok(true)
            }
        }
    }

    /// The step's micro-batches, drawn from the stream.
    pub(super) fn next_batch(&mut self) -> GlobalBatch {
        let micro: Vec<Vec<usize>> = (0..self.accumulate)
            .map(|_| self.stream.next_batch())
            .collect();
        let train = &self.corpus.train;
        let targets: i64 = micro.iter().map(|b| target_tokens(train, b)).sum();
        let samples: u64 = micro.iter().map(|b| b.len() as u64).sum();
        let tokens: i64 = micro
            .iter()
            .map(|b| {
                b.iter()
                    .map(|&j| (train[j].src.len() + train[j].tgt.len() + 2) as i64)
                    .sum::<i64>()
            })
            .sum();
        GlobalBatch {
            micro,
            target_tokens: targets,
            samples,
            tokens,
        }
    }

    /// Forward and backward over this rank's shards of each micro-batch (its own, and in an
    /// elastic round of fewer ranks those of the missing ones: virtual ranks rank, rank +
    /// world, ...), with dropout seeded by (seed, step, virtual rank, micro-batch); returns
    /// this rank's summed loss, on the device. The gradient exchange is armed before the last
    /// backward: its buckets start as that backward completes them (`exchange` waits for them).
    /// The gradients are `loss_scale` times the loss's (`fp16`; 1 otherwise).
    pub(super) fn forward_backward(&mut self, batch: &GlobalBatch, loss_scale: f64) -> Tensor {
        let config = self.config;
        let train = &self.corpus.train;
        self.replica.optimizer.zero_grad();
        let (rank, world, virtual_world) = (self.rank, self.world, self.virtual_world);
        let shards: Vec<(usize, usize, Vec<usize>)> = batch
            .micro
            .iter()
            .enumerate()
            .flat_map(|(i, micro)| {
                (rank..virtual_world)
                    .step_by(world)
                    .map(move |v| (i, v, data::shard(micro, train, v, virtual_world)))
            })
            .collect();
        let last = shards.iter().rposition(|(_, _, s)| !s.is_empty());
        let mut grad_scale = loss_scale / batch.target_tokens as f64;
        if self.scaler.is_some() && loss_scale::overflow_injected(self.step + 1, rank) {
            grad_scale = f64::INFINITY;
        }
        // The loss stays on the device until the step's one host read.
        let mut loss_local = Tensor::zeros([], (Kind::Double, self.device));
        for (k, (i, v, mine)) in shards.iter().enumerate() {
            if mine.is_empty() {
                continue;
            }
            let tb = data::to_tensors(train, mine, self.device);
            if Some(k) == last
                && let Some(sync) = self.replica.grad_sync.as_mut()
            {
                sync.arm(self.comm.as_mut());
            }
            tch::manual_seed(step_seed(config.seed, self.step, *v, *i));
            loss_local +=
                self.replica
                    .model
                    .train_loss_backward(&tb, config.label_smoothing, grad_scale);
        }
        loss_local
    }
}

/// A seed for libtorch's RNG at (run seed, step, rank, micro-batch): dropout masks are a pure
/// function of the position in training, so a resume replays them exactly.
fn step_seed(seed: u64, step: u64, rank: usize, micro: usize) -> i64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for v in [step, rank as u64, micro as u64] {
        h = (h ^ v).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    (h >> 1) as i64
}

fn target_tokens(examples: &[Example], batch: &[usize]) -> i64 {
    batch
        .iter()
        .map(|&i| examples[i].tgt.len() as i64 + 1)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_seeds_differ_by_step_rank_and_micro_batch() {
        let a = step_seed(1, 10, 0, 0);
        assert_eq!(a, step_seed(1, 10, 0, 0));
        assert_ne!(a, step_seed(1, 11, 0, 0));
        assert_ne!(a, step_seed(1, 10, 1, 0));
        assert_ne!(a, step_seed(1, 10, 0, 1));
        assert_ne!(a, step_seed(2, 10, 0, 0));
        assert!(a >= 0);
    }
}
