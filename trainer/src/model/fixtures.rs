//! A tiny model for the model's and decoding's tests: two layers each side, 16 wide, no
//! dropout, tied embeddings.

use ferrotrain_api::config::{ModelConfig, Precision};
use tch::{Device, nn};

use super::Transformer;

pub(crate) fn tiny() -> ModelConfig {
    ModelConfig {
        d_model: 16,
        heads: 2,
        encoder_layers: 2,
        decoder_layers: 2,
        ffn_dim: 32,
        dropout: 0.0,
        attention_dropout: None,
        activation_dropout: None,
        tie_embeddings: true,
        max_positions: 32,
    }
}

/// A model of config `c` in fp32 (see `build_in`).
pub(crate) fn build(c: &ModelConfig) -> (nn::VarStore, Transformer) {
    build_in(c, Precision::Fp32)
}

/// A model of config `c` for a vocabulary of 11, its weights drawn after seeding with 0.
pub(crate) fn build_in(c: &ModelConfig, precision: Precision) -> (nn::VarStore, Transformer) {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Transformer::new(&vs.root(), c, 11, precision);
    (vs, m)
}
