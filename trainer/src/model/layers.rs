//! The transformer's layers: multi-head attention (self and cross, with the decoder's
//! key/value cache), the feed-forward block, dropout, and the pre-layer-norm encoder and
//! decoder layers built from them. Matrix multiplies run in the compute dtype (`dense`).

use ferrotrain_api::config::{ModelConfig, Precision};
use tch::nn;
use tch::{Kind, Tensor};

use super::onednn;

/// Multi-head attention. Self-attention projects q, k, v with one matrix; cross-attention
/// projects q from the decoder and k, v (one matrix) from the encoder output.
#[derive(Debug)]
pub(super) struct Attention {
    q: Option<nn::Linear>,
    kv: Option<nn::Linear>,
    qkv: Option<nn::Linear>,
    out: nn::Linear,
    heads: i64,
    dropout: f64,
    kind: Kind,
}

/// The dtype matrix multiplies run in.
pub(super) fn compute_kind(precision: Precision) -> Kind {
    match precision {
        Precision::Fp32 => Kind::Float,
        Precision::Bf16 => Kind::BFloat16,
        Precision::Fp16 => Kind::Half,
        Precision::Auto => unreachable!("precision: auto is decided before a model is built"),
    }
}

/// `x W^T + b` in `kind`: input and weights are cast (autograd carries the gradient back to
/// the fp32 weights) and the result stays in `kind`. fp32 on a CPU goes through oneDNN
/// (`onednn.rs`: twice MKL's speed where MKL takes its generic path).
pub(super) fn dense(x: &Tensor, layer: &nn::Linear, kind: Kind) -> Tensor {
    if kind == Kind::Float && x.kind() == Kind::Float {
        if onednn::applies(x) {
            return onednn::linear(x, layer);
        }
        return x.apply(layer);
    }
    let bias = layer.bs.as_ref().map(|b| b.to_kind(kind));
    x.to_kind(kind)
        .linear(&layer.ws.to_kind(kind), bias.as_ref())
}

/// A linear layer with Xavier-uniform weights (as PyTorch's nn.Transformer) and zero bias.
pub(super) fn linear(p: nn::Path, input: i64, output: i64) -> nn::Linear {
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
        let y = if train && self.dropout > 0.0 && q.device() == tch::Device::Cpu {
            attention_with_dropout(q, k, v, mask, causal, self.dropout)
        } else {
            let p = if train { self.dropout } else { 0.0 };
            Tensor::scaled_dot_product_attention(q, k, v, mask, p, causal, None, false)
        };
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
    pub(super) fn memory_kv(&self, memory: &Tensor) -> (Tensor, Tensor) {
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

/// Attention with dropout on its weights, written out, for training on a CPU. libtorch's fused
/// CPU kernel takes no dropout, so `scaled_dot_product_attention` with dropout falls back to
/// its math path, which casts bf16 inputs to fp32 (fp32 matrix multiplies) and draws one
/// Bernoulli sample per weight. Here the products run in the inputs' dtype, the softmax in
/// fp32 (as autocast does), and the dropout is `Drop16`'s. `mask` [B, 1, 1, S]: true =
/// attend; `causal`: no attending to later positions.
pub(super) fn attention_with_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    p: f64,
) -> Tensor {
    let (lq, lk, dh) = (q.size()[2], k.size()[2], q.size()[3]);
    let mut scores = (q * (1.0 / (dh as f64).sqrt())).matmul(&k.transpose(-2, -1));
    if let Some(m) = mask {
        scores = scores.masked_fill(&m.logical_not(), f64::NEG_INFINITY);
    }
    if causal {
        let later = Tensor::ones([lq, lk], (Kind::Bool, q.device())).triu(1);
        scores = scores.masked_fill(&later, f64::NEG_INFINITY);
    }
    scores
        .softmax(-1, Kind::Float)
        .to_kind(q.kind())
        .drop(p, true)
        .matmul(v)
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
pub(super) trait Drop16 {
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

pub(super) fn layer_norm(p: nn::Path, d: i64) -> nn::LayerNorm {
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
pub(super) struct EncoderLayer {
    norm1: nn::LayerNorm,
    attn: Attention,
    norm2: nn::LayerNorm,
    ffn: FeedForward,
    dropout: f64,
}

impl EncoderLayer {
    pub(super) fn new(p: nn::Path, c: &ModelConfig, kind: Kind) -> Self {
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

    pub(super) fn forward(&self, x: &Tensor, mask: &Tensor, train: bool) -> Tensor {
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
pub(super) struct DecoderLayer {
    norm1: nn::LayerNorm,
    self_attn: Attention,
    norm2: nn::LayerNorm,
    pub(super) cross_attn: Attention,
    norm3: nn::LayerNorm,
    ffn: FeedForward,
    dropout: f64,
}

impl DecoderLayer {
    pub(super) fn new(p: nn::Path, c: &ModelConfig, kind: Kind) -> Self {
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

    pub(super) fn forward(
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

    pub(super) fn step(&self, x: &Tensor, cache: &mut LayerCache, src_mask: &Tensor) -> Tensor {
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
    pub(super) self_kv: Option<(Tensor, Tensor)>,
    pub(super) memory_kv: (Tensor, Tensor),
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    #[test]
    fn written_out_attention_is_libtorchs_without_dropout_and_drops_with_it() {
        tch::manual_seed(3);
        let (b, h, l, s, dh) = (3, 2, 5, 7, 8);
        let q = Tensor::randn([b, h, l, dh], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([b, h, s, dh], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([b, h, s, dh], (Kind::Float, Device::Cpu));
        let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
            .repeat([2])
            .narrow(0, 0, b * s)
            .view([b, 1, 1, s])
            .ne(0);
        let kq = Tensor::randn([b, h, l, dh], (Kind::Float, Device::Cpu));
        let kv = Tensor::randn([b, h, l, dh], (Kind::Float, Device::Cpu));
        // A drop probability that rounds to 0 (a multiple of 2^-16) keeps every weight.
        for (key, value, m, causal) in [(&k, &v, Some(&mask), false), (&kq, &kv, None, true)] {
            let ours = attention_with_dropout(&q, key, value, m, causal, 1e-9);
            let theirs =
                Tensor::scaled_dot_product_attention(&q, key, value, m, 0.0, causal, None, false);
            let diff = (ours - theirs).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{diff}");
        }
        let dropped = attention_with_dropout(&q, &k, &v, Some(&mask), false, 0.5);
        let kept = attention_with_dropout(&q, &k, &v, Some(&mask), false, 1e-9);
        assert_eq!(dropped.size(), kept.size());
        assert!((dropped - kept).abs().max().double_value(&[]) > 1e-3);
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
}
