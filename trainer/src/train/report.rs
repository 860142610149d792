//! What a step tells the world: its line in rank 0's train log, the progress report
//! (/progress, /metrics, TensorBoard, the launcher's progress file) with its rates and ETA,
//! and a log line every `logEverySteps`.

use ferrotrain_api::TrainerPhase;
use ferrotrain_api::recovery::Timestamp;

use super::start::log_line;
use super::step::StepOutcome;
use super::trainer::Trainer;
use crate::error::{Result, TrainError};
use crate::metrics::SharedProgress;

impl Trainer<'_> {
    /// Keeps the step for the rates and the reported loss, refuses a loss that is not
    /// finite (unless fp16 skipped the step: the loss scale backs off), and (rank 0) appends
    /// the step's line to the train log.
    pub(super) fn record(&mut self, s: &StepOutcome) -> Result<()> {
        self.window
            .push(s.seconds, s.comm_seconds, s.tokens, s.samples);
        let (step, loss) = (s.step, s.loss);
        if loss.is_finite() {
            self.window.push_loss(loss);
        } else if !s.skipped {
            return Err(TrainError::Other(format!(
                "loss became {loss} at step {step}: lower optimizer.lr or raise schedule.warmupSteps"
            ).into()));
        }
        if let Some(log) = self.log.as_mut() {
            let mut line = serde_json::json!({
                "step": step, "loss": loss, "lr": s.lr, "gradNorm": s.grad_norm, "samples": self.samples,
                "tokens": s.tokens, "seconds": s.seconds, "commSeconds": s.comm_seconds,
            });
            if let Some(scale) = s.loss_scale {
                line["lossScale"] = scale.into();
            }
            if s.skipped {
                line["skipped"] = true.into();
            }
            log_line(log, &line)?;
        }
        Ok(())
    }

    /// The step in the progress report (/progress, /metrics, the launcher's progress file),
    /// in TensorBoard, and (rank 0, every logEverySteps) in a log line.
    pub(super) fn report(&mut self, s: &StepOutcome) {
        let config = self.config;
        let (step, lr) = (s.step, s.lr);
        let rates = self.window.rates();
        let mut p = self.progress.lock().expect("progress lock");
        p.step = step;
        p.samples = self.samples;
        p.epoch = self.stream.position().epoch;
        p.loss = Some(self.window.mean_loss());
        p.learning_rate = Some(lr);
        p.loss_scale = s.loss_scale;
        p.skipped_steps = self.skipped_steps;
        if let Some(r) = rates {
            p.steps_per_second = Some(r.steps_per_second);
            p.samples_per_second = Some(r.samples_per_second);
            p.tokens_per_second = Some(r.tokens_per_second);
            p.step_time_seconds = Some(r.step_time_seconds);
            let exchanged = self.replica.grad_sync.is_some();
            p.comm_fraction = exchanged.then_some(r.comm_fraction.clamp(0.0, 1.0));
            p.eta_seconds = Some(self.eta(s, r.steps_per_second));
        }
        if let Some(store) = self.store.as_ref() {
            p.last_checkpoint = store.last_completed();
        }
        p.peak_memory_bytes = peak_memory_bytes();
        if p.attempt_first_step_time.is_none() {
            p.attempt_first_step_time = Some(Timestamp::now());
        }
        if let Some(g) = &s.gang_resources {
            p.gang_resources = Some(g.clone());
        }
        self.reporter.step(&p, s.loss, s.grad_norm);
        let scale = s
            .loss_scale
            .map(|l| format!(" loss scale {l} ({} skipped)", p.skipped_steps))
            .unwrap_or_default();
        if self.leader && (step % config.log_every_steps == 0 || step == 1 || s.final_step) {
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
    }

    /// Seconds to the end at `steps_per_second`, with the evaluations still to come, within
    /// the time budget.
    pub(super) fn eta(&self, s: &StepOutcome, steps_per_second: f64) -> f64 {
        let config = self.config;
        let remaining = config.max_steps - s.step;
        let mut eta = remaining as f64 / steps_per_second;
        // Evaluations still to come pause training: every `every` steps and at the end.
        let every = config.eval.every_steps;
        if let (Some(total), Some(done)) = (
            config.max_steps.checked_div(every),
            s.step.checked_div(every),
        ) {
            let evals = total - done + u64::from(!config.max_steps.is_multiple_of(every));
            eta += evals as f64 * self.eval.last_seconds;
        }
        if let Some(budget) = self.clock.budget {
            eta = eta.min((budget - s.train_seconds).max(0.0));
        }
        eta
    }
}

/// Peak resident memory of this process (VmHWM), bytes.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(super) fn set_phase(progress: &SharedProgress, phase: TrainerPhase) {
    progress.lock().expect("progress lock").phase = phase;
}
