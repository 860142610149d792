//! Everything before the first step: the device and the rendezvous, the corpus with one
//! vocabulary on every rank, the model and optimizer, the resume, rank 0's progress server,
//! checkpoint store and step log, the batch stream, the signal handlers and the clock.

use std::time::Instant;

use ferrotrain_api::config::{BatchConfig, StepPlan};
use ferrotrain_api::progress::PrecisionChoice;
use tch::Device;

use super::batch::Batches;
use super::clock::Clock;
use super::evaluate::EvalState;
use super::hand_over::Heal;
use super::job::{CONFIG_FILE, RunOptions, VOCAB_FILE};
use super::position::Position;
use super::replica::ModelReplica;
use super::report::{Reporting, serve_progress};
use super::resume::{Sources, config_digest, resume};
use super::save::SaveState;
use super::scaling::Scaling;
use super::step_log::StepLog;
use super::stop::Stop;
use super::trainer::Trainer;
use crate::checkpoint::{CheckpointStore, WriterId};
use crate::data::{self, Corpus, preflight_data};
use crate::device::{expected_gpus, select_device, startup_line, visible_gpus};
use crate::distributed::{self, Collective, broadcast_bytes};
use crate::error::{Result, TrainError};
use crate::metrics::Reporter;
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
        let heal = Heal::new(opts.rank.heal_dir.clone(), config_digest(config));
        let sources = Sources {
            store: store.as_ref(),
            heal_dir: heal.dir(),
            config: heal.config(),
        };
        let start = resume(
            &sources,
            config,
            &replica.params,
            &mut replica.optimizer,
            comm.as_mut(),
            bucket_bytes,
        )?;
        let scaling = Scaling::new(&config.loss_scale, precision, start.loss_scale, leader);
        let (progress, server) = serve_progress(
            opts,
            leader,
            world,
            &start,
            &replica,
            store.as_ref(),
            &scaling,
        )?;
        let reporter = Reporter::start(
            &progress,
            leader,
            &opts.job_dir,
            &config.tensorboard,
            &corpus.stats,
        );
        // The whole gang's batch (an elastic round of fewer ranks processes the same
        // batches): `globalTokens` per step, or `maxTokens` per rank of the gang asked for
        // (elastic.maxReplicas: more ranks cut the same batch into more shards).
        let virtual_world = opts.rank.virtual_world.unwrap_or(world).max(world);
        let batch_world = opts.rank.batch_world.unwrap_or(virtual_world);
        let plan = config.batch.plan(batch_world);
        if leader {
            log_plan(&config.batch, plan, batch_world);
        }
        let batches = Batches::start(
            &corpus.train,
            plan.micro_tokens as usize,
            plan.accumulate,
            config.seed,
            start.samples,
        )?;
        let log = StepLog::open(leader, &opts.job_dir)?;
        let (eval, save) = (
            EvalState::new(start.step),
            SaveState::new(store, start.step),
        );
        // From here a SIGTERM (pod deletion, node drain) or SIGINT stops every rank at the
        // same step and saves a checkpoint instead of losing the work since the last one.
        signals::arm();
        let clock = Clock::start(start.earlier_seconds, config.max_seconds.map(|s| s as f64));
        // A first sample now, so the first summary has a utilisation.
        let mut sampler = ResourceSampler::default();
        sampler.sample();
        let reporting = Reporting::new(leader, progress, server, reporter, log, sampler);
        Ok(Trainer {
            config,
            device,
            rank,
            world,
            virtual_world,
            leader,
            started,
            position: Position::at(&start),
            stop: Stop::default(),
            clock,
            scaling,
            eval,
            heal,
            reporting,
            batches,
            save,
            replica,
            corpus,
            comm,
        })
    }
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
    let mut comm = distributed::init(&opts.rank, &config.distributed, device)?;
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

/// Rank 0's checkpoint store: it alone loads and writes checkpoints.
fn open_store(opts: &RunOptions, leader: bool) -> Result<Option<CheckpointStore>> {
    if !leader {
        return Ok(None);
    }
    let store = CheckpointStore::open_writer(
        &opts.job_dir,
        opts.config.checkpoint.clone(),
        WriterId::of_rank(&opts.rank),
    )?;
    store.put_job_files(&[CONFIG_FILE, VOCAB_FILE])?;
    Ok(Some(store))
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
