//! When checkpoints are saved and which are kept.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// When checkpoints are written and which are kept.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// Save every this many steps (and at the end); 0 = only at the end.
    #[serde(default = "defaults::checkpoint_every_steps")]
    pub every_steps: u64,
    /// Also save when this many seconds passed since the last save.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub every_seconds: Option<u64>,
    /// Keep the newest K complete checkpoints.
    #[serde(default = "defaults::keep_latest")]
    #[schemars(range(min = 1))]
    pub keep_latest: u32,
    /// Also keep the N with the lowest validation loss.
    #[serde(default = "defaults::one")]
    pub keep_best: u32,
}

impl_default_from_serde!(CheckpointPolicy);
