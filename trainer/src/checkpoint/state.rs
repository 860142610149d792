//! trainer.json: the checkpoint's state besides its tensors.

use ferrotrain_api::checksummed;
use ferrotrain_api::progress::PrecisionChoice;
use serde::{Deserialize, Serialize};

use crate::loss_scale::ScaleState;

/// trainer.json: what a resume needs besides the tensors.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainerState {
    pub step: u64,
    /// Global data position: examples consumed over all ranks.
    pub samples: u64,
    pub epoch: u64,
    /// The run's seed; dropout is re-seeded from (seed, step) every step.
    pub seed: u64,
    pub config_digest: String,
    pub world_size: u32,
    pub train_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_bleu: Option<f64>,
    /// RFC 3339 time the save started.
    pub time: String,
    /// Wall-clock seconds of training so far, over every run of the job: `maxSeconds` and a
    /// time-horizon schedule count from here after a resume. 0 in older checkpoints.
    #[serde(default)]
    pub train_seconds: f64,
    /// The precision the run trained in, and why (absent in older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionChoice>,
    /// `fp16`: the dynamic loss scale after this step; a resume goes on with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<ScaleState>,
}

impl TrainerState {
    /// trainer.json's bytes: pretty JSON with its own CRC-32C ([`sealed`]): a flipped digit
    /// in a step or a sample count is seen, not resumed from.
    pub fn encode(&self) -> serde_json::Result<Vec<u8>> {
        checksummed::seal(self, checksummed::CRC_FIELD)
    }

    /// Parses trainer.json and checks its CRC-32C (a file written before it was recorded has
    /// none and is taken as it is).
    pub fn decode(bytes: &[u8]) -> Result<TrainerState, String> {
        checksummed::open(bytes, checksummed::CRC_FIELD)
    }
}
