//! AdamW's hyper-parameters and gradient clipping.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// AdamW with decoupled weight decay.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate (reached at the end of warmup).
    #[serde(default = "defaults::lr")]
    #[schemars(range(min = 0.0))]
    pub lr: f64,
    /// First-moment decay.
    #[serde(default = "defaults::beta1")]
    #[schemars(range(min = 0.0, max = 0.999999))]
    pub beta1: f64,
    /// Second-moment decay.
    #[serde(default = "defaults::beta2")]
    #[schemars(range(min = 0.0, max = 0.999999))]
    pub beta2: f64,
    /// Denominator epsilon.
    #[serde(default = "defaults::eps")]
    #[schemars(range(min = 0.0))]
    pub eps: f64,
    /// Decoupled weight decay (not applied to biases and layer norms).
    #[serde(default = "defaults::weight_decay")]
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this; 0 disables clipping.
    #[serde(default = "defaults::clip_norm")]
    #[schemars(range(min = 0.0))]
    pub clip_norm: f64,
}

impl_default_from_serde!(OptimizerConfig);
