//! Evaluation: validation loss and corpus BLEU, each rank on its slice of the validation
//! set, the sufficient statistics summed over ranks.

use std::time::Instant;

use ferrotrain_api::{TrainerConfig, TrainerPhase};
use tch::Device;

use super::report::set_phase;
use super::start::log_line;
use super::step::StepOutcome;
use super::trainer::Trainer;
use crate::bleu::BleuStats;
use crate::data::{self, Corpus};
use crate::decode;
use crate::dist::{self, Collective};
use crate::error::Result;
use crate::model::{self, Transformer};

/// Validation loss (per target token, no smoothing) and BLEU statistics for this rank's
/// share of the validation set; every rank must call it (it all-reduces).
fn evaluate(
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
        dist::all_reduce_host(comm, &stats)?
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

impl Trainer<'_> {
    /// Every `eval.everySteps` steps and after the last (every rank: `evaluate` all-reduces).
    pub(super) fn evaluate_if_due(&mut self, s: &StepOutcome) -> Result<()> {
        let step = s.step;
        let every = self.config.eval.every_steps;
        // A signalled rank has seconds before SIGKILL: checkpoint, do not evaluate.
        let eval_due = ((every > 0 && step.is_multiple_of(every)) || s.final_step)
            && self.interrupted_by.is_none();
        if !eval_due || self.eval.last_step == step {
            return Ok(());
        }
        set_phase(&self.progress, TrainerPhase::Evaluating);
        let e0 = Instant::now();
        let (eval_loss, eval_bleu) = evaluate(
            &self.replica.model,
            &self.corpus,
            self.config,
            self.comm.as_mut(),
            self.device,
        )?;
        let eval = &mut self.eval;
        eval.last_step = step;
        eval.last_seconds = e0.elapsed().as_secs_f64();
        if let Some(l) = eval_loss {
            eval.best = Some(eval.best.map_or(l, |b: f64| b.min(l)));
            eval.last = Some((l, eval_bleu));
        }
        if self.leader {
            tracing::info!(
                step,
                eval_loss = eval_loss.unwrap_or(f64::NAN),
                eval_bleu = eval_bleu.unwrap_or(f64::NAN),
                seconds = e0.elapsed().as_secs_f64(),
                "evaluation"
            );
            if let Some(log) = self.log.as_mut() {
                let line = serde_json::json!({"step": step, "evalLoss": eval_loss, "evalBleu": eval_bleu, "evalSeconds": e0.elapsed().as_secs_f64()});
                log_line(log, &line)?;
            }
        }
        let mut p = self.progress.lock().expect("progress lock");
        p.eval_loss = eval_loss;
        p.eval_bleu = eval_bleu;
        p.eval_step = Some(step);
        p.best_eval_loss = self.eval.best;
        p.phase = TrainerPhase::Training;
        Ok(())
    }
}
