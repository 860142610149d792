//! Evaluation: validation loss and corpus BLEU, each rank on its slice of the validation
//! set, the sufficient statistics summed over ranks; and what the run's evaluations found,
//! which decides when the next is due.

use ferrotrain_api::TrainerConfig;
use tch::Device;

use super::outcome::StepOutcome;
use crate::bleu::BleuStats;
use crate::data::{self, Corpus};
use crate::decode;
use crate::distributed::{self, Collective};
use crate::error::Result;
use crate::model::{self, Transformer};

/// What the evaluations of this run found.
pub(super) struct EvalState {
    /// The last evaluation that had a loss: (loss, BLEU).
    last: Option<(f64, Option<f64>)>,
    best: Option<f64>,
    /// The step evaluated last (the starting step before the first evaluation).
    last_step: u64,
    /// How long the last evaluation took (the ETA adds the ones to come).
    last_seconds: f64,
}

impl EvalState {
    /// No evaluation yet in this run: it counts from the starting `step`.
    pub(super) fn new(step: u64) -> Self {
        EvalState {
            last: None,
            best: None,
            last_step: step,
            last_seconds: 0.0,
        }
    }

    /// Every `every` steps and after the last, once a step; not after a signal (a
    /// signalled rank has seconds before SIGKILL: it checkpoints, it does not evaluate).
    pub(super) fn due(&self, every: u64, s: &StepOutcome, interrupted: bool) -> bool {
        let step = s.step;
        let eval_due = ((every > 0 && step.is_multiple_of(every)) || s.final_step) && !interrupted;
        eval_due && self.last_step != step
    }

    /// The evaluation of `step` took `seconds` and found `loss` and `bleu`.
    pub(super) fn record(&mut self, step: u64, seconds: f64, loss: Option<f64>, bleu: Option<f64>) {
        self.last_step = step;
        self.last_seconds = seconds;
        if let Some(l) = loss {
            self.best = Some(self.best.map_or(l, |b: f64| b.min(l)));
            self.last = Some((l, bleu));
        }
    }

    /// `step` was evaluated.
    pub(super) fn evaluated_at(&self, step: u64) -> bool {
        self.last_step == step
    }

    /// The last evaluation that had a loss: (loss, BLEU).
    pub(super) fn last(&self) -> Option<(f64, Option<f64>)> {
        self.last
    }

    /// The lowest loss of the run's evaluations.
    pub(super) fn best(&self) -> Option<f64> {
        self.best
    }

    /// How long the last evaluation took.
    pub(super) fn last_seconds(&self) -> f64 {
        self.last_seconds
    }
}

/// Validation loss (per target token, no smoothing) and BLEU statistics for this rank's
/// share of the validation set; every rank must call it (it all-reduces).
pub(super) fn evaluate(
    model: &Transformer,
    corpus: &Corpus,
    config: &TrainerConfig,
    comm: &mut dyn Collective,
    device: Device,
) -> Result<(Option<f64>, Option<f64>)> {
    if corpus.valid.is_empty() {
        return Ok((None, None));
    }
    let (rank, world) = (comm.rank(), comm.world_size());
    let mine: Vec<usize> = (rank..corpus.valid.len()).step_by(world).collect();
    let mut loss_sum = 0.0;
    let mut tokens = 0.0;
    tch::no_grad(|| {
        let max_tokens = config.batch.max_tokens as usize;
        let mut order = mine.clone();
        order.sort_by_key(|&i| corpus.valid[i].src.len().max(corpus.valid[i].tgt.len()));
        let mut start = 0;
        while start < order.len() {
            let mut end = start;
            let mut longest = 0;
            while end < order.len() {
                let e = &corpus.valid[order[end]];
                let l = e.src.len().max(e.tgt.len()) + 2;
                if (end - start + 1) * longest.max(l) > max_tokens && end > start {
                    break;
                }
                longest = longest.max(l);
                end += 1;
            }
            let batch = data::to_tensors(&corpus.valid, &order[start..end], device);
            let logits = model.forward(&batch.src, &batch.tgt_in, false);
            let nll = model::loss_sum(&logits, &batch.tgt_out, 0.0);
            loss_sum += nll.double_value(&[]);
            tokens += batch.tgt_tokens as f64;
            start = end;
        }
    });
    let mut stats = vec![loss_sum as f32, tokens as f32];
    let mut want_bleu = false;
    if config.eval.bleu {
        want_bleu = true;
        let limit = config
            .eval
            .max_sentences
            .map_or(corpus.valid.len(), |m| m as usize);
        let chosen: Vec<usize> = mine.iter().copied().filter(|&i| i < limit).collect();
        let sources: Vec<Vec<u32>> = chosen
            .iter()
            .map(|&i| corpus.valid[i].src.clone())
            .collect();
        let outputs = decode::translate(
            model,
            &sources,
            decode::Search::beam(config.eval.beam_size as usize),
            config.batch.max_tokens as usize,
            device,
        );
        let mut total = BleuStats::default();
        for (&i, out) in chosen.iter().zip(&outputs) {
            total += BleuStats::sentence(&corpus.vocab.decode(out), &corpus.valid_references[i]);
        }
        stats.extend(total.to_vector().into_iter().map(|v| v as f32));
    }
    let summed = if world > 1 {
        distributed::all_reduce_host(comm, &stats)?
    } else {
        stats
    };
    let loss = (summed[1] > 0.0).then(|| f64::from(summed[0]) / f64::from(summed[1]));
    let bleu_score = want_bleu.then(|| {
        let v: Vec<u64> = summed[2..].iter().map(|&f| f.round() as u64).collect();
        BleuStats::from_vector(&v).score().score
    });
    Ok((loss, bleu_score))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluations_are_due_every_few_steps_and_at_the_end_once_and_keep_the_best() {
        let mut eval = EvalState::new(10);
        assert!(
            !eval.due(10, &StepOutcome::sample(10, false), false),
            "the starting step"
        );
        assert!(!eval.due(10, &StepOutcome::sample(15, false), false));
        assert!(eval.due(10, &StepOutcome::sample(20, false), false));
        assert!(
            !eval.due(10, &StepOutcome::sample(20, false), true),
            "not after a signal"
        );
        assert!(
            eval.due(0, &StepOutcome::sample(23, true), false),
            "the last step"
        );
        assert!(
            !eval.due(0, &StepOutcome::sample(23, false), false),
            "never without everySteps"
        );
        eval.record(20, 2.5, Some(3.0), Some(12.0));
        assert!(eval.evaluated_at(20));
        assert!(
            !eval.due(10, &StepOutcome::sample(20, true), false),
            "once a step"
        );
        eval.record(30, 1.5, Some(3.5), None);
        eval.record(40, 1.0, None, None);
        assert_eq!(eval.best(), Some(3.0));
        assert_eq!(
            eval.last(),
            Some((3.5, None)),
            "a loss-less evaluation is not the last"
        );
        assert_eq!(eval.last_seconds(), 1.0);
    }
}
