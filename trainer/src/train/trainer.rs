//! One rank's training run, as `run` drives it: its state, each part owned by the concern
//! that changes it (`Batches`, `Position`, `Stop`, `Clock`, `Scaling`, `EvalState`,
//! `SaveState`, `Reporting`, `Heal`, each with its methods in its own file) beside what does
//! not change once started (the config, the ranks, the device) and what the step computes
//! with (the replica, the corpus, the collective); and its end. `start` makes it; `step`
//! drives the concerns one step at a time.

use std::time::{Duration, Instant};

use ferrotrain_api::TrainerConfig;
use tch::Device;

use super::batch::Batches;
use super::clock::Clock;
use super::evaluate::EvalState;
use super::hand_over::{Heal, LastStep};
use super::job::Summary;
use super::position::Position;
use super::replica::ModelReplica;
use super::report::Reporting;
use super::save::SaveState;
use super::scaling::Scaling;
use super::stop::Stop;
use crate::data::Corpus;
use crate::distributed::Collective;
use crate::error::{Result, TrainError};

/// One rank's training run: `start`, then `train` (a `step` at a time) until `done`, then
/// `finish`.
pub(super) struct Trainer<'a> {
    pub(super) config: &'a TrainerConfig,
    pub(super) device: Device,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// The gang's full world size (FERROTRAIN_VIRTUAL_WORLD, at least `world`): a smaller
    /// elastic round covers the missing ranks' shards, so every step's global batch is the
    /// full gang's and the loss curve does not change with the world size.
    pub(super) virtual_world: usize,
    pub(super) leader: bool,
    /// When `run` began (the summary's seconds).
    pub(super) started: Instant,
    pub(super) position: Position,
    pub(super) stop: Stop,
    pub(super) clock: Clock,
    pub(super) scaling: Scaling,
    pub(super) eval: EvalState,
    pub(super) heal: Heal,
    // Dropped in this order, the reverse of making them (as when they were `run`'s locals):
    // the metrics server stops (`reporting`) and a save in flight completes (`save`) before
    // the collective closes.
    pub(super) reporting: Reporting,
    pub(super) batches: Batches,
    pub(super) save: SaveState,
    pub(super) replica: ModelReplica,
    pub(super) corpus: Corpus,
    pub(super) comm: Box<dyn Collective>,
}

impl Trainer<'_> {
    /// `maxSteps` reached, or the last step stopped the run (time budget or signal).
    pub(super) fn done(&self) -> bool {
        self.position.step() >= self.config.max_steps || self.stop.stopped()
    }

    /// The round ended with `error`: a retryable one leaves this rank's state for the next.
    pub(super) fn hand_over(&self, error: &TrainError) {
        self.heal.on_error(error, self.rank, &self.last_step());
    }

    /// The gang stopped together on a signal (the round ends: the pod goes away, the gang
    /// resizes): every rank is at the same step.
    pub(super) fn hand_over_at_stop(&self) {
        self.heal.leave(self.rank, &self.last_step());
    }

    fn last_step(&self) -> LastStep<'_> {
        LastStep {
            position: &self.position,
            optimizer: &self.replica.optimizer,
            train_seconds: self.clock.synced_seconds(),
            loss_scale: self.scaling.state(),
        }
    }

    /// Once the gang ended together (`end_together`): waits for the last upload (rank 0,
    /// with a bucket) and reports the end.
    pub(super) fn finish(mut self) -> Result<Summary> {
        let last_checkpoint = self.save.wait()?;
        let interrupted_by = self.stop.interrupted_by();
        self.save.wait_durable(upload_limit(interrupted_by))?;
        self.reporting
            .finish(interrupted_by.is_none(), self.save.checkpoints());
        let last_eval = self.eval.last();
        Ok(Summary {
            step: self.position.step(),
            resumed_from_step: self.position.resumed_from_step(),
            loss: self.reporting.train_loss(),
            eval_loss: last_eval.map(|e| e.0),
            eval_bleu: last_eval.and_then(|e| e.1),
            last_checkpoint,
            seconds: self.started.elapsed().as_secs_f64(),
            interrupted_by,
            final_progress: self.reporting.progress(),
        })
    }
}

/// How long the end of a run waits for its last checkpoint's upload: a run stopped by a
/// signal has its pod's termination grace (the launcher's stop grace, less a margin for the
/// rest of the exit); a run that finished waits long enough for any upload that progresses.
fn upload_limit(interrupted_by: Option<i32>) -> Duration {
    const FINISHED: Duration = Duration::from_secs(1800);
    if interrupted_by.is_none() {
        return FINISHED;
    }
    let grace = std::env::var(ferrotrain_api::env::FERROTRAIN_STOP_GRACE_SECONDS)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|g| g.is_finite() && *g > 0.0)
        .unwrap_or(25.0);
    Duration::from_secs_f64((grace - 3.0).max(1.0))
}
