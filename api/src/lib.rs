//! ferrotrain's contracts between the operator, the launcher and the trainer ranks.

pub mod config;
pub mod env;
pub mod exit;
pub mod progress;

pub use config::{ConfigError, FieldError, ParallelFiles, Task, TrainerConfig};
pub use progress::{CheckpointInfo, Progress, TrainerPhase};
pub mod crd;
