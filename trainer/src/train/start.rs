//! Everything before the first step: the device and the rendezvous, the corpus with one
//! vocabulary on every rank, the model and optimizer, the resume, rank 0's progress server,
//! checkpoint store and step log, the batch stream, the signal handlers and the clock.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use ferrotrain_api::TrainerPhase;
use ferrotrain_api::config::{BatchConfig, Precision, StepPlan};
use ferrotrain_api::progress::PrecisionChoice;
use tch::Device;

use super::job::{CONFIG_FILE, RunOptions, TRAIN_LOG, VOCAB_FILE};
use super::replica::ModelReplica;
use super::resume::{Sources, Start, config_digest, resume};
use super::trainer::{Clock, Heal, Trainer};
use super::window::Window;
use crate::checkpoint::{CheckpointStore, WriterId};
use crate::data::{self, BatchStream, Corpus, preflight_data};
use crate::device::{expected_gpus, select_device, startup_line, visible_gpus};
use crate::dist::{self, Collective, broadcast_bytes};
use crate::error::{Result, TrainError};
use crate::loss_scale::LossScaler;
use crate::metrics::{MetricsServer, Reporter, SharedProgress};
use crate::model;
use crate::precision;
use crate::resources::ResourceSampler;
use ferrotrain_launch::signals;

impl<'a> Trainer<'a> {
    /// Everything before the first step: device and rendezvous, data, model and optimizer,
    /// resume, progress server and reporter, batch stream and step log; then the signal
    /// handlers and the training clock.
    pub(super) fn start(opts: &'a RunOptions) -> Result<Self> {
        let started = Instant::now();
        let config = &opts.config;
        let (device, mut comm, precision) = open_gang(opts)?;
        let (rank, world) = (comm.rank(), comm.world_size());
        let leader = rank == 0;
        let corpus = load_corpus(opts, comm.as_mut())?;
        if corpus.train.is_empty() {
            return Err(TrainError::Data(
                "the training set is empty after filtering".into(),
            ));
        }
        let bucket_bytes = config.distributed.bucket_mib as usize * 1024 * 1024;
        let vocab = corpus.vocab.size() as i64;
        let mut replica = ModelReplica::new(
            config,
            device,
            precision.used,
            vocab,
            comm.as_mut(),
            bucket_bytes,
        )?;
        let store = open_store(opts, leader)?;
        let heal = Heal {
            dir: opts.rank.heal_dir.clone(),
            config: config_digest(config),
        };
        let sources = Sources {
            store: store.as_ref(),
            heal_dir: heal.dir.as_deref(),
            config: heal.config,
        };
        let start = resume(
            &sources,
            config,
            &replica.params,
            &mut replica.optimizer,
            comm.as_mut(),
            bucket_bytes,
        )?;
        let scaler = loss_scaler(config, &precision, &start, leader);
        let (progress, server) =
            serve_progress(opts, leader, world, &start, &replica, store.as_ref())?;
        {
            let mut p = progress.lock().expect("progress lock");
            p.precision = Some(precision.clone());
            p.loss_scale = scaler.as_ref().map(LossScaler::scale);
        }
        let reporter = Reporter::start(
            &progress,
            leader,
            &opts.job_dir,
            &config.tensorboard,
            &corpus.stats,
        );
        // The whole gang's batch (an elastic round of fewer ranks processes the same
        // batches): `globalTokens` per step, or `maxTokens` per rank.
        let virtual_world = opts.rank.virtual_world.unwrap_or(world).max(world);
        let plan = config.batch.plan(virtual_world);
        if leader {
            log_plan(&config.batch, plan, virtual_world);
        }
        let mut stream = BatchStream::new(&corpus.train, plan.micro_tokens as usize, config.seed);
        stream.seek(start.samples)?;
        let log = open_log(leader, &opts.job_dir)?;
        let (eval, save) = Self::first_marks(start.step);
        // From here a SIGTERM (pod deletion, node drain) or SIGINT stops every rank at the
        // same step and saves a checkpoint instead of losing the work since the last one.
        signals::arm();
        let clock = Clock {
            loop_started: Instant::now(),
            earlier_seconds: start.earlier_seconds,
            synced_seconds: start.earlier_seconds,
            budget: config.max_seconds.map(|s| s as f64),
        };
        // A first sample now, so the first summary has a utilisation.
        let mut sampler = ResourceSampler::default();
        sampler.sample();
        Ok(Trainer {
            config,
            device,
            rank,
            world,
            virtual_world,
            accumulate: plan.accumulate,
            leader,
            started,
            step: start.step,
            samples: start.samples,
            resumed_from_step: start.resumed_from_step,
            heal,
            clock,
            window: Window::default(),
            eval,
            save,
            train_loss: None,
            stop: false,
            interrupted_by: None,
            precision,
            scaler,
            skipped_steps: 0,
            sampler,
            log,
            stream,
            reporter,
            _server: server,
            progress,
            store,
            replica,
            corpus,
            comm,
        })
    }
}

/// `fp16`'s dynamic loss scale, going on from the state's (None in the other precisions).
fn loss_scaler(
    config: &ferrotrain_api::TrainerConfig,
    precision: &PrecisionChoice,
    start: &Start,
    leader: bool,
) -> Option<LossScaler> {
    let scaler = (precision.used == Precision::Fp16)
        .then(|| LossScaler::new(&config.loss_scale, start.loss_scale));
    if let (true, Some(s)) = (leader, &scaler) {
        tracing::info!(
            scale = s.scale(),
            resumed = start.loss_scale.is_some(),
            "fp16: dynamic loss scale"
        );
    }
    scaler
}

/// Checks the data files, picks the device, meets the other ranks, agrees on the precision
/// and (rank 0) writes the job's config.
fn open_gang(opts: &RunOptions) -> Result<(Device, Box<dyn Collective>, PrecisionChoice)> {
    let config = &opts.config;
    preflight_data(config)?;
    let device = select_device(
        config.device,
        opts.rank.local_rank,
        expected_gpus()?,
        visible_gpus(),
    )?;
    tracing::info!(rank = opts.rank.rank, "{}", startup_line(device));
    if let Some(line) = crate::attention::configure(device) {
        tracing::info!(rank = opts.rank.rank, "{line}");
    }
    let doctor = crate::doctor::findings(&crate::doctor::Machine::here());
    tracing::info!(rank = opts.rank.rank, "{}", crate::doctor::summary(&doctor));
    let mut comm = dist::init(&opts.rank, &config.distributed, device)?;
    let leader = comm.rank() == 0;
    let hardware = precision::Hardware::of(device);
    let choice = precision::decide(config.precision, &hardware);
    tracing::info!(
        rank = opts.rank.rank,
        "{}",
        precision::startup_line(&choice)
    );
    if let (true, Some(warning)) = (leader, precision::emulation_warning(&choice, &hardware)) {
        tracing::warn!("{warning}");
    }
    precision::agree(comm.as_mut(), &choice)?;
    if leader {
        std::fs::create_dir_all(&opts.job_dir)?;
        std::fs::write(opts.job_dir.join(CONFIG_FILE), config.to_yaml())?;
    }
    Ok((device, comm, choice))
}

/// Loads the corpus on every rank with one vocabulary: rank 0 learns (or reloads) it and
/// sends it to the others.
fn load_corpus(opts: &RunOptions, comm: &mut dyn Collective) -> Result<Corpus> {
    let vocab_path = opts.job_dir.join(VOCAB_FILE);
    if comm.world_size() == 1 {
        return data::load_corpus(&opts.config, &vocab_path);
    }
    if comm.rank() == 0 {
        let corpus = data::load_corpus(&opts.config, &vocab_path)?;
        let bytes = std::fs::read(&vocab_path).ok();
        broadcast_bytes(comm, bytes)?;
        Ok(corpus)
    } else {
        let bytes = broadcast_bytes(comm, None)?;
        let local = std::env::temp_dir().join(format!(
            "ferrotrain-vocab-{}-rank{}.json",
            std::process::id(),
            comm.rank()
        ));
        if bytes.is_empty() {
            return data::load_corpus(&opts.config, &local);
        }
        std::fs::write(&local, bytes)?;
        let corpus = data::load_corpus(&opts.config, &local);
        let _ = std::fs::remove_file(&local);
        corpus
    }
}

/// Rank 0's progress (served on /metrics, /progress and /healthz when `metrics_port` is set),
/// filled with where the run starts.
fn serve_progress(
    opts: &RunOptions,
    leader: bool,
    world: usize,
    start: &Start,
    replica: &ModelReplica,
    store: Option<&CheckpointStore>,
) -> Result<(SharedProgress, Option<MetricsServer>)> {
    let progress: SharedProgress = Default::default();
    let server = match (leader, opts.metrics_port) {
        (true, Some(port)) => {
            let server = MetricsServer::start(port, progress.clone())?;
            tracing::info!(addr = %server.local_addr(), "serving /metrics, /progress, /healthz");
            Some(server)
        }
        _ => None,
    };
    {
        let mut p = progress.lock().expect("progress lock");
        p.phase = TrainerPhase::Training;
        p.step = start.step;
        p.total_steps = opts.config.max_steps;
        p.samples = start.samples;
        p.world_size = world as u32;
        p.resumed_from_step = start.resumed_from_step;
        p.healed_from = start.source.healed_from();
        p.parameters = model::parameter_count(&replica.vs);
        p.last_checkpoint = store.and_then(|s| s.last_completed());
    }
    Ok((progress, server))
}

/// Rank 0's checkpoint store: it alone loads and writes checkpoints.
fn open_store(opts: &RunOptions, leader: bool) -> Result<Option<CheckpointStore>> {
    if !leader {
        return Ok(None);
    }
    Ok(Some(CheckpointStore::open_writer(
        &opts.job_dir,
        opts.config.checkpoint.clone(),
        WriterId::of_rank(&opts.rank),
    )?))
}

/// Rank 0's step log (`train-log.jsonl`), appended to across restarts. Never read back by
/// the trainer: a damaged log costs its damaged lines, not the run. A last line left cut
/// short (a rank 0 killed mid-write, a full disk) is ended first, so that this run's first
/// line is not glued to it.
fn open_log(leader: bool, job_dir: &Path) -> Result<Option<File>> {
    if !leader {
        return Ok(None);
    }
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(job_dir.join(TRAIN_LOG))?;
    if ends_mid_line(&log)? {
        log.write_all(b"\n")?;
    }
    Ok(Some(log))
}

fn ends_mid_line(file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last != *b"\n")
}

/// Appends one line to the step log in one write (a line formatted straight into the file
/// takes a write per token, and a kill between them leaves half a line).
pub(super) fn log_line(log: &mut File, line: &serde_json::Value) -> std::io::Result<()> {
    log.write_all(format!("{line}\n").as_bytes())
}

/// The start-up line that says how a step's batch is cut for this gang.
fn log_plan(batch: &BatchConfig, plan: StepPlan, ranks: usize) {
    let per_rank = plan.micro_tokens as usize / ranks.max(1);
    match batch.global_tokens {
        Some(global) => tracing::info!(
            "batch: globalTokens {global} per step over {ranks} rank(s): {} micro-batch(es) of {} tokens per side, about {per_rank} per rank",
            plan.accumulate,
            plan.micro_tokens,
        ),
        None => tracing::info!(
            "batch: {} micro-batch(es) of {} tokens per side per step ({ranks} rank(s) x maxTokens {}), about {per_rank} per rank",
            plan.accumulate,
            plan.micro_tokens,
            batch.max_tokens,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: whatever damage the log took (truncated, a bit flipped, zeroed at ten
    /// offsets), the trainer opens it and its next line is a line of its own that parses.
    #[test]
    fn a_damaged_train_log_is_appended_to_with_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_LOG);
        let mut good = Vec::new();
        for step in 1..=4 {
            let line = serde_json::json!({"step": step, "loss": 3.5, "samples": step * 64});
            good.extend(format!("{line}\n").bytes());
        }
        let next = serde_json::json!({"step": 5, "loss": 3.25});
        for copy in ferrotrain_fuzz::damage::copies(&good) {
            std::fs::write(&path, &copy.bytes).unwrap();
            let mut log = open_log(true, dir.path()).unwrap().unwrap();
            log_line(&mut log, &next).unwrap();
            let text = std::fs::read(&path).unwrap();
            let last = text[..text.len() - 1]
                .split(|&b| b == b'\n')
                .next_back()
                .unwrap();
            let parsed: serde_json::Value = serde_json::from_slice(last)
                .unwrap_or_else(|e| panic!("{copy}: {e}: {}", String::from_utf8_lossy(last)));
            assert_eq!(parsed, next, "{copy}");
            assert!(
                text.starts_with(&copy.bytes),
                "{copy}: the old lines are kept"
            );
        }
    }
}
