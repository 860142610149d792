//! The trainer's configuration: the one type the trainer parses from YAML and the operator
//! embeds in `DistributedTraining.spec.trainer`, so the two never drift.
//!
//! Field names are camelCase in YAML (Kubernetes convention). Every field but `task` and
//! `maxSteps` has a default; unknown fields are rejected.

mod batch;
mod checkpoint;
mod data;
mod defaults;
mod device;
mod distributed;
mod error;
mod eval;
#[cfg(test)]
mod fixtures;
mod model;
mod optimizer;
mod schedule;
mod tensorboard;
mod trainer;
mod validate;

pub use batch::{BatchConfig, StepPlan};
pub use checkpoint::{BucketUrl, CheckpointPolicy, Endpoint, ObjectStore, check_endpoint};
pub use data::{CopyTaskConfig, DataConfig, ParallelFiles, TokenizerConfig};
pub use device::{DeviceKind, LossScaleConfig, Precision};
pub use distributed::{Backend, DistributedConfig};
pub use error::{ConfigError, FieldError};
pub use eval::EvalConfig;
pub use model::ModelConfig;
pub use optimizer::OptimizerConfig;
pub use schedule::{ScheduleConfig, ScheduleHorizon, ScheduleKind};
pub use tensorboard::TensorBoardConfig;
pub use trainer::{Task, TrainerConfig};
