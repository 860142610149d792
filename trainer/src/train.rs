//! The training loop. Per step, like the paper: batch -> forward -> loss -> backward ->
//! all-reduce -> clip -> optimizer step -> schedule -> maybe evaluate -> maybe checkpoint ->
//! report.
//!
//! Every rank runs this loop on its shard of the same global batches. Rank 0 alone loads and
//! writes checkpoints and serves progress; it broadcasts the vocabulary, the weights and the
//! optimizer state, so other ranks never need the checkpoint volume.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrotrain_api::config::{DeviceKind, Precision, Task};
use ferrotrain_api::progress::GangResources;
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_api::{CheckpointInfo, TrainerConfig, TrainerPhase};
use tch::{Device, Kind, Tensor};

use crate::bleu::BleuStats;
use crate::checkpoint::{CheckpointStore, Named, TrainerState, WriterId};
use crate::data::{self, BatchStream, Corpus, Example};
use crate::decode;
use crate::dist::{self, Collective, RankEnv};
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsServer, Reporter, SharedProgress};
use crate::model::{self, Transformer};
use crate::net::Net;
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
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            TrainError::Config(format!("{name}={v:?} is not a number of GPUs").into())
        }),
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
        DeviceKind::Auto => Err(TrainError::Config(
            format!(
                "device: auto on a pod given {expect_gpus} GPU(s) ({}), but {}: refusing to \
             train on the CPU (set device: cpu to do so on purpose)",
                ferrotrain_api::env::FERROTRAIN_EXPECT_GPUS,
                why()
            )
            .into(),
        )),
        DeviceKind::Cuda => Err(TrainError::Config(
            format!("device: cuda requested but {}", why()).into(),
        )),
    }
}

/// One line on what this process computes with: the device, the libtorch build, CUDA.
pub fn startup_line(device: Device) -> String {
    // Linked against libtorch_cuda (build.rs); libtorch itself says CUDA only with a GPU.
    let build = match (env!("FERROTRAIN_LIBTORCH_BUILD"), tch::utils::has_cuda()) {
        ("CUDA", _) | (_, true) => "CUDA",
        _ => "CPU",
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
            return Err(TrainError::Data(
                format!("{field}: file {file} does not exist or is not a file").into(),
            ));
        }
    }
    Ok(())
}

/// Broadcasts unsigned integers from rank 0, exactly: each travels as four 16-bit limbs,
/// which f32 represents without rounding.
pub(crate) fn broadcast_u64s(comm: &mut dyn Collective, values: &[u64]) -> Result<Vec<u64>> {
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
            return Err(TrainError::Distributed(
                format!("resume header: {} values, expected 4", v.len()).into(),
            ));
        };
        let status = match status {
            0 => ResumeStatus::Fresh,
            1 => ResumeStatus::Resumed,
            4 => ResumeStatus::Incompatible,
            other => {
                return Err(TrainError::Distributed(
                    format!("resume header: unknown status {other} from rank 0").into(),
                ));
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
                TrainError::IncompatibleCheckpoint(
                    format!("checkpoint has no tensor {name} that the model needs").into(),
                )
            })?;
        if src.size() != var.size() {
            return Err(TrainError::IncompatibleCheckpoint(
                format!(
                    "checkpoint tensor {name} has shape {:?}, the model needs {:?}",
                    src.size(),
                    var.size()
                )
                .into(),
            ));
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

/// A sliding window of recent steps for rates and the reported loss.
#[derive(Default)]
struct Window {
    steps: VecDeque<(f64, f64, i64, u64)>, // (seconds, comm seconds, tokens, samples)
    losses: VecDeque<f64>,
}

/// Rates over the window's steps.
#[derive(Clone, Copy, Debug)]
struct Rates {
    steps_per_second: f64,
    samples_per_second: f64,
    tokens_per_second: f64,
    step_time_seconds: f64,
    /// Seconds in collectives per second of step (not clamped).
    comm_fraction: f64,
}

impl Window {
    const LEN: usize = 20;
    fn push(&mut self, seconds: f64, comm: f64, tokens: i64, samples: u64) {
        if self.steps.len() == Self::LEN {
            self.steps.pop_front();
        }
        self.steps.push_back((seconds, comm, tokens, samples));
    }
    fn push_loss(&mut self, loss: f64) {
        if self.losses.len() == Self::LEN {
            self.losses.pop_front();
        }
        self.losses.push_back(loss);
    }
    /// The mean loss of the recent steps (the progress report's loss).
    fn mean_loss(&self) -> f64 {
        self.losses.iter().sum::<f64>() / self.losses.len() as f64
    }
    fn rates(&self) -> Option<Rates> {
        let secs: f64 = self.steps.iter().map(|s| s.0).sum();
        if secs <= 0.0 {
            return None;
        }
        let n = self.steps.len() as f64;
        let comm: f64 = self.steps.iter().map(|s| s.1).sum();
        let tokens: i64 = self.steps.iter().map(|s| s.2).sum();
        let samples: u64 = self.steps.iter().map(|s| s.3).sum();
        Some(Rates {
            steps_per_second: n / secs,
            samples_per_second: samples as f64 / secs,
            tokens_per_second: tokens as f64 / secs,
            step_time_seconds: secs / n,
            comm_fraction: comm / secs,
        })
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
            ).into()))
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
        // Rank 0's parameters and moments, straight from the optimizer's flat buffers.
        dist::broadcast_buffers(comm, &optimizer.state_buffers(), bucket_bytes)?;
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
    let mut t = Trainer::start(opts)?;
    while !t.done() {
        let s = t.step()?;
        t.evaluate_if_due(&s)?;
        t.checkpoint_if_due(&s)?;
        t.report(&s);
    }
    t.finish()
}

/// Checks the data files, picks the device, meets the other ranks and (rank 0) writes the
/// job's config.
fn open_gang(opts: &RunOptions) -> Result<(Device, Box<dyn Collective>)> {
    let config = &opts.config;
    preflight_data(config)?;
    let device = select_device(
        config.device,
        opts.rank.local_rank,
        expected_gpus()?,
        visible_gpus(),
    )?;
    tracing::info!(rank = opts.rank.rank, "{}", startup_line(device));
    let comm = dist::init(&opts.rank, &config.distributed, device)?;
    let leader = comm.rank() == 0;
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
    Ok((device, comm))
}

/// Rank 0's progress (served on /metrics, /progress and /healthz when `metrics_port` is set),
/// filled with where the run starts.
fn serve_progress(
    opts: &RunOptions,
    leader: bool,
    world: usize,
    start: &Start,
    net: &Net,
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
        p.parameters = model::parameter_count(&net.vs);
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

/// Rank 0's step log (`train-log.jsonl`), appended to across restarts.
fn open_log(leader: bool, job_dir: &Path) -> Result<Option<File>> {
    if !leader {
        return Ok(None);
    }
    Ok(Some(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(job_dir.join(TRAIN_LOG))?,
    ))
}

/// Training time, which `maxSeconds` and a time-horizon schedule count: the job's earlier
/// runs plus this run's loop, not its start-up (data, vocabulary, rendezvous), which differs
/// between machines and restarts.
struct Clock {
    loop_started: Instant,
    earlier_seconds: f64,
    /// `maxSeconds`.
    budget: Option<f64>,
}

impl Clock {
    /// This rank's count; the step's all-reduce gives every rank rank 0's.
    fn train_seconds(&self) -> f64 {
        self.earlier_seconds + self.loop_started.elapsed().as_secs_f64()
    }
    fn over_budget(&self, train_seconds: f64) -> bool {
        self.budget.is_some_and(|b| train_seconds >= b)
    }
    /// The share of the budget spent (0 without one), for a time-horizon schedule.
    fn time_used(&self, train_seconds: f64) -> f64 {
        self.budget.map_or(0.0, |b| train_seconds / b)
    }
}

/// What the evaluations of this run found.
struct EvalState {
    /// The last evaluation that had a loss: (loss, BLEU).
    last: Option<(f64, Option<f64>)>,
    best: Option<f64>,
    /// The step evaluated last (the starting step before the first evaluation).
    last_step: u64,
    /// How long the last evaluation took (the ETA adds the ones to come).
    last_seconds: f64,
}

/// When rank 0 last saved a checkpoint.
struct SaveState {
    /// The starting step before the first save.
    last_step: u64,
    last_time: Instant,
}

/// The step's global batch: `batch.accumulate` micro-batches of the stream (every rank
/// draws all of them and trains on its shard of each).
struct GlobalBatch {
    micro: Vec<Vec<usize>>,
    /// Target tokens (with EOS): the loss is per target token of the global batch.
    target_tokens: i64,
    samples: u64,
    /// Source and target tokens, each with its EOS (tokens/s).
    tokens: i64,
}

/// What `Trainer::exchange` reads at the end of a step's backward, for its gang and
/// single-rank halves.
struct StepEnd<'t> {
    /// This rank's summed loss, on the device.
    loss_local: &'t Tensor,
    /// The global batch's target tokens (the loss's denominator).
    target_tokens: i64,
    /// The signal this rank received, or 0.
    signal: i32,
    train_seconds: f64,
    /// Whether this step reports resources (every `logEverySteps`).
    summarise: bool,
}

/// The step's one host read, the same on every rank.
struct Synced {
    loss: f64,
    grad_norm: f64,
    /// Rank 0's training seconds.
    train_seconds: f64,
    comm_seconds: f64,
    gang_resources: Option<GangResources>,
    /// Set when some rank was signalled.
    interrupted_by: Option<i32>,
}

/// What one optimizer step did.
struct StepOutcome {
    /// The step just taken (the first is 1).
    step: u64,
    /// Per target token of the global batch.
    loss: f64,
    grad_norm: f64,
    lr: f64,
    seconds: f64,
    comm_seconds: f64,
    /// Source and target tokens of the global batch, each with its EOS.
    tokens: i64,
    /// Examples in the global batch.
    samples: u64,
    /// Rank 0's training seconds at the step's all-reduce.
    train_seconds: f64,
    /// Every rank's resources, on the steps that summarise them (every logEverySteps).
    gang_resources: Option<GangResources>,
    /// The run's last step: maxSteps reached, the time budget spent or a signal received.
    final_step: bool,
}

/// One rank's training run: `start`, then `step`, `evaluate_if_due`, `checkpoint_if_due` and
/// `report` until `done`, then `finish`.
struct Trainer<'a> {
    config: &'a TrainerConfig,
    device: Device,
    rank: usize,
    world: usize,
    leader: bool,
    /// When `run` began (the summary's seconds).
    started: Instant,
    /// Optimizer steps taken, of the job (not only this run).
    step: u64,
    /// Examples consumed, of the job.
    samples: u64,
    resumed_from_step: Option<u64>,
    clock: Clock,
    window: Window,
    eval: EvalState,
    save: SaveState,
    /// The last step's loss.
    train_loss: Option<f64>,
    /// The last step was the run's last (time budget or signal).
    stop: bool,
    interrupted_by: Option<i32>,
    /// Every rank's CPU, memory and GPU, summed into rank 0's view with the step's all-reduce
    /// every logEverySteps.
    sampler: ResourceSampler,
    // Dropped in this order, the reverse of making them (as when they were `run`'s locals):
    // the metrics server stops and a save in flight completes before the collective closes.
    log: Option<File>,
    stream: BatchStream,
    reporter: Reporter,
    _server: Option<MetricsServer>,
    progress: SharedProgress,
    store: Option<CheckpointStore>,
    net: Net,
    corpus: Corpus,
    comm: Box<dyn Collective>,
}

impl<'a> Trainer<'a> {
    /// Everything before the first step: device and rendezvous, data, model and optimizer,
    /// resume, progress server and reporter, batch stream and step log; then the signal
    /// handlers and the training clock.
    fn start(opts: &'a RunOptions) -> Result<Self> {
        let started = Instant::now();
        let config = &opts.config;
        let (device, mut comm) = open_gang(opts)?;
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
        let mut net = Net::new(config, device, vocab, comm.as_mut(), bucket_bytes)?;
        let store = open_store(opts, leader)?;
        let start = resume(
            store.as_ref(),
            config,
            &net.params,
            &mut net.optimizer,
            comm.as_mut(),
            bucket_bytes,
        )?;
        let (progress, server) = serve_progress(opts, leader, world, &start, &net, store.as_ref())?;
        let reporter = Reporter::start(
            &progress,
            leader,
            &opts.job_dir,
            &config.tensorboard,
            &corpus.stats,
        );
        // `maxTokens` is per rank: the global micro-batch holds `world` ranks' worth.
        let global_tokens = config.batch.max_tokens as usize * world;
        let mut stream = BatchStream::new(&corpus.train, global_tokens, config.seed);
        stream.seek(start.samples)?;
        let log = open_log(leader, &opts.job_dir)?;
        let (eval, save) = Self::first_marks(start.step);
        // From here a SIGTERM (pod deletion, node drain) or SIGINT stops every rank at the
        // same step and saves a checkpoint instead of losing the work since the last one.
        signals::arm();
        let clock = Clock {
            loop_started: Instant::now(),
            earlier_seconds: start.earlier_seconds,
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
            leader,
            started,
            step: start.step,
            samples: start.samples,
            resumed_from_step: start.resumed_from_step,
            clock,
            window: Window::default(),
            eval,
            save,
            train_loss: None,
            stop: false,
            interrupted_by: None,
            sampler,
            log,
            stream,
            reporter,
            _server: server,
            progress,
            store,
            net,
            corpus,
            comm,
        })
    }

    /// No evaluation or save yet in this run: both count from the starting step.
    fn first_marks(step: u64) -> (EvalState, SaveState) {
        let eval = EvalState {
            last: None,
            best: None,
            last_step: step,
            last_seconds: 0.0,
        };
        let save = SaveState {
            last_step: step,
            last_time: Instant::now(),
        };
        (eval, save)
    }

    /// `maxSteps` reached, or the last step stopped the run (time budget or signal).
    fn done(&self) -> bool {
        self.step >= self.config.max_steps || self.stop
    }

    /// One optimizer step, like the paper: batch -> forward -> loss -> backward -> all-reduce
    /// (with the step's one host read) -> clip -> AdamW at the schedule's rate.
    fn step(&mut self) -> Result<StepOutcome> {
        let t0 = Instant::now();
        let config = self.config;
        let batch = self.next_batch();
        let loss_local = self.forward_backward(&batch);
        let synced = self.exchange(&loss_local, batch.target_tokens)?;
        if synced.interrupted_by.is_some() {
            self.interrupted_by = synced.interrupted_by;
        }
        self.stop = self.clock.over_budget(synced.train_seconds) || self.interrupted_by.is_some();
        let optimizer = &mut self.net.optimizer;
        optimizer.clip_to(synced.grad_norm, config.optimizer.clip_norm);
        let lr = optim::learning_rate(
            config.optimizer.lr,
            &config.schedule,
            config.max_steps,
            self.step + 1,
            self.clock.time_used(synced.train_seconds),
        );
        optimizer.step(lr);
        self.step += 1;
        self.samples += batch.samples;
        self.train_loss = Some(synced.loss);
        let outcome = StepOutcome {
            step: self.step,
            loss: synced.loss,
            grad_norm: synced.grad_norm,
            lr,
            seconds: t0.elapsed().as_secs_f64(),
            comm_seconds: synced.comm_seconds,
            tokens: batch.tokens,
            samples: batch.samples,
            train_seconds: synced.train_seconds,
            gang_resources: synced.gang_resources,
            final_step: self.step >= config.max_steps || self.stop,
        };
        self.record(&outcome)?;
        Ok(outcome)
    }

    /// The step's micro-batches, drawn from the stream.
    fn next_batch(&mut self) -> GlobalBatch {
        let micro: Vec<Vec<usize>> = (0..self.config.batch.accumulate)
            .map(|_| self.stream.next_batch())
            .collect();
        let train = &self.corpus.train;
        let targets: i64 = micro.iter().map(|b| target_tokens(train, b)).sum();
        let samples: u64 = micro.iter().map(|b| b.len() as u64).sum();
        let tokens: i64 = micro
            .iter()
            .map(|b| {
                b.iter()
                    .map(|&j| (train[j].src.len() + train[j].tgt.len() + 2) as i64)
                    .sum::<i64>()
            })
            .sum();
        GlobalBatch {
            micro,
            target_tokens: targets,
            samples,
            tokens,
        }
    }

    /// Forward and backward over this rank's shard of each micro-batch, with dropout seeded
    /// by (seed, step, rank, micro-batch); returns this rank's summed loss, on the device.
    /// The gradient exchange is armed before the last backward: its buckets start as that
    /// backward completes them (`exchange` waits for them).
    fn forward_backward(&mut self, batch: &GlobalBatch) -> Tensor {
        let config = self.config;
        let train = &self.corpus.train;
        self.net.optimizer.zero_grad();
        let shards: Vec<Vec<usize>> = batch
            .micro
            .iter()
            .map(|micro| data::shard(micro, train, self.rank, self.world))
            .collect();
        let last = shards.iter().rposition(|s| !s.is_empty());
        // The loss stays on the device until the step's one host read.
        let mut loss_local = Tensor::zeros([], (Kind::Double, self.device));
        for (i, mine) in shards.iter().enumerate() {
            if mine.is_empty() {
                continue;
            }
            let tb = data::to_tensors(train, mine, self.device);
            if Some(i) == last
                && let Some(sync) = self.net.grad_sync.as_mut()
            {
                sync.arm(self.comm.as_mut());
            }
            tch::manual_seed(step_seed(config.seed, self.step, self.rank, i));
            loss_local += self.net.model.train_loss_backward(
                &tb,
                config.label_smoothing,
                1.0 / batch.target_tokens as f64,
            );
        }
        loss_local
    }

    /// The step's collectives and its one host read: the gradients, loss, clock, signals
    /// and (some steps) resources of every rank.
    fn exchange(&mut self, loss_local: &Tensor, target_tokens: i64) -> Result<Synced> {
        let signal = signals::received();
        let train_seconds = self.clock.train_seconds();
        // The same on every rank: the step number decides.
        let summarise = (self.step + 1).is_multiple_of(self.config.log_every_steps.max(1));
        let end = StepEnd {
            loss_local,
            target_tokens,
            signal,
            train_seconds,
            summarise,
        };
        if self.net.grad_sync.is_some() {
            self.exchange_gang(end)
        } else {
            self.exchange_alone(end)
        }
    }

    /// `exchange` with other ranks: the gradient buckets, then one all-reduce of the
    /// step's scalars.
    fn exchange_gang(&mut self, end: StepEnd) -> Result<Synced> {
        let sync = self.net.grad_sync.as_mut().expect("world > 1");
        let mut comm_seconds = sync.finish(self.comm.as_mut())?;
        let c0 = Instant::now();
        // Sums: the loss, rank 0's clock (the others add 0), how many ranks were signalled,
        // and (some steps) each rank's resources in its own slots.
        // f32 like every collective (the clock to a few ms over weeks).
        let clock = if self.leader { end.train_seconds } else { 0.0 };
        let flag = f32::from(u8::from(end.signal != 0));
        let mut host = vec![0.0, clock as f32, flag];
        if end.summarise {
            host.extend(resource_slots(&mut self.sampler, self.rank, self.world));
        }
        let mut scalars = self.comm.upload(&host)?;
        tch::no_grad(|| {
            scalars
                .narrow(0, 0, 1)
                .f_copy_(&end.loss_local.reshape([1]))
        })?;
        self.comm.all_reduce_sum(&mut scalars)?;
        // The step's one host read: the summed scalars and the (summed) gradients' norm.
        let norm = self.net.optimizer.grad_norm();
        let mut parts = vec![scalars.to_kind(Kind::Double)];
        parts.extend(norm.map(|n| n.reshape([1])));
        let v = self.comm.download(Tensor::cat(&parts, 0))?;
        comm_seconds += c0.elapsed().as_secs_f64();
        Ok(Synced {
            loss: v[0] / end.target_tokens as f64,
            grad_norm: v.get(host.len()).copied().unwrap_or(0.0),
            train_seconds: v[1],
            comm_seconds,
            gang_resources: end
                .summarise
                .then(|| GangResources::from_slots(&v[3..host.len()]))
                .flatten(),
            // Some rank was signalled: all stop here, and exit the way it would.
            interrupted_by: (v[2] > 0.0).then_some(if end.signal != 0 {
                end.signal
            } else {
                libc::SIGTERM
            }),
        })
    }

    /// `exchange` on a single rank: no collective, the same one host read.
    fn exchange_alone(&mut self, end: StepEnd) -> Result<Synced> {
        // The step's one host read: the loss and the gradients' norm.
        let mut parts = vec![end.loss_local.reshape([1])];
        parts.extend(self.net.optimizer.grad_norm().map(|n| n.reshape([1])));
        let v = self.comm.download(Tensor::cat(&parts, 0))?;
        let gang_resources = if end.summarise {
            let mine: Vec<f64> = resource_slots(&mut self.sampler, 0, 1)
                .into_iter()
                .map(f64::from)
                .collect();
            GangResources::from_slots(&mine)
        } else {
            None
        };
        Ok(Synced {
            loss: v[0] / end.target_tokens as f64,
            grad_norm: v.get(1).copied().unwrap_or(0.0),
            train_seconds: end.train_seconds,
            comm_seconds: 0.0,
            gang_resources,
            interrupted_by: (end.signal != 0).then_some(end.signal),
        })
    }

    /// Keeps the step for the rates and the reported loss, refuses a loss that is not
    /// finite, and (rank 0) appends the step's line to the train log.
    fn record(&mut self, s: &StepOutcome) -> Result<()> {
        self.window
            .push(s.seconds, s.comm_seconds, s.tokens, s.samples);
        self.window.push_loss(s.loss);
        let (step, loss) = (s.step, s.loss);
        if !loss.is_finite() {
            return Err(TrainError::Other(format!(
                "loss became {loss} at step {step}: lower optimizer.lr or raise schedule.warmupSteps"
            ).into()));
        }
        if let Some(log) = self.log.as_mut() {
            let line = serde_json::json!({
                "step": step, "loss": loss, "lr": s.lr, "gradNorm": s.grad_norm, "samples": self.samples,
                "tokens": s.tokens, "seconds": s.seconds, "commSeconds": s.comm_seconds,
            });
            writeln!(log, "{line}")?;
        }
        Ok(())
    }

    /// Every `eval.everySteps` steps and after the last (every rank: `evaluate` all-reduces).
    fn evaluate_if_due(&mut self, s: &StepOutcome) -> Result<()> {
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
            &self.net.model,
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
                writeln!(log, "{line}")?;
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

    /// Rank 0 starts a background save every `checkpoint.everySteps` steps or
    /// `everySeconds` seconds, after an evaluation when the best are kept, and at the end.
    fn checkpoint_if_due(&mut self, s: &StepOutcome) -> Result<()> {
        let config = self.config;
        let step = s.step;
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let every = config.checkpoint.every_steps;
        let by_steps = every > 0 && step.is_multiple_of(every);
        let by_time = config
            .checkpoint
            .every_seconds
            .is_some_and(|secs| self.save.last_time.elapsed().as_secs() >= secs);
        // Every evaluated step is saved when the best checkpoints are kept, so "best by
        // eval loss" always has the evaluated weights to keep.
        let evaluated = self.eval.last_step == step && config.checkpoint.keep_best > 0;
        if !(by_steps || by_time || evaluated || s.final_step) || self.save.last_step == step {
            return Ok(());
        }
        let (last_eval, evaluated_now) = (self.eval.last, self.eval.last_step == step);
        let state = TrainerState {
            step,
            samples: self.samples,
            epoch: self.stream.position().epoch,
            seed: config.seed,
            config_digest: config.digest(),
            world_size: self.world as u32,
            train_loss: self.train_loss,
            eval_loss: evaluated_now.then(|| last_eval.map(|e| e.0)).flatten(),
            eval_bleu: evaluated_now.then(|| last_eval.and_then(|e| e.1)).flatten(),
            time: rfc3339_now(),
            train_seconds: s.train_seconds,
        };
        let blocked = store.save(&self.net.params, &self.net.optimizer.state(), state)?;
        tracing::debug!(step, blocked, "checkpoint started");
        self.save.last_step = step;
        self.save.last_time = Instant::now();
        Ok(())
    }

    /// The step in the progress report (/progress, /metrics, the launcher's progress file),
    /// in TensorBoard, and (rank 0, every logEverySteps) in a log line.
    fn report(&mut self, s: &StepOutcome) {
        let config = self.config;
        let (step, lr) = (s.step, s.lr);
        let rates = self.window.rates();
        let mut p = self.progress.lock().expect("progress lock");
        p.step = step;
        p.samples = self.samples;
        p.epoch = self.stream.position().epoch;
        p.loss = Some(self.window.mean_loss());
        p.learning_rate = Some(lr);
        if let Some(r) = rates {
            p.steps_per_second = Some(r.steps_per_second);
            p.samples_per_second = Some(r.samples_per_second);
            p.tokens_per_second = Some(r.tokens_per_second);
            p.step_time_seconds = Some(r.step_time_seconds);
            p.comm_fraction = (self.world > 1).then_some(r.comm_fraction.clamp(0.0, 1.0));
            p.eta_seconds = Some(self.eta(s, r.steps_per_second));
        }
        if let Some(store) = self.store.as_ref() {
            p.last_checkpoint = store.last_completed();
        }
        p.peak_memory_bytes = peak_memory_bytes();
        if p.attempt_first_step_time.is_none() {
            p.attempt_first_step_time = Some(Timestamp::now());
        }
        if let Some(g) = &s.gang_resources {
            p.gang_resources = Some(g.clone());
        }
        self.reporter.step(&p, s.loss, s.grad_norm);
        if self.leader && (step % config.log_every_steps == 0 || step == 1 || s.final_step) {
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

    /// Seconds to the end at `steps_per_second`, with the evaluations still to come, within
    /// the time budget.
    fn eta(&self, s: &StepOutcome, steps_per_second: f64) -> f64 {
        let config = self.config;
        let remaining = config.max_steps - s.step;
        let mut eta = remaining as f64 / steps_per_second;
        // Evaluations still to come pause training: every `every` steps and at the end.
        let every = config.eval.every_steps;
        if let (Some(total), Some(done)) = (
            config.max_steps.checked_div(every),
            s.step.checked_div(every),
        ) {
            let evals = total - done + u64::from(!config.max_steps.is_multiple_of(every));
            eta += evals as f64 * self.eval.last_seconds;
        }
        if let Some(budget) = self.clock.budget {
            eta = eta.min((budget - s.train_seconds).max(0.0));
        }
        eta
    }

    /// Waits for the last save, reports the end, and meets the other ranks once more.
    fn finish(mut self) -> Result<Summary> {
        let last_checkpoint = match self.store.as_mut() {
            Some(store) => store.wait()?,
            None => None,
        };
        {
            let mut p = self.progress.lock().expect("progress lock");
            if self.interrupted_by.is_none() {
                p.phase = TrainerPhase::Finished;
                p.eta_seconds = Some(0.0);
            }
            p.last_checkpoint = last_checkpoint.clone();
        }
        self.reporter.finish(&self.progress);
        self.comm.barrier()?;
        Ok(Summary {
            step: self.step,
            resumed_from_step: self.resumed_from_step,
            loss: self.train_loss,
            eval_loss: self.eval.last.map(|e| e.0),
            eval_bleu: self.eval.last.and_then(|e| e.1),
            last_checkpoint,
            seconds: self.started.elapsed().as_secs_f64(),
            interrupted_by: self.interrupted_by,
            final_progress: self.progress.lock().expect("progress lock").clone(),
        })
    }
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
        if !cfg!(feature = "cuda") {
            assert!(line.contains("CPU build"), "{line}");
        }
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
        let mut w = Window::default();
        assert!(w.rates().is_none());
        w.push(0.5, 0.1, 1000, 10);
        w.push(0.5, 0.1, 1000, 10);
        let r = w.rates().unwrap();
        assert!((r.steps_per_second - 2.0).abs() < 1e-9);
        assert!((r.samples_per_second - 20.0).abs() < 1e-9);
        assert!((r.tokens_per_second - 2000.0).abs() < 1e-9);
        assert!((r.step_time_seconds - 0.5).abs() < 1e-9);
        assert!((r.comm_fraction - 0.2).abs() < 1e-9);
        for loss in 0..=Window::LEN {
            w.push_loss(loss as f64);
        }
        // The first loss left the window: the mean of 1..=20.
        assert!((w.mean_loss() - 10.5).abs() < 1e-9);
    }
}
