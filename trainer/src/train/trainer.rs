//! One rank's training run, as `run` drives it: its state (`Trainer`, its clock, what its
//! evaluations and saves found so far), and its end. The steps it takes are methods in the
//! files of their concern (`start`, `step`, `exchange`, `evaluate`, `save`, `report`).

use std::fs::File;
use std::time::Instant;

use ferrotrain_api::progress::PrecisionChoice;
use ferrotrain_api::{TrainerConfig, TrainerPhase};
use tch::Device;

use super::job::Summary;
use super::replica::ModelReplica;
use super::window::Window;
use crate::checkpoint::CheckpointStore;
use crate::data::{BatchStream, Corpus};
use crate::dist::Collective;
use crate::error::Result;
use crate::loss_scale::LossScaler;
use crate::metrics::{MetricsServer, Reporter, SharedProgress};
use crate::resources::ResourceSampler;

/// Training time, which `maxSeconds` and a time-horizon schedule count: the job's earlier
/// runs plus this run's loop, not its start-up (data, vocabulary, rendezvous), which differs
/// between machines and restarts.
pub(super) struct Clock {
    pub(super) loop_started: Instant,
    pub(super) earlier_seconds: f64,
    /// Rank 0's training seconds at the last step (the step's all-reduce gives every rank
    /// rank 0's count): what the next round goes on from.
    pub(super) synced_seconds: f64,
    /// `maxSeconds`.
    pub(super) budget: Option<f64>,
}

impl Clock {
    /// This rank's count; the step's all-reduce gives every rank rank 0's.
    pub(super) fn train_seconds(&self) -> f64 {
        self.earlier_seconds + self.loop_started.elapsed().as_secs_f64()
    }
    pub(super) fn over_budget(&self, train_seconds: f64) -> bool {
        self.budget.is_some_and(|b| train_seconds >= b)
    }
    /// The share of the budget spent (0 without one), for a time-horizon schedule.
    pub(super) fn time_used(&self, train_seconds: f64) -> f64 {
        self.budget.map_or(0.0, |b| train_seconds / b)
    }
}

/// Where this rank leaves its state when the round ends (`heal`): its pod's heal directory
/// (none: nothing is left) and the digest of the config it trains with.
pub(super) struct Heal {
    pub(super) dir: Option<std::path::PathBuf>,
    pub(super) config: u64,
}

/// What the evaluations of this run found.
pub(super) struct EvalState {
    /// The last evaluation that had a loss: (loss, BLEU).
    pub(super) last: Option<(f64, Option<f64>)>,
    pub(super) best: Option<f64>,
    /// The step evaluated last (the starting step before the first evaluation).
    pub(super) last_step: u64,
    /// How long the last evaluation took (the ETA adds the ones to come).
    pub(super) last_seconds: f64,
}

/// When rank 0 last saved a checkpoint.
pub(super) struct SaveState {
    /// The starting step before the first save.
    pub(super) last_step: u64,
    pub(super) last_time: Instant,
}

/// One rank's training run: `start`, then `step`, `evaluate_if_due`, `checkpoint_if_due` and
/// `report` until `done`, then `finish`.
pub(super) struct Trainer<'a> {
    pub(super) config: &'a TrainerConfig,
    pub(super) device: Device,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// The gang's full world size (FERROTRAIN_VIRTUAL_WORLD, at least `world`): a smaller
    /// elastic round covers the missing ranks' shards, so every step's global batch is the
    /// full gang's and the loss curve does not change with the world size.
    pub(super) virtual_world: usize,
    /// Micro-batches per optimizer step (`batch.plan`).
    pub(super) accumulate: u32,
    pub(super) leader: bool,
    /// When `run` began (the summary's seconds).
    pub(super) started: Instant,
    /// Optimizer steps taken, of the job (not only this run).
    pub(super) step: u64,
    /// Examples consumed, of the job.
    pub(super) samples: u64,
    pub(super) resumed_from_step: Option<u64>,
    pub(super) heal: Heal,
    pub(super) clock: Clock,
    pub(super) window: Window,
    pub(super) eval: EvalState,
    pub(super) save: SaveState,
    /// The last step's loss.
    pub(super) train_loss: Option<f64>,
    /// The last step was the run's last (time budget or signal).
    pub(super) stop: bool,
    pub(super) interrupted_by: Option<i32>,
    /// The precision every rank trains in, and why.
    pub(super) precision: PrecisionChoice,
    /// `fp16`'s dynamic loss scale (None in the other precisions).
    pub(super) scaler: Option<LossScaler>,
    /// Steps this run skipped on a gradient overflow (`fp16`).
    pub(super) skipped_steps: u64,
    /// Every rank's CPU, memory and GPU, summed into rank 0's view with the step's all-reduce
    /// every logEverySteps.
    pub(super) sampler: ResourceSampler,
    // Dropped in this order, the reverse of making them (as when they were `run`'s locals):
    // the metrics server stops and a save in flight completes before the collective closes.
    pub(super) log: Option<File>,
    pub(super) stream: BatchStream,
    pub(super) reporter: Reporter,
    pub(super) _server: Option<MetricsServer>,
    pub(super) progress: SharedProgress,
    pub(super) store: Option<CheckpointStore>,
    pub(super) replica: ModelReplica,
    pub(super) corpus: Corpus,
    pub(super) comm: Box<dyn Collective>,
}

impl Trainer<'_> {
    /// No evaluation or save yet in this run: both count from the starting step.
    pub(super) fn first_marks(step: u64) -> (EvalState, SaveState) {
        let eval = EvalState {
            last: None,
            best: None,
            last_step: step,
            last_seconds: 0.0,
        };
        let save = SaveState {
            last_step: step,
            last_time: Instant::now(),
        };
        (eval, save)
    }

    /// `maxSteps` reached, or the last step stopped the run (time budget or signal).
    pub(super) fn done(&self) -> bool {
        self.step >= self.config.max_steps || self.stop
    }

    /// Waits for the last save, reports the end, and meets the other ranks once more.
    pub(super) fn finish(mut self) -> Result<Summary> {
        let last_checkpoint = match self.store.as_mut() {
            Some(store) => store.wait()?,
            None => None,
        };
        {
            let mut p = self.progress.lock().expect("progress lock");
            if self.interrupted_by.is_none() {
                p.phase = TrainerPhase::Finished;
                p.eta_seconds = Some(0.0);
            }
            p.last_checkpoint = last_checkpoint.clone();
        }
        self.reporter.finish(&self.progress);
        self.comm.barrier()?;
        Ok(Summary {
            step: self.step,
            resumed_from_step: self.resumed_from_step,
            loss: self.train_loss,
            eval_loss: self.eval.last.map(|e| e.0),
            eval_bleu: self.eval.last.and_then(|e| e.1),
            last_checkpoint,
            seconds: self.started.elapsed().as_secs_f64(),
            interrupted_by: self.interrupted_by,
            final_progress: self.progress.lock().expect("progress lock").clone(),
        })
    }
}
