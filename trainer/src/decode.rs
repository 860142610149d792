//! Greedy and beam-search decoding with the model's incremental (key/value cached) decoder.

use tch::{Device, Kind, Tensor};

use crate::data::{BOS, EOS, PAD};
use crate::model::Transformer;

/// Longest output (tokens before EOS) for each source: 1.5x its length + 10, within the
/// position table. Per sentence, so batching never changes a translation.
fn output_limits(model: &Transformer, sources: &[&[u32]]) -> Vec<i64> {
    sources
        .iter()
        .map(|s| ((s.len() as i64 + 1) * 3 / 2 + 10).min(model.max_positions() - 2))
        .collect()
}

/// Pads `sources` (ids without EOS) into a [B, S] tensor with EOS appended.
fn source_tensor(sources: &[&[u32]], device: Device) -> Tensor {
    let len = sources.iter().map(|s| s.len() + 1).max().unwrap_or(1);
    let mut flat = Vec::with_capacity(sources.len() * len);
    for s in sources {
        flat.extend(s.iter().map(|&t| i64::from(t)));
        flat.push(EOS);
        flat.extend(std::iter::repeat_n(PAD, len - s.len() - 1));
    }
    Tensor::from_slice(&flat)
        .view([sources.len() as i64, len as i64])
        .to_device(device)
}

/// Greedy decoding of one batch; returns ids without BOS/EOS.
pub fn greedy(model: &Transformer, sources: &[&[u32]], device: Device) -> Vec<Vec<u32>> {
    tch::no_grad(|| {
        let src = source_tensor(sources, device);
        let batch = src.size()[0];
        let limits = output_limits(model, sources);
        let limit_t = Tensor::from_slice(&limits).to_device(device);
        let mut state = model.start_decoding(&src);
        let mut prev = Tensor::full([batch], BOS, (Kind::Int64, device));
        let mut finished = Tensor::zeros([batch], (Kind::Bool, device));
        let mut steps = Vec::new();
        for t in 0..=limits.iter().copied().max().unwrap_or(0) {
            let next = model.decode_step(&mut state, &prev).argmax(-1, false);
            let at_limit = limit_t.le(t);
            let next = next.where_self(
                &at_limit.logical_not(),
                &Tensor::from(EOS).to_device(device),
            );
            let next = next.where_self(
                &finished.logical_not(),
                &Tensor::from(PAD).to_device(device),
            );
            finished = finished.logical_or(&next.eq(EOS));
            steps.push(next.shallow_clone());
            prev = next;
            if finished.all().int64_value(&[]) == 1 {
                break;
            }
        }
        let tokens = Tensor::stack(&steps, 1).to_device(Device::Cpu);
        let rows: Vec<Vec<i64>> = Vec::try_from(tokens).expect("int64 matrix");
        rows.into_iter().map(|row| strip(&row)).collect()
    })
}

/// Ids up to (excluding) the first EOS, without padding.
fn strip(row: &[i64]) -> Vec<u32> {
    row.iter()
        .take_while(|&&t| t != EOS)
        .filter(|&&t| t != PAD && t != BOS)
        .map(|&t| t as u32)
        .collect()
}

/// Beam search of one batch with `beam` hypotheses per sentence; scores are log-probability
/// divided by length (fairseq's default length penalty of 1). Returns the best hypothesis
/// of each sentence, ids without BOS/EOS.
pub fn beam_search(
    model: &Transformer,
    sources: &[&[u32]],
    beam: usize,
    device: Device,
) -> Vec<Vec<u32>> {
    if beam <= 1 {
        return greedy(model, sources, device);
    }
    tch::no_grad(|| {
        let src = source_tensor(sources, device);
        let batch = src.size()[0];
        let limits = output_limits(model, sources);
        let k = beam;
        let expand = Tensor::arange(batch, (Kind::Int64, device))
            .repeat_interleave_self_int(k as i64, 0, None);
        let mut state = model.start_decoding(&src.index_select(0, &expand));
        let mut beams = Beams::new(batch as usize, k);
        for t in 0..=limits.iter().copied().max().unwrap_or(0) {
            beams.finish_at_limits(t, &limits);
            if beams.all_done() {
                break;
            }
            let prev_t = Tensor::from_slice(&beams.prev).to_device(device);
            let logp = model.decode_step(&mut state, &prev_t);
            let vocab = logp.size()[1];
            let total = logp
                + Tensor::from_slice(&beams.scores)
                    .to_device(device)
                    .to_kind(Kind::Float)
                    .unsqueeze(1);
            let (top_scores, top_index) =
                total
                    .view([batch, k as i64 * vocab])
                    .topk(2 * k as i64, -1, true, true);
            let top_scores: Vec<Vec<f32>> =
                Vec::try_from(top_scores.to_device(Device::Cpu)).expect("float matrix");
            let top_index: Vec<Vec<i64>> =
                Vec::try_from(top_index.to_device(Device::Cpu)).expect("int64 matrix");
            let reorder = beams.advance(&top_scores, &top_index, vocab);
            state.select(&Tensor::from_slice(&reorder).to_device(device));
        }
        beams.best()
    })
}

/// A finished hypothesis: its length-normalised score and its tokens.
type Finished = (f64, Vec<i64>);

/// The state of a beam search over `b` sentences with `k` beams each; beam slot `s * k + i`
/// is sentence `s`'s `i`-th alive hypothesis.
struct Beams {
    b: usize,
    k: usize,
    /// Alive beams: tokens so far and cumulative log-probability.
    tokens: Vec<Vec<i64>>,
    scores: Vec<f64>,
    /// The last token of each alive beam (the next decoder input).
    prev: Vec<i64>,
    /// Each sentence's finished hypotheses; `k` of them end its search.
    done: Vec<Vec<Finished>>,
}

impl Beams {
    /// One live beam per sentence (the others -inf), all at BOS.
    fn new(b: usize, k: usize) -> Self {
        Beams {
            b,
            k,
            tokens: vec![Vec::new(); b * k],
            scores: (0..b * k)
                .map(|i| if i % k == 0 { 0.0 } else { f64::NEG_INFINITY })
                .collect(),
            prev: vec![BOS; b * k],
            done: vec![Vec::new(); b],
        }
    }

    /// A sentence at its length limit (one limit per sentence) ends its alive beams here
    /// (forced EOS).
    fn finish_at_limits(&mut self, t: i64, limits: &[i64]) {
        let k = self.k;
        for (s, &limit) in limits.iter().enumerate() {
            if self.done[s].len() < k && t == limit {
                for slot in s * k..(s + 1) * k {
                    if self.scores[slot] > f64::NEG_INFINITY {
                        let len = (self.tokens[slot].len() + 1) as f64;
                        self.done[s].push((self.scores[slot] / len, self.tokens[slot].clone()));
                    }
                }
                while self.done[s].len() < k {
                    self.done[s].push((f64::NEG_INFINITY, Vec::new()));
                }
            }
        }
    }

    fn all_done(&self) -> bool {
        self.done.iter().all(|d| d.len() >= self.k)
    }

    /// One decoding step from each sentence's top `2k` candidates (`top_index` over
    /// `k * vocab` beam-token pairs): EOS candidates finish, the best `k` others become the
    /// new alive beams. Returns the old beam each new slot continues (the cache reorder).
    fn advance(&mut self, top_scores: &[Vec<f32>], top_index: &[Vec<i64>], vocab: i64) -> Vec<i64> {
        let (b, k) = (self.b, self.k);
        let mut next = Alive {
            reorder: Vec::with_capacity(b * k),
            tokens: vec![Vec::new(); b * k],
            scores: vec![f64::NEG_INFINITY; b * k],
            prev: vec![PAD; b * k],
        };
        for s in 0..b {
            self.expand_sentence(s, &top_scores[s], &top_index[s], vocab, &mut next);
        }
        self.tokens = next.tokens;
        self.scores = next.scores;
        self.prev = next.prev;
        next.reorder
    }

    /// Sentence `s`'s part of `advance`.
    fn expand_sentence(
        &mut self,
        s: usize,
        top_scores: &[f32],
        top_index: &[i64],
        vocab: i64,
        next: &mut Alive,
    ) {
        let k = self.k;
        let mut alive = 0;
        let sentence_done = self.done[s].len() >= k;
        for (j, (&score, &index)) in top_scores.iter().zip(top_index).enumerate() {
            if alive == k {
                break;
            }
            let origin = s * k + (index / vocab) as usize;
            let token = index % vocab;
            let score = f64::from(score);
            if sentence_done || score == f64::NEG_INFINITY {
                break;
            }
            if token == EOS {
                // Only candidates ranked within the beam may finish (fairseq).
                if j < k {
                    let hyp = self.tokens[origin].clone();
                    let len = (hyp.len() + 1) as f64;
                    self.done[s].push((score / len, hyp));
                }
                continue;
            }
            let slot = s * k + alive;
            let mut hyp = self.tokens[origin].clone();
            hyp.push(token);
            next.tokens[slot] = hyp;
            next.scores[slot] = score;
            next.prev[slot] = token;
            next.reorder.push(origin as i64);
            alive += 1;
        }
        // Keep the cache shape: dead slots copy row s*k and are scored -inf.
        while alive < k {
            next.reorder.push((s * k) as i64);
            alive += 1;
        }
    }

    /// Each sentence's best finished hypothesis, ids without BOS/EOS.
    fn best(self) -> Vec<Vec<u32>> {
        let k = self.k;
        let (tokens, scores) = (self.tokens, self.scores);
        self.done
            .into_iter()
            .enumerate()
            .map(|(s, mut hyps)| {
                if hyps.is_empty() {
                    // No hypothesis finished (cannot happen with the last-step rule, but be safe).
                    let best = (0..k)
                        .max_by(|&a, &c| scores[s * k + a].total_cmp(&scores[s * k + c]))
                        .unwrap_or(0);
                    return strip(&tokens[s * k + best]);
                }
                hyps.sort_by(|a, c| c.0.total_cmp(&a.0));
                strip(&hyps[0].1)
            })
            .collect()
    }
}

/// The alive beams being built by one step, and the cache rows they continue.
struct Alive {
    reorder: Vec<i64>,
    tokens: Vec<Vec<i64>>,
    scores: Vec<f64>,
    prev: Vec<i64>,
}

/// Translates many sentences: sorts by length, decodes in batches of about
/// `max_tokens` source tokens, and returns outputs in the input order.
pub fn translate(
    model: &Transformer,
    sources: &[Vec<u32>],
    beam: usize,
    max_tokens: usize,
    device: Device,
) -> Vec<Vec<u32>> {
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sources[i].len()));
    let mut outputs = vec![Vec::new(); sources.len()];
    let mut start = 0;
    // Beam search multiplies the batch by the beam width.
    let budget = (max_tokens / beam.max(1)).max(1);
    while start < order.len() {
        let longest = sources[order[start]].len() + 1;
        let count = (budget / longest).clamp(1, 512).min(order.len() - start);
        let batch: Vec<&[u32]> = order[start..start + count]
            .iter()
            .map(|&i| sources[i].as_slice())
            .collect();
        let decoded = beam_search(model, &batch, beam, device);
        for (&i, out) in order[start..start + count].iter().zip(decoded) {
            outputs[i] = out;
        }
        start += count;
    }
    outputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::tiny;
    use ferrotrain_api::config::{ModelConfig, Precision};
    use tch::nn;

    fn model() -> Transformer {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let c = ModelConfig {
            encoder_layers: 1,
            max_positions: 40,
            ..tiny()
        };
        // The model holds its own references to the variables.
        Transformer::new(&vs.root(), &c, 9, Precision::Fp32)
    }

    /// Scores a full hypothesis with the teacher-forced model: sum of log p(token) incl. EOS.
    fn score(m: &Transformer, src: &[u32], hyp: &[u32]) -> f64 {
        let s = source_tensor(&[src], Device::Cpu);
        let mut tin = vec![BOS];
        tin.extend(hyp.iter().map(|&t| i64::from(t)));
        let mut tout: Vec<i64> = hyp.iter().map(|&t| i64::from(t)).collect();
        tout.push(EOS);
        let logp = m
            .forward(&s, &Tensor::from_slice(&tin).unsqueeze(0), false)
            .log_softmax(-1, Kind::Float);
        let picked = logp
            .squeeze_dim(0)
            .gather(1, &Tensor::from_slice(&tout).unsqueeze(1), false);
        picked.sum(Kind::Double).double_value(&[])
    }

    #[test]
    fn batched_greedy_equals_one_at_a_time() {
        let m = model();
        let sources: Vec<Vec<u32>> = vec![vec![4, 5, 6], vec![7], vec![8, 4, 4, 5, 6, 7]];
        let refs: Vec<&[u32]> = sources.iter().map(Vec::as_slice).collect();
        let batched = greedy(&m, &refs, Device::Cpu);
        for (src, out) in sources.iter().zip(&batched) {
            assert_eq!(&greedy(&m, &[src.as_slice()], Device::Cpu)[0], out);
        }
        assert_eq!(translate(&m, &sources, 1, 8, Device::Cpu), batched);
    }

    #[test]
    fn beam_search_never_scores_below_greedy() {
        let m = model();
        let sources: Vec<Vec<u32>> = vec![vec![4, 5, 6], vec![7, 8], vec![5, 5, 5, 5]];
        for src in &sources {
            let g = &greedy(&m, &[src.as_slice()], Device::Cpu)[0];
            let b = &beam_search(&m, &[src.as_slice()], 4, Device::Cpu)[0];
            let (gs, bs) = (
                score(&m, src, g) / (g.len() + 1) as f64,
                score(&m, src, b) / (b.len() + 1) as f64,
            );
            assert!(
                bs >= gs - 1e-4,
                "beam {b:?} ({bs}) worse than greedy {g:?} ({gs})"
            );
        }
        // Batched beam search gives the same result as one sentence at a time.
        let refs: Vec<&[u32]> = sources.iter().map(Vec::as_slice).collect();
        let batched = beam_search(&m, &refs, 4, Device::Cpu);
        for (src, out) in sources.iter().zip(&batched) {
            assert_eq!(&beam_search(&m, &[src.as_slice()], 4, Device::Cpu)[0], out);
        }
    }
}
