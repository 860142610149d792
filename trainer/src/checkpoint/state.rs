//! trainer.json: the checkpoint's state besides its tensors.

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

/// trainer.json's field holding the CRC-32C of the file as written with that field's value
/// [`CRC_PLACEHOLDER`]: a flipped digit in a step or a sample count is seen, not resumed from.
const CRC_FIELD: &str = "crc32c";
const CRC_PLACEHOLDER: &str = "00000000";

impl TrainerState {
    /// trainer.json's bytes: pretty JSON with its own CRC-32C.
    pub fn encode(&self) -> serde_json::Result<Vec<u8>> {
        let mut value = serde_json::to_value(self)?;
        if let Some(object) = value.as_object_mut() {
            object.insert(CRC_FIELD.into(), CRC_PLACEHOLDER.into());
        }
        let mut bytes = serde_json::to_vec_pretty(&value)?;
        let crc = format!("{:08x}", crc32c::crc32c(&bytes));
        let field = crc_field(CRC_PLACEHOLDER);
        if let Some(at) = find(&bytes, field.as_bytes()) {
            bytes.splice(at..at + field.len(), crc_field(&crc).bytes());
        }
        Ok(bytes)
    }

    /// Parses trainer.json and checks its CRC-32C (a file written before it was recorded has
    /// none and is taken as it is).
    pub fn decode(bytes: &[u8]) -> Result<TrainerState, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if let Some(recorded) = value.get(CRC_FIELD) {
            let hex = recorded
                .as_str()
                .filter(|h| h.len() == CRC_PLACEHOLDER.len())
                .ok_or_else(|| format!("{CRC_FIELD} is not a CRC: {recorded}"))?;
            let field = crc_field(hex);
            let at = find(bytes, field.as_bytes())
                .ok_or_else(|| format!("{CRC_FIELD} is not where it was written"))?;
            let mut zeroed = bytes.to_vec();
            zeroed.splice(at..at + field.len(), crc_field(CRC_PLACEHOLDER).bytes());
            let actual = format!("{:08x}", crc32c::crc32c(&zeroed));
            if actual != hex {
                return Err(format!(
                    "does not match its CRC-32C ({actual}, the file says {hex}): the file is damaged"
                ));
            }
        }
        serde_json::from_value(value).map_err(|e| e.to_string())
    }
}

fn crc_field(hex: &str) -> String {
    format!("\"{CRC_FIELD}\": \"{hex}\"")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
