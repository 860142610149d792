//! The precision every rank trains in, and `fp16`'s dynamic loss scale: the scale the loss
//! is multiplied by before backward, and the steps skipped when the gradients overflowed.

use ferrotrain_api::config::{LossScaleConfig, Precision};
use ferrotrain_api::progress::PrecisionChoice;

use crate::error::{Result, TrainError};
use crate::loss_scale::{self, LossScaler, MAX_CONSECUTIVE_SKIPS, ScaleState, Update};

/// The run's precision and loss scaling.
pub(super) struct Scaling {
    /// The precision every rank trains in, and why.
    precision: PrecisionChoice,
    /// `fp16`'s dynamic loss scale (None in the other precisions).
    scaler: Option<LossScaler>,
    /// Steps this run skipped on a gradient overflow (`fp16`).
    skipped_steps: u64,
}

impl Scaling {
    /// `fp16`'s loss scale goes on from `resumed` (the state's), else `config`'s.
    pub(super) fn new(
        config: &LossScaleConfig,
        precision: PrecisionChoice,
        resumed: Option<ScaleState>,
        leader: bool,
    ) -> Self {
        let scaler = (precision.used == Precision::Fp16).then(|| LossScaler::new(config, resumed));
        if let (true, Some(s)) = (leader, &scaler) {
            tracing::info!(
                scale = s.scale(),
                resumed = resumed.is_some(),
                "fp16: dynamic loss scale"
            );
        }
        Scaling {
            precision,
            scaler,
            skipped_steps: 0,
        }
    }

    pub(super) fn precision(&self) -> &PrecisionChoice {
        &self.precision
    }

    /// The factor the loss is multiplied by before backward (1 outside `fp16`).
    pub(super) fn factor(&self) -> f64 {
        self.scaler.as_ref().map_or(1.0, LossScaler::scale)
    }

    /// `fp16`'s loss scale now (None in the other precisions).
    pub(super) fn loss_scale(&self) -> Option<f64> {
        self.scaler.as_ref().map(LossScaler::scale)
    }

    /// What a checkpoint or a heal snapshot keeps of the loss scale.
    pub(super) fn state(&self) -> Option<ScaleState> {
        self.scaler.as_ref().map(|s| s.state)
    }

    pub(super) fn skipped_steps(&self) -> u64 {
        self.skipped_steps
    }

    /// Test hook (`FERROTRAIN_INJECT_OVERFLOW`): only a run with a loss scaler honours it.
    pub(super) fn overflow_injected(&self, step: u64, rank: usize) -> bool {
        self.scaler.is_some() && loss_scale::overflow_injected(step, rank)
    }

    /// `fp16`: updates the loss scale from whether `step`'s all-reduced gradients were
    /// `finite` (the same on every rank); true when the update must be skipped. Fails when
    /// the gradients overflowed on `MAX_CONSECUTIVE_SKIPS` steps in a row.
    pub(super) fn overflowed(&mut self, step: u64, finite: bool, rank: usize) -> Result<bool> {
        let Some(scaler) = self.scaler.as_mut() else {
            return Ok(false);
        };
        match scaler.update(finite) {
            Update::Kept => Ok(false),
            Update::Grew { from } => {
                tracing::debug!(step, from, to = scaler.scale(), "fp16: loss scale grew");
                Ok(false)
            }
            Update::Skipped { from } => {
                self.skipped_steps += 1;
                tracing::warn!(
                    rank,
                    "fp16: gradients overflowed at step {step}: step skipped, loss scale {from} -> {}",
                    scaler.scale()
                );
                if scaler.consecutive_skips >= MAX_CONSECUTIVE_SKIPS {
                    // Permanent (exit 2): a restart from the checkpoint would overflow again.
                    return Err(TrainError::Config(format!(
                        "precision fp16: the gradients overflowed on {MAX_CONSECUTIVE_SKIPS} steps in a \
                         row (loss scale now {:e}): the model's activations overflow fp16 itself; use \
                         precision bf16 or fp32, or lower optimizer.lr",
                        scaler.scale()
                    ).into()));
                }
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaling(used: Precision) -> Scaling {
        let choice = PrecisionChoice {
            requested: used,
            used,
            reason: "test".into(),
        };
        Scaling::new(&LossScaleConfig::default(), choice, None, false)
    }

    #[test]
    fn only_fp16_skips_steps_and_too_many_in_a_row_fail_the_run() {
        let mut fp32 = scaling(Precision::Fp32);
        assert_eq!(fp32.factor(), 1.0);
        assert!(!fp32.overflowed(1, false, 0).unwrap());
        assert_eq!((fp32.skipped_steps(), fp32.state()), (0, None));

        let mut fp16 = scaling(Precision::Fp16);
        let initial = fp16.factor();
        assert!(!fp16.overflowed(1, true, 0).unwrap());
        assert!(fp16.overflowed(2, false, 0).unwrap());
        assert_eq!(fp16.skipped_steps(), 1);
        assert!(fp16.factor() < initial, "the scale backs off");
        assert_eq!(fp16.loss_scale(), Some(fp16.factor()));
        for step in 3..=MAX_CONSECUTIVE_SKIPS as u64 {
            assert!(fp16.overflowed(step, false, 0).unwrap());
        }
        let e = fp16.overflowed(99, false, 0).unwrap_err();
        assert_eq!(e.exit_code(), ferrotrain_api::exit::INVALID_CONFIG);
        assert!(e.to_string().contains("use precision bf16 or fp32"), "{e}");
    }
}
