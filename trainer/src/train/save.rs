//! When rank 0 saves a checkpoint, and what its trainer.json says. Rank 0 alone holds the
//! store; a save runs in the background, and dropping the store waits for it. A save the disk
//! refused does not end the run (the store records it and the next due save tries again);
//! the last one does: the run must not end as if it had the checkpoint of its last step.

use std::time::{Duration, Instant, SystemTime};

use ferrotrain_api::config::CheckpointPolicy;
use ferrotrain_api::{CheckpointInfo, TrainerConfig};

use super::report::Checkpoints;

use super::evaluate::EvalState;
use super::outcome::StepOutcome;
use super::replica::ModelReplica;
use super::scaling::Scaling;
use crate::checkpoint::{CheckpointStore, TrainerState};
use crate::error::{Reason, Result, TrainError};
use crate::rfc3339::{self, Resolution};

/// Rank 0's checkpoint store, and when it last saved.
pub(super) struct SaveState {
    /// Rank 0's (none on the others).
    store: Option<CheckpointStore>,
    /// The starting step before the first save.
    last_step: u64,
    last_time: Instant,
}

/// What trainer.json says besides the step: where the run stands, from the concerns that
/// keep it.
pub(super) struct RunState<'s> {
    pub(super) samples: u64,
    pub(super) epoch: u64,
    pub(super) world: usize,
    pub(super) train_loss: Option<f64>,
    pub(super) eval: &'s EvalState,
    pub(super) scaling: &'s Scaling,
}

impl SaveState {
    /// No save yet in this run: it counts from the starting `step`.
    pub(super) fn new(store: Option<CheckpointStore>, step: u64) -> Self {
        SaveState {
            store,
            last_step: step,
            last_time: Instant::now(),
        }
    }

    /// Rank 0 starts a background save every `checkpoint.everySteps` steps or
    /// `everySeconds` seconds, after an evaluation when the best are kept, and at the end.
    pub(super) fn checkpoint_if_due(
        &mut self,
        config: &TrainerConfig,
        s: &StepOutcome,
        run: &RunState<'_>,
        replica: &ModelReplica,
    ) -> Result<()> {
        let step = s.step;
        if !self.due(&config.checkpoint, s, run.eval.evaluated_at(step)) {
            return Ok(());
        }
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let state = trainer_state(config, step, s.train_seconds, run);
        let blocked = store.save(&replica.params, &replica.optimizer.state(), state)?;
        tracing::debug!(step, blocked, "checkpoint started");
        self.last_step = step;
        self.last_time = Instant::now();
        Ok(())
    }

    /// Whether `s` is saved by `policy`, `evaluated` when the step was evaluated.
    fn due(&self, policy: &CheckpointPolicy, s: &StepOutcome, evaluated: bool) -> bool {
        let step = s.step;
        let every = policy.every_steps;
        let by_steps = every > 0 && step.is_multiple_of(every);
        let by_time = policy
            .every_seconds
            .is_some_and(|secs| self.last_time.elapsed().as_secs() >= secs);
        // Every evaluated step is saved when the best checkpoints are kept, so "best by
        // eval loss" always has the evaluated weights to keep.
        let evaluated = evaluated && policy.keep_best > 0;
        (by_steps || by_time || evaluated || s.final_step) && self.last_step != step
    }

    /// At the end of training (rank 0): waits for the save in flight, and saves `step` (at
    /// `train_seconds`) when no checkpoint holds it, as when a round resumed from the peers'
    /// state of the last step because its save had failed. A save the disk refused is an
    /// error here: the next round, which resumes from this state, saves it.
    pub(super) fn save_last(
        &mut self,
        config: &TrainerConfig,
        (step, train_seconds): (u64, f64),
        run: &RunState<'_>,
        replica: &ModelReplica,
    ) -> Result<()> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let mut saved = store.wait();
        if matches!(&saved, Ok(last) if last.as_ref().map_or(0, |c| c.step) < step) {
            tracing::info!(step, "saving the last step: no checkpoint holds it yet");
            let state = trainer_state(config, step, train_seconds, run);
            saved = store
                .save(&replica.params, &replica.optimizer.state(), state)
                .and_then(|_| store.wait());
            self.last_step = step;
        }
        saved
            .map(drop)
            .map_err(|e| last_save_failed(e, step, store))
    }

    /// Rank 0's checkpoints as the progress report shows them (nothing on the others).
    pub(super) fn checkpoints(&self) -> Checkpoints {
        let Some(store) = self.store.as_ref() else {
            return Checkpoints::default();
        };
        Checkpoints {
            last: store.last_completed(),
            durable: store.durable(),
            error: store.save_error(),
            failures: store.save_failures(),
        }
    }

    /// Waits for the save in flight and, with a bucket, at most `limit` for its upload: the
    /// run's last checkpoint should outlive the pod. Says so when it will not.
    pub(super) fn wait_durable(&mut self, limit: Duration) -> Result<()> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        if !store.flush_uploads(limit)? {
            let step = store.last_completed().map(|c| c.step);
            tracing::warn!(
                ?step,
                durable = ?store.durable().map(|d| d.step),
                "the last checkpoint is not in the bucket after {:.0} s: it is on this pod's disk only (not durable)",
                limit.as_secs_f64()
            );
        }
        Ok(())
    }

    /// Before the training changes the model or the optimizer's state (the update): the save
    /// in flight must have copied them out (rank 0; at once when it has).
    pub(super) fn before_update(&mut self) {
        if let Some(store) = self.store.as_mut() {
            store.copied();
        }
    }

    /// Waits for the save in flight; the newest complete checkpoint then (rank 0).
    pub(super) fn wait(&mut self) -> Result<Option<CheckpointInfo>> {
        match self.store.as_mut() {
            Some(store) => store.wait(),
            None => Ok(None),
        }
    }
}

/// The last save failed with `e`: a disk that refused it is said so, with what comes next.
fn last_save_failed(e: TrainError, step: u64, store: &CheckpointStore) -> TrainError {
    if !e.disk_refused() {
        return e;
    }
    let why = format!(
        "the checkpoint of the last step ({step}) was not saved: the disk under {} refused it; \
         the run ends (retryable) so that the next round saves it from this state once the volume \
         has room",
        store.root().display()
    );
    tracing::error!("{why}: {e}");
    TrainError::Other(Reason::caused(why, e))
}

/// trainer.json of `step`, reached at `train_seconds`.
fn trainer_state(
    config: &TrainerConfig,
    step: u64,
    train_seconds: f64,
    run: &RunState<'_>,
) -> TrainerState {
    let (last_eval, evaluated_now) = (run.eval.last(), run.eval.evaluated_at(step));
    TrainerState {
        step,
        samples: run.samples,
        epoch: run.epoch,
        seed: config.seed,
        config_digest: config.digest(),
        world_size: run.world as u32,
        train_loss: run.train_loss,
        eval_loss: evaluated_now.then(|| last_eval.map(|e| e.0)).flatten(),
        eval_bleu: evaluated_now.then(|| last_eval.and_then(|e| e.1)).flatten(),
        time: rfc3339::format(SystemTime::now(), Resolution::Exact),
        train_seconds,
        precision: Some(run.scaling.precision().clone()),
        loss_scale: run.scaling.state(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_are_due_by_steps_after_a_kept_evaluation_and_at_the_end_once_a_step() {
        let policy = CheckpointPolicy {
            every_steps: 100,
            every_seconds: None,
            keep_latest: 1,
            keep_best: 0,
            store: None,
        };
        let keep_best = CheckpointPolicy {
            keep_best: 1,
            ..policy.clone()
        };
        let mut save = SaveState::new(None, 100);
        assert!(
            !save.due(&policy, &StepOutcome::sample(100, true), true),
            "the starting step"
        );
        assert!(!save.due(&policy, &StepOutcome::sample(150, false), false));
        assert!(save.due(&policy, &StepOutcome::sample(200, false), false));
        assert!(
            save.due(&policy, &StepOutcome::sample(150, true), false),
            "the last step"
        );
        assert!(
            !save.due(&policy, &StepOutcome::sample(150, false), true),
            "best not kept"
        );
        assert!(
            save.due(&keep_best, &StepOutcome::sample(150, false), true),
            "best kept"
        );
        let by_time = CheckpointPolicy {
            every_seconds: Some(0),
            ..policy.clone()
        };
        assert!(save.due(&by_time, &StepOutcome::sample(150, false), false));
        save.last_step = 200;
        assert!(
            !save.due(&policy, &StepOutcome::sample(200, true), true),
            "once a step"
        );
    }
}
