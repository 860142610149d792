//! ferrotrain's contracts between the operator, the launcher and the trainer ranks.
//!
//! The `DistributedTraining` custom resource ([`crd`]) is behind the `crd` feature: the
//! operator and the end-to-end tests enable it, the trainer does not, so it builds no
//! Kubernetes types.

pub mod budget;
pub mod checksummed;
pub mod config;
#[cfg(feature = "crd")]
pub mod crd;
pub mod documented;
pub mod env;
pub mod exit;
pub mod output;
pub mod progress;
pub mod rank_end;
pub mod reason;
pub mod recovery;
#[cfg(feature = "reference")]
pub mod reference;

pub use budget::{DEFAULT_MAX_RESTARTS, RestartBudget};
pub use config::{ConfigError, FieldError, ParallelFiles, Task, TrainerConfig};
pub use progress::{
    CheckpointError, CheckpointInfo, DataStats, DurableCheckpoint, GpuUsage, Progress,
    ResourceUsage, TrainerPhase,
};
pub use rank_end::{EndKind, RankEnd};
pub use recovery::Recovery;
