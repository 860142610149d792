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

/// How to decode: the beam width (1 = greedy) and, for a beam, the length penalty α that ranks
/// its finished hypotheses by `log p / (length + 1)^α` (fairseq's `lenpen`; the length counts
/// EOS). α = 1 is the mean log-probability per token; above 1 longer outputs win more often,
/// below 1 shorter ones (0: the most probable hypothesis).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Search {
    pub beam: usize,
    pub length_penalty: f64,
}

impl Search {
    /// A beam of `beam` (1: greedy) with length penalty 1.
    pub const fn beam(beam: usize) -> Search {
        Search {
            beam,
            length_penalty: 1.0,
        }
    }
}

/// A finished hypothesis: its ids (without BOS/EOS), its length with EOS, and the sum of the
/// log-probabilities of its tokens and EOS (no EOS for one cut at the length limit; 0 for a
/// greedy output, the only one of its sentence).
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    pub log_prob: f64,
    pub length: usize,
    pub tokens: Vec<u32>,
}

impl Hypothesis {
    fn finished((log_prob, tokens): Finished) -> Hypothesis {
        Hypothesis {
            log_prob,
            length: tokens.len() + 1,
            tokens: strip(&tokens),
        }
    }

    /// Its score under length penalty `alpha`.
    fn score(&self, alpha: f64) -> f64 {
        self.log_prob / (self.length as f64).powf(alpha)
    }
}

/// The best of one sentence's hypotheses under length penalty `alpha` (the first of equals):
/// its ids.
pub fn best(hypotheses: &[Hypothesis], alpha: f64) -> &[u32] {
    best_hypothesis(hypotheses, alpha).map_or(&[], |h| h.tokens.as_slice())
}

fn best_hypothesis(hypotheses: &[Hypothesis], alpha: f64) -> Option<&Hypothesis> {
    let mut best: Option<(&Hypothesis, f64)> = None;
    for h in hypotheses {
        let score = h.score(alpha);
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((h, score));
        }
    }
    best.map(|(h, _)| h)
}

/// Beam search of one batch with `beam` hypotheses per sentence: each sentence's `beam`
/// finished hypotheses in the order they finished (those that could not finish score -inf).
/// Which hypotheses finish does not depend on the length penalty (the alive beams are ranked
/// by their log-probability), so one search serves every penalty. Beam 1 is greedy decoding:
/// one hypothesis per sentence.
pub fn beam_hypotheses(
    model: &Transformer,
    sources: &[&[u32]],
    beam: usize,
    device: Device,
) -> Vec<Vec<Hypothesis>> {
    if beam <= 1 {
        return greedy(model, sources, device)
            .into_iter()
            .map(|tokens| {
                vec![Hypothesis {
                    log_prob: 0.0,
                    length: tokens.len() + 1,
                    tokens,
                }]
            })
            .collect();
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
        beams.finished()
    })
}

/// A finished hypothesis: its log-probability (EOS's included) and its tokens.
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
                        self.done[s].push((self.scores[slot], self.tokens[slot].clone()));
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
                    self.done[s].push((score, self.tokens[origin].clone()));
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

    /// Each sentence's finished hypotheses; a sentence none of whose beams finished (cannot
    /// happen with the last-step rule, but be safe) gets its best alive one.
    fn finished(self) -> Vec<Vec<Hypothesis>> {
        let k = self.k;
        let (tokens, scores) = (self.tokens, self.scores);
        self.done
            .into_iter()
            .enumerate()
            .map(|(s, hyps)| {
                if hyps.is_empty() {
                    let best = (0..k)
                        .max_by(|&a, &c| scores[s * k + a].total_cmp(&scores[s * k + c]))
                        .unwrap_or(0);
                    let alive = (scores[s * k + best], tokens[s * k + best].clone());
                    return vec![Hypothesis::finished(alive)];
                }
                hyps.into_iter().map(Hypothesis::finished).collect()
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
    search: Search,
    max_tokens: usize,
    device: Device,
) -> Vec<Vec<u32>> {
    translate_hypotheses(model, sources, search.beam, max_tokens, device)
        .iter()
        .map(|hyps| best(hyps, search.length_penalty).to_vec())
        .collect()
}

/// [`translate`]'s search, each sentence's finished hypotheses (see [`beam_hypotheses`]),
/// for choosing among them under several length penalties.
pub fn translate_hypotheses(
    model: &Transformer,
    sources: &[Vec<u32>],
    beam: usize,
    max_tokens: usize,
    device: Device,
) -> Vec<Vec<Hypothesis>> {
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sources[i].len()));
    let mut outputs: Vec<Vec<Hypothesis>> = vec![Vec::new(); sources.len()];
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
        let decoded = beam_hypotheses(model, &batch, beam, device);
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
        assert_eq!(
            translate(&m, &sources, Search::beam(1), 8, Device::Cpu),
            batched
        );
    }

    /// Beam search's best outputs with length penalty 1.
    fn beam_search(m: &Transformer, sources: &[&[u32]], k: usize) -> Vec<Vec<u32>> {
        beam_hypotheses(m, sources, k, Device::Cpu)
            .iter()
            .map(|h| best(h, 1.0).to_vec())
            .collect()
    }

    #[test]
    fn beam_search_never_scores_below_greedy() {
        let m = model();
        let sources: Vec<Vec<u32>> = vec![vec![4, 5, 6], vec![7, 8], vec![5, 5, 5, 5]];
        for src in &sources {
            let g = &greedy(&m, &[src.as_slice()], Device::Cpu)[0];
            let b = &beam_search(&m, &[src.as_slice()], 4)[0];
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
        let batched = beam_search(&m, &refs, 4);
        for (src, out) in sources.iter().zip(&batched) {
            assert_eq!(&beam_search(&m, &[src.as_slice()], 4)[0], out);
        }
        assert_eq!(
            translate(&m, &sources, Search::beam(4), 8, Device::Cpu),
            batched
        );
    }

    #[test]
    fn a_larger_length_penalty_never_picks_a_shorter_output() {
        let m = model();
        // This model's beams end at several lengths for [3, 3] and at the limit elsewhere.
        let sources: Vec<Vec<u32>> = vec![vec![4, 5, 6], vec![3, 3], vec![7, 8], vec![8]];
        let refs: Vec<&[u32]> = sources.iter().map(Vec::as_slice).collect();
        let all = beam_hypotheses(&m, &refs, 4, Device::Cpu);
        let mut penalty_mattered = false;
        for (src, hyps) in sources.iter().zip(&all) {
            assert_eq!(hyps.len(), 4, "{hyps:?}");
            // Each hypothesis carries the model's own log-probability of its tokens and EOS
            // (unless it emitted PAD or BOS, which its ids leave out, or was cut at the limit,
            // where no EOS was scored).
            let limit = output_limits(&m, &[src.as_slice()])[0] as usize;
            let ended = |h: &&Hypothesis| h.length == h.tokens.len() + 1 && h.tokens.len() < limit;
            for h in hyps.iter().filter(ended) {
                let teacher = score(&m, src, &h.tokens);
                assert!((h.log_prob - teacher).abs() < 1e-3, "{h:?}: {teacher}");
            }
            let chosen = |alpha| best_hypothesis(hyps, alpha).unwrap();
            let lengths: Vec<usize> = [0.0, 0.5, 1.0, 2.0, 4.0]
                .into_iter()
                .map(|alpha| chosen(alpha).length)
                .collect();
            assert!(lengths.is_sorted(), "{src:?}: {lengths:?} from {hyps:?}");
            penalty_mattered |= lengths[0] < lengths[4];
            // No penalty: the most probable hypothesis.
            let top = hyps.iter().map(|h| h.log_prob).fold(f64::MIN, f64::max);
            assert_eq!(chosen(0.0).log_prob, top);
            assert_eq!(best(hyps, 1.0), chosen(1.0).tokens);
        }
        assert!(penalty_mattered, "{all:?}");
    }
}
