//! What the trainer reads: parallel text and its tokenizer, or the copy task's synthetic
//! sequences.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// Parallel text: one sentence a line, source and target aligned by line; `.gz` is accepted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParallelFiles {
    /// Source-language file (relative paths resolve against the working directory).
    pub source: String,
    /// Target-language file, line-aligned with `source`.
    pub target: String,
}

/// Data for the `translation` task.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataConfig {
    /// Training pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<ParallelFiles>,
    /// Validation pairs (loss and BLEU during training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<ParallelFiles>,
    /// Training pairs with more subword tokens than this on either side are skipped.
    #[serde(default = "defaults::max_sentence_tokens")]
    #[schemars(range(min = 2))]
    pub max_sentence_tokens: u32,
    /// The subword tokenizer shared by source and target.
    #[serde(default)]
    pub tokenizer: TokenizerConfig,
}

/// A joint byte-pair-encoding tokenizer over source and target.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenizerConfig {
    /// Vocabulary size to learn (including the 4 special tokens).
    #[serde(default = "defaults::vocab_size")]
    #[schemars(range(min = 16, max = 1000000))]
    pub vocab_size: u32,
    /// Merges seen fewer times than this are not learned.
    #[serde(default = "defaults::min_frequency")]
    #[schemars(range(min = 1))]
    pub min_frequency: u32,
    /// Use this tokenizer.json instead of learning one. Either way, the tokenizer is saved
    /// beside the checkpoints and reused by every restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Synthetic sequences for the `copy` task.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CopyTaskConfig {
    /// Number of distinct symbols (excluding the 4 special tokens).
    #[serde(default = "defaults::copy_symbols")]
    #[schemars(range(min = 2, max = 100000))]
    pub symbols: u32,
    /// Shortest sequence length.
    #[serde(default = "defaults::copy_min_length")]
    #[schemars(range(min = 1))]
    pub min_length: u32,
    /// Longest sequence length.
    #[serde(default = "defaults::copy_max_length")]
    #[schemars(range(min = 1))]
    pub max_length: u32,
    /// Training examples per epoch.
    #[serde(default = "defaults::copy_train_samples")]
    #[schemars(range(min = 1))]
    pub train_samples: u64,
    /// Validation examples.
    #[serde(default = "defaults::copy_valid_samples")]
    #[schemars(range(min = 1))]
    pub valid_samples: u64,
}

impl_default_from_serde!(DataConfig, TokenizerConfig, CopyTaskConfig);
