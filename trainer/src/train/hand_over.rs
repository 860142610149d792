//! What a rank leaves when its round ends before the job does: the state of the last step it
//! completed, in its pod's heal directory (`heal`), for the next round to start from instead
//! of the last checkpoint. A step's state is consistent between steps only: a collective
//! that breaks inside a step leaves the parameters and moments of the step before (the
//! optimizer updates them after the exchange, and nothing there can fail).

use std::path::PathBuf;

use super::position::Position;
use crate::error::TrainError;
use crate::heal::{self, HealState};
use crate::loss_scale::ScaleState;
use crate::optim::AdamW;

/// Where this rank leaves its state when the round ends: its pod's heal directory (none:
/// nothing is left) and the digest of the config it trains with.
pub(super) struct Heal {
    dir: Option<PathBuf>,
    config: u64,
}

/// The state of the last completed step, as the concerns that keep it hold it.
pub(super) struct LastStep<'s> {
    pub(super) position: &'s Position,
    pub(super) optimizer: &'s AdamW,
    /// Rank 0's training seconds at the step.
    pub(super) train_seconds: f64,
    pub(super) loss_scale: Option<ScaleState>,
}

impl Heal {
    pub(super) fn new(dir: Option<PathBuf>, config: u64) -> Self {
        Heal { dir, config }
    }

    /// The pod's heal directory (none outside a launcher).
    pub(super) fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// The digest of the whole trainer config.
    pub(super) fn config(&self) -> u64 {
        self.config
    }

    /// The round ended with `error`: a retryable one (a peer died or hung, the round was
    /// ended elsewhere) leaves this rank's state; a permanent one ends the job anyway.
    pub(super) fn on_error(&self, error: &TrainError, rank: usize, last: &LastStep<'_>) {
        if error.exit_code() == ferrotrain_api::exit::RETRYABLE {
            self.leave(rank, last);
        }
    }

    /// Leaves the state of the `last` step in the heal directory, if the pod has one.
    pub(super) fn leave(&self, rank: usize, last: &LastStep<'_>) {
        let Some(dir) = self.dir.as_deref() else {
            return;
        };
        let step = last.position.step();
        let state = HealState {
            step,
            samples: last.position.samples(),
            optimizer_steps: last.optimizer.steps,
            train_seconds: last.train_seconds,
            loss_scale: last.loss_scale,
            config: self.config,
            layout: Vec::new(),
            crc32c: 0,
        };
        let started = std::time::Instant::now();
        match heal::write(dir, &state, &last.optimizer.state_buffers()) {
            Ok(true) => tracing::info!(
                rank,
                step,
                seconds = started.elapsed().as_secs_f64(),
                "heal: left the state of step {step} for the next round"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(rank, error = %e, "heal: no state left"),
        }
    }
}
