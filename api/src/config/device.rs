//! Where tensors live and the precision the forward and backward passes compute in.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults;

/// Numeric precision of the forward/backward pass.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Precision {
    /// What the hardware is fast at, decided at start-up: `bf16` on GPUs of compute
    /// capability 8.0 or more and on CPUs with AMX-BF16 or AVX512-BF16, `fp16` on GPUs of
    /// capability 7.x, `fp32` otherwise. Every rank must come to the same choice.
    #[default]
    Auto,
    /// 32-bit floats everywhere.
    Fp32,
    /// bfloat16 for matrix multiplies; weights, layer norms, loss and optimizer stay fp32.
    Bf16,
    /// float16 for matrix multiplies with dynamic loss scaling (`lossScale`); weights,
    /// layer norms, loss and optimizer stay fp32. For GPUs without bf16 (V100, T4).
    Fp16,
}

impl Precision {
    /// The name in configs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Precision::Auto),
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            _ => Err(format!("expected auto, fp32, bf16 or fp16, got {s:?}")),
        }
    }
}

/// Dynamic loss scaling for `precision: fp16`, as PyTorch's `GradScaler`: the loss is
/// multiplied by the scale before backward and the gradients divided by it before the
/// update; a step whose (all-reduced) gradients hold an inf or NaN is skipped on every rank
/// and the scale multiplied by `backoffFactor`; after `growthInterval` steps without one the
/// scale is multiplied by `growthFactor`. Ignored by the other precisions.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LossScaleConfig {
    /// The first scale (a resumed run goes on with its checkpoint's).
    #[serde(default = "defaults::initial_loss_scale")]
    pub initial: f64,
    /// Multiplies the scale after `growthInterval` steps without an overflow; more than 1.
    #[serde(default = "defaults::growth_factor")]
    pub growth_factor: f64,
    /// Multiplies the scale on an overflow; in (0, 1).
    #[serde(default = "defaults::backoff_factor")]
    pub backoff_factor: f64,
    /// Steps without an overflow before the scale grows.
    #[serde(default = "defaults::growth_interval")]
    #[schemars(range(min = 1))]
    pub growth_interval: u64,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig {
            initial: defaults::initial_loss_scale(),
            growth_factor: defaults::growth_factor(),
            backoff_factor: defaults::backoff_factor(),
            growth_interval: defaults::growth_interval(),
        }
    }
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DeviceKind {
    /// CUDA when available (rank i uses GPU LOCAL_RANK), otherwise CPU.
    #[default]
    Auto,
    /// Always CPU.
    Cpu,
    /// Always CUDA; fails when no GPU is visible.
    Cuda,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::MINIMAL;
    use crate::config::{ConfigError, TrainerConfig};

    #[test]
    fn precision_defaults_to_auto_and_loss_scale_to_grad_scalers() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(c.precision, Precision::Auto);
        assert_eq!(c.loss_scale, LossScaleConfig::default());
        assert_eq!(
            (c.loss_scale.initial, c.loss_scale.growth_interval),
            (65536.0, 2000)
        );
        for p in [
            Precision::Auto,
            Precision::Fp32,
            Precision::Bf16,
            Precision::Fp16,
        ] {
            let c = TrainerConfig::from_yaml(&format!("{MINIMAL}precision: {p}\n"), "t").unwrap();
            assert_eq!(c.precision, p);
            assert_eq!(p.as_str().parse::<Precision>(), Ok(p));
        }
        assert!("fp8".parse::<Precision>().unwrap_err().contains("fp16"));
        let err = TrainerConfig::from_yaml(&format!("{MINIMAL}precision: fp8\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("precision") || err.contains("fp8"), "{err}");
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(
            &format!(
                "{MINIMAL}lossScale: {{initial: 0, growthFactor: 1, backoffFactor: 1.5, \
                 growthInterval: 0}}\n"
            ),
            "t",
        ) else {
            panic!("expected invalid");
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "lossScale.initial",
                "lossScale.growthFactor",
                "lossScale.backoffFactor",
                "lossScale.growthInterval"
            ]
        );
    }
}
