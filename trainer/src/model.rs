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

use ferrotrain_api::config::{ModelConfig, Precision};
use tch::nn;
use tch::{Kind, Tensor};

use crate::data::{PAD, TensorBatch};

/// Multi-head attention. Self-attention projects q, k, v with one matrix; cross-attention
/// projects q from the decoder and k, v (one matrix) from the encoder output.
#[derive(Debug)]
struct Attention {
    q: Option<nn::Linear>,
    kv: Option<nn::Linear>,
    qkv: Option<nn::Linear>,
    out: nn::Linear,
    heads: i64,
    dropout: f64,
    kind: Kind,
}

/// The dtype matrix multiplies run in.
fn compute_kind(precision: Precision) -> Kind {
    match precision {
        Precision::Fp32 => Kind::Float,
        Precision::Bf16 => Kind::BFloat16,
    }
}

/// `x W^T + b` in `kind`: input and weights are cast (autograd carries the gradient back to
/// the fp32 weights) and the result stays in `kind`.
fn dense(x: &Tensor, layer: &nn::Linear, kind: Kind) -> Tensor {
    if kind == Kind::Float && x.kind() == Kind::Float {
        return x.apply(layer);
    }
    let bias = layer.bs.as_ref().map(|b| b.to_kind(kind));
    x.to_kind(kind)
        .linear(&layer.ws.to_kind(kind), bias.as_ref())
}

/// A linear layer with Xavier-uniform weights (as PyTorch's nn.Transformer) and zero bias.
fn linear(p: nn::Path, input: i64, output: i64) -> nn::Linear {
    let bound = (6.0 / (input + output) as f64).sqrt();
    let config = nn::LinearConfig {
        ws_init: nn::init::Init::Uniform {
            lo: -bound,
            up: bound,
        },
        bs_init: Some(nn::init::Init::Const(0.0)),
        bias: true,
    };
    nn::linear(p, input, output, config)
}

impl Attention {
    fn new_self(p: nn::Path, d: i64, heads: i64, dropout: f64, kind: Kind) -> Self {
        Attention {
            q: None,
            kv: None,
            qkv: Some(linear(&p / "qkv", d, 3 * d)),
            out: linear(&p / "out", d, d),
            heads,
            dropout,
            kind,
        }
    }

    fn new_cross(p: nn::Path, d: i64, heads: i64, dropout: f64, kind: Kind) -> Self {
        Attention {
            q: Some(linear(&p / "q", d, d)),
            kv: Some(linear(&p / "kv", d, 2 * d)),
            qkv: None,
            out: linear(&p / "out", d, d),
            heads,
            dropout,
            kind,
        }
    }

    fn project(&self, x: &Tensor, layer: &Option<nn::Linear>) -> Tensor {
        dense(x, layer.as_ref().expect("projection"), self.kind)
    }

    /// [B, L, D] -> [B, H, L, D/H]
    fn split_heads(&self, x: &Tensor) -> Tensor {
        let (b, l, d) = x.size3().expect("[B, L, D]");
        x.view([b, l, self.heads, d / self.heads]).transpose(1, 2)
    }

    /// [B, H, L, D/H] -> [B, L, D]
    fn merge_heads(x: &Tensor) -> Tensor {
        let (b, h, l, dh) = x.size4().expect("[B, H, L, Dh]");
        x.transpose(1, 2).contiguous().view([b, l, h * dh])
    }

    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        train: bool,
    ) -> Tensor {
        let p = if train { self.dropout } else { 0.0 };
        let y = Tensor::scaled_dot_product_attention(q, k, v, mask, p, causal, None, false);
        dense(&Self::merge_heads(&y), &self.out, self.kind)
    }

    /// Self-attention over `x` ([B, L, D]); `mask` is a [B, 1, 1, L] key mask (true = attend).
    fn self_attention(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        train: bool,
    ) -> Tensor {
        let qkv = self.project(x, &self.qkv);
        let parts = qkv.chunk(3, -1);
        let (q, k, v) = (
            self.split_heads(&parts[0]),
            self.split_heads(&parts[1]),
            self.split_heads(&parts[2]),
        );
        self.attend(&q, &k, &v, mask, causal, train)
    }

    /// Self-attention for one new decoder position, appending its key and value to `cache`.
    fn self_attention_step(&self, x: &Tensor, cache: &mut Option<(Tensor, Tensor)>) -> Tensor {
        let qkv = self.project(x, &self.qkv);
        let parts = qkv.chunk(3, -1);
        let q = self.split_heads(&parts[0]);
        let (mut k, mut v) = (self.split_heads(&parts[1]), self.split_heads(&parts[2]));
        if let Some((ck, cv)) = cache.take() {
            k = Tensor::cat(&[ck, k], 2);
            v = Tensor::cat(&[cv, v], 2);
        }
        let y = self.attend(&q, &k, &v, None, false, false);
        *cache = Some((k, v));
        y
    }

    /// Keys and values of the encoder output for cross-attention: ([B,H,S,Dh], [B,H,S,Dh]).
    fn memory_kv(&self, memory: &Tensor) -> (Tensor, Tensor) {
        let kv = self.project(memory, &self.kv);
        let parts = kv.chunk(2, -1);
        (self.split_heads(&parts[0]), self.split_heads(&parts[1]))
    }

    fn cross_attention(
        &self,
        x: &Tensor,
        kv: &(Tensor, Tensor),
        mask: &Tensor,
        train: bool,
    ) -> Tensor {
        let q = self.split_heads(&self.project(x, &self.q));
        self.attend(&q, &kv.0, &kv.1, Some(mask), false, train)
    }
}

#[derive(Debug)]
struct FeedForward {
    up: nn::Linear,
    down: nn::Linear,
    dropout: f64,
    kind: Kind,
}

impl FeedForward {
    fn new(p: nn::Path, d: i64, ffn: i64, dropout: f64, kind: Kind) -> Self {
        FeedForward {
            up: linear(&p / "up", d, ffn),
            down: linear(&p / "down", ffn, d),
            dropout,
            kind,
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let hidden = dense(x, &self.up, self.kind)
            .relu()
            .drop(self.dropout, train);
        dense(&hidden, &self.down, self.kind)
    }
}

/// Inverted dropout whose mask comes from 64-bit random integers split into four 16-bit
/// draws: a quarter of the generator work of `Tensor::dropout`, whose per-element Bernoulli
/// draw took a quarter of a CPU training step. The drop probability is rounded to a multiple
/// of 2^-16. Draws come from libtorch's generator, so `tch::manual_seed` makes them
/// reproducible.
trait Drop16 {
    fn drop(&self, p: f64, train: bool) -> Tensor;
}

impl Drop16 for Tensor {
    fn drop(&self, p: f64, train: bool) -> Tensor {
        if !train || p <= 0.0 {
            return self.shallow_clone();
        }
        let n = self.numel() as i64;
        let draws = Tensor::empty([(n + 3) / 4], (Kind::Int64, self.device()))
            .random_from_(i64::MIN, None)
            .view_dtype(Kind::Int16)
            .narrow(0, 0, n)
            .view(self.size().as_slice());
        let threshold = i64::from(i16::MIN) + (p * 65536.0).round() as i64;
        self * draws.ge(threshold) * (1.0 / (1.0 - p))
    }
}

fn layer_norm(p: nn::Path, d: i64) -> nn::LayerNorm {
    nn::layer_norm(p, vec![d], Default::default())
}

/// Dropout on attention weights and on feed-forward activations (both default to `dropout`).
fn sublayer_dropouts(c: &ModelConfig) -> (f64, f64) {
    (
        c.attention_dropout.unwrap_or(c.dropout),
        c.activation_dropout.unwrap_or(c.dropout),
    )
}

#[derive(Debug)]
struct EncoderLayer {
    norm1: nn::LayerNorm,
    attn: Attention,
    norm2: nn::LayerNorm,
    ffn: FeedForward,
    dropout: f64,
}

impl EncoderLayer {
    fn new(p: nn::Path, c: &ModelConfig, kind: Kind) -> Self {
        let (d, h, drop) = (i64::from(c.d_model), i64::from(c.heads), c.dropout);
        let (attn_drop, act_drop) = sublayer_dropouts(c);
        EncoderLayer {
            norm1: layer_norm(&p / "norm1", d),
            attn: Attention::new_self(&p / "self_attn", d, h, attn_drop, kind),
            norm2: layer_norm(&p / "norm2", d),
            ffn: FeedForward::new(&p / "ffn", d, i64::from(c.ffn_dim), act_drop, kind),
            dropout: drop,
        }
    }

    fn forward(&self, x: &Tensor, mask: &Tensor, train: bool) -> Tensor {
        let x = x + self
            .attn
            .self_attention(&x.apply(&self.norm1), Some(mask), false, train)
            .drop(self.dropout, train);
        &x + self
            .ffn
            .forward(&x.apply(&self.norm2), train)
            .drop(self.dropout, train)
    }
}

#[derive(Debug)]
struct DecoderLayer {
    norm1: nn::LayerNorm,
    self_attn: Attention,
    norm2: nn::LayerNorm,
    cross_attn: Attention,
    norm3: nn::LayerNorm,
    ffn: FeedForward,
    dropout: f64,
}

impl DecoderLayer {
    fn new(p: nn::Path, c: &ModelConfig, kind: Kind) -> Self {
        let (d, h, drop) = (i64::from(c.d_model), i64::from(c.heads), c.dropout);
        let (attn_drop, act_drop) = sublayer_dropouts(c);
        DecoderLayer {
            norm1: layer_norm(&p / "norm1", d),
            self_attn: Attention::new_self(&p / "self_attn", d, h, attn_drop, kind),
            norm2: layer_norm(&p / "norm2", d),
            cross_attn: Attention::new_cross(&p / "cross_attn", d, h, attn_drop, kind),
            norm3: layer_norm(&p / "norm3", d),
            ffn: FeedForward::new(&p / "ffn", d, i64::from(c.ffn_dim), act_drop, kind),
            dropout: drop,
        }
    }

    fn forward(
        &self,
        x: &Tensor,
        memory_kv: &(Tensor, Tensor),
        src_mask: &Tensor,
        train: bool,
    ) -> Tensor {
        let x = x + self
            .self_attn
            .self_attention(&x.apply(&self.norm1), None, true, train)
            .drop(self.dropout, train);
        let x = &x
            + self
                .cross_attn
                .cross_attention(&x.apply(&self.norm2), memory_kv, src_mask, train)
                .drop(self.dropout, train);
        &x + self
            .ffn
            .forward(&x.apply(&self.norm3), train)
            .drop(self.dropout, train)
    }

    fn step(&self, x: &Tensor, cache: &mut LayerCache, src_mask: &Tensor) -> Tensor {
        let x = x + self
            .self_attn
            .self_attention_step(&x.apply(&self.norm1), &mut cache.self_kv);
        let x = &x
            + self.cross_attn.cross_attention(
                &x.apply(&self.norm2),
                &cache.memory_kv,
                src_mask,
                false,
            );
        &x + self.ffn.forward(&x.apply(&self.norm3), false)
    }
}

/// Per-layer decoding state: the growing self-attention keys/values and the fixed
/// cross-attention keys/values of the encoder output.
pub struct LayerCache {
    self_kv: Option<(Tensor, Tensor)>,
    memory_kv: (Tensor, Tensor),
}

/// Incremental decoding state for a batch of sentences (or beams).
pub struct DecoderState {
    layers: Vec<LayerCache>,
    src_mask: Tensor,
    /// Positions decoded so far.
    pub position: i64,
}

impl DecoderState {
    /// Keeps only the rows `index` (beam search reordering / finished sentences dropped).
    pub fn select(&mut self, index: &Tensor) {
        for layer in &mut self.layers {
            if let Some((k, v)) = layer.self_kv.take() {
                layer.self_kv = Some((k.index_select(0, index), v.index_select(0, index)));
            }
            layer.memory_kv = (
                layer.memory_kv.0.index_select(0, index),
                layer.memory_kv.1.index_select(0, index),
            );
        }
        self.src_mask = self.src_mask.index_select(0, index);
    }
}

/// The encoder-decoder transformer.
#[derive(Debug)]
pub struct Transformer {
    src_embed: nn::Embedding,
    tgt_embed: Option<nn::Embedding>,
    output: Option<nn::Linear>,
    positions: Tensor,
    encoder: Vec<EncoderLayer>,
    encoder_norm: nn::LayerNorm,
    decoder: Vec<DecoderLayer>,
    decoder_norm: nn::LayerNorm,
    scale: f64,
    dropout: f64,
    kind: Kind,
}

/// Sinusoidal position encodings [max_len, d].
fn sinusoids(max_len: i64, d: i64, device: tch::Device) -> Tensor {
    let pos = Tensor::arange(max_len, (Kind::Float, device)).unsqueeze(1);
    let i = Tensor::arange_start_step(0, d, 2, (Kind::Float, device));
    let freq = (i * (-(10000f64.ln()) / d as f64)).exp();
    let angles = pos * freq.unsqueeze(0);
    Tensor::stack(&[angles.sin(), angles.cos()], 2).view([max_len, d])
}

impl Transformer {
    /// Builds the model's variables under `p` (initialized from libtorch's RNG: seed first);
    /// `precision` is the dtype of its matrix multiplies (variables are always fp32).
    pub fn new(p: &nn::Path, c: &ModelConfig, vocab: i64, precision: Precision) -> Self {
        let d = i64::from(c.d_model);
        let kind = compute_kind(precision);
        let embed_config = nn::EmbeddingConfig {
            ws_init: nn::init::Init::Randn {
                mean: 0.0,
                stdev: (d as f64).powf(-0.5),
            },
            padding_idx: PAD,
            ..Default::default()
        };
        let src_embed = nn::embedding(p / "embed", vocab, d, embed_config);
        let (tgt_embed, output) = if c.tie_embeddings {
            (None, None)
        } else {
            (
                Some(nn::embedding(p / "tgt_embed", vocab, d, embed_config)),
                Some(linear(p / "output", d, vocab)),
            )
        };
        Transformer {
            src_embed,
            tgt_embed,
            output,
            positions: sinusoids(i64::from(c.max_positions), d, p.device()),
            encoder: (0..c.encoder_layers)
                .map(|i| EncoderLayer::new(p / "encoder" / "layers" / i, c, kind))
                .collect(),
            encoder_norm: layer_norm(p / "encoder" / "norm", d),
            decoder: (0..c.decoder_layers)
                .map(|i| DecoderLayer::new(p / "decoder" / "layers" / i, c, kind))
                .collect(),
            decoder_norm: layer_norm(p / "decoder" / "norm", d),
            scale: (d as f64).sqrt(),
            dropout: c.dropout,
            kind,
        }
    }

    fn embed(&self, table: &nn::Embedding, ids: &Tensor, offset: i64, train: bool) -> Tensor {
        let len = ids.size()[1];
        let pos = self.positions.narrow(0, offset, len);
        (ids.apply(table) * self.scale + pos).drop(self.dropout, train)
    }

    fn tgt_table(&self) -> &nn::Embedding {
        self.tgt_embed.as_ref().unwrap_or(&self.src_embed)
    }

    /// [B, S] source ids -> [B, 1, 1, S] attention mask (true = a real token).
    pub fn source_mask(src: &Tensor) -> Tensor {
        src.ne(PAD).unsqueeze(1).unsqueeze(1)
    }

    /// Encodes source ids [B, S] into [B, S, D].
    pub fn encode(&self, src: &Tensor, src_mask: &Tensor, train: bool) -> Tensor {
        let mut x = self.embed(&self.src_embed, src, 0, train);
        for layer in &self.encoder {
            x = layer.forward(&x, src_mask, train);
        }
        x.apply(&self.encoder_norm)
    }

    /// Output logits [..., V] from decoder hidden states [..., D], in the compute dtype.
    fn project(&self, h: &Tensor) -> Tensor {
        match &self.output {
            Some(out) => dense(h, out, self.kind),
            None => h
                .to_kind(self.kind)
                .matmul(&self.src_embed.ws.to_kind(self.kind).tr()),
        }
    }

    /// Teacher-forced logits [B, T, V] for source [B, S] and decoder input [B, T], in the
    /// compute dtype (`loss_sum` takes them as they are).
    pub fn forward(&self, src: &Tensor, tgt_in: &Tensor, train: bool) -> Tensor {
        self.project(&self.decoder_states(src, tgt_in, train))
    }

    /// One micro-batch of training: returns (as a 0-dim f64 tensor on the device) the
    /// label-smoothed cross-entropy summed over the real (non-PAD) target tokens of `tgt_out` [B, T], and adds its gradient times
    /// `grad_scale` to every parameter's `.grad`.
    ///
    /// Autograd runs the network up to the final decoder states; the output projection and
    /// the loss are differentiated by hand in chunks of rows (`fused_projection_loss`), so
    /// the [tokens, V] logits, the largest tensor of a step, never exist in full. The
    /// result is the gradient of `loss_sum(forward(..))` (tested), in 40% of the time of
    /// that part of the step.
    pub fn train_loss_backward(
        &self,
        batch: &TensorBatch,
        label_smoothing: f64,
        grad_scale: f64,
    ) -> Tensor {
        let states = self.decoder_states(&batch.src, &batch.tgt_in, true);
        let (h, targets) = real_positions(&states, &batch.tgt_out, &batch.real);
        let rows = loss_chunk_rows(h.device());
        self.projection_loss_backward(&h, &targets, label_smoothing, grad_scale, rows)
    }

    /// The output projection and loss of `train_loss_backward` for decoder states `h`
    /// [N, D] (attached to the autograd graph) and their targets [N], `rows` at a time.
    fn projection_loss_backward(
        &self,
        h: &Tensor,
        targets: &Tensor,
        label_smoothing: f64,
        grad_scale: f64,
        rows: i64,
    ) -> Tensor {
        let (weight, bias) = match &self.output {
            Some(out) => (&out.ws, out.bs.as_ref()),
            None => (&self.src_embed.ws, None),
        };
        let fused = tch::no_grad(|| {
            fused_projection_loss(
                &h.detach(),
                weight,
                bias,
                targets,
                label_smoothing,
                self.kind,
                rows,
            )
        });
        // A scalar whose gradient is exactly the hand-computed one: d/dh (h . dh) = dh.
        let mut surrogate =
            (h * &fused.d_h).sum(Kind::Float) + (weight * &fused.d_weight).sum(Kind::Float);
        if let Some(b) = bias {
            surrogate += (b * &fused.d_bias).sum(Kind::Float);
        }
        (surrogate * grad_scale).backward();
        fused.loss
    }

    /// Teacher-forced decoder output [B, T, D] (after the final layer norm).
    fn decoder_states(&self, src: &Tensor, tgt_in: &Tensor, train: bool) -> Tensor {
        let src_mask = Self::source_mask(src);
        let memory = self.encode(src, &src_mask, train);
        let mut x = self.embed(self.tgt_table(), tgt_in, 0, train);
        for layer in &self.decoder {
            let kv = layer.cross_attn.memory_kv(&memory);
            x = layer.forward(&x, &kv, &src_mask, train);
        }
        x.apply(&self.decoder_norm)
    }

    /// Encodes `src` and prepares incremental decoding.
    pub fn start_decoding(&self, src: &Tensor) -> DecoderState {
        let src_mask = Self::source_mask(src);
        let memory = self.encode(src, &src_mask, false);
        DecoderState {
            layers: self
                .decoder
                .iter()
                .map(|layer| LayerCache {
                    self_kv: None,
                    memory_kv: layer.cross_attn.memory_kv(&memory),
                })
                .collect(),
            src_mask,
            position: 0,
        }
    }

    /// Log-probabilities [B, V] of the next token given the previous one [B].
    pub fn decode_step(&self, state: &mut DecoderState, prev: &Tensor) -> Tensor {
        let mut x = self.embed(self.tgt_table(), &prev.unsqueeze(1), state.position, false);
        for (layer, cache) in self.decoder.iter().zip(state.layers.iter_mut()) {
            x = layer.step(&x, cache, &state.src_mask);
        }
        state.position += 1;
        self.project(&x.apply(&self.decoder_norm))
            .squeeze_dim(1)
            .log_softmax(-1, Kind::Float)
    }

    /// Longest sequence the position table covers.
    pub fn max_positions(&self) -> i64 {
        self.positions.size()[0]
    }
}

/// Label-smoothed cross-entropy summed over real target tokens (PAD ignored); with
/// `label_smoothing` 0 it is the plain negative log-likelihood.
/// bf16 logits are scored in fp32. Logits [..., V], targets [...].
pub fn loss_sum(logits: &Tensor, tgt_out: &Tensor, label_smoothing: f64) -> Tensor {
    let v = *logits.size().last().expect("logits [..., V]");
    logits
        .to_kind(Kind::Float)
        .view([-1, v])
        .cross_entropy_loss::<Tensor>(
            &tgt_out.view([-1]),
            None,
            tch::Reduction::Sum,
            PAD,
            label_smoothing,
        )
}

/// Decoder states [N, D] and targets [N] at the N real (non-PAD) positions of `tgt_out`
/// [B, T], from states [B, T, D]: about 14% of a length-bucketed batch is padding, which
/// the loss ignores anyway, so it is never projected onto the vocabulary.
/// `real` [N] holds the flattened positions, found on the host (`TensorBatch::real`): the
/// number of rows is then known without asking the device.
fn real_positions(h: &Tensor, tgt_out: &Tensor, real: &Tensor) -> (Tensor, Tensor) {
    let d = *h.size().last().expect("[B, T, D]");
    (
        h.reshape([-1, d]).index_select(0, real),
        tgt_out.reshape([-1]).index_select(0, real),
    )
}

/// Rows of logits `fused_projection_loss` holds at a time, by device. On a CPU, 256 rows x 8k
/// vocabulary = 8 MB in fp32, which stays in cache while it is read and written six times.
/// Measured on the Multi30k recipe (2 threads): 64 rows 153 ms, 256 rows 85 ms, 1024 rows
/// 114 ms, all 1,750 rows at once (what autograd does) 198 ms for the projection and loss,
/// forward and backward. On a GPU the cache argument is gone and each chunk costs kernel
/// launches: 8192 rows (256 MB of fp32 logits at 8k) take a 16k-token batch in two chunks.
/// (The GPU value is not measured yet: no GPU has been lent to this project's sessions.)
fn loss_chunk_rows(device: tch::Device) -> i64 {
    if device.is_cuda() { 8192 } else { 256 }
}

/// The label-smoothed loss of an output projection and its gradients.
struct FusedLoss {
    /// Summed over rows: a 0-dim f64 tensor on the device (read by the caller once a step,
    /// not here: reading it would wait for the device every micro-batch).
    loss: Tensor,
    /// dL/dh [N, D], fp32.
    d_h: Tensor,
    /// dL/dW [V, D], fp32.
    d_weight: Tensor,
    /// dL/db [V], fp32 (zeros when there is no bias).
    d_bias: Tensor,
}

/// Label-smoothed cross-entropy (PyTorch's definition, summed) of the logits
/// `h W^T + b` against `targets` [N], with its gradients, `rows` rows at a time. Matrix
/// multiplies run in `kind`, like `dense`; logits, softmax and gradients are fp32.
///
/// With p = softmax(z) and smoothing e over V classes, per row:
///   loss  = logsumexp(z) - (1 - e) z[y] - (e / V) sum(z)
///   dL/dz = p - (1 - e) onehot(y) - e / V
fn fused_projection_loss(
    h: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    targets: &Tensor,
    label_smoothing: f64,
    kind: Kind,
    rows: i64,
) -> FusedLoss {
    let (n, d) = (h.size()[0], h.size()[1]);
    let v = weight.size()[0];
    let eps = label_smoothing;
    let device = h.device();
    let hk = h.to_kind(kind);
    let wk = weight.to_kind(kind);
    let bk = bias.map(|b| b.to_kind(kind));
    let d_h = Tensor::empty([n, d], (Kind::Float, device));
    let mut d_weight = Tensor::zeros([v, d], (Kind::Float, device));
    let mut d_bias = Tensor::zeros([v], (Kind::Float, device));
    let mut loss = Tensor::zeros([], (Kind::Double, device));
    let mut start = 0;
    while start < n {
        let len = rows.min(n - start);
        let hc = hk.narrow(0, start, len);
        let y = targets.narrow(0, start, len).unsqueeze(1);
        let z = match &bk {
            Some(b) => hc.linear(&wk, Some(b)),
            None => hc.matmul(&wk.tr()),
        }
        .to_kind(Kind::Float);
        let lse = z.logsumexp([-1], true);
        loss += lse.sum(Kind::Double)
            - z.gather(1, &y, false).sum(Kind::Double) * (1.0 - eps)
            - z.sum(Kind::Double) * (eps / v as f64);
        let mut g = (z - lse).exp_();
        if eps != 0.0 {
            let _ = g.g_sub_scalar_(eps / v as f64);
        }
        let hit = Tensor::full([len, 1], eps - 1.0, (Kind::Float, device));
        let _ = g.scatter_add_(1, &y, &hit);
        let gk = g.to_kind(kind);
        let mut rows_d_h = d_h.narrow(0, start, len);
        rows_d_h.copy_(&gk.matmul(&wk).to_kind(Kind::Float));
        d_weight += gk.tr().matmul(&hc).to_kind(Kind::Float);
        if bias.is_some() {
            d_bias += g.sum_dim_intlist(0, false, Kind::Float);
        }
        start += len;
    }
    FusedLoss {
        loss,
        d_h,
        d_weight,
        d_bias,
    }
}

/// Trainable variables sorted by name: the order every rank agrees on.
pub fn named_parameters(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Number of scalar parameters.
pub fn parameter_count(vs: &nn::VarStore) -> u64 {
    vs.trainable_variables()
        .iter()
        .map(|t| t.numel() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn tiny() -> ModelConfig {
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

    fn build(c: &ModelConfig) -> (nn::VarStore, Transformer) {
        build_in(c, Precision::Fp32)
    }

    fn build_in(c: &ModelConfig, precision: Precision) -> (nn::VarStore, Transformer) {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let m = Transformer::new(&vs.root(), c, 11, precision);
        (vs, m)
    }

    #[test]
    fn bf16_follows_fp32_and_trains_fp32_weights() {
        let src = Tensor::from_slice(&[5i64, 6, 7, 2, 8, 9, 2, PAD]).view([2, 4]);
        let tgt_in = Tensor::from_slice(&[1i64, 4, 5, 1, 7, 8]).view([2, 3]);
        let tgt_out = Tensor::from_slice(&[4i64, 5, 2, 7, 8, 2]).view([2, 3]);
        let (_, fp32) = build(&tiny());
        let (vs, bf16) = build_in(&tiny(), Precision::Bf16);
        let reference = fp32.forward(&src, &tgt_in, false);
        let logits = bf16.forward(&src, &tgt_in, false);
        assert_eq!(logits.kind(), Kind::BFloat16);
        // bf16 keeps 8 mantissa bits: logits agree to about 1% of their spread.
        let diff = (logits.to_kind(Kind::Float) - &reference)
            .abs()
            .max()
            .double_value(&[]);
        let spread = reference.abs().max().double_value(&[]);
        assert!(diff < 0.03 * spread, "{diff} vs spread {spread}");
        let loss = loss_sum(&logits, &tgt_out, 0.1);
        assert_eq!(loss.kind(), Kind::Float);
        loss.backward();
        for (name, p) in named_parameters(&vs) {
            assert_eq!(p.kind(), Kind::Float, "{name}");
            let g = p.grad();
            assert!(g.defined() && g.kind() == Kind::Float, "{name}");
            let size = g.abs().sum(Kind::Float).double_value(&[]);
            assert!(
                size > 0.0 || name.ends_with(".bias"),
                "{name} got no gradient"
            );
        }
    }

    #[test]
    fn variables_are_named_by_path() {
        let (vs, _) = build(&tiny());
        let names: Vec<String> = named_parameters(&vs).into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&"encoder.layers.0.self_attn.qkv.weight".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"decoder.layers.1.cross_attn.kv.bias".to_string()),
            "{names:?}"
        );
        assert!(names.contains(&"embed.weight".to_string()), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with("output")),
            "tied model has no output layer"
        );
        let mut untied = tiny();
        untied.tie_embeddings = false;
        let (vs, _) = build(&untied);
        assert!(
            named_parameters(&vs)
                .iter()
                .any(|(n, _)| n == "output.weight")
        );
    }

    #[test]
    fn dropout_keeps_the_expected_fraction_and_scales_the_rest() {
        tch::manual_seed(7);
        let x = Tensor::ones([1000, 257], (Kind::Float, Device::Cpu));
        let y = x.drop(0.1, true);
        let kept = y
            .ne(0.0)
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[]);
        // 257,000 draws: the kept fraction is within 5 standard deviations of 0.9.
        assert!(
            (kept - 0.9).abs() < 5.0 * (0.9f64 * 0.1 / 257_000.0).sqrt(),
            "{kept}"
        );
        let nonzero = y.masked_select(&y.ne(0.0));
        let scale = nonzero.mean(Kind::Double).double_value(&[]);
        assert!((scale - 1.0 / 0.9).abs() < 1e-6, "{scale}");
        assert!((x.drop(0.1, false) - &x).abs().max().double_value(&[]) == 0.0);
        tch::manual_seed(7);
        let again = x.drop(0.1, true);
        assert!(again.equal(&y), "same seed, same mask");
        tch::manual_seed(8);
        assert!(!x.drop(0.1, true).equal(&y));
    }

    #[test]
    fn decoder_is_causal() {
        let (_, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 7, 2]).unsqueeze(0);
        let a = Tensor::from_slice(&[1i64, 4, 5, 6]).unsqueeze(0);
        let b = Tensor::from_slice(&[1i64, 4, 9, 9]).unsqueeze(0);
        let la = m.forward(&src, &a, false);
        let lb = m.forward(&src, &b, false);
        // Positions 0 and 1 see only tokens 0..=1, identical in a and b.
        let diff = (la.narrow(1, 0, 2) - lb.narrow(1, 0, 2))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "future tokens leaked: {diff}");
        let diff_late = (la.narrow(1, 3, 1) - lb.narrow(1, 3, 1))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff_late > 1e-6);
    }

    #[test]
    fn padding_in_the_source_does_not_change_the_output() {
        let (_, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 2]).unsqueeze(0);
        let padded = Tensor::from_slice(&[5i64, 6, 2, PAD, PAD]).unsqueeze(0);
        let tgt = Tensor::from_slice(&[1i64, 4]).unsqueeze(0);
        let diff = (m.forward(&src, &tgt, false) - m.forward(&padded, &tgt, false))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn incremental_decoding_matches_the_full_forward_pass() {
        let (_, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 7, 8, 2, 4, 9, 2]).view([2, 4]);
        let tgt = Tensor::from_slice(&[1i64, 4, 5, 6, 1, 7, 8, 9]).view([2, 4]);
        let full = m.forward(&src, &tgt, false).log_softmax(-1, Kind::Float);
        let mut state = m.start_decoding(&src);
        for t in 0..4 {
            let step = m.decode_step(&mut state, &tgt.select(1, t));
            let diff = (step - full.select(1, t)).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "position {t}: {diff}");
        }
    }

    #[test]
    fn incremental_decoding_matches_over_long_outputs_in_both_precisions() {
        // Greedy and beam search decode up to 1.5x the source length + 10 positions, in
        // the training precision: the key/value cache must follow the full pass that far.
        let config = ModelConfig {
            d_model: 32,
            heads: 4,
            encoder_layers: 3,
            decoder_layers: 3,
            ffn_dim: 64,
            max_positions: 64,
            ..tiny()
        };
        let len = 40;
        tch::manual_seed(3);
        let src = Tensor::randint_low(3, 11, [2, 12], (Kind::Int64, Device::Cpu));
        let _ = src.narrow(1, 9, 3).get(1).fill_(PAD); // the second source is shorter
        let tgt = Tensor::randint_low(3, 11, [2, len], (Kind::Int64, Device::Cpu));
        for (precision, tolerance) in [(Precision::Fp32, 1e-4), (Precision::Bf16, 0.15)] {
            let (_, m) = build_in(&config, precision);
            let full = m.forward(&src, &tgt, false).log_softmax(-1, Kind::Float);
            let mut state = m.start_decoding(&src);
            let mut worst = 0.0f64;
            for t in 0..len {
                let step = m.decode_step(&mut state, &tgt.select(1, t));
                let diff = (step - full.select(1, t)).abs().max().double_value(&[]);
                worst = worst.max(diff);
            }
            assert!(
                worst < tolerance,
                "{precision:?}: log-probs differ by {worst}"
            );
        }
    }

    #[test]
    fn loss_ignores_padding_and_matches_the_label_smoothing_formula() {
        let (_, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 2]).unsqueeze(0);
        let tgt_in = Tensor::from_slice(&[1i64, 4, 5]).unsqueeze(0);
        let out = Tensor::from_slice(&[4i64, 5, 2]).unsqueeze(0);
        let in_padded = Tensor::from_slice(&[1i64, 4, 5, 2]).unsqueeze(0);
        let out_padded = Tensor::from_slice(&[4i64, 5, 2, PAD]).unsqueeze(0);
        let logits = m.forward(&src, &tgt_in, false);
        let smoothed = loss_sum(&logits, &out, 0.1);
        let nll = loss_sum(&logits, &out, 0.0);
        let nll_padded = loss_sum(&m.forward(&src, &in_padded, false), &out_padded, 0.0);
        let (smoothed, nll, nll_padded) = (
            smoothed.double_value(&[]),
            nll.double_value(&[]),
            nll_padded.double_value(&[]),
        );
        assert!((nll - nll_padded).abs() < 1e-4, "{nll} vs {nll_padded}");
        // (1 - e) * NLL + e * mean over the vocabulary of -log p, summed over tokens.
        let logp = logits.log_softmax(-1, Kind::Float);
        let uniform = -logp
            .mean_dim(-1, false, Kind::Float)
            .sum(Kind::Float)
            .double_value(&[]);
        let expected = 0.9 * nll + 0.1 * uniform;
        assert!(
            (smoothed - expected).abs() < 1e-4,
            "{smoothed} vs {expected}"
        );
    }

    /// Loss and every parameter's gradient from `train_loss_backward` (hand-differentiated,
    /// chunked) and from autograd through `loss_sum(forward(..))`.
    fn fused_and_autograd(
        c: &ModelConfig,
        precision: Precision,
        rows: i64,
    ) -> (f64, f64, Vec<(String, Tensor, Tensor)>) {
        let src = Tensor::from_slice(&[5i64, 6, 7, 2, 8, 9, 2, PAD, 3, 2, PAD, PAD]).view([3, 4]);
        let tgt_in =
            Tensor::from_slice(&[1i64, 4, 5, 6, 1, 7, 8, PAD, 1, 9, PAD, PAD]).view([3, 4]);
        let tgt_out =
            Tensor::from_slice(&[4i64, 5, 6, 2, 7, 8, 2, PAD, 9, 2, PAD, PAD]).view([3, 4]);
        let (vs, m) = build_in(c, precision);
        let params = named_parameters(&vs);
        let reference = loss_sum(&m.forward(&src, &tgt_in, false), &tgt_out, 0.1);
        (&reference * 0.5).backward();
        let expected: Vec<Tensor> = params.iter().map(|(_, p)| p.grad().copy()).collect();
        for (_, p) in &params {
            let _ = p.grad().zero_();
        }
        let real = TensorBatch::from_tensors(src.copy(), tgt_in.copy(), tgt_out.copy()).real;
        let (h, targets) = real_positions(&m.decoder_states(&src, &tgt_in, false), &tgt_out, &real);
        let loss = m
            .projection_loss_backward(&h, &targets, 0.1, 0.5, rows)
            .double_value(&[]);
        let grads = params
            .into_iter()
            .zip(expected)
            .map(|((name, p), e)| (name, p.grad().copy(), e))
            .collect();
        (loss, reference.double_value(&[]), grads)
    }

    #[test]
    fn fused_loss_has_the_loss_and_gradients_of_autograd() {
        let mut untied = tiny();
        untied.tie_embeddings = false;
        // 8 real target tokens: chunks of 3 rows split them unevenly, 64 takes them at once.
        for (config, precision, rows, tolerance) in [
            (tiny(), Precision::Fp32, 3, 1e-5),
            (tiny(), Precision::Fp32, 64, 1e-5),
            (untied, Precision::Fp32, 3, 1e-5),
            // bf16 rounds the logits and their gradient before and after each multiply.
            (tiny(), Precision::Bf16, 3, 2e-2),
        ] {
            let (fused, reference, grads) = fused_and_autograd(&config, precision, rows);
            let case = format!("{precision:?}, tied {}, rows {rows}", config.tie_embeddings);
            assert!(
                (fused - reference).abs() < tolerance * reference.abs(),
                "{case}: loss {fused} vs {reference}"
            );
            for (name, got, want) in grads {
                let err = (&got - &want).norm().double_value(&[]);
                let size = want.norm().double_value(&[]);
                assert!(
                    err <= tolerance * size.max(1e-3),
                    "{case}: {name} gradient off by {err} (norm {size})"
                );
            }
        }
    }

    #[test]
    fn train_loss_backward_returns_the_loss_and_fills_gradients() {
        let (vs, m) = build(&tiny());
        let src = Tensor::from_slice(&[5i64, 6, 2]).unsqueeze(0);
        let tgt_in = Tensor::from_slice(&[1i64, 4, 5, 2]).unsqueeze(0);
        let tgt_out = Tensor::from_slice(&[4i64, 5, 2, PAD]).unsqueeze(0);
        // Dropout is 0 in tiny(), so the training pass equals the evaluation pass.
        let expected = loss_sum(&m.forward(&src, &tgt_in, false), &tgt_out, 0.1).double_value(&[]);
        let batch = TensorBatch::from_tensors(src.copy(), tgt_in.copy(), tgt_out.copy());
        let loss = m.train_loss_backward(&batch, 0.1, 1.0).double_value(&[]);
        assert!((loss - expected).abs() < 1e-4, "{loss} vs {expected}");
        let embed = named_parameters(&vs)
            .into_iter()
            .find(|(n, _)| n == "embed.weight")
            .expect("tied embedding");
        assert!(embed.1.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0);
    }
}
