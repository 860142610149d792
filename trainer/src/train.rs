//! The training loop. Per step, like the paper: batch -> forward -> loss -> backward ->
//! all-reduce -> clip -> optimizer step -> schedule -> maybe evaluate -> maybe checkpoint ->
//! report.
//!
//! Every rank runs this loop on its shard of the same global batches. Rank 0 alone loads and
//! writes checkpoints and serves progress; it broadcasts the vocabulary, the weights and the
//! optimizer state, so other ranks never need the checkpoint volume.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrotrain_api::config::{DeviceKind, Precision, Task};
use ferrotrain_api::progress::GangResources;
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{CheckpointInfo, TrainerConfig, TrainerPhase};
use tch::{Device, Kind, Tensor, nn};

use crate::bleu::BleuStats;
use crate::checkpoint::{CheckpointStore, Named, TrainerState, WriterId};
use crate::data::{self, BatchStream, Corpus, Example};
use crate::decode;
use crate::dist::{self, Collective, GradSync, RankEnv};
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsServer, Reporter, SharedProgress};
use crate::model::{self, Transformer};
use crate::optim::{self, AdamW};
use crate::resources::ResourceSampler;
use crate::signals;

/// File (under the job's checkpoint directory) with one JSON line per optimizer step.
pub const TRAIN_LOG: &str = "train-log.jsonl";
/// The vocabulary every restart reuses.
pub const VOCAB_FILE: &str = "tokenizer.json";
/// The config the job was started with (for `ferrotrain translate`).
pub const CONFIG_FILE: &str = "config.yaml";

/// Everything a rank needs to run.
pub struct RunOptions {
    pub config: TrainerConfig,
    /// `<checkpoint dir>/<job>`.
    pub job_dir: PathBuf,
    /// Rank 0 serves /metrics, /progress, /healthz here (0 = ephemeral).
    pub metrics_port: Option<u16>,
    pub rank: RankEnv,
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Summary {
    pub step: u64,
    pub resumed_from_step: Option<u64>,
    pub loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_bleu: Option<f64>,
    pub last_checkpoint: Option<CheckpointInfo>,
    pub seconds: f64,
    /// Set when SIGTERM/SIGINT stopped the run early (after saving a checkpoint).
    pub interrupted_by: Option<i32>,
    /// Rank 0's last progress report (phase Finished after a complete run).
    pub final_progress: ferrotrain_api::Progress,
}

/// What this process can see of CUDA (`Cuda::device_count`, 0 without a CUDA libtorch or GPU).
pub fn visible_gpus() -> usize {
    if tch::Cuda::is_available() {
        tch::Cuda::device_count().max(0) as usize
    } else {
        0
    }
}

/// GPUs the pod was given (FERROTRAIN_EXPECT_GPUS, set by the operator from gpusPerReplica).
pub fn expected_gpus() -> Result<u32> {
    let name = ferrotrain_api::env::FERROTRAIN_EXPECT_GPUS;
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| TrainError::Config(format!("{name}={v:?} is not a number of GPUs"))),
        _ => Ok(0),
    }
}

/// Picks the device for this rank: GPU `local_rank % visible` (one visible GPU per process
/// works), the CPU when there is none, unless the pod was given GPUs (`expect_gpus`): then a
/// missing CUDA is a configuration error, not a silent CPU run.
pub fn select_device(
    kind: DeviceKind,
    local_rank: usize,
    expect_gpus: u32,
    visible: usize,
) -> Result<Device> {
    let why = || {
        if tch::utils::has_cuda() {
            "no CUDA device is visible"
        } else {
            "this libtorch has no CUDA (a CPU build, or libtorch_cuda was not linked)"
        }
    };
    match kind {
        DeviceKind::Cpu => {
            if expect_gpus > 0 {
                tracing::warn!(
                    "device: cpu while the pod was given {expect_gpus} GPU(s): they stay idle"
                );
            }
            Ok(Device::Cpu)
        }
        _ if visible > 0 => Ok(Device::Cuda(local_rank % visible)),
        DeviceKind::Auto if expect_gpus == 0 => Ok(Device::Cpu),
        DeviceKind::Auto => Err(TrainError::Config(format!(
            "device: auto on a pod given {expect_gpus} GPU(s) ({}), but {}: refusing to \
             train on the CPU (set device: cpu to do so on purpose)",
            ferrotrain_api::env::FERROTRAIN_EXPECT_GPUS,
            why()
        ))),
        DeviceKind::Cuda => Err(TrainError::Config(format!(
            "device: cuda requested but {}",
            why()
        ))),
    }
}

/// One line on what this process computes with: the device, the libtorch build, CUDA.
pub fn startup_line(device: Device) -> String {
    let build = if tch::utils::has_cuda() {
        "CUDA"
    } else {
        "CPU"
    };
    let mut line = format!(
        "device {device:?}; libtorch {} ({build} build, tch {}); {} CUDA device(s) visible",
        env!("FERROTRAIN_LIBTORCH_VERSION"),
        TCH_VERSION,
        visible_gpus()
    );
    if tch::Cuda::is_available() {
        line += &format!("; cuDNN {}", tch::Cuda::cudnn_is_available());
    }
    line
}

/// The tch crate this binary was built with (it pins the libtorch version).
const TCH_VERSION: &str = "0.24.0";

/// Checks that configured data files exist before meeting other ranks, so a typo fails fast
/// with exit code 3 on every rank instead of as a collective timeout.
pub fn preflight_data(config: &TrainerConfig) -> Result<()> {
    if config.task != Task::Translation {
        return Ok(());
    }
    let mut files = Vec::new();
    for (field, pair) in [
        ("data.train", &config.data.train),
        ("data.valid", &config.data.valid),
    ] {
        if let Some(p) = pair {
            files.push((format!("{field}.source"), p.source.clone()));
            files.push((format!("{field}.target"), p.target.clone()));
        }
    }
    if let Some(p) = &config.data.tokenizer.path {
        files.push(("data.tokenizer.path".into(), p.clone()));
    }
    for (field, file) in files {
        if !Path::new(&file).is_file() {
            return Err(TrainError::Data(format!(
                "{field}: file {file} does not exist or is not a file"
            )));
        }
    }
    Ok(())
}

/// Broadcasts unsigned integers from rank 0, exactly: each travels as four 16-bit limbs,
/// which f32 represents without rounding.
fn broadcast_u64s(comm: &mut dyn Collective, values: &[u64]) -> Result<Vec<u64>> {
    let limbs: Vec<f32> = values
        .iter()
        .flat_map(|v| (0..4).map(move |i| ((v >> (16 * i)) & 0xffff) as f32))
        .collect();
    let back = dist::broadcast_host(comm, &limbs)?;
    Ok(back
        .chunks(4)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |acc, (i, &l)| acc | ((l as u64) << (16 * i)))
        })
        .collect())
}

/// What rank 0 found in the job's checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResumeStatus {
    Fresh,
    Resumed,
    /// The checkpoint does not fit the config: every rank fails with exit 4.
    Incompatible,
}

/// Where training starts, as rank 0 decided it; every rank learns it from rank 0. Encoded
/// and decoded here only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ResumeHeader {
    status: ResumeStatus,
    step: u64,
    samples: u64,
    optimizer_steps: u64,
}

impl ResumeHeader {
    fn encode(&self) -> [u64; 4] {
        let status = match self.status {
            ResumeStatus::Fresh => 0,
            ResumeStatus::Resumed => 1,
            ResumeStatus::Incompatible => 4,
        };
        [status, self.step, self.samples, self.optimizer_steps]
    }

    fn decode(v: &[u64]) -> Result<Self> {
        let &[status, step, samples, optimizer_steps] = v else {
            return Err(TrainError::Distributed(format!(
                "resume header: {} values, expected 4",
                v.len()
            )));
        };
        let status = match status {
            0 => ResumeStatus::Fresh,
            1 => ResumeStatus::Resumed,
            4 => ResumeStatus::Incompatible,
            other => {
                return Err(TrainError::Distributed(format!(
                    "resume header: unknown status {other} from rank 0"
                )));
            }
        };
        Ok(ResumeHeader {
            status,
            step,
            samples,
            optimizer_steps,
        })
    }

    /// Rank 0's header on every rank.
    fn broadcast(self, comm: &mut dyn Collective) -> Result<Self> {
        Self::decode(&broadcast_u64s(comm, &self.encode())?)
    }
}

/// Broadcasts a byte string from rank 0 (each byte as one f32).
fn broadcast_bytes(comm: &mut dyn Collective, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
    let len = broadcast_u64s(comm, &[bytes.as_ref().map_or(0, |b| b.len() as u64)])?[0] as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    let floats: Vec<f32> = match bytes {
        Some(b) => b.into_iter().map(f32::from).collect(),
        None => vec![0.0; len],
    };
    let back = dist::broadcast_host(comm, &floats)?;
    Ok(back.into_iter().map(|f| f as u8).collect())
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

/// Copies checkpointed tensors into the model's variables, by name.
pub fn restore_model(vars: &[(String, Tensor)], saved: &Named) -> Result<()> {
    for (name, var) in vars {
        let src = saved
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                TrainError::IncompatibleCheckpoint(format!(
                    "checkpoint has no tensor {name} that the model needs"
                ))
            })?;
        if src.size() != var.size() {
            return Err(TrainError::IncompatibleCheckpoint(format!(
                "checkpoint tensor {name} has shape {:?}, the model needs {:?}",
                src.size(),
                var.size()
            )));
        }
        let mut dst = var.shallow_clone();
        tch::no_grad(|| dst.copy_(src));
    }
    Ok(())
}

/// A seed for libtorch's RNG at (run seed, step, rank, micro-batch): dropout masks are a pure
/// function of the position in training, so a resume replays them exactly.
fn step_seed(seed: u64, step: u64, rank: usize, micro: usize) -> i64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for v in [step, rank as u64, micro as u64] {
        h = (h ^ v).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    (h >> 1) as i64
}

fn target_tokens(examples: &[Example], batch: &[usize]) -> i64 {
    batch
        .iter()
        .map(|&i| examples[i].tgt.len() as i64 + 1)
        .sum()
}

fn rfc3339_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Peak resident memory of this process (VmHWM), bytes.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

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
            config.eval.beam_size as usize,
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

/// A sliding window of recent steps for rates.
struct Window {
    steps: VecDeque<(f64, f64, i64, u64)>, // (seconds, comm seconds, tokens, samples)
}

impl Window {
    const LEN: usize = 20;
    fn push(&mut self, seconds: f64, comm: f64, tokens: i64, samples: u64) {
        if self.steps.len() == Self::LEN {
            self.steps.pop_front();
        }
        self.steps.push_back((seconds, comm, tokens, samples));
    }
    fn rates(&self) -> Option<(f64, f64, f64, f64, f64)> {
        let secs: f64 = self.steps.iter().map(|s| s.0).sum();
        if secs <= 0.0 {
            return None;
        }
        let n = self.steps.len() as f64;
        let comm: f64 = self.steps.iter().map(|s| s.1).sum();
        let tokens: i64 = self.steps.iter().map(|s| s.2).sum();
        let samples: u64 = self.steps.iter().map(|s| s.3).sum();
        Some((
            n / secs,
            samples as f64 / secs,
            tokens as f64 / secs,
            secs / n,
            comm / secs,
        ))
    }
}

/// Whether /proc/cpuinfo's `flags` name bf16 matrix units (AMX-BF16 or AVX512-BF16). Empty
/// text (not Linux) counts as yes: nothing to warn about.
fn cpu_has_bf16_units(cpuinfo: &str) -> bool {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .collect();
    cpuinfo.is_empty()
        || flags
            .iter()
            .any(|f| matches!(*f, "amx_bf16" | "avx512_bf16"))
}

/// Where this run starts, agreed by every rank.
struct Start {
    step: u64,
    samples: u64,
    /// Training seconds of the job's earlier runs (rank 0 knows; the others learn rank 0's
    /// clock every step).
    earlier_seconds: f64,
    resumed_from_step: Option<u64>,
}

/// Resume: rank 0 (the one with a `store`) reads the newest complete checkpoint into the
/// model and the optimizer and tells the others, who take its weights and moments.
fn resume(
    store: Option<&CheckpointStore>,
    config: &TrainerConfig,
    params: &[(String, Tensor)],
    optimizer: &mut AdamW,
    grad_sync: Option<&mut GradSync>,
    comm: &mut dyn Collective,
    bucket_bytes: usize,
) -> Result<Start> {
    let mut resume_state: Option<TrainerState> = None;
    let mut status = ResumeStatus::Fresh;
    let mut incompatible = None;
    let latest = match store {
        Some(store) => store.latest()?,
        None => None,
    };
    if let Some((dir, _)) = latest {
        let loaded = CheckpointStore::load(&dir)?;
        let outcome = if loaded.state.config_digest != config.digest() {
            Err(TrainError::IncompatibleCheckpoint(format!(
                "checkpoint {} was written by a config with digest {}, this config has {} \
                 (model shape, task or vocabulary changed); use a new job name or checkpoint directory",
                dir.display(),
                loaded.state.config_digest,
                config.digest()
            )))
        } else {
            restore_model(params, &loaded.model)
                .and_then(|_| optimizer.load_state(&loaded.optimizer))
        };
        match outcome {
            Ok(()) => {
                tracing::info!(step = loaded.state.step, dir = %dir.display(), "resuming from checkpoint");
                status = ResumeStatus::Resumed;
                resume_state = Some(loaded.state);
            }
            Err(e) => {
                status = ResumeStatus::Incompatible;
                incompatible = Some(e);
            }
        }
    }
    let (mut step, mut samples) = resume_state
        .as_ref()
        .map_or((0, 0), |s| (s.step, s.samples));
    let earlier_seconds = resume_state.as_ref().map_or(0.0, |s| s.train_seconds);
    if comm.world_size() > 1 {
        let header = ResumeHeader {
            status,
            step,
            samples,
            optimizer_steps: optimizer.steps,
        }
        .broadcast(comm)?;
        status = header.status;
        step = header.step;
        samples = header.samples;
        optimizer.steps = header.optimizer_steps;
        if status == ResumeStatus::Incompatible {
            return Err(incompatible.unwrap_or_else(|| {
                TrainError::IncompatibleCheckpoint(
                    "rank 0 found the checkpoint incompatible with the config".into(),
                )
            }));
        }
        let sync = grad_sync.expect("world > 1");
        sync.broadcast_params(comm)?;
        // The moments travel through device buckets like the parameters.
        GradSync::new(&optimizer.moments(), bucket_bytes).broadcast_params(comm)?;
    } else if let Some(e) = incompatible {
        return Err(e);
    }
    let resumed_from_step = (status == ResumeStatus::Resumed).then_some(step);
    Ok(Start {
        step,
        samples,
        earlier_seconds,
        resumed_from_step,
    })
}

/// Trains until `maxSteps` (or `maxSeconds`), resuming from the job's latest checkpoint.
pub fn run(opts: &RunOptions) -> Result<Summary> {
    let started = Instant::now();
    let config = &opts.config;
    preflight_data(config)?;
    let device = select_device(
        config.device,
        opts.rank.local_rank,
        expected_gpus()?,
        visible_gpus(),
    )?;
    tracing::info!(rank = opts.rank.rank, "{}", startup_line(device));
    let mut comm = dist::init(&opts.rank, &config.distributed, device)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let leader = rank == 0;
    if leader && config.precision == Precision::Bf16 && device == Device::Cpu {
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        if !cpu_has_bf16_units(&flags) {
            tracing::warn!(
                "precision: bf16 on a CPU without AMX or AVX512-BF16: bf16 is emulated and \
                 probably slower than fp32 here"
            );
        }
    }
    if leader {
        std::fs::create_dir_all(&opts.job_dir)?;
        std::fs::write(opts.job_dir.join(CONFIG_FILE), config.to_yaml())?;
    }

    let corpus = load_corpus(opts, comm.as_mut())?;
    if corpus.train.is_empty() {
        return Err(TrainError::Data(
            "the training set is empty after filtering".into(),
        ));
    }

    tch::manual_seed(config.seed as i64);
    let vs = nn::VarStore::new(device);
    let model = Transformer::new(
        &vs.root(),
        &config.model,
        corpus.vocab.size() as i64,
        config.precision,
    );
    let params = model::named_parameters(&vs);
    let mut optimizer = AdamW::new(&params, &config.optimizer);
    let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    let bucket_bytes = config.distributed.bucket_mib as usize * 1024 * 1024;
    let mut grad_sync = (world > 1).then(|| GradSync::new(&tensors, bucket_bytes));

    let mut store = if leader {
        Some(CheckpointStore::open_writer(
            &opts.job_dir,
            config.checkpoint.clone(),
            WriterId::of_rank(&opts.rank),
        )?)
    } else {
        None
    };
    let Start {
        mut step,
        mut samples,
        earlier_seconds,
        resumed_from_step,
    } = resume(
        store.as_ref(),
        config,
        &params,
        &mut optimizer,
        grad_sync.as_mut(),
        comm.as_mut(),
        bucket_bytes,
    )?;

    let progress: SharedProgress = Default::default();
    let _server = match (leader, opts.metrics_port) {
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
        p.step = step;
        p.total_steps = config.max_steps;
        p.samples = samples;
        p.world_size = world as u32;
        p.resumed_from_step = resumed_from_step;
        p.parameters = model::parameter_count(&vs);
        p.last_checkpoint = store.as_ref().and_then(|s| s.last_completed());
    }
    let mut reporter = Reporter::start(
        &progress,
        leader,
        &opts.job_dir,
        &config.tensorboard,
        &corpus.stats,
    );

    let mut stream = BatchStream::new(&corpus.train, config.batch.max_tokens as usize, config.seed);
    stream.seek(samples)?;
    let mut log = if leader {
        Some(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(opts.job_dir.join(TRAIN_LOG))?,
        )
    } else {
        None
    };

    let mut window = Window {
        steps: VecDeque::new(),
    };
    let mut recent_loss: VecDeque<f64> = VecDeque::new();
    let mut last_eval: Option<(f64, Option<f64>)> = None;
    let mut best_eval: Option<f64> = None;
    let mut last_eval_step = step;
    let mut last_save_step = step;
    let mut last_save_time = Instant::now();
    let mut stop = false;
    let mut interrupted_by = None;
    let mut last_eval_seconds = 0.0;
    let total_seconds_budget = config.max_seconds.map(|s| s as f64);
    let mut train_loss = None;

    // From here a SIGTERM (pod deletion, node drain) or SIGINT stops every rank at the same
    // step and saves a checkpoint instead of losing the work since the last one.
    signals::arm();
    // maxSeconds and a time-horizon schedule count training, not start-up (data, vocabulary,
    // rendezvous), which differs between machines and restarts.
    let loop_started = Instant::now();
    // Every rank's CPU, memory and GPU, summed into rank 0's view with the step's all-reduce
    // every logEverySteps (a first sample now, so the first summary has a utilisation).
    let mut sampler = crate::resources::ResourceSampler::default();
    sampler.sample();
    let mut gang_resources = None;
    while step < config.max_steps && !stop {
        let t0 = Instant::now();
        let micro: Vec<Vec<usize>> = (0..config.batch.accumulate)
            .map(|_| stream.next_batch())
            .collect();
        let global_tokens: i64 = micro.iter().map(|b| target_tokens(&corpus.train, b)).sum();
        let step_samples: u64 = micro.iter().map(|b| b.len() as u64).sum();
        let mut step_tokens = 0i64;
        optimizer.zero_grad();
        // The loss stays on the device until the step's one host read below.
        let mut loss_local = Tensor::zeros([], (Kind::Double, device));
        for (i, batch) in micro.iter().enumerate() {
            let mine = data::shard(batch, &corpus.train, rank, world);
            step_tokens += batch
                .iter()
                .map(|&j| (corpus.train[j].src.len() + corpus.train[j].tgt.len() + 2) as i64)
                .sum::<i64>();
            if mine.is_empty() {
                continue;
            }
            let tb = data::to_tensors(&corpus.train, &mine, device);
            tch::manual_seed(step_seed(config.seed, step, rank, i));
            loss_local += model.train_loss_backward(
                &tb.src,
                &tb.tgt_in,
                &tb.tgt_out,
                config.label_smoothing,
                1.0 / global_tokens as f64,
            );
        }
        let mut comm_seconds = 0.0;
        let signal = signals::received();
        let loss;
        let grad_norm;
        let mut train_seconds = earlier_seconds + loop_started.elapsed().as_secs_f64();
        // The same on every rank: the step number decides.
        let summarise_resources = (step + 1) % config.log_every_steps.max(1) == 0;
        if let Some(sync) = grad_sync.as_mut() {
            comm_seconds += sync.sync(comm.as_mut())?;
            let c0 = Instant::now();
            // Sums: the loss, rank 0's clock (the others add 0), how many ranks were signalled,
            // and (some steps) each rank's resources in its own slots.
            // f32 like every collective (the clock to a few ms over weeks).
            let clock = if leader { train_seconds } else { 0.0 };
            let flag = f32::from(u8::from(signal != 0));
            let mut host = vec![0.0, clock as f32, flag];
            if summarise_resources {
                host.extend(resource_slots(&mut sampler, rank, world));
            }
            let mut scalars = comm.upload(&host)?;
            tch::no_grad(|| scalars.narrow(0, 0, 1).f_copy_(&loss_local.reshape([1])))?;
            comm.all_reduce_sum(&mut scalars)?;
            // The step's one host read: the summed scalars and the (summed) gradients' norm.
            let norm = optimizer.grad_norm();
            let mut parts = vec![scalars.to_kind(Kind::Double)];
            parts.extend(norm.map(|n| n.reshape([1])));
            let v = comm.download(Tensor::cat(&parts, 0))?;
            comm_seconds += c0.elapsed().as_secs_f64();
            loss = v[0] / global_tokens as f64;
            train_seconds = v[1];
            grad_norm = v.get(host.len()).copied().unwrap_or(0.0);
            if summarise_resources {
                gang_resources = GangResources::from_slots(&v[3..host.len()]);
            }
            if v[2] > 0.0 {
                // Some rank was signalled: all stop here, and exit the way it would.
                interrupted_by = Some(if signal != 0 { signal } else { libc::SIGTERM });
            }
        } else {
            interrupted_by = (signal != 0).then_some(signal);
            // The step's one host read: the loss and the gradients' norm.
            let mut parts = vec![loss_local.reshape([1])];
            parts.extend(optimizer.grad_norm().map(|n| n.reshape([1])));
            let v = comm.download(Tensor::cat(&parts, 0))?;
            loss = v[0] / global_tokens as f64;
            grad_norm = v.get(1).copied().unwrap_or(0.0);
            if summarise_resources {
                let mine: Vec<f64> = resource_slots(&mut sampler, 0, 1)
                    .into_iter()
                    .map(f64::from)
                    .collect();
                gang_resources = GangResources::from_slots(&mine);
            }
        }
        let over_budget = total_seconds_budget.is_some_and(|b| train_seconds >= b);
        stop = over_budget || interrupted_by.is_some();
        optimizer.clip_to(grad_norm, config.optimizer.clip_norm);
        let time_used = total_seconds_budget.map_or(0.0, |b| train_seconds / b);
        let lr = optim::learning_rate(
            config.optimizer.lr,
            &config.schedule,
            config.max_steps,
            step + 1,
            time_used,
        );
        optimizer.step(lr);
        step += 1;
        samples += step_samples;
        train_loss = Some(loss);
        let seconds = t0.elapsed().as_secs_f64();
        window.push(seconds, comm_seconds, step_tokens, step_samples);
        if recent_loss.len() == Window::LEN {
            recent_loss.pop_front();
        }
        recent_loss.push_back(loss);
        if !loss.is_finite() {
            return Err(TrainError::Other(format!(
                "loss became {loss} at step {step}: lower optimizer.lr or raise schedule.warmupSteps"
            )));
        }

        if let Some(log) = log.as_mut() {
            let line = serde_json::json!({
                "step": step, "loss": loss, "lr": lr, "gradNorm": grad_norm, "samples": samples,
                "tokens": step_tokens, "seconds": seconds, "commSeconds": comm_seconds,
            });
            writeln!(log, "{line}")?;
        }

        let final_step = step >= config.max_steps || stop;
        // A signalled rank has seconds before SIGKILL: checkpoint, do not evaluate.
        let eval_due = ((config.eval.every_steps > 0 && step % config.eval.every_steps == 0)
            || final_step)
            && interrupted_by.is_none();
        if eval_due && last_eval_step != step {
            set_phase(&progress, TrainerPhase::Evaluating);
            let e0 = Instant::now();
            let (eval_loss, eval_bleu) = evaluate(&model, &corpus, config, comm.as_mut(), device)?;
            last_eval_step = step;
            last_eval_seconds = e0.elapsed().as_secs_f64();
            if let Some(l) = eval_loss {
                best_eval = Some(best_eval.map_or(l, |b: f64| b.min(l)));
                last_eval = Some((l, eval_bleu));
            }
            if leader {
                tracing::info!(
                    step,
                    eval_loss = eval_loss.unwrap_or(f64::NAN),
                    eval_bleu = eval_bleu.unwrap_or(f64::NAN),
                    seconds = e0.elapsed().as_secs_f64(),
                    "evaluation"
                );
                if let Some(log) = log.as_mut() {
                    let line = serde_json::json!({"step": step, "evalLoss": eval_loss, "evalBleu": eval_bleu, "evalSeconds": e0.elapsed().as_secs_f64()});
                    writeln!(log, "{line}")?;
                }
            }
            let mut p = progress.lock().expect("progress lock");
            p.eval_loss = eval_loss;
            p.eval_bleu = eval_bleu;
            p.eval_step = Some(step);
            p.best_eval_loss = best_eval;
            p.phase = TrainerPhase::Training;
        }

        if let Some(store) = store.as_mut() {
            let every = config.checkpoint.every_steps;
            let by_steps = every > 0 && step % every == 0;
            let by_time = config
                .checkpoint
                .every_seconds
                .is_some_and(|s| last_save_time.elapsed().as_secs() >= s);
            // Every evaluated step is saved when the best checkpoints are kept, so "best by
            // eval loss" always has the evaluated weights to keep.
            let evaluated = last_eval_step == step && config.checkpoint.keep_best > 0;
            if (by_steps || by_time || evaluated || final_step) && last_save_step != step {
                let state = TrainerState {
                    step,
                    samples,
                    epoch: stream.position().epoch,
                    seed: config.seed,
                    config_digest: config.digest(),
                    world_size: world as u32,
                    train_loss,
                    eval_loss: (last_eval_step == step)
                        .then(|| last_eval.map(|e| e.0))
                        .flatten(),
                    eval_bleu: (last_eval_step == step)
                        .then(|| last_eval.and_then(|e| e.1))
                        .flatten(),
                    time: rfc3339_now(),
                    train_seconds,
                };
                let blocked = store.save(&params, &optimizer.state(), state)?;
                tracing::debug!(step, blocked, "checkpoint started");
                last_save_step = step;
                last_save_time = Instant::now();
            }
        }

        let rates = window.rates();
        let mut p = progress.lock().expect("progress lock");
        p.step = step;
        p.samples = samples;
        p.epoch = stream.position().epoch;
        p.loss = Some(recent_loss.iter().sum::<f64>() / recent_loss.len() as f64);
        p.learning_rate = Some(lr);
        if let Some((sps, samples_ps, tps, step_time, comm_fraction)) = rates {
            p.steps_per_second = Some(sps);
            p.samples_per_second = Some(samples_ps);
            p.tokens_per_second = Some(tps);
            p.step_time_seconds = Some(step_time);
            p.comm_fraction = (world > 1).then_some(comm_fraction.clamp(0.0, 1.0));
            let remaining = config.max_steps - step;
            let mut eta = remaining as f64 / sps;
            // Evaluations still to come pause training: every `every` steps and at the end.
            let every = config.eval.every_steps;
            if let (Some(total), Some(done)) =
                (config.max_steps.checked_div(every), step.checked_div(every))
            {
                let evals = total - done + u64::from(!config.max_steps.is_multiple_of(every));
                eta += evals as f64 * last_eval_seconds;
            }
            if let Some(budget) = total_seconds_budget {
                eta = eta.min((budget - train_seconds).max(0.0));
            }
            p.eta_seconds = Some(eta);
        }
        if let Some(store) = store.as_ref() {
            p.last_checkpoint = store.last_completed();
        }
        p.peak_memory_bytes = peak_memory_bytes();
        if p.attempt_first_step_time.is_none() {
            p.attempt_first_step_time = Some(Timestamp::now());
        }
        if let Some(g) = gang_resources.take() {
            p.gang_resources = Some(g);
        }
        reporter.step(&p, loss, grad_norm);
        if leader && (step % config.log_every_steps == 0 || step == 1 || final_step) {
            tracing::info!(
                "step {step}/{} loss {:.4} lr {lr:.3e} {:.2} steps/s {:.0} tok/s comm {:.0}% eta {:.0}s",
                config.max_steps,
                p.loss.unwrap_or(f64::NAN),
                p.steps_per_second.unwrap_or(0.0),
                p.tokens_per_second.unwrap_or(0.0),
                100.0 * p.comm_fraction.unwrap_or(0.0),
                p.eta_seconds.unwrap_or(0.0),
            );
        }
    }

    let last_checkpoint = match store.as_mut() {
        Some(store) => store.wait()?,
        None => None,
    };
    {
        let mut p = progress.lock().expect("progress lock");
        if interrupted_by.is_none() {
            p.phase = TrainerPhase::Finished;
            p.eta_seconds = Some(0.0);
        }
        p.last_checkpoint = last_checkpoint.clone();
    }
    reporter.finish(&progress);
    comm.barrier()?;
    Ok(Summary {
        step,
        resumed_from_step,
        loss: train_loss,
        eval_loss: last_eval.map(|e| e.0),
        eval_bleu: last_eval.and_then(|e| e.1),
        last_checkpoint,
        seconds: started.elapsed().as_secs_f64(),
        interrupted_by,
        final_progress: progress.lock().expect("progress lock").clone(),
    })
}

/// This rank's resources in its slots of the step's all-reduce (the other ranks' slots 0).
fn resource_slots(sampler: &mut ResourceSampler, rank: usize, world: usize) -> Vec<f32> {
    let mut slots = vec![0.0f32; world * GangResources::SLOTS];
    let mine = GangResources::slots(sampler.sample().as_ref());
    slots[rank * GangResources::SLOTS..][..GangResources::SLOTS].copy_from_slice(&mine);
    slots
}

fn set_phase(progress: &SharedProgress, phase: TrainerPhase) {
    progress.lock().expect("progress lock").phase = phase;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_units_are_read_from_cpuinfo_flags() {
        let sapphire = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n";
        let zen4 = "flags\t\t: fpu avx2 avx512f avx512_bf16\n";
        let skylake = "model name\t: Xeon avx512_bf16\nflags\t\t: fpu avx2 avx512f\n";
        assert!(cpu_has_bf16_units(sapphire));
        assert!(cpu_has_bf16_units(zen4));
        assert!(!cpu_has_bf16_units(skylake), "only the flags line counts");
        assert!(cpu_has_bf16_units(""));
    }

    #[test]
    fn a_pod_given_gpus_never_trains_on_the_cpu_by_accident() {
        use DeviceKind::{Auto, Cpu, Cuda};
        // (kind, local rank, GPUs the pod was given, GPUs visible) -> device or exit 2
        let table = [
            (Auto, 0, 0, 0, Some(Device::Cpu)),
            (Auto, 0, 4, 0, None),
            (Cuda, 0, 0, 0, None),
            (Cuda, 1, 4, 0, None),
            (Cpu, 0, 4, 0, Some(Device::Cpu)),
            (Cpu, 1, 0, 2, Some(Device::Cpu)),
            (Auto, 3, 4, 4, Some(Device::Cuda(3))),
            // One visible GPU per process (the device plugin's way): every rank uses GPU 0.
            (Auto, 3, 1, 1, Some(Device::Cuda(0))),
            (Cuda, 5, 0, 2, Some(Device::Cuda(1))),
        ];
        for (kind, local, expect, visible, want) in table {
            let got = select_device(kind, local, expect, visible);
            match want {
                Some(d) => assert_eq!(got.unwrap(), d, "{kind:?} {local} {expect} {visible}"),
                None => {
                    let err = got.unwrap_err();
                    assert_eq!(err.exit_code(), 2, "{err}");
                    if kind == Auto {
                        assert!(
                            err.to_string().contains("refusing to train on the CPU"),
                            "{err}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_startup_line_names_the_device_and_the_libtorch_build() {
        let line = startup_line(Device::Cpu);
        assert!(line.contains("device Cpu"), "{line}");
        assert!(line.contains("libtorch 2."), "{line}");
        assert!(
            line.contains("CPU build") || line.contains("CUDA build"),
            "{line}"
        );
    }

    #[test]
    fn the_resume_header_round_trips_and_refuses_garbage() {
        for status in [
            ResumeStatus::Fresh,
            ResumeStatus::Resumed,
            ResumeStatus::Incompatible,
        ] {
            let h = ResumeHeader {
                status,
                step: u64::MAX - 3,
                samples: 1 << 40,
                optimizer_steps: 17,
            };
            assert_eq!(ResumeHeader::decode(&h.encode()).unwrap(), h);
            let mut comm = dist::Single {
                device: Device::Cpu,
            };
            assert_eq!(h.broadcast(&mut comm).unwrap(), h);
        }
        assert!(ResumeHeader::decode(&[2, 0, 0, 0]).is_err());
        assert!(ResumeHeader::decode(&[0, 0, 0]).is_err());
    }

    #[test]
    fn step_seeds_differ_by_step_rank_and_micro_batch() {
        let a = step_seed(1, 10, 0, 0);
        assert_eq!(a, step_seed(1, 10, 0, 0));
        assert_ne!(a, step_seed(1, 11, 0, 0));
        assert_ne!(a, step_seed(1, 10, 1, 0));
        assert_ne!(a, step_seed(1, 10, 0, 1));
        assert_ne!(a, step_seed(2, 10, 0, 0));
        assert!(a >= 0);
    }

    #[test]
    fn window_rates() {
        let mut w = Window {
            steps: VecDeque::new(),
        };
        assert!(w.rates().is_none());
        w.push(0.5, 0.1, 1000, 10);
        w.push(0.5, 0.1, 1000, 10);
        let (sps, samples, tps, step_time, comm) = w.rates().unwrap();
        assert!((sps - 2.0).abs() < 1e-9);
        assert!((samples - 20.0).abs() < 1e-9);
        assert!((tps - 2000.0).abs() < 1e-9);
        assert!((step_time - 0.5).abs() < 1e-9);
        assert!((comm - 0.2).abs() < 1e-9);
    }
}
