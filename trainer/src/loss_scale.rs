//! Dynamic loss scaling for `precision: fp16`, as PyTorch's `GradScaler` does it: the loss is
//! multiplied by the scale before backward (small gradients stay above fp16's smallest
//! normal), the gradients divided by it before the update; a step whose all-reduced
//! gradients hold an inf or NaN is skipped and the scale backs off; after `growthInterval`
//! clean steps it grows. The transitions are pure; the trainer applies them every step, the
//! same on every rank (each sees the same all-reduced gradients).

use std::sync::OnceLock;

use ferrotrain_api::config::LossScaleConfig;
use serde::{Deserialize, Serialize};

/// Overflowing steps in a row after which fp16 is hopeless for this model (the scale has
/// backed off by 2^40): the activations themselves overflow.
pub const MAX_CONSECUTIVE_SKIPS: u32 = 40;

/// The scaler's state as a checkpoint keeps it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleState {
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub growth_tracker: u64,
}

/// What `LossScaler::update` did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Update {
    /// The step goes ahead; the scale stays.
    Kept,
    /// The step goes ahead; the scale grew from `from`.
    Grew { from: f64 },
    /// The gradients overflowed: the step is skipped; the scale backed off from `from`.
    Skipped { from: f64 },
}

/// The dynamic loss scale.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    pub state: ScaleState,
    config: LossScaleConfig,
    /// Skipped steps in a row.
    pub consecutive_skips: u32,
}

impl LossScaler {
    /// A scaler at `resumed` (a checkpoint's) or the config's initial scale.
    pub fn new(config: &LossScaleConfig, resumed: Option<ScaleState>) -> Self {
        LossScaler {
            state: resumed.unwrap_or(ScaleState {
                scale: config.initial,
                growth_tracker: 0,
            }),
            config: config.clone(),
            consecutive_skips: 0,
        }
    }

    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// After a step's gradients were checked: `finite` when every (all-reduced) gradient was.
    /// GradScaler's `_amp_update_scale_`: back off and reset the tracker on an overflow;
    /// grow (when the grown scale is finite) and reset it after `growthInterval` clean steps.
    pub fn update(&mut self, finite: bool) -> Update {
        let from = self.state.scale;
        if !finite {
            self.state.scale = from * self.config.backoff_factor;
            self.state.growth_tracker = 0;
            self.consecutive_skips += 1;
            return Update::Skipped { from };
        }
        self.consecutive_skips = 0;
        let clean = self.state.growth_tracker + 1;
        if clean >= self.config.growth_interval {
            let grown = from * self.config.growth_factor;
            self.state.growth_tracker = 0;
            if grown.is_finite() {
                self.state.scale = grown;
                return Update::Grew { from };
            }
            return Update::Kept;
        }
        self.state.growth_tracker = clean;
        Update::Kept
    }
}

/// Test hook: `FERROTRAIN_INJECT_OVERFLOW=STEP@RANK[,STEP@RANK...]` makes that rank's
/// gradients of that step (1-based) infinite, as an fp16 overflow in its backward would.
/// Only a run with a loss scaler honours it.
pub fn overflow_injected(step: u64, rank: usize) -> bool {
    static AT: OnceLock<Vec<(u64, usize)>> = OnceLock::new();
    AT.get_or_init(|| {
        std::env::var("FERROTRAIN_INJECT_OVERFLOW")
            .map(|v| parse_injections(&v))
            .unwrap_or_default()
    })
    .contains(&(step, rank))
}

fn parse_injections(v: &str) -> Vec<(u64, usize)> {
    v.split(',')
        .filter_map(|one| {
            let (step, rank) = one.trim().split_once('@')?;
            Some((step.parse().ok()?, rank.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(interval: u64) -> LossScaleConfig {
        LossScaleConfig {
            initial: 1024.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: interval,
        }
    }

    #[test]
    fn an_overflow_halves_the_scale_and_resets_the_growth_count() {
        let mut s = LossScaler::new(&config(3), None);
        assert_eq!(s.update(true), Update::Kept);
        assert_eq!(s.state.growth_tracker, 1);
        assert_eq!(s.update(false), Update::Skipped { from: 1024.0 });
        assert_eq!(
            s.state,
            ScaleState {
                scale: 512.0,
                growth_tracker: 0
            }
        );
        assert_eq!(s.consecutive_skips, 1);
        assert_eq!(s.update(false), Update::Skipped { from: 512.0 });
        assert_eq!((s.scale(), s.consecutive_skips), (256.0, 2));
        assert_eq!(s.update(true), Update::Kept);
        assert_eq!(s.consecutive_skips, 0);
    }

    #[test]
    fn the_scale_grows_after_growth_interval_clean_steps() {
        let mut s = LossScaler::new(&config(3), None);
        assert_eq!(s.update(true), Update::Kept);
        assert_eq!(s.update(true), Update::Kept);
        assert_eq!(s.update(true), Update::Grew { from: 1024.0 });
        assert_eq!(
            s.state,
            ScaleState {
                scale: 2048.0,
                growth_tracker: 0
            }
        );
        // An overflow in the middle starts the count again.
        s.update(true);
        s.update(false);
        s.update(true);
        s.update(true);
        assert_eq!(s.scale(), 1024.0);
        assert_eq!(s.update(true), Update::Grew { from: 1024.0 });
    }

    #[test]
    fn growth_stops_short_of_infinity_and_a_resume_keeps_the_state() {
        let mut s = LossScaler::new(
            &config(1),
            Some(ScaleState {
                scale: f64::MAX,
                growth_tracker: 0,
            }),
        );
        assert_eq!(s.update(true), Update::Kept);
        assert_eq!(s.scale(), f64::MAX);
        let saved = ScaleState {
            scale: 8.0,
            growth_tracker: 1,
        };
        let json = serde_json::to_string(&saved).unwrap();
        assert_eq!(json, r#"{"scale":8.0,"growthTracker":1}"#);
        let mut resumed = LossScaler::new(&config(2), Some(serde_json::from_str(&json).unwrap()));
        assert_eq!(resumed.update(true), Update::Grew { from: 8.0 });
    }

    #[test]
    fn injections_name_a_step_and_a_rank() {
        assert_eq!(parse_injections("5@1, 7@0"), [(5, 1), (7, 0)]);
        assert_eq!(parse_injections("5"), []);
        assert_eq!(parse_injections("x@1,3@y"), []);
    }
}
