//! Choosing what to translate with, on validation data only: every kept checkpoint alone,
//! the average of the last K and of the best K by validation loss (K = 2..maxAverage), each
//! scored by BLEU on a validation set, with a beam under each length penalty asked for (one
//! search per candidate serves them all); the best is written to `<job>/selected.json` and
//! used by `ferrotrain translate --selected`. A test set is never read here: score it once,
//! afterwards, with the selection.

use std::path::{Path, PathBuf};

use ferrotrain_api::config::Precision;
use serde::{Deserialize, Serialize};

use crate::checkpoint::TrainerState;
use crate::error::{Result, TrainError};
use crate::translate::{Job, Translator, read_text_lines};
use crate::{bleu, decode};

/// Where `select` writes its choice.
pub const SELECTED_FILE: &str = "selected.json";

/// One way to translate: the checkpoints averaged (one: that checkpoint), and the length
/// penalty that ranks a beam's hypotheses ([`decode::Search`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// For people: `step 1200`, `last 3`, `best 3 by val loss`.
    pub name: String,
    /// The checkpoints' steps, oldest first.
    pub steps: Vec<u64>,
    /// 1 (the mean log-probability per token) in selections written before it was chosen.
    #[serde(default = "unit_length_penalty")]
    pub length_penalty: f64,
}

fn unit_length_penalty() -> f64 {
    1.0
}

/// The selection `select` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selection {
    pub chosen: Candidate,
    /// Its validation BLEU (sacreBLEU 13a, cased).
    pub val_bleu: f64,
    pub beam: usize,
    /// The validation files it was chosen on.
    pub source: PathBuf,
    pub reference: PathBuf,
    /// Every candidate with its validation BLEU, in the order scored.
    pub scored: Vec<(Candidate, f64)>,
}

/// The candidates for `checkpoints` (complete, oldest first): each alone, then for K in
/// 2..=max_average the last K and the best K by the validation loss their trainer.json
/// holds (only checkpoints that have one; fewer than K: left out). Duplicates go.
pub fn candidates(checkpoints: &[TrainerState], max_average: usize) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = checkpoints
        .iter()
        .map(|s| Candidate {
            name: format!("step {}", s.step),
            steps: vec![s.step],
            length_penalty: 1.0,
        })
        .collect();
    let mut by_loss: Vec<&TrainerState> = checkpoints
        .iter()
        .filter(|s| s.eval_loss.is_some())
        .collect();
    by_loss.sort_by(|a, b| {
        a.eval_loss
            .partial_cmp(&b.eval_loss)
            .expect("finite losses")
    });
    for k in 2..=max_average {
        if checkpoints.len() >= k {
            let steps = checkpoints[checkpoints.len() - k..].iter().map(|s| s.step);
            out.push(candidate(format!("last {k}"), steps));
        }
        if by_loss.len() >= k {
            let steps = by_loss[..k].iter().map(|s| s.step);
            out.push(candidate(format!("best {k} by val loss"), steps));
        }
    }
    let mut seen = Vec::new();
    out.retain(|c| {
        let new = !seen.contains(&c.steps);
        seen.push(c.steps.clone());
        new
    });
    out
}

fn candidate(name: String, steps: impl Iterator<Item = u64>) -> Candidate {
    let mut steps: Vec<u64> = steps.collect();
    steps.sort_unstable();
    Candidate {
        name,
        steps,
        length_penalty: 1.0,
    }
}

/// The best scored candidate: the highest BLEU; on a tie the fewer checkpoints, then the
/// later ones, then the length penalty nearer 1.
pub fn pick(scored: &[(Candidate, f64)]) -> Option<&(Candidate, f64)> {
    let off_unit = |c: &Candidate| (c.length_penalty - 1.0).abs();
    scored.iter().max_by(|(a, x), (b, y)| {
        x.total_cmp(y)
            .then(b.steps.len().cmp(&a.steps.len()))
            .then(a.steps.last().cmp(&b.steps.last()))
            .then(off_unit(b).total_cmp(&off_unit(a)))
    })
}

/// What `ferrotrain select` is asked.
pub struct Request<'a> {
    pub job_dir: &'a Path,
    pub source: &'a Path,
    pub reference: &'a Path,
    pub beam: usize,
    /// Each candidate's beam is scored under each of these (beam 1: only under 1).
    pub length_penalties: &'a [f64],
    pub max_average: usize,
    pub max_tokens: usize,
    pub precision: Option<Precision>,
}

/// Scores every candidate of the job on the validation files, writes and returns the
/// selection.
pub fn select(r: &Request) -> Result<Selection> {
    let job = Job::open(r.job_dir)?;
    let sources = read_text_lines(r.source)?;
    let refs = read_text_lines(r.reference)?;
    if sources.len() != refs.len() || sources.is_empty() {
        return Err(TrainError::Data(
            format!(
                "{} holds {} lines and {} holds {}: a validation set needs as many (and some)",
                r.source.display(),
                sources.len(),
                r.reference.display(),
                refs.len()
            )
            .into(),
        ));
    }
    let complete = job.checkpoints()?;
    let states: Vec<TrainerState> = complete.iter().map(|(_, s)| s.clone()).collect();
    let mut scored = Vec::new();
    for c in candidates(&states, r.max_average) {
        let dirs: Vec<PathBuf> = c
            .steps
            .iter()
            .filter_map(|step| complete.iter().find(|(_, s)| s.step == *step))
            .map(|(d, _)| d.clone())
            .collect();
        let weights = job.weights(&dirs)?;
        let requested = r.precision.unwrap_or(job.config.precision);
        let translator = Translator::new(&job, &weights, requested)?;
        let hyps = translator.hypotheses(&job.vocab, &sources, r.beam, r.max_tokens);
        let penalties = if r.beam > 1 {
            r.length_penalties
        } else {
            &[1.0]
        };
        for &length_penalty in penalties {
            let outputs: Vec<String> = hyps
                .iter()
                .map(|h| job.vocab.decode(decode::best(h, length_penalty)))
                .collect();
            let score = bleu::corpus_bleu(&outputs, &refs).score;
            tracing::info!(candidate = %c.name, steps = ?c.steps, length_penalty, val_bleu = format!("{score:.2}"), "scored");
            let c = Candidate {
                length_penalty,
                ..c.clone()
            };
            scored.push((c, score));
        }
    }
    let Some((chosen, val_bleu)) = pick(&scored).cloned() else {
        return Err(TrainError::Data(
            format!(
                "{}: no complete checkpoint to select from",
                job.dir.display()
            )
            .into(),
        ));
    };
    let selection = Selection {
        chosen,
        val_bleu,
        beam: r.beam,
        source: r.source.to_path_buf(),
        reference: r.reference.to_path_buf(),
        scored,
    };
    let json = serde_json::to_vec_pretty(&selection).expect("a selection serializes");
    std::fs::write(job.dir.join(SELECTED_FILE), json)?;
    Ok(selection)
}

/// The selection `select` wrote in `job_dir`.
pub fn read_selection(job_dir: &Path) -> Result<Selection> {
    let path = job_dir.join(SELECTED_FILE);
    let bytes = std::fs::read(&path).map_err(|e| {
        TrainError::Data(
            format!(
                "--selected: cannot read {} ({e}); run `ferrotrain select` first",
                path.display()
            )
            .into(),
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        TrainError::Data(format!("--selected: {} is malformed: {e}", path.display()).into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64, eval_loss: Option<f64>) -> TrainerState {
        TrainerState {
            step,
            samples: 0,
            epoch: 0,
            seed: 1,
            config_digest: String::new(),
            world_size: 1,
            train_loss: None,
            eval_loss,
            eval_bleu: None,
            time: String::new(),
            train_seconds: 0.0,
            precision: None,
            loss_scale: None,
        }
    }

    fn steps(cs: &[Candidate]) -> Vec<(&str, Vec<u64>)> {
        cs.iter()
            .map(|c| (c.name.as_str(), c.steps.clone()))
            .collect()
    }

    #[test]
    fn candidates_are_each_checkpoint_then_the_last_and_best_k() {
        let kept = [
            state(100, Some(3.0)),
            state(200, Some(2.0)),
            state(300, Some(2.5)),
            state(400, None),
        ];
        assert_eq!(
            steps(&candidates(&kept, 3)),
            [
                ("step 100", vec![100]),
                ("step 200", vec![200]),
                ("step 300", vec![300]),
                ("step 400", vec![400]),
                ("last 2", vec![300, 400]),
                ("best 2 by val loss", vec![200, 300]),
                ("last 3", vec![200, 300, 400]),
                ("best 3 by val loss", vec![100, 200, 300]),
            ]
        );
        // The same checkpoints twice are scored once.
        let two = [state(100, Some(3.0)), state(200, Some(2.0))];
        assert_eq!(
            steps(&candidates(&two, 5)),
            [
                ("step 100", vec![100]),
                ("step 200", vec![200]),
                ("last 2", vec![100, 200])
            ]
        );
    }

    fn c(name: &str, steps: &[u64], length_penalty: f64) -> Candidate {
        Candidate {
            name: name.into(),
            steps: steps.to_vec(),
            length_penalty,
        }
    }

    #[test]
    fn the_pick_is_the_best_bleu_then_fewer_then_later_checkpoints_then_penalty_nearer_1() {
        let scored = vec![
            (c("step 100", &[100], 1.0), 30.0),
            (c("last 2", &[100, 200], 1.0), 31.5),
            (c("step 200", &[200], 1.0), 31.5),
            (c("step 150", &[150], 1.0), 31.5),
        ];
        assert_eq!(pick(&scored).unwrap().0.name, "step 200");
        assert!(pick(&[]).is_none());
        let penalties = [0.6, 1.4, 1.2, 0.7].map(|a| (c("step 200", &[200], a), 31.5));
        assert_eq!(pick(&penalties).unwrap().0.length_penalty, 1.2);
        let better = [
            (c("step 200", &[200], 1.0), 31.5),
            (c("step 200", &[200], 2.0), 31.6),
        ];
        assert_eq!(pick(&better).unwrap().0.length_penalty, 2.0);
    }

    #[test]
    fn a_selection_written_before_length_penalties_reads_as_penalty_1() {
        let old = r#"{"chosen": {"name": "last 2", "steps": [300, 400]}, "valBleu": 37.5,
            "beam": 4, "source": "val.en", "reference": "val.de",
            "scored": [[{"name": "last 2", "steps": [300, 400]}, 37.5]]}"#;
        let s: Selection = serde_json::from_str(old).unwrap();
        assert_eq!(s.chosen, c("last 2", &[300, 400], 1.0));
        assert_eq!(s.scored[0].0.length_penalty, 1.0);
    }
}
