//! The documented defaults: one function per default (serde's `default = "..."` names them),
//! and `Default` for the sections whose every field has one.

// PyTorch's GradScaler defaults.
pub fn initial_loss_scale() -> f64 {
    65536.0
}
pub fn growth_factor() -> f64 {
    2.0
}
pub fn backoff_factor() -> f64 {
    0.5
}
pub fn growth_interval() -> u64 {
    2000
}
pub fn seed() -> u64 {
    1
}
pub fn label_smoothing() -> f64 {
    0.1
}
pub fn log_every_steps() -> u64 {
    50
}
pub fn max_sentence_tokens() -> u32 {
    128
}
pub fn vocab_size() -> u32 {
    8000
}
pub fn min_frequency() -> u32 {
    2
}
pub fn copy_symbols() -> u32 {
    20
}
pub fn copy_min_length() -> u32 {
    3
}
pub fn copy_max_length() -> u32 {
    12
}
pub fn copy_train_samples() -> u64 {
    20_000
}
pub fn copy_valid_samples() -> u64 {
    200
}
pub fn d_model() -> u32 {
    256
}
pub fn heads() -> u32 {
    4
}
pub fn layers() -> u32 {
    3
}
pub fn ffn_dim() -> u32 {
    512
}
pub fn dropout() -> f64 {
    0.1
}
pub fn yes() -> bool {
    true
}
pub fn max_positions() -> u32 {
    256
}
pub fn max_tokens() -> u32 {
    2000
}
pub fn one() -> u32 {
    1
}
pub fn lr() -> f64 {
    2e-3
}
pub fn beta1() -> f64 {
    0.9
}
pub fn beta2() -> f64 {
    0.98
}
pub fn eps() -> f64 {
    1e-9
}
pub fn weight_decay() -> f64 {
    0.01
}
pub fn clip_norm() -> f64 {
    1.0
}
pub fn warmup_steps() -> u64 {
    300
}
pub fn eval_every() -> u64 {
    1000
}
pub fn checkpoint_every_steps() -> u64 {
    500
}
pub fn keep_latest() -> u32 {
    3
}
pub fn bucket_mib() -> u32 {
    25
}
pub fn collective_timeout() -> u64 {
    60
}
pub fn rendezvous_timeout() -> u64 {
    300
}

macro_rules! impl_default_from_serde {
    ($($ty:ty),*) => {$(
        impl Default for $ty {
            /// The documented defaults (the same ones an empty YAML mapping gets).
            fn default() -> Self {
                serde_json::from_value(serde_json::json!({})).expect("all fields have defaults")
            }
        }
    )*};
}
pub(super) use impl_default_from_serde;
