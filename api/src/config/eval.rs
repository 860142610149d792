//! Validation loss and BLEU during training.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// Evaluation on the validation set.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many steps (and once at the end); 0 = only at the end.
    #[serde(default = "defaults::eval_every")]
    pub every_steps: u64,
    /// Also decode the validation set and report corpus BLEU (sacreBLEU-compatible).
    #[serde(default = "defaults::yes")]
    pub bleu: bool,
    /// Beam width for decoding; 1 = greedy.
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1, max = 64))]
    pub beam_size: u32,
    /// Decode at most this many validation sentences for BLEU (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_sentences: Option<u32>,
}

impl_default_from_serde!(EvalConfig);
