//! The loop and its step, like the paper: the global batch, forward and backward over this
//! rank's shard of it, the exchange (`exchange.rs`), clip, AdamW at the schedule's rate; then
//! maybe evaluate, maybe checkpoint, report. Each concern keeps its own state (`trainer.rs`):
//! the loop hands each what the step did.

use std::time::Instant;

use tch::{Kind, Tensor};

use super::batch::GlobalBatch;
use super::evaluate::evaluate;
use super::outcome::StepOutcome;
use super::report::Standing;
use super::save::RunState;
use super::trainer::Trainer;
use crate::data;
use crate::error::Result;
use crate::optim;

impl Trainer<'_> {
    /// Steps until `done`, or the first error.
    pub(super) fn train(&mut self) -> Result<()> {
        while !self.done() {
            let s = self.step()?;
            self.evaluate_if_due(&s)?;
            self.checkpoint_if_due(&s)?;
            self.report(&s);
            crate::phases::end(s.step, s.tokens);
        }
        Ok(())
    }

    /// One optimizer step, like the paper: batch -> forward -> loss -> backward -> all-reduce
    /// (with the step's one host read) -> clip -> AdamW at the schedule's rate. A loss that
    /// is not finite ends the run here; the step is recorded only once it passed.
    pub(super) fn step(&mut self) -> Result<StepOutcome> {
        let t0 = Instant::now();
        crate::phases::begin();
        let config = self.config;
        let batch = self.batches.next(&self.corpus.train);
        crate::phases::mark("data");
        let loss_scale = self.scaling.factor();
        let loss_local = self.forward_backward(&batch, loss_scale);
        crate::fault::rank_fault(self.rank, self.position.step());
        let synced = self.exchange(&loss_local, batch.target_tokens)?;
        // The gradient norm and the step's host read (the all-reduce with several ranks).
        crate::phases::mark("optimizer");
        let over_budget = self.clock.over_budget(synced.train_seconds);
        self.stop.after_step(over_budget, synced.interrupted_by);
        let grad_norm = synced.grad_norm / loss_scale;
        let step = self.position.next_step();
        let skipped = self
            .scaling
            .overflowed(step, grad_norm.is_finite(), self.rank)?;
        let lr = optim::learning_rate(
            config.optimizer.lr,
            &config.schedule,
            config.max_steps,
            step,
            self.clock.time_used(synced.train_seconds),
        );
        if !skipped {
            // A save of the last step may still be copying the weights and moments out.
            self.save.before_update();
            let optimizer = &mut self.replica.optimizer;
            optimizer.clip_to(grad_norm, config.optimizer.clip_norm);
            optimizer.unscale(loss_scale);
            optimizer.step(lr);
        }
        crate::phases::mark("optimizer");
        self.position.advance(batch.samples);
        self.clock.sync(synced.train_seconds);
        let outcome = StepOutcome {
            step,
            loss: synced.loss,
            grad_norm,
            lr,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds: synced.comm_seconds,
            tokens: batch.tokens,
            samples: batch.samples,
            train_seconds: synced.train_seconds,
            gang_resources: synced.gang_resources,
            final_step: self.done(),
            skipped,
            loss_scale: self.scaling.loss_scale(),
        };
        outcome.fail_if_diverged()?;
        self.reporting.record(&outcome, self.position.samples())?;
        Ok(outcome)
    }

    /// Every `eval.everySteps` steps and after the last (every rank: `evaluate` all-reduces).
    fn evaluate_if_due(&mut self, s: &StepOutcome) -> Result<()> {
        let interrupted = self.stop.interrupted_by().is_some();
        if !self.eval.due(self.config.eval.every_steps, s, interrupted) {
            return Ok(());
        }
        self.reporting.evaluating();
        let e0 = Instant::now();
        let found = evaluate(
            &self.replica.model,
            &self.corpus,
            self.config,
            self.comm.as_mut(),
            self.device,
        )?;
        self.eval
            .record(s.step, e0.elapsed().as_secs_f64(), found.0, found.1);
        self.reporting
            .evaluated(s.step, found, self.eval.best(), e0)
    }

    /// Rank 0 saves when `save` says the step is due, with what trainer.json says of it.
    fn checkpoint_if_due(&mut self, s: &StepOutcome) -> Result<()> {
        let run = RunState {
            samples: self.position.samples(),
            epoch: self.batches.epoch(),
            world: self.world,
            train_loss: self.reporting.train_loss(),
            eval: &self.eval,
            scaling: &self.scaling,
        };
        self.save
            .checkpoint_if_due(self.config, s, &run, &self.replica)
    }

    /// The end of training, every rank together: rank 0 waits for its last save (and saves
    /// the step reached when no checkpoint holds it), then the gang meets once more. An error
    /// here is one of the round's, like a step's: the ranks hand their state over.
    pub(super) fn end_together(&mut self) -> Result<()> {
        let run = RunState {
            samples: self.position.samples(),
            epoch: self.batches.epoch(),
            world: self.world,
            train_loss: self.reporting.train_loss(),
            eval: &self.eval,
            scaling: &self.scaling,
        };
        let reached = (self.position.step(), self.clock.synced_seconds());
        let saved = self
            .save
            .save_last(self.config, reached, &run, &self.replica);
        if saved.is_err() {
            self.reporting.checkpoints(self.save.checkpoints());
        }
        saved?;
        // The others wait here for rank 0's last save, never for its upload (`finish`): that
        // may take longer than the collective timeout.
        self.comm.barrier()
    }

    /// The step in the progress report, with where the run stands.
    fn report(&mut self, s: &StepOutcome) {
        let at = Standing {
            samples: self.position.samples(),
            epoch: self.batches.epoch(),
            skipped_steps: self.scaling.skipped_steps(),
            exchanged: self.replica.grad_sync.is_some(),
            checkpoints: self.save.checkpoints(),
            eval_seconds: self.eval.last_seconds(),
            budget: self.clock.budget(),
        };
        self.reporting.step(self.config, s, at);
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
        crate::phases::mark("optimizer");
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
        if self
            .scaling
            .overflow_injected(self.position.next_step(), rank)
        {
            grad_scale = f64::INFINITY;
        }
        // The loss stays on the device until the step's one host read.
        let mut loss_local = Tensor::zeros([], (Kind::Double, self.device));
        for (k, (i, v, mine)) in shards.iter().enumerate() {
            if mine.is_empty() {
                continue;
            }
            let tb = data::to_tensors(train, mine, self.device);
            if crate::phases::enabled() {
                let (src, tgt) = (tb.src.size(), tb.tgt_in.size());
                crate::phases::shape(src[0], src[1], tgt[1], tb.real.size()[0]);
                crate::phases::mark("data");
            }
            if Some(k) == last
                && let Some(sync) = self.replica.grad_sync.as_mut()
            {
                sync.arm(self.comm.as_mut());
            }
            tch::manual_seed(step_seed(config.seed, self.position.step(), *v, *i));
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
