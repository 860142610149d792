//! When rank 0 saves a checkpoint, and what its trainer.json says.

use std::time::{Instant, SystemTime};

use super::step::StepOutcome;
use super::trainer::Trainer;
use crate::checkpoint::TrainerState;
use crate::error::Result;
use crate::rfc3339::{self, Resolution};

impl Trainer<'_> {
    /// Rank 0 starts a background save every `checkpoint.everySteps` steps or
    /// `everySeconds` seconds, after an evaluation when the best are kept, and at the end.
    pub(super) fn checkpoint_if_due(&mut self, s: &StepOutcome) -> Result<()> {
        let config = self.config;
        let step = s.step;
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let every = config.checkpoint.every_steps;
        let by_steps = every > 0 && step.is_multiple_of(every);
        let by_time = config
            .checkpoint
            .every_seconds
            .is_some_and(|secs| self.save.last_time.elapsed().as_secs() >= secs);
        // Every evaluated step is saved when the best checkpoints are kept, so "best by
        // eval loss" always has the evaluated weights to keep.
        let evaluated = self.eval.last_step == step && config.checkpoint.keep_best > 0;
        if !(by_steps || by_time || evaluated || s.final_step) || self.save.last_step == step {
            return Ok(());
        }
        let (last_eval, evaluated_now) = (self.eval.last, self.eval.last_step == step);
        let state = TrainerState {
            step,
            samples: self.samples,
            epoch: self.stream.position().epoch,
            seed: config.seed,
            config_digest: config.digest(),
            world_size: self.world as u32,
            train_loss: self.train_loss,
            eval_loss: evaluated_now.then(|| last_eval.map(|e| e.0)).flatten(),
            eval_bleu: evaluated_now.then(|| last_eval.and_then(|e| e.1)).flatten(),
            time: rfc3339::format(SystemTime::now(), Resolution::Exact),
            train_seconds: s.train_seconds,
            precision: Some(self.precision.clone()),
            loss_scale: self.scaler.as_ref().map(|l| l.state),
        };
        let blocked = store.save(&self.replica.params, &self.replica.optimizer.state(), state)?;
        tracing::debug!(step, blocked, "checkpoint started");
        self.save.last_step = step;
        self.save.last_time = Instant::now();
        Ok(())
    }
}
