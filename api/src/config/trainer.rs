//! The whole document: what to learn, for how long, and every section; parsing, loading and
//! the digest that says which checkpoints a config can resume.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::batch::BatchConfig;
use super::checkpoint::CheckpointPolicy;
use super::data::{CopyTaskConfig, DataConfig};
use super::defaults;
use super::device::{DeviceKind, LossScaleConfig, Precision};
use super::distributed::DistributedConfig;
use super::error::ConfigError;
use super::eval::EvalConfig;
use super::model::ModelConfig;
use super::optimizer::OptimizerConfig;
use super::schedule::ScheduleConfig;
use super::tensorboard::TensorBoardConfig;

/// What the trainer learns.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Task {
    /// Sequence-to-sequence translation from parallel text files (`data.train`, `data.valid`).
    Translation,
    /// A synthetic task (the target is the source sequence): needs no files; for tests and demos.
    Copy,
}

/// A complete trainer configuration.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainerConfig {
    /// What to learn: `translation` (parallel text files) or `copy` (synthetic, no files).
    pub task: Task,
    /// Seed for weight init, data order and dropout. Same seed + same config = same run.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// Number of optimizer steps to train for; also the schedule's horizon (cosine).
    #[schemars(range(min = 1))]
    pub max_steps: u64,
    /// Optional wall-clock budget in seconds: training stops (with a final evaluation and
    /// checkpoint) at whichever comes first, `maxSteps` or this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_seconds: Option<u64>,
    /// Parallel corpus and tokenizer (task `translation`).
    #[serde(default)]
    pub data: DataConfig,
    /// Synthetic data (task `copy`).
    #[serde(default)]
    pub copy: CopyTaskConfig,
    /// The encoder-decoder transformer.
    #[serde(default)]
    pub model: ModelConfig,
    /// How sentences are grouped into steps.
    #[serde(default)]
    pub batch: BatchConfig,
    /// AdamW hyper-parameters and gradient clipping.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule.
    #[serde(default)]
    pub schedule: ScheduleConfig,
    /// Label smoothing of the cross-entropy loss, in [0, 1).
    #[serde(default = "defaults::label_smoothing")]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub label_smoothing: f64,
    /// Numeric precision of the matrix multiplies: `auto` (the default: what the hardware
    /// is fast at), `fp32`, `bf16` or `fp16` (with dynamic loss scaling).
    #[serde(default)]
    pub precision: Precision,
    /// Dynamic loss scaling for `precision: fp16` (and `auto` when it picks fp16).
    #[serde(default)]
    pub loss_scale: LossScaleConfig,
    /// Validation loss and BLEU.
    #[serde(default)]
    pub eval: EvalConfig,
    /// When to save and how many checkpoints to keep.
    #[serde(default)]
    pub checkpoint: CheckpointPolicy,
    /// Gradient exchange and rendezvous between ranks.
    #[serde(default)]
    pub distributed: DistributedConfig,
    /// Where the trainer runs: `auto` picks CUDA when a GPU is visible.
    #[serde(default)]
    pub device: DeviceKind,
    /// Intra-op threads per rank; default = available cores / local ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub threads: Option<u32>,
    /// Log a progress line every this many steps.
    #[serde(default = "defaults::log_every_steps")]
    #[schemars(range(min = 1))]
    pub log_every_steps: u64,
    /// TensorBoard event files written by rank 0.
    #[serde(default)]
    pub tensorboard: TensorBoardConfig,
}

impl TrainerConfig {
    /// Parses YAML (or JSON, a subset) and validates it. `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: TrainerConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
                origin: origin.to_string(),
                message: e.to_string(),
            })?;
        config.check(origin)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Serializes to YAML (what the operator puts in the job's ConfigMap).
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("config serializes")
    }

    /// `validate`, as a `Result`.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        let errors = self.validate();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_string(),
                errors,
            })
        }
    }

    /// A stable digest of everything that shapes the model's tensors and vocabulary; a
    /// checkpoint whose digest differs cannot be resumed by this config (exit code 4).
    /// Training length, data paths, optimizer hyper-parameters, evaluation and checkpoint
    /// cadence may change between runs. (Changing the batching usually moves batch
    /// boundaries; resuming then fails at the data position, also with exit code 4.)
    pub fn digest(&self) -> String {
        let shaping = serde_json::json!({
            "task": self.task,
            "tokenizer": {"vocabSize": self.data.tokenizer.vocab_size, "path": self.data.tokenizer.path},
            "copySymbols": self.copy.symbols,
            "model": self.model,
        });
        // FNV-1a 64: dependency-free and stable across Rust versions.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in shaping.to_string().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScheduleKind;
    use crate::config::fixtures::MINIMAL;

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(c.model.d_model, 256);
        assert_eq!(c.optimizer.lr, 2e-3);
        assert_eq!(c.schedule.kind, ScheduleKind::InverseSqrt);
        assert_eq!(c.batch.max_tokens, 2000);
        assert_eq!(c.checkpoint.keep_latest, 3);
    }

    #[test]
    fn unknown_field_is_named() {
        let err = TrainerConfig::from_yaml("task: copy\nmaxSteps: 10\nmodel:\n  dmodel: 3\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dmodel"), "{err}");
    }

    #[test]
    fn wrong_type_is_named() {
        let err = TrainerConfig::from_yaml("task: copy\nmaxSteps: ten\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("maxSteps") || err.contains("line 2"), "{err}");
    }

    #[test]
    fn unknown_task_is_rejected() {
        let err = TrainerConfig::from_yaml("task: summarize\nmaxSteps: 10\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("summarize"), "{err}");
    }

    #[test]
    fn yaml_round_trip_is_lossless() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        let again = TrainerConfig::from_yaml(&c.to_yaml(), "again").unwrap();
        assert_eq!(c, again);
        assert_eq!(c.digest(), again.digest());
    }

    #[test]
    fn digest_ignores_training_length_but_not_model_shape() {
        let a = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        let mut b = a.clone();
        b.max_steps = 99;
        b.eval.every_steps = 7;
        b.optimizer.lr = 1e-4;
        assert_eq!(a.digest(), b.digest());
        b.model.d_model = 128;
        assert_ne!(a.digest(), b.digest());
    }
}
