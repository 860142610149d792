//! How sentences are grouped into micro-batches and optimizer steps.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// Token-count batching.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchConfig {
    /// Upper bound on padded tokens per side (source or target) of one rank's micro-batch: per
    /// GPU, like fairseq's --max-tokens. Without globalTokens, a step of N ranks takes about
    /// N x maxTokens x accumulate tokens per side. Sentences are bucketed by length so padding
    /// stays small.
    #[serde(default = "defaults::max_tokens")]
    #[schemars(range(min = 8))]
    pub max_tokens: u32,
    /// Micro-batches accumulated into one optimizer step (with globalTokens: at least this
    /// many).
    #[serde(default = "defaults::one")]
    #[schemars(range(min = 1, max = 1024))]
    pub accumulate: u32,
    /// Padded tokens per side of one optimizer step for the whole gang, whatever the number
    /// of ranks: the recipe's batch. Each rank takes a share of every micro-batch, and the
    /// micro-batches per step are max(accumulate, ceil(globalTokens / (ranks x maxTokens))),
    /// so no rank's share exceeds maxTokens. The same recipe on 1, 2 or 64 ranks then takes
    /// the same batches and follows the same loss curve, only faster. Unset: ranks x maxTokens
    /// x accumulate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8))]
    pub global_tokens: Option<u32>,
}

/// How a step's batch is cut, for a gang of `ranks`: `micro_tokens` padded tokens per side
/// in each of the stream's global micro-batches (shared by the ranks), `accumulate` of them
/// per optimizer step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub micro_tokens: u32,
    pub accumulate: u32,
}

impl BatchConfig {
    /// The step's plan for `ranks` ranks (an elastic round counts the whole gang: its
    /// survivors take the missing ranks' shares, so the batches do not change).
    pub fn plan(&self, ranks: usize) -> StepPlan {
        let ranks = ranks.max(1) as u64;
        let Some(global) = self.global_tokens else {
            return StepPlan {
                micro_tokens: (u64::from(self.max_tokens) * ranks).min(u64::from(u32::MAX)) as u32,
                accumulate: self.accumulate,
            };
        };
        let per_micro = ranks * u64::from(self.max_tokens);
        let needed = u64::from(global).div_ceil(per_micro) as u32;
        let accumulate = self.accumulate.max(needed).max(1);
        StepPlan {
            micro_tokens: global.div_ceil(accumulate),
            accumulate,
        }
    }
}

impl_default_from_serde!(BatchConfig);

#[cfg(test)]
mod tests {
    use crate::config::fixtures::MINIMAL;
    use crate::config::{ConfigError, TrainerConfig};

    #[test]
    fn global_tokens_fix_the_batch_whatever_the_ranks() {
        let plan = |yaml: &str, ranks: usize| {
            let c = TrainerConfig::from_yaml(&format!("{MINIMAL}batch: {yaml}\n"), "t").unwrap();
            let p = c.batch.plan(ranks);
            (p.micro_tokens, p.accumulate)
        };
        // Per rank (unset): the gang's micro-batch grows with the ranks.
        assert_eq!(plan("{maxTokens: 2000}", 1), (2000, 1));
        assert_eq!(plan("{maxTokens: 2000, accumulate: 2}", 4), (8000, 2));
        // globalTokens: the same step on 1 or 2 ranks; more ranks, fewer micro-batches.
        assert_eq!(plan("{maxTokens: 2000, globalTokens: 2000}", 1), (2000, 1));
        assert_eq!(plan("{maxTokens: 2000, globalTokens: 2000}", 2), (2000, 1));
        assert_eq!(plan("{maxTokens: 1000, globalTokens: 8000}", 1), (1000, 8));
        assert_eq!(plan("{maxTokens: 1000, globalTokens: 8000}", 3), (2667, 3));
        assert_eq!(plan("{maxTokens: 1000, globalTokens: 8000}", 8), (8000, 1));
        // accumulate is a floor.
        assert_eq!(
            plan("{maxTokens: 2000, globalTokens: 2000, accumulate: 2}", 2),
            (1000, 2)
        );
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(
            &format!("{MINIMAL}copy: {{maxLength: 20}}\nbatch: {{globalTokens: 16}}\n"),
            "t",
        ) else {
            panic!("expected invalid");
        };
        assert!(
            errors
                .iter()
                .any(|e| e.path == "batch.globalTokens" && e.reason.contains("16")),
            "{errors:?}"
        );
    }
}
