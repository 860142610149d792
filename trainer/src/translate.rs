//! Translating with a job's checkpoints: the model of one checkpoint or the average of
//! several, restored in the precision asked for; sentences in, sentences out. `ferrotrain
//! translate` and `ferrotrain select` (checkpoint_selection.rs) use it.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use ferrotrain_api::TrainerConfig;
use ferrotrain_api::config::Precision;
use ferrotrain_api::progress::PrecisionChoice;
use tch::Device;

use crate::checkpoint::{self, CheckpointStore, Named, TrainerState};
use crate::data::{self, Vocabulary};
use crate::error::{Reason, Result, TrainError};
use crate::model::{self, Transformer};
use crate::{decode, device, precision, train};

/// A job directory as the trainer left it: its config and vocabulary.
pub struct Job {
    pub dir: PathBuf,
    pub config: TrainerConfig,
    pub vocab: Vocabulary,
}

impl Job {
    pub fn open(dir: &Path) -> Result<Job> {
        let config = TrainerConfig::load(&dir.join(train::CONFIG_FILE))?;
        let vocab_path = dir.join(train::VOCAB_FILE);
        let vocab = if vocab_path.is_file() {
            Vocabulary::load(&vocab_path)?
        } else {
            // The copy task's symbols are not saved: they follow from the config.
            data::load_corpus(&config, &vocab_path)?.vocab
        };
        Ok(Job {
            dir: dir.to_path_buf(),
            config,
            vocab,
        })
    }

    /// The job's complete checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<(PathBuf, TrainerState)>> {
        CheckpointStore::new(&self.dir, Default::default())?.complete()
    }

    /// The mean of the weights of checkpoints `dirs` (one: its own weights), each checked
    /// to come from this job's config.
    pub fn weights(&self, dirs: &[PathBuf]) -> Result<Named> {
        let mut models = Vec::with_capacity(dirs.len());
        for d in dirs {
            let loaded = CheckpointStore::load(d)?;
            if loaded.state.config_digest != self.config.digest() {
                return Err(TrainError::IncompatibleCheckpoint(
                    format!(
                        "{} does not belong to the config in {}",
                        loaded.dir.display(),
                        self.dir.display()
                    )
                    .into(),
                ));
            }
            models.push(loaded.model);
        }
        checkpoint::average_weights(models)
            .map_err(|e| TrainError::IncompatibleCheckpoint(e.into()))
    }
}

/// A model ready to translate.
pub struct Translator {
    net: Transformer,
    _vs: tch::nn::VarStore,
    device: Device,
    pub precision: PrecisionChoice,
}

impl Translator {
    /// `weights` in a model of `job`'s shape on its device, with matrix multiplies in
    /// `requested` (`auto` decided as in training).
    pub fn new(job: &Job, weights: &Named, requested: Precision) -> Result<Translator> {
        let device = device::select_device(
            job.config.device,
            0,
            device::expected_gpus()?,
            device::visible_gpus(),
        )?;
        if let Some(line) = crate::attention::configure(device) {
            tracing::debug!("{line}");
        }
        let precision = precision::decide(requested, &precision::Hardware::of(device));
        let vs = tch::nn::VarStore::new(device);
        let net = Transformer::new(
            &vs.root(),
            &job.config.model,
            job.vocab.size() as i64,
            precision.used,
        );
        train::restore_model(&model::named_parameters(&vs), weights)?;
        Ok(Translator {
            net,
            _vs: vs,
            device,
            precision,
        })
    }

    /// One output line per input line.
    pub fn translate(
        &self,
        vocab: &Vocabulary,
        lines: &[String],
        search: decode::Search,
        max_tokens: usize,
    ) -> Vec<String> {
        self.hypotheses(vocab, lines, search.beam, max_tokens)
            .iter()
            .map(|hyps| vocab.decode(decode::best(hyps, search.length_penalty)))
            .collect()
    }

    /// Each input line's finished hypotheses with a beam of `beam` (beam 1 = greedy, one
    /// each), to choose among under any length penalty ([`decode::best`]).
    pub fn hypotheses(
        &self,
        vocab: &Vocabulary,
        lines: &[String],
        beam: usize,
        max_tokens: usize,
    ) -> Vec<Vec<decode::Hypothesis>> {
        let limit = (self.net.max_positions() - 2).max(1) as usize;
        let sources: Vec<Vec<u32>> = lines
            .iter()
            .map(|l| {
                let mut ids = vocab.encode(l);
                ids.truncate(limit);
                ids
            })
            .collect();
        decode::translate_hypotheses(&self.net, &sources, beam, max_tokens, self.device)
    }
}

/// Resolves `--checkpoint` to (job directory, checkpoint directory): a checkpoint directory,
/// or a job directory (its newest complete checkpoint).
pub fn resolve_checkpoint(path: &Path) -> Result<(PathBuf, PathBuf)> {
    if path.join("trainer.json").is_file() {
        let job = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        return Ok((job, path.to_path_buf()));
    }
    if !path.is_dir() {
        return Err(TrainError::Data(
            format!("--checkpoint {}: no such directory", path.display()).into(),
        ));
    }
    let store = CheckpointStore::new(path, Default::default())?;
    match store.latest()? {
        Some((dir, _)) => Ok((path.to_path_buf(), dir)),
        None => Err(TrainError::Data(format!(
            "--checkpoint {}: neither a checkpoint directory nor a job directory with a complete checkpoint",
            path.display()
        ).into())),
    }
}

/// Checkpoint `dir` and, for `count` > 1, the complete checkpoints before it (fewer if the
/// job has fewer): the directories to average, oldest first, and their steps.
pub fn newest_before(job: &Job, dir: &Path, count: usize) -> Result<(Vec<PathBuf>, Vec<u64>)> {
    let step = CheckpointStore::load(dir)?.state.step;
    let mut chosen: Vec<(PathBuf, u64)> = job
        .checkpoints()?
        .into_iter()
        .filter(|(_, s)| s.step < step)
        .map(|(d, s)| (d, s.step))
        .collect();
    chosen.drain(..chosen.len().saturating_sub(count.max(1) - 1));
    chosen.push((dir.to_path_buf(), step));
    Ok(chosen.into_iter().unzip())
}

/// The checkpoints of `job` at `steps` (each must be complete).
pub fn at_steps(job: &Job, steps: &[u64]) -> Result<Vec<PathBuf>> {
    let complete = job.checkpoints()?;
    steps
        .iter()
        .map(|step| {
            complete
                .iter()
                .find(|(_, s)| s.step == *step)
                .map(|(d, _)| d.clone())
                .ok_or_else(|| {
                    TrainError::Data(
                        format!(
                            "--steps: {} has no complete checkpoint at step {step}",
                            job.dir.display()
                        )
                        .into(),
                    )
                })
        })
        .collect()
}

/// Lines of a text file, `.gz` decompressed.
pub fn read_text_lines(path: &Path) -> Result<Vec<String>> {
    let file = std::fs::File::open(path).map_err(|e| {
        TrainError::Data(Reason::caused(format!("cannot read {}", path.display()), e))
    })?;
    let reader: Box<dyn std::io::Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    std::io::BufReader::new(reader)
        .lines()
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| TrainError::Data(Reason::caused(format!("cannot read {}", path.display()), e)))
}
