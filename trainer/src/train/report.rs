//! What the run tells the world: rank 0's train log (a line per step, per evaluation), the
//! progress report (/progress, /metrics, TensorBoard, the launcher's progress file) with its
//! rates and ETA, and a log line every `logEverySteps`. It only records: what a step's loss
//! means for the run is the step's to judge (`outcome`).

use std::time::Instant;

use ferrotrain_api::progress::GangResources;
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{
    CheckpointError, CheckpointInfo, DurableCheckpoint, Progress, TrainerConfig, TrainerPhase,
};

use super::job::RunOptions;
use super::outcome::StepOutcome;
use super::replica::ModelReplica;
use super::resume::Start;
use super::scaling::Scaling;
use super::step_log::StepLog;
use super::window::Window;
use crate::checkpoint::CheckpointStore;
use crate::error::Result;
use crate::metrics::{MetricsServer, Reporter, SharedProgress};
use crate::model;
use crate::resources::ResourceSampler;

/// The reporting side of a run: what it keeps of recent steps and where it tells them.
pub(super) struct Reporting {
    /// Every rank's CPU, memory and GPU, summed into rank 0's view with the step's
    /// all-reduce every logEverySteps.
    sampler: ResourceSampler,
    window: Window,
    /// The last step's loss.
    train_loss: Option<f64>,
    leader: bool,
    // Dropped in this order, the reverse of making them: the metrics server stops before
    // the run's store and collective go.
    log: Option<StepLog>,
    reporter: Reporter,
    _server: Option<MetricsServer>,
    progress: SharedProgress,
}

/// What the progress report shows besides the step: where the run stands, from the
/// concerns that keep it.
pub(super) struct Standing {
    pub(super) samples: u64,
    pub(super) epoch: u64,
    pub(super) skipped_steps: u64,
    /// The gradients are exchanged with other ranks (a comm fraction is reported).
    pub(super) exchanged: bool,
    pub(super) checkpoints: Checkpoints,
    /// How long the last evaluation took (the ETA adds the ones to come).
    pub(super) eval_seconds: f64,
    /// `maxSeconds`.
    pub(super) budget: Option<f64>,
}

/// Rank 0's checkpoints as the report shows them (none on the others).
#[derive(Default)]
pub(super) struct Checkpoints {
    /// The newest complete checkpoint.
    pub(super) last: Option<CheckpointInfo>,
    /// The newest checkpoint in the bucket (`checkpoint.store`).
    pub(super) durable: Option<DurableCheckpoint>,
    /// The last save's failure, while none completed since.
    pub(super) error: Option<CheckpointError>,
    /// Saves that failed in this run.
    pub(super) failures: u64,
}

impl Checkpoints {
    fn report_in(self, p: &mut Progress) {
        p.last_checkpoint = self.last;
        p.durable_checkpoint = self.durable;
        p.checkpoint_error = self.error;
        p.checkpoint_save_failures = self.failures;
    }
}

impl Reporting {
    /// `progress` as `serve_progress` made it, the reporter started on it, rank 0's step
    /// log, and a sampler that has taken its first sample.
    pub(super) fn new(
        leader: bool,
        progress: SharedProgress,
        server: Option<MetricsServer>,
        reporter: Reporter,
        log: Option<StepLog>,
        sampler: ResourceSampler,
    ) -> Self {
        Reporting {
            sampler,
            window: Window::default(),
            train_loss: None,
            leader,
            log,
            reporter,
            _server: server,
            progress,
        }
    }

    /// The last step's loss.
    pub(super) fn train_loss(&self) -> Option<f64> {
        self.train_loss
    }

    /// Keeps the step for the rates and the reported loss, and (rank 0) appends the step's
    /// line to the train log, with the job's `samples` after it.
    pub(super) fn record(&mut self, s: &StepOutcome, samples: u64) -> Result<()> {
        self.window
            .push(s.seconds, s.comm_seconds, s.tokens, s.samples);
        let (step, loss) = (s.step, s.loss);
        // Not finite only on a step fp16 skipped: it keeps the last loss.
        if loss.is_finite() {
            self.window.push_loss(loss);
            self.train_loss = Some(loss);
        }
        if let Some(log) = self.log.as_mut() {
            let mut line = serde_json::json!({
                "step": step, "loss": loss, "lr": s.lr, "gradNorm": s.grad_norm, "samples": samples,
                "tokens": s.tokens, "seconds": s.seconds, "commSeconds": s.comm_seconds,
            });
            if let Some(scale) = s.loss_scale {
                line["lossScale"] = scale.into();
            }
            if s.skipped {
                line["skipped"] = true.into();
            }
            log.append(&line)?;
        }
        Ok(())
    }

    /// The step in the progress report (/progress, /metrics, the launcher's progress file),
    /// in TensorBoard, and (rank 0, every logEverySteps) in a log line.
    pub(super) fn step(&mut self, config: &TrainerConfig, s: &StepOutcome, at: Standing) {
        let rates = self.window.rates();
        let mut p = self.progress.lock().expect("progress lock");
        p.step = s.step;
        p.samples = at.samples;
        p.epoch = at.epoch;
        p.loss = Some(self.window.mean_loss());
        p.learning_rate = Some(s.lr);
        p.loss_scale = s.loss_scale;
        p.skipped_steps = at.skipped_steps;
        if let Some(r) = rates {
            p.steps_per_second = Some(r.steps_per_second);
            p.samples_per_second = Some(r.samples_per_second);
            p.tokens_per_second = Some(r.tokens_per_second);
            p.step_time_seconds = Some(r.step_time_seconds);
            p.comm_fraction = at.exchanged.then_some(r.comm_fraction.clamp(0.0, 1.0));
            let eta = eta(config, s, r.steps_per_second, at.eval_seconds, at.budget);
            p.eta_seconds = Some(eta);
        }
        at.checkpoints.report_in(&mut p);
        p.peak_memory_bytes = peak_memory_bytes();
        if p.attempt_first_step_time.is_none() {
            p.attempt_first_step_time = Some(Timestamp::now());
        }
        if let Some(g) = &s.gang_resources {
            p.gang_resources = Some(g.clone());
        }
        self.reporter.step(&p, s.loss, s.grad_norm);
        let step = s.step;
        if self.leader && (step.is_multiple_of(config.log_every_steps) || step == 1 || s.final_step)
        {
            log_step(config, s, &p);
        }
    }

    /// This rank's resources in its slots of the step's all-reduce (the other ranks' slots 0).
    pub(super) fn resource_slots(&mut self, rank: usize, world: usize) -> Vec<f32> {
        let mut slots = vec![0.0f32; world * GangResources::SLOTS];
        let mine = GangResources::slots(self.sampler.sample().as_ref());
        slots[rank * GangResources::SLOTS..][..GangResources::SLOTS].copy_from_slice(&mine);
        slots
    }

    /// The run evaluates: the report says so until `evaluated`.
    pub(super) fn evaluating(&self) {
        self.progress.lock().expect("progress lock").phase = TrainerPhase::Evaluating;
    }

    /// The evaluation of `step`, begun at `started`, found `loss` and `bleu`; `best` is the
    /// run's lowest loss so far.
    pub(super) fn evaluated(
        &mut self,
        step: u64,
        (loss, bleu): (Option<f64>, Option<f64>),
        best: Option<f64>,
        started: Instant,
    ) -> Result<()> {
        if self.leader {
            tracing::info!(
                step,
                eval_loss = loss.unwrap_or(f64::NAN),
                eval_bleu = bleu.unwrap_or(f64::NAN),
                seconds = started.elapsed().as_secs_f64(),
                "evaluation"
            );
            if let Some(log) = self.log.as_mut() {
                let line = serde_json::json!({"step": step, "evalLoss": loss, "evalBleu": bleu, "evalSeconds": started.elapsed().as_secs_f64()});
                log.append(&line)?;
            }
        }
        let mut p = self.progress.lock().expect("progress lock");
        p.eval_loss = loss;
        p.eval_bleu = bleu;
        p.eval_step = Some(step);
        p.best_eval_loss = best;
        p.phase = TrainerPhase::Training;
        Ok(())
    }

    /// The end of the run (`finished`: not stopped by a signal), with its checkpoints: the
    /// last report.
    pub(super) fn finish(&mut self, finished: bool, checkpoints: Checkpoints) {
        {
            let mut p = self.progress.lock().expect("progress lock");
            if finished {
                p.phase = TrainerPhase::Finished;
                p.eta_seconds = Some(0.0);
            }
            checkpoints.report_in(&mut p);
        }
        self.reporter.finish(&self.progress);
    }

    /// The checkpoints changed between steps (the last save failed): the report says so.
    pub(super) fn checkpoints(&mut self, checkpoints: Checkpoints) {
        let mut p = self.progress.lock().expect("progress lock");
        checkpoints.report_in(&mut p);
        self.reporter.update(&p);
    }

    /// The report as it stands (rank 0's: the run's summary).
    pub(super) fn progress(&self) -> Progress {
        self.progress.lock().expect("progress lock").clone()
    }
}

/// Rank 0's log line for step `s`, from its report `p`.
fn log_step(config: &TrainerConfig, s: &StepOutcome, p: &Progress) {
    let (step, lr) = (s.step, s.lr);
    let scale = s
        .loss_scale
        .map(|l| format!(" loss scale {l} ({} skipped)", p.skipped_steps))
        .unwrap_or_default();
    tracing::info!(
        "step {step}/{} loss {:.4} lr {lr:.3e} {:.2} steps/s {:.0} tok/s comm {:.0}% eta {:.0}s{scale}",
        config.max_steps,
        p.loss.unwrap_or(f64::NAN),
        p.steps_per_second.unwrap_or(0.0),
        p.tokens_per_second.unwrap_or(0.0),
        100.0 * p.comm_fraction.unwrap_or(0.0),
        p.eta_seconds.unwrap_or(0.0),
    );
}

/// Seconds to the end after step `s` at `steps_per_second`, with the evaluations still to
/// come (each as long as the last, `eval_seconds`), within the time `budget`.
fn eta(
    config: &TrainerConfig,
    s: &StepOutcome,
    steps_per_second: f64,
    eval_seconds: f64,
    budget: Option<f64>,
) -> f64 {
    let remaining = config.max_steps - s.step;
    let mut eta = remaining as f64 / steps_per_second;
    // Evaluations still to come pause training: every `every` steps and at the end.
    let every = config.eval.every_steps;
    if let (Some(total), Some(done)) = (
        config.max_steps.checked_div(every),
        s.step.checked_div(every),
    ) {
        let evals = total - done + u64::from(!config.max_steps.is_multiple_of(every));
        eta += evals as f64 * eval_seconds;
    }
    if let Some(budget) = budget {
        eta = eta.min((budget - s.train_seconds).max(0.0));
    }
    eta
}

/// Peak resident memory of this process (VmHWM), bytes.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Rank 0's progress (served on /metrics, /progress and /healthz when `metrics_port` is set),
/// filled with where the run starts and the precision it trains in.
pub(super) fn serve_progress(
    opts: &RunOptions,
    leader: bool,
    world: usize,
    start: &Start,
    replica: &ModelReplica,
    store: Option<&CheckpointStore>,
    scaling: &Scaling,
) -> Result<(SharedProgress, Option<MetricsServer>)> {
    let progress: SharedProgress = Default::default();
    let server = match (leader, opts.metrics_port) {
        (true, Some(port)) => {
            let server = crate::metrics::serve_rank(port, progress.clone())?;
            tracing::info!(addr = %server.local_addr(), "serving /metrics, /progress, /healthz");
            Some(server)
        }
        _ => None,
    };
    {
        let mut p = progress.lock().expect("progress lock");
        p.phase = TrainerPhase::Training;
        p.step = start.step;
        p.total_steps = opts.config.max_steps;
        p.samples = start.samples;
        p.world_size = world as u32;
        // The round the report is of: the launcher serves it on after the next round began.
        p.round = opts.rank.round;
        p.resumed_from_step = start.resumed_from_step;
        p.healed_from = start.source.healed_from();
        p.parameters = model::parameter_count(&replica.vs);
        p.last_checkpoint = store.and_then(CheckpointStore::last_completed);
        p.durable_checkpoint = store.and_then(CheckpointStore::durable);
        p.precision = Some(scaling.precision().clone());
        p.loss_scale = scaling.loss_scale();
    }
    Ok((progress, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_adds_the_evaluations_to_come_within_the_budget() {
        let yaml = "task: copy\nmaxSteps: 100\neval:\n  everySteps: 30\n";
        let config = TrainerConfig::from_yaml(yaml, "test").unwrap();
        let s = StepOutcome {
            seconds: 0.5,
            train_seconds: 80.0,
            ..StepOutcome::sample(40, false)
        };
        // 60 steps at 2 steps/s, and the evaluations at 60, 90 and the end, 5 s each.
        assert_eq!(eta(&config, &s, 2.0, 5.0, None), 45.0);
        assert_eq!(eta(&config, &s, 2.0, 5.0, Some(100.0)), 20.0);
        assert_eq!(eta(&config, &s, 2.0, 5.0, Some(50.0)), 0.0);
    }
}
