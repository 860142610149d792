//! The shape of the transformer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// A pre-layer-norm encoder-decoder transformer.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.dModel % self.heads == 0", "message": "model.dModel must be divisible by model.heads"}
]))]
pub struct ModelConfig {
    /// Width of embeddings and hidden states (transformer-base: 512).
    #[serde(default = "defaults::d_model")]
    #[schemars(range(min = 8, max = 16384))]
    pub d_model: u32,
    /// Attention heads; must divide dModel.
    #[serde(default = "defaults::heads")]
    #[schemars(range(min = 1, max = 256))]
    pub heads: u32,
    /// Encoder layers (transformer-base: 6).
    #[serde(default = "defaults::layers")]
    #[schemars(range(min = 1, max = 128))]
    pub encoder_layers: u32,
    /// Decoder layers (transformer-base: 6).
    #[serde(default = "defaults::layers")]
    #[schemars(range(min = 1, max = 128))]
    pub decoder_layers: u32,
    /// Hidden width of the position-wise feed-forward blocks (transformer-base: 2048).
    #[serde(default = "defaults::ffn_dim")]
    #[schemars(range(min = 1, max = 131072))]
    pub ffn_dim: u32,
    /// Dropout on embeddings and residual branches, and (unless set below) on attention
    /// weights and feed-forward activations.
    #[serde(default = "defaults::dropout")]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub dropout: f64,
    /// Dropout on attention weights; unset = `dropout` (PyTorch's nn.Transformer). The
    /// original Transformer (Vaswani et al., 2017) and fairseq use 0, which also lets
    /// attention run as one fused kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub attention_dropout: Option<f64>,
    /// Dropout on the feed-forward hidden activations (after ReLU); unset = `dropout`
    /// (nn.Transformer). The original Transformer and fairseq use 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub activation_dropout: Option<f64>,
    /// Share one matrix between source embedding, target embedding and output projection.
    #[serde(default = "defaults::yes")]
    pub tie_embeddings: bool,
    /// Longest sequence (in tokens, with BOS/EOS) the positional encoding covers.
    #[serde(default = "defaults::max_positions")]
    #[schemars(range(min = 8, max = 65536))]
    pub max_positions: u32,
}

impl_default_from_serde!(ModelConfig);

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, TrainerConfig};

    #[test]
    fn sublayer_dropouts_default_to_dropout_and_are_range_checked() {
        let base = "task: copy\nmaxSteps: 10\nmodel:\n  dropout: 0.2\n";
        let c = TrainerConfig::from_yaml(base, "t").expect("valid");
        assert_eq!(
            (c.model.attention_dropout, c.model.activation_dropout),
            (None, None)
        );
        let set = format!("{base}  attentionDropout: 0.0\n  activationDropout: 0.05\n");
        let c = TrainerConfig::from_yaml(&set, "t").expect("valid");
        assert_eq!(c.model.attention_dropout, Some(0.0));
        assert_eq!(c.model.activation_dropout, Some(0.05));
        let bad = format!("{base}  attentionDropout: 1.0\n  activationDropout: -0.1\n");
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(&bad, "t") else {
            panic!("expected invalid");
        };
        let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["model.attentionDropout", "model.activationDropout"]);
        // Unset fields leave the digest of existing checkpoints unchanged.
        let plain = TrainerConfig::from_yaml(base, "t").expect("valid");
        assert!(
            !serde_json::to_string(&plain.model)
                .unwrap()
                .contains("Dropout")
        );
    }
}
