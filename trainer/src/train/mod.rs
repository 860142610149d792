//! The training loop. Per step, like the paper: batch -> forward -> loss -> backward ->
//! all-reduce -> clip -> optimizer step -> schedule -> maybe evaluate -> maybe checkpoint ->
//! report.
//!
//! Every rank runs this loop on its shard of the same global batches. Rank 0 alone loads and
//! writes checkpoints and serves progress; it broadcasts the vocabulary, the weights and the
//! optimizer state, so other ranks never need the checkpoint volume.
//!
//! `run` is the loop; each file holds one concern of it. What a run is given and returns:
//! `job` (and the job directory's files). Before the first step: `start`, `resume` (where
//! the state comes from: a peer's, a checkpoint's), `replica` (the model and its optimizer).
//! The loop: `step` (forward and backward, optimizer step, then the concerns), `exchange`
//! (the step's collectives and its one host read), `outcome` (what a step did, and the
//! judgement of its loss). The state, each part with the methods that change it (`trainer`
//! holds them together): `batch` (the stream, the step's global batch), `position` (the
//! job's step and samples), `stop` (the time budget, a signal), `clock` (training time),
//! `scaling` (precision and fp16's loss scale), `evaluate`, `save` (when rank 0
//! checkpoints), `report` (the progress report) with `window` (rates) and `step_log` (rank 0's
//! train log), and `hand_over` (the state left for the next round).

mod batch;
mod clock;
mod evaluate;
mod exchange;
mod hand_over;
mod job;
mod outcome;
mod position;
mod replica;
mod report;
mod resume;
mod save;
mod scaling;
mod start;
mod step;
mod step_log;
mod stop;
mod trainer;
mod window;

pub use job::{CONFIG_FILE, RunOptions, Summary, TRAIN_LOG, VOCAB_FILE};
pub use resume::restore_model;

use crate::error::TrainError;
use trainer::Trainer;

/// Why a run ended early: the error, and the last step this rank completed once it had
/// started (the record its launcher reads names it: `ferrotrain_api::RankEnd`).
#[derive(Debug)]
pub struct Failure {
    pub error: TrainError,
    pub step: Option<u64>,
}

impl From<TrainError> for Failure {
    fn from(error: TrainError) -> Self {
        Failure { error, step: None }
    }
}

/// Trains until `maxSteps` (or `maxSeconds`), from the freshest state of the gang's last
/// round or the job's latest checkpoint. When the round ends early (a peer failed, a signal,
/// the last checkpoint not saved) the state it reached is left for the next round.
pub fn run(opts: &RunOptions) -> std::result::Result<Summary, Failure> {
    let mut t = Trainer::start(opts)?;
    let trained = t.train();
    if trained.is_ok() && t.stop.interrupted_by().is_some() {
        t.hand_over_at_stop();
    }
    if let Err(error) = trained.and_then(|()| t.end_together()) {
        t.hand_over(&error);
        let step = Some(t.position.step());
        return Err(Failure { error, step });
    }
    let step = t.position.step();
    t.finish().map_err(|error| Failure {
        error,
        step: Some(step),
    })
}
