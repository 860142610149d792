//! What one optimizer step did, and the step's judgement of it: a loss that is not finite
//! ends the run (the model diverged), unless fp16 skipped the step.

use ferrotrain_api::progress::GangResources;

use crate::error::{Result, TrainError};

/// What one optimizer step did.
pub(super) struct StepOutcome {
    /// The step just taken (the first is 1).
    pub(super) step: u64,
    /// Per target token of the global batch.
    pub(super) loss: f64,
    pub(super) grad_norm: f64,
    pub(super) lr: f64,
    pub(super) seconds: f64,
    pub(super) comm_seconds: f64,
    /// Source and target tokens of the global batch, each with its EOS.
    pub(super) tokens: i64,
    /// Examples in the global batch.
    pub(super) samples: u64,
    /// Rank 0's training seconds at the step's all-reduce.
    pub(super) train_seconds: f64,
    /// Every rank's resources, on the steps that summarise them (every logEverySteps).
    pub(super) gang_resources: Option<GangResources>,
    /// The run's last step: maxSteps reached, the time budget spent or a signal received.
    pub(super) final_step: bool,
    /// `fp16`: the gradients overflowed, the update was skipped (on every rank).
    pub(super) skipped: bool,
    /// `fp16`: the loss scale after this step.
    pub(super) loss_scale: Option<f64>,
}

impl StepOutcome {
    /// Fails the run when the loss is not finite: the model diverged, and more steps would
    /// not bring it back. A step fp16 skipped is not judged: its loss scale backs off and the
    /// next step tries again.
    pub(super) fn fail_if_diverged(&self) -> Result<()> {
        let (step, loss) = (self.step, self.loss);
        if loss.is_finite() || self.skipped {
            return Ok(());
        }
        Err(TrainError::Diverged(
            format!(
                "loss became {loss} at step {step}: lower optimizer.lr or raise schedule.warmupSteps"
            )
            .into(),
        ))
    }
}

/// The tests' step: step `step` of a healthy run (its last when `final_step`); each test sets
/// what else it is about.
#[cfg(test)]
impl StepOutcome {
    pub(super) fn sample(step: u64, final_step: bool) -> StepOutcome {
        StepOutcome {
            step,
            loss: 1.0,
            grad_norm: 1.0,
            lr: 1e-3,
            seconds: 0.1,
            comm_seconds: 0.0,
            tokens: 10,
            samples: 2,
            train_seconds: 1.0,
            gang_resources: None,
            final_step,
            skipped: false,
            loss_scale: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(loss: f64, skipped: bool) -> StepOutcome {
        StepOutcome {
            loss,
            skipped,
            ..StepOutcome::sample(7, false)
        }
    }

    #[test]
    fn a_loss_that_is_not_finite_fails_the_run_unless_fp16_skipped_the_step() {
        assert!(outcome(2.5, false).fail_if_diverged().is_ok());
        assert!(outcome(f64::NAN, true).fail_if_diverged().is_ok());
        assert!(outcome(f64::INFINITY, true).fail_if_diverged().is_ok());
        for loss in [f64::NAN, f64::INFINITY] {
            let e = outcome(loss, false).fail_if_diverged().unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "loss became {loss} at step 7: lower optimizer.lr or raise schedule.warmupSteps"
                )
            );
            assert_eq!(e.exit_code(), ferrotrain_api::exit::RETRYABLE);
        }
    }
}
