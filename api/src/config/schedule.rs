//! The learning rate over the run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// Shape of the learning rate over steps.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ScheduleKind {
    /// Linear warmup, then lr * sqrt(warmup / step) (the Transformer paper's schedule).
    #[default]
    InverseSqrt,
    /// Linear warmup, then cosine decay to `minLrRatio * lr` at the end of the horizon.
    Cosine,
    /// Linear warmup, then linear decay to `minLrRatio * lr` at the end of the horizon.
    Linear,
    /// Linear warmup, then constant.
    Constant,
}

/// What cosine and linear decay measure progress by.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ScheduleHorizon {
    /// Optimizer steps out of `maxSteps` (deterministic: exact resume).
    #[default]
    Steps,
    /// Training seconds out of `maxSeconds`, counted across restarts: the decay ends when
    /// the time budget does, however fast the machine is. The lr then depends on wall time,
    /// so a resumed run is not bitwise the uninterrupted one.
    Time,
}

/// Learning-rate schedule.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleConfig {
    /// `inverseSqrt`, `cosine`, `linear` or `constant`.
    #[serde(default)]
    pub kind: ScheduleKind,
    /// Steps of linear warmup from 0 to `optimizer.lr`.
    #[serde(default = "defaults::warmup_steps")]
    pub warmup_steps: u64,
    /// Cosine and linear: final lr as a fraction of the peak.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_lr_ratio: f64,
    /// Cosine and linear: decay over `steps` (of maxSteps) or `time` (of maxSeconds).
    #[serde(default)]
    pub horizon: ScheduleHorizon,
}

impl_default_from_serde!(ScheduleConfig);
