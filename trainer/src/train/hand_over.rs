//! The loop, and what a rank leaves when its round ends before the job does: the state of the
//! last step it completed, in its pod's heal directory (`heal`), for the next round to start
//! from instead of the last checkpoint. A step's state is consistent between steps only: a
//! collective that breaks inside a step leaves the parameters and moments of the step before
//! (the optimizer updates them after the exchange, and nothing there can fail).

use super::trainer::Trainer;
use crate::error::{Result, TrainError};
use crate::heal::{self, HealState};

impl Trainer<'_> {
    /// Steps until `done`, or the first error.
    pub(super) fn train(&mut self) -> Result<()> {
        while !self.done() {
            let s = self.step()?;
            self.evaluate_if_due(&s)?;
            self.checkpoint_if_due(&s)?;
            self.report(&s);
        }
        Ok(())
    }

    /// The round ended with `error`: a retryable one (a peer died or hung, the round was
    /// ended elsewhere) leaves this rank's state; a permanent one ends the job anyway.
    pub(super) fn hand_over(&self, error: &TrainError) {
        if error.exit_code() == ferrotrain_api::exit::RETRYABLE {
            self.leave_state();
        }
    }

    /// The gang stopped together on a signal (the round ends: the pod goes away, the gang
    /// resizes): every rank is at the same step.
    pub(super) fn hand_over_at_stop(&self) {
        self.leave_state();
    }

    fn leave_state(&self) {
        let Some(dir) = self.heal.dir.as_deref() else {
            return;
        };
        let state = HealState {
            step: self.step,
            samples: self.samples,
            optimizer_steps: self.replica.optimizer.steps,
            train_seconds: self.clock.synced_seconds,
            loss_scale: self.scaler.as_ref().map(|s| s.state),
            config: self.heal.config,
            layout: Vec::new(),
            crc32c: 0,
        };
        let started = std::time::Instant::now();
        match heal::write(dir, &state, &self.replica.optimizer.state_buffers()) {
            Ok(true) => tracing::info!(
                rank = self.rank,
                step = self.step,
                seconds = started.elapsed().as_secs_f64(),
                "heal: left the state of step {} for the next round",
                self.step
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(rank = self.rank, error = %e, "heal: no state left"),
        }
    }
}
