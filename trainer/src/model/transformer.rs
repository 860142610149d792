//! The encoder-decoder transformer: embeddings with sinusoidal positions, the encoder and
//! decoder stacks, the output projection (tied to the embedding or its own), teacher-forced
//! training and incremental decoding.

use ferrotrain_api::config::{ModelConfig, Precision};
use tch::nn;
use tch::{Kind, Tensor};

use super::layers::{
    DecoderLayer, Drop16, EncoderLayer, LayerCache, compute_kind, dense, layer_norm, linear,
};
use super::loss::{fused_projection_loss, loss_chunk_rows, real_positions};
use crate::data::{PAD, TensorBatch};

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
        crate::phases::mark("forward");
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
        crate::phases::mark("loss");
        // A scalar whose gradient is exactly the hand-computed one: d/dh (h . dh) = dh.
        let mut surrogate =
            (h * &fused.d_h).sum(Kind::Float) + (weight * &fused.d_weight).sum(Kind::Float);
        if let Some(b) = bias {
            surrogate += (b * &fused.d_bias).sum(Kind::Float);
        }
        (surrogate * grad_scale).backward();
        crate::phases::mark("backward");
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
    use tch::Device;

    use super::*;
    use crate::model::fixtures::{build, build_in, tiny};
    use crate::model::loss_sum;

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
