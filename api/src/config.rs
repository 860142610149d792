//! The trainer's configuration: the one type the trainer parses from YAML and the operator
//! embeds in `DistributedTraining.spec.trainer`, so the two never drift.
//!
//! Field names are camelCase in YAML (Kubernetes convention). Every field but `task` and
//! `maxSteps` has a default; unknown fields are rejected.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the trainer learns.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Task {
    /// Sequence-to-sequence translation from parallel text files (`data.train`, `data.valid`).
    Translation,
    /// A synthetic task (the target is the source sequence): needs no files; for tests and demos.
    Copy,
}

/// A complete trainer configuration.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainerConfig {
    /// What to learn: `translation` (parallel text files) or `copy` (synthetic, no files).
    pub task: Task,
    /// Seed for weight init, data order and dropout. Same seed + same config = same run.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// Number of optimizer steps to train for; also the schedule's horizon (cosine).
    #[schemars(range(min = 1))]
    pub max_steps: u64,
    /// Optional wall-clock budget in seconds: training stops (with a final evaluation and
    /// checkpoint) at whichever comes first, `maxSteps` or this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_seconds: Option<u64>,
    /// Parallel corpus and tokenizer (task `translation`).
    #[serde(default)]
    pub data: DataConfig,
    /// Synthetic data (task `copy`).
    #[serde(default)]
    pub copy: CopyTaskConfig,
    /// The encoder-decoder transformer.
    #[serde(default)]
    pub model: ModelConfig,
    /// How sentences are grouped into steps.
    #[serde(default)]
    pub batch: BatchConfig,
    /// AdamW hyper-parameters and gradient clipping.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule.
    #[serde(default)]
    pub schedule: ScheduleConfig,
    /// Label smoothing of the cross-entropy loss, in [0, 1).
    #[serde(default = "defaults::label_smoothing")]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub label_smoothing: f64,
    /// Numeric precision of the matrix multiplies: `auto` (the default: what the hardware
    /// is fast at), `fp32`, `bf16` or `fp16` (with dynamic loss scaling).
    #[serde(default)]
    pub precision: Precision,
    /// Dynamic loss scaling for `precision: fp16` (and `auto` when it picks fp16).
    #[serde(default)]
    pub loss_scale: LossScaleConfig,
    /// Validation loss and BLEU.
    #[serde(default)]
    pub eval: EvalConfig,
    /// When to save and how many checkpoints to keep.
    #[serde(default)]
    pub checkpoint: CheckpointPolicy,
    /// Gradient exchange and rendezvous between ranks.
    #[serde(default)]
    pub distributed: DistributedConfig,
    /// Where the trainer runs: `auto` picks CUDA when a GPU is visible.
    #[serde(default)]
    pub device: DeviceKind,
    /// Intra-op threads per rank; default = available cores / local ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub threads: Option<u32>,
    /// Log a progress line every this many steps.
    #[serde(default = "defaults::log_every_steps")]
    #[schemars(range(min = 1))]
    pub log_every_steps: u64,
    /// TensorBoard event files written by rank 0.
    #[serde(default)]
    pub tensorboard: TensorBoardConfig,
}

/// TensorBoard event files: rank 0 writes one run directory per attempt, `attempt-<N>/`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TensorBoardConfig {
    /// Write them.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Directory that gets `<job>/attempt-<N>/` (one directory can serve several jobs to one
    /// TensorBoard); default: `tensorboard/` in the job's checkpoint directory. Relative paths
    /// resolve against the working directory. In Kubernetes it must be on a volume rank 0's
    /// pod mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

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

/// AdamW with decoupled weight decay.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate (reached at the end of warmup).
    #[serde(default = "defaults::lr")]
    #[schemars(range(min = 0.0))]
    pub lr: f64,
    /// First-moment decay.
    #[serde(default = "defaults::beta1")]
    #[schemars(range(min = 0.0, max = 0.999999))]
    pub beta1: f64,
    /// Second-moment decay.
    #[serde(default = "defaults::beta2")]
    #[schemars(range(min = 0.0, max = 0.999999))]
    pub beta2: f64,
    /// Denominator epsilon.
    #[serde(default = "defaults::eps")]
    #[schemars(range(min = 0.0))]
    pub eps: f64,
    /// Decoupled weight decay (not applied to biases and layer norms).
    #[serde(default = "defaults::weight_decay")]
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Clip the global gradient L2 norm to this; 0 disables clipping.
    #[serde(default = "defaults::clip_norm")]
    #[schemars(range(min = 0.0))]
    pub clip_norm: f64,
}

/// Shape of the learning rate over steps.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ScheduleKind {
    /// Linear warmup, then lr * sqrt(warmup / step) (the Transformer paper's schedule).
    #[default]
    InverseSqrt,
    /// Linear warmup, then cosine decay to `minLrRatio * lr` at the end of the horizon.
    Cosine,
    /// Linear warmup, then linear decay to `minLrRatio * lr` at the end of the horizon.
    Linear,
    /// Linear warmup, then constant.
    Constant,
}

/// What cosine and linear decay measure progress by.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ScheduleHorizon {
    /// Optimizer steps out of `maxSteps` (deterministic: exact resume).
    #[default]
    Steps,
    /// Training seconds out of `maxSeconds`, counted across restarts: the decay ends when
    /// the time budget does, however fast the machine is. The lr then depends on wall time,
    /// so a resumed run is not bitwise the uninterrupted one.
    Time,
}

/// Learning-rate schedule.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleConfig {
    /// `inverseSqrt`, `cosine`, `linear` or `constant`.
    #[serde(default)]
    pub kind: ScheduleKind,
    /// Steps of linear warmup from 0 to `optimizer.lr`.
    #[serde(default = "defaults::warmup_steps")]
    pub warmup_steps: u64,
    /// Cosine and linear: final lr as a fraction of the peak.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_lr_ratio: f64,
    /// Cosine and linear: decay over `steps` (of maxSteps) or `time` (of maxSeconds).
    #[serde(default)]
    pub horizon: ScheduleHorizon,
}

/// Numeric precision of the forward/backward pass.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Precision {
    /// What the hardware is fast at, decided at start-up: `bf16` on GPUs of compute
    /// capability 8.0 or more and on CPUs with AMX-BF16 or AVX512-BF16, `fp16` on GPUs of
    /// capability 7.x, `fp32` otherwise. Every rank must come to the same choice.
    #[default]
    Auto,
    /// 32-bit floats everywhere.
    Fp32,
    /// bfloat16 for matrix multiplies; weights, layer norms, loss and optimizer stay fp32.
    Bf16,
    /// float16 for matrix multiplies with dynamic loss scaling (`lossScale`); weights,
    /// layer norms, loss and optimizer stay fp32. For GPUs without bf16 (V100, T4).
    Fp16,
}

impl Precision {
    /// The name in configs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Precision::Auto),
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            _ => Err(format!("expected auto, fp32, bf16 or fp16, got {s:?}")),
        }
    }
}

/// Dynamic loss scaling for `precision: fp16`, as PyTorch's `GradScaler`: the loss is
/// multiplied by the scale before backward and the gradients divided by it before the
/// update; a step whose (all-reduced) gradients hold an inf or NaN is skipped on every rank
/// and the scale multiplied by `backoffFactor`; after `growthInterval` steps without one the
/// scale is multiplied by `growthFactor`. Ignored by the other precisions.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LossScaleConfig {
    /// The first scale (a resumed run goes on with its checkpoint's).
    #[serde(default = "defaults::initial_loss_scale")]
    pub initial: f64,
    /// Multiplies the scale after `growthInterval` steps without an overflow; more than 1.
    #[serde(default = "defaults::growth_factor")]
    pub growth_factor: f64,
    /// Multiplies the scale on an overflow; in (0, 1).
    #[serde(default = "defaults::backoff_factor")]
    pub backoff_factor: f64,
    /// Steps without an overflow before the scale grows.
    #[serde(default = "defaults::growth_interval")]
    #[schemars(range(min = 1))]
    pub growth_interval: u64,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig {
            initial: defaults::initial_loss_scale(),
            growth_factor: defaults::growth_factor(),
            backoff_factor: defaults::backoff_factor(),
            growth_interval: defaults::growth_interval(),
        }
    }
}

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

/// Which collective backend moves gradients between ranks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Backend {
    /// NCCL when the ranks have GPUs, the TCP ring otherwise.
    #[default]
    Auto,
    /// The TCP ring all-reduce (CPU tensors).
    Ring,
    /// NCCL (GPU tensors; needs a build with the `cuda` feature).
    Nccl,
}

/// Gradient exchange and rendezvous.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DistributedConfig {
    /// Collective backend.
    #[serde(default)]
    pub backend: Backend,
    /// Gradients are exchanged in buckets of about this many MiB, each started as soon as
    /// backward has completed its gradients (the first bucket is at most 1 MiB, so the
    /// exchange starts early). Smaller buckets overlap more of the exchange with backward;
    /// larger ones send fewer, bigger messages.
    #[serde(default = "defaults::bucket_mib")]
    #[schemars(range(min = 1, max = 4096))]
    pub bucket_mib: u32,
    /// A collective that does not complete in this many seconds fails the rank with a
    /// retryable exit code (a dead or hung peer never hangs the gang).
    #[serde(default = "defaults::collective_timeout")]
    #[schemars(range(min = 1))]
    pub collective_timeout_seconds: u64,
    /// How long ranks keep trying to reach each other at start-up.
    #[serde(default = "defaults::rendezvous_timeout")]
    #[schemars(range(min = 1))]
    pub rendezvous_timeout_seconds: u64,
    /// Exchange gradients in bfloat16 (NCCL only): half the bytes, slightly less precise.
    #[serde(default)]
    pub bf16_gradients: bool,
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DeviceKind {
    /// CUDA when available (rank i uses GPU LOCAL_RANK), otherwise CPU.
    #[default]
    Auto,
    /// Always CPU.
    Cpu,
    /// Always CUDA; fails when no GPU is visible.
    Cuda,
}

mod defaults {
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
impl_default_from_serde!(
    DataConfig,
    TokenizerConfig,
    CopyTaskConfig,
    ModelConfig,
    BatchConfig,
    OptimizerConfig,
    ScheduleConfig,
    EvalConfig,
    CheckpointPolicy,
    DistributedConfig,
    TensorBoardConfig
);

/// One invalid field: its path in the document (`optimizer.lr`) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, unknown field, wrong type: the parser's message names the field and the location.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// Every semantic problem found, each naming its field.
    #[error("{origin}: invalid config:\n{}", .errors.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        origin: String,
        errors: Vec<FieldError>,
    },
}

impl ConfigError {
    /// A single-line summary (for termination messages and Kubernetes events).
    pub fn one_line(&self) -> String {
        match self {
            ConfigError::Invalid { origin, errors } => format!(
                "{origin}: invalid config: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            other => other.to_string().replace('\n', " "),
        }
    }
}

impl TrainerConfig {
    /// Parses YAML (or JSON, a subset) and validates it. `origin` names the source in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: TrainerConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
                origin: origin.to_string(),
                message: e.to_string(),
            })?;
        config.check(origin)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Serializes to YAML (what the operator puts in the job's ConfigMap).
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).expect("config serializes")
    }

    /// `validate`, as a `Result`.
    pub fn check(&self, origin: &str) -> Result<(), ConfigError> {
        let errors = self.validate();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: origin.to_string(),
                errors,
            })
        }
    }

    /// Every semantic problem (ranges, cross-field rules), section by section. Pure: does not
    /// touch files.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut problems = Problems::default();
        self.check_run(&mut problems);
        match self.task {
            Task::Translation => self.check_translation_data(&mut problems),
            Task::Copy => self.check_copy(&mut problems),
        }
        self.check_model(&mut problems);
        self.check_batch_and_optimizer(&mut problems);
        self.check_schedule(&mut problems);
        self.check_eval_and_checkpoint(&mut problems);
        self.check_distributed(&mut problems);
        problems.0
    }

    /// Run length, loss, logging and threads.
    fn check_run(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.max_steps == 0 {
            bad("maxSteps", "must be at least 1".into());
        }
        if self.max_seconds == Some(0) {
            bad("maxSeconds", "must be at least 1 when set".into());
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            bad(
                "labelSmoothing",
                format!("must be in [0, 1), got {}", self.label_smoothing),
            );
        }
        if self.log_every_steps == 0 {
            bad("logEverySteps", "must be at least 1".into());
        }
        if self.threads == Some(0) {
            bad("threads", "must be at least 1 when set".into());
        }
        let scale = &self.loss_scale;
        if !(scale.initial.is_finite() && scale.initial > 0.0) {
            bad(
                "lossScale.initial",
                format!("must be a positive number, got {}", scale.initial),
            );
        }
        if !(scale.growth_factor.is_finite() && scale.growth_factor > 1.0) {
            bad(
                "lossScale.growthFactor",
                format!("must be more than 1, got {}", scale.growth_factor),
            );
        }
        if !(scale.backoff_factor > 0.0 && scale.backoff_factor < 1.0) {
            bad(
                "lossScale.backoffFactor",
                format!("must be in (0, 1), got {}", scale.backoff_factor),
            );
        }
        if scale.growth_interval == 0 {
            bad("lossScale.growthInterval", "must be at least 1".into());
        }
    }

    /// The translation data, the tokenizer and the sentence lengths the model and batches hold.
    fn check_translation_data(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.data.train.is_none() {
            bad(
                "data.train",
                "is required for task translation (source and target files)".into(),
            );
        }
        for (name, files) in [
            ("data.train", &self.data.train),
            ("data.valid", &self.data.valid),
        ] {
            if let Some(f) = files {
                if f.source.trim().is_empty() {
                    bad(&format!("{name}.source"), "must name a file".into());
                }
                if f.target.trim().is_empty() {
                    bad(&format!("{name}.target"), "must name a file".into());
                }
            }
        }
        let tok = &self.data.tokenizer;
        if tok.path.is_none() && tok.vocab_size < 64 {
            bad(
                "data.tokenizer.vocabSize",
                format!(
                    "must be at least 64 to learn a subword vocabulary, got {}",
                    tok.vocab_size
                ),
            );
        }
        if tok.min_frequency == 0 {
            bad("data.tokenizer.minFrequency", "must be at least 1".into());
        }
        if self.data.max_sentence_tokens < 2 {
            bad("data.maxSentenceTokens", "must be at least 2".into());
        }
        if self.data.max_sentence_tokens + 2 > self.model.max_positions {
            bad(
                "data.maxSentenceTokens",
                format!(
                    "{} plus BOS/EOS exceeds model.maxPositions {}",
                    self.data.max_sentence_tokens, self.model.max_positions
                ),
            );
        }
        self.check_batch_holds(
            self.data.max_sentence_tokens,
            "sentence of data.maxSentenceTokens",
            problems,
        );
    }

    /// `batch.maxTokens` and `batch.globalTokens` each hold the longest sequence plus BOS/EOS
    /// (`what` names it: "sentence of data.maxSentenceTokens").
    fn check_batch_holds(&self, longest: u32, what: &str, problems: &mut Problems) {
        let limits = [
            ("batch.maxTokens", Some(self.batch.max_tokens)),
            ("batch.globalTokens", self.batch.global_tokens),
        ];
        for (path, limit) in limits {
            if let Some(limit) = limit
                && longest + 2 > limit
            {
                problems.bad(
                    path,
                    format!("{limit} cannot hold one {what} {longest} plus BOS/EOS"),
                );
            }
        }
    }

    /// The copy task's synthetic data and the sequence lengths the model and batches hold.
    fn check_copy(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let c = &self.copy;
        if c.symbols < 2 {
            bad(
                "copy.symbols",
                format!("must be at least 2, got {}", c.symbols),
            );
        }
        if c.min_length == 0 {
            bad("copy.minLength", "must be at least 1".into());
        }
        if c.max_length < c.min_length {
            bad(
                "copy.maxLength",
                format!(
                    "{} is less than copy.minLength {}",
                    c.max_length, c.min_length
                ),
            );
        }
        if c.max_length + 2 > self.model.max_positions {
            bad(
                "copy.maxLength",
                format!(
                    "{} plus BOS/EOS exceeds model.maxPositions {}",
                    c.max_length, self.model.max_positions
                ),
            );
        }
        if c.train_samples == 0 {
            bad("copy.trainSamples", "must be at least 1".into());
        }
        if c.valid_samples == 0 {
            bad("copy.validSamples", "must be at least 1".into());
        }
        self.check_batch_holds(c.max_length, "sequence of copy.maxLength", problems);
    }

    /// The model's shape and dropouts.
    fn check_model(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let m = &self.model;
        if m.d_model == 0 || m.heads == 0 {
            bad("model.dModel", "dModel and heads must be positive".into());
        } else if !m.d_model.is_multiple_of(m.heads) {
            bad(
                "model.dModel",
                format!("{} is not divisible by model.heads {}", m.d_model, m.heads),
            );
        } else if !(m.d_model / m.heads).is_multiple_of(2) {
            bad(
                "model.heads",
                format!(
                    "head size dModel/heads = {} must be even",
                    m.d_model / m.heads
                ),
            );
        }
        if m.encoder_layers == 0 {
            bad("model.encoderLayers", "must be at least 1".into());
        }
        if m.decoder_layers == 0 {
            bad("model.decoderLayers", "must be at least 1".into());
        }
        if m.ffn_dim == 0 {
            bad("model.ffnDim", "must be at least 1".into());
        }
        for (field, value) in [
            ("model.dropout", Some(m.dropout)),
            ("model.attentionDropout", m.attention_dropout),
            ("model.activationDropout", m.activation_dropout),
        ] {
            if let Some(v) = value
                && !(0.0..1.0).contains(&v)
            {
                bad(field, format!("must be in [0, 1), got {v}"));
            }
        }
    }

    /// Gradient accumulation and the optimizer's hyper-parameters.
    fn check_batch_and_optimizer(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.batch.accumulate == 0 {
            bad("batch.accumulate", "must be at least 1".into());
        }
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            bad(
                "optimizer.lr",
                format!("must be a positive number, got {}", o.lr),
            );
        }
        for (path, v) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&v) {
                bad(path, format!("must be in [0, 1), got {v}"));
            }
        }
        if !(o.eps.is_finite() && o.eps > 0.0) {
            bad("optimizer.eps", format!("must be positive, got {}", o.eps));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            bad(
                "optimizer.weightDecay",
                format!("must be >= 0, got {}", o.weight_decay),
            );
        }
        if !(o.clip_norm.is_finite() && o.clip_norm >= 0.0) {
            bad(
                "optimizer.clipNorm",
                format!("must be >= 0 (0 disables clipping), got {}", o.clip_norm),
            );
        }
    }

    /// The learning-rate schedule and its horizon.
    fn check_schedule(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if !(0.0..=1.0).contains(&self.schedule.min_lr_ratio) {
            bad(
                "schedule.minLrRatio",
                format!("must be in [0, 1], got {}", self.schedule.min_lr_ratio),
            );
        }
        if self.schedule.horizon == ScheduleHorizon::Time {
            if self.max_seconds.is_none() {
                bad(
                    "schedule.horizon",
                    "`time` decays over maxSeconds, which is not set".into(),
                );
            }
            if !matches!(
                self.schedule.kind,
                ScheduleKind::Cosine | ScheduleKind::Linear
            ) {
                let kind = serde_json::to_value(self.schedule.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                bad(
                    "schedule.horizon",
                    format!("`time` only applies to kind cosine or linear, not {kind}"),
                );
            }
        }
    }

    /// Evaluation and the checkpoint policy.
    fn check_eval_and_checkpoint(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        if self.eval.beam_size == 0 {
            bad("eval.beamSize", "must be at least 1 (1 = greedy)".into());
        }
        if self.eval.max_sentences == Some(0) {
            bad("eval.maxSentences", "must be at least 1 when set".into());
        }
        if self.checkpoint.keep_latest == 0 {
            bad(
                "checkpoint.keepLatest",
                "must be at least 1 (the newest checkpoint is the resume point)".into(),
            );
        }
        if self.checkpoint.every_seconds == Some(0) {
            bad(
                "checkpoint.everySeconds",
                "must be at least 1 when set".into(),
            );
        }
        if self
            .tensorboard
            .dir
            .as_deref()
            .is_some_and(|d| d.trim().is_empty())
        {
            bad(
                "tensorboard.dir",
                "must not be empty when set (leave it out for the job's checkpoint directory)"
                    .into(),
            );
        }
    }

    /// Gradient exchange and rendezvous.
    fn check_distributed(&self, problems: &mut Problems) {
        let mut bad = |path: &str, reason: String| problems.bad(path, reason);
        let d = &self.distributed;
        if d.bucket_mib == 0 {
            bad("distributed.bucketMib", "must be at least 1".into());
        }
        if d.collective_timeout_seconds == 0 {
            bad(
                "distributed.collectiveTimeoutSeconds",
                "must be at least 1".into(),
            );
        }
        if d.rendezvous_timeout_seconds == 0 {
            bad(
                "distributed.rendezvousTimeoutSeconds",
                "must be at least 1".into(),
            );
        }
    }

    /// A stable digest of everything that shapes the model's tensors and vocabulary; a
    /// checkpoint whose digest differs cannot be resumed by this config (exit code 4).
    /// Training length, data paths, optimizer hyper-parameters, evaluation and checkpoint
    /// cadence may change between runs. (Changing the batching usually moves batch
    /// boundaries; resuming then fails at the data position, also with exit code 4.)
    pub fn digest(&self) -> String {
        let shaping = serde_json::json!({
            "task": self.task,
            "tokenizer": {"vocabSize": self.data.tokenizer.vocab_size, "path": self.data.tokenizer.path},
            "copySymbols": self.copy.symbols,
            "model": self.model,
        });
        // FNV-1a 64: dependency-free and stable across Rust versions.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in shaping.to_string().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}

/// The problems one validation found, in the order the checks run.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn bad(&mut self, path: &str, reason: String) {
        self.0.push(FieldError {
            path: path.to_string(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "task: copy\nmaxSteps: 10\n";

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(c.model.d_model, 256);
        assert_eq!(c.optimizer.lr, 2e-3);
        assert_eq!(c.schedule.kind, ScheduleKind::InverseSqrt);
        assert_eq!(c.batch.max_tokens, 2000);
        assert_eq!(c.checkpoint.keep_latest, 3);
    }

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

    #[test]
    fn tensorboard_is_on_by_default_and_its_dir_checked() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(
            c.tensorboard,
            TensorBoardConfig {
                enabled: true,
                dir: None
            }
        );
        let c = TrainerConfig::from_yaml(
            &format!("{MINIMAL}tensorboard: {{enabled: false, dir: /tb}}\n"),
            "t",
        )
        .unwrap();
        assert!(!c.tensorboard.enabled);
        assert_eq!(c.tensorboard.dir.as_deref(), Some("/tb"));
        let Err(ConfigError::Invalid { errors, .. }) =
            TrainerConfig::from_yaml(&format!("{MINIMAL}tensorboard: {{dir: ' '}}\n"), "t")
        else {
            panic!("expected invalid");
        };
        assert_eq!(errors[0].path, "tensorboard.dir");
    }

    #[test]
    fn precision_defaults_to_auto_and_loss_scale_to_grad_scalers() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        assert_eq!(c.precision, Precision::Auto);
        assert_eq!(c.loss_scale, LossScaleConfig::default());
        assert_eq!(
            (c.loss_scale.initial, c.loss_scale.growth_interval),
            (65536.0, 2000)
        );
        for p in [
            Precision::Auto,
            Precision::Fp32,
            Precision::Bf16,
            Precision::Fp16,
        ] {
            let c = TrainerConfig::from_yaml(&format!("{MINIMAL}precision: {p}\n"), "t").unwrap();
            assert_eq!(c.precision, p);
            assert_eq!(p.as_str().parse::<Precision>(), Ok(p));
        }
        assert!("fp8".parse::<Precision>().unwrap_err().contains("fp16"));
        let err = TrainerConfig::from_yaml(&format!("{MINIMAL}precision: fp8\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("precision") || err.contains("fp8"), "{err}");
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(
            &format!(
                "{MINIMAL}lossScale: {{initial: 0, growthFactor: 1, backoffFactor: 1.5, \
                 growthInterval: 0}}\n"
            ),
            "t",
        ) else {
            panic!("expected invalid");
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "lossScale.initial",
                "lossScale.growthFactor",
                "lossScale.backoffFactor",
                "lossScale.growthInterval"
            ]
        );
    }

    #[test]
    fn unknown_field_is_named() {
        let err = TrainerConfig::from_yaml("task: copy\nmaxSteps: 10\nmodel:\n  dmodel: 3\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dmodel"), "{err}");
    }

    #[test]
    fn wrong_type_is_named() {
        let err = TrainerConfig::from_yaml("task: copy\nmaxSteps: ten\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("maxSteps") || err.contains("line 2"), "{err}");
    }

    #[test]
    fn unknown_task_is_rejected() {
        let err = TrainerConfig::from_yaml("task: summarize\nmaxSteps: 10\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("summarize"), "{err}");
    }

    #[test]
    fn every_range_error_is_reported_with_its_path() {
        let text = "task: translation\nmaxSteps: 10\noptimizer:\n  lr: -0.1\nmodel:\n  dModel: 250\n  heads: 4\ndata:\n  tokenizer:\n    vocabSize: 20\n";
        let Err(ConfigError::Invalid { errors, .. }) = TrainerConfig::from_yaml(text, "t") else {
            panic!("expected invalid");
        };
        let paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"optimizer.lr"), "{paths:?}");
        assert!(paths.contains(&"model.dModel"), "{paths:?}");
        assert!(paths.contains(&"data.tokenizer.vocabSize"), "{paths:?}");
        assert!(paths.contains(&"data.train"), "{paths:?}");
    }

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

    #[test]
    fn a_time_horizon_needs_max_seconds_and_a_decaying_schedule() {
        let errors_of = |text: &str| match TrainerConfig::from_yaml(text, "t") {
            Err(ConfigError::Invalid { errors, .. }) => errors,
            other => panic!("expected invalid, got {other:?}"),
        };
        let no_budget =
            errors_of("task: copy\nmaxSteps: 10\nschedule: {kind: linear, horizon: time}\n");
        assert_eq!(no_budget.len(), 1, "{no_budget:?}");
        assert_eq!(no_budget[0].path, "schedule.horizon");
        assert!(no_budget[0].reason.contains("maxSeconds"), "{no_budget:?}");
        let inverse = errors_of(
            "task: copy\nmaxSteps: 10\nmaxSeconds: 60\nschedule: {kind: inverseSqrt, horizon: time}\n",
        );
        assert_eq!(inverse[0].path, "schedule.horizon");
        assert!(
            inverse[0].reason.ends_with("not inverseSqrt"),
            "{inverse:?}"
        );
        let ok =
            "task: copy\nmaxSteps: 10\nmaxSeconds: 60\nschedule: {kind: cosine, horizon: time}\n";
        assert!(TrainerConfig::from_yaml(ok, "t").is_ok());
    }

    #[test]
    fn yaml_round_trip_is_lossless() {
        let c = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        let again = TrainerConfig::from_yaml(&c.to_yaml(), "again").unwrap();
        assert_eq!(c, again);
        assert_eq!(c.digest(), again.digest());
    }

    #[test]
    fn digest_ignores_training_length_but_not_model_shape() {
        let a = TrainerConfig::from_yaml(MINIMAL, "t").unwrap();
        let mut b = a.clone();
        b.max_steps = 99;
        b.eval.every_steps = 7;
        b.optimizer.lr = 1e-4;
        assert_eq!(a.digest(), b.digest());
        b.model.d_model = 128;
        assert_ne!(a.digest(), b.digest());
    }
}
