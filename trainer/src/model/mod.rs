//! A pre-layer-norm encoder-decoder transformer ("Attention Is All You Need", with the
//! layer norm moved in front of each sub-layer as in most modern implementations), built on
//! libtorch's fused scaled-dot-product attention.
//!
//! With `precision: bf16` every matrix multiply (linear layers, attention, the output
//! projection) runs in bfloat16 while the weights, the residual stream, layer norms, the loss
//! and the optimizer stay fp32: what `torch.autocast` does, written out so it is the same on
//! CPU (AMX/AVX-512 bf16 kernels through oneDNN) and GPU (tensor cores).
//!
//! Variables are named by path (`encoder.layers.0.self_attn.qkv.weight`) so checkpoints are
//! readable, and sorted by name wherever an order matters (gradient buckets, optimizer state).

mod layers;
mod loss;
mod onednn;
mod transformer;

#[cfg(test)]
pub(crate) mod fixtures;

pub use layers::LayerCache;
pub use loss::loss_sum;
pub use transformer::{DecoderState, Transformer, named_parameters, parameter_count};
