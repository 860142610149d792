//! Rank 0's HTTP endpoint: `/metrics` (Prometheus / OpenMetrics text), `/progress` (JSON
//! `Progress`), `/healthz`; and the `Reporter` the training loop hands each step to (data
//! stats at start, TensorBoard events).
//!
//! The server is axum on a current-thread tokio runtime of its own thread, and the metrics
//! are encoded by prometheus-client: the libraries the operator's endpoints use. Training
//! never waits on it: a request clones the progress under the lock and encodes outside it.
//! The process's CPU, memory and threads are read from /proc at request time.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ferrotrain_api::config::TensorBoardConfig;
use ferrotrain_api::progress::GangResources;
use ferrotrain_api::{DataStats, Progress, ResourceUsage, TrainerPhase};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::error::{Reason, Result, TrainError};
use crate::resources::ResourceSampler;
use crate::tensorboard::{self, TrainingBoard};

/// The progress shared between the training loop (writer) and the server (reader).
pub type SharedProgress = Arc<Mutex<Progress>>;

/// The OpenMetrics content type (Prometheus negotiates it; what the operator serves too).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the handlers read.
#[derive(Clone)]
struct ServerState {
    progress: SharedProgress,
    resources: Arc<Mutex<ResourceSampler>>,
    /// In-place restarts: this process's round and where node 0's launcher keeps the rounds
    /// that ended (read at every request: the launcher rewrites it between rounds).
    round: u64,
    round_ends: Option<std::path::PathBuf>,
}

/// A running server; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `0.0.0.0:port` (port 0 = ephemeral) and serves until dropped.
    pub fn start(port: u16, progress: SharedProgress) -> Result<Self> {
        let err = |e: std::io::Error| {
            TrainError::Other(Reason::caused(format!("metrics: port {port}"), e))
        };
        let listener = std::net::TcpListener::bind(("0.0.0.0", port)).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let state = ServerState {
            progress,
            resources: Default::default(),
            round: env(ferrotrain_api::env::FERROTRAIN_ROUND)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0),
            round_ends: env(ferrotrain_api::env::FERROTRAIN_ROUNDS_FILE).map(Into::into),
        };
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::warn!(error = %e, "metrics: cannot serve"),
                    };
                    let served = axum::serve(listener, router(state))
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(e) = served {
                        tracing::warn!(error = %e, "metrics: server stopped");
                    }
                })
            })
            .map_err(err)?;
        Ok(MetricsServer {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Graceful shutdown waits for open connections; the handlers answer at once.
            let _ = thread.join();
        }
    }
}

fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/progress", get(progress))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// The report with the process's resources read now.
fn snapshot(state: &ServerState) -> Progress {
    let mut p = state
        .progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let resources = state
        .resources
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .sample();
    p.resources = resources.or(p.resources);
    p.round = state.round;
    if let Some(path) = &state.round_ends {
        p.round_ends = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
    }
    p
}

async fn progress(State(state): State<ServerState>) -> impl IntoResponse {
    // Progress holds only numbers and strings: encoding cannot fail (a NaN becomes null).
    let body = serde_json::to_vec(&snapshot(&state)).unwrap_or_default();
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
}

async fn metrics(State(state): State<ServerState>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, METRICS_CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        prometheus_text(&snapshot(&state)),
    )
}

/// The exposition of a progress report.
///
/// Every value is a gauge named `ferrotrain_*` (CPU seconds a counter); a field the report
/// does not have yet (no evaluation so far, no checkpoint) is left out rather than exported
/// as 0.
pub fn prometheus_text(p: &Progress) -> String {
    let mut r = Registry::with_prefix("ferrotrain");
    phase_metrics(&mut r, p.phase);
    for (name, help, v) in int_gauges(p) {
        if let Some(v) = v {
            r.register(name, help, ConstGauge::new(v));
        }
    }
    for (name, help, v) in float_gauges(p) {
        if let Some(v) = v {
            r.register(name, help, ConstGauge::new(v));
        }
    }
    if let Some(res) = &p.resources {
        resource_metrics(&mut r, res);
    }
    if let Some(g) = &p.gang_resources {
        gang_metrics(&mut r, g);
    }
    if let Some(d) = &p.data {
        data_metrics(&mut r, d);
    }

    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// One family `phase` with a 1 for the current phase and a 0 for each other.
fn phase_metrics(r: &mut Registry, current: TrainerPhase) {
    let phases = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    for (phase, label) in [
        (TrainerPhase::Starting, "starting"),
        (TrainerPhase::Training, "training"),
        (TrainerPhase::Evaluating, "evaluating"),
        (TrainerPhase::Finished, "finished"),
    ] {
        phases
            .get_or_create(&vec![("phase", label)])
            .set(i64::from(current == phase));
    }
    r.register(
        "phase",
        "What the trainer is doing (1 for the current phase)",
        phases,
    );
}

/// A gauge's name, help and value (`None`: not known yet, left out).
type Entry<T> = (&'static str, &'static str, Option<T>);

/// The whole-number gauges in exposition order: the run's position (step, epoch, samples,
/// ranks, last evaluation), its checkpoints, and its size.
fn int_gauges(p: &Progress) -> [Entry<u64>; 12] {
    let ckpt = p.last_checkpoint.as_ref();
    [
        ("step", "Optimizer steps completed", Some(p.step)),
        (
            "total_steps",
            "Steps the run will take (maxSteps)",
            Some(p.total_steps),
        ),
        (
            "epoch",
            "Passes over the training data started so far (0-based)",
            Some(p.epoch),
        ),
        (
            "samples",
            "Training examples consumed so far over all ranks (the global data position)",
            Some(p.samples),
        ),
        (
            "world_size",
            "Ranks exchanging gradients",
            Some(u64::from(p.world_size)),
        ),
        ("eval_step", "Step of the last evaluation", p.eval_step),
        (
            "last_checkpoint_step",
            "Step held by the newest complete checkpoint",
            ckpt.map(|c| c.step),
        ),
        (
            "last_checkpoint_bytes",
            "Size on disk of the newest complete checkpoint",
            ckpt.map(|c| c.size_bytes),
        ),
        (
            "last_checkpoint_timestamp_seconds",
            "Unix time the newest checkpoint became complete",
            ckpt.and_then(|c| unix_seconds(&c.time)),
        ),
        (
            "resumed_from_step",
            "Step this run resumed from (absent for a fresh start)",
            p.resumed_from_step,
        ),
        ("parameters", "Model parameters", Some(p.parameters)),
        (
            "peak_memory_bytes",
            "Peak resident memory of rank 0",
            p.peak_memory_bytes,
        ),
    ]
}

/// The fractional gauges in exposition order: speed, loss and evaluation, the schedule, and
/// the newest checkpoint's cost.
fn float_gauges(p: &Progress) -> [Entry<f64>; 12] {
    [
        (
            "steps_per_second",
            "Optimizer steps per second, recent average",
            p.steps_per_second,
        ),
        (
            "samples_per_second",
            "Training examples per second over all ranks, recent average",
            p.samples_per_second,
        ),
        (
            "tokens_per_second",
            "Source+target tokens (no padding) per second over all ranks, recent average",
            p.tokens_per_second,
        ),
        (
            "step_time_seconds",
            "Wall-clock seconds per optimizer step, recent average",
            p.step_time_seconds,
        ),
        (
            "comm_fraction",
            "Share of step time spent waiting on gradient exchange (0..1)",
            p.comm_fraction,
        ),
        (
            "loss",
            "Training loss (label-smoothed cross-entropy per target token), recent average",
            p.loss,
        ),
        (
            "eval_loss",
            "Validation loss (cross-entropy per target token) at the last evaluation",
            p.eval_loss,
        ),
        (
            "eval_bleu",
            "Corpus BLEU on the validation set at the last evaluation (sacreBLEU 13a, cased)",
            p.eval_bleu,
        ),
        (
            "best_eval_loss",
            "Lowest validation loss so far",
            p.best_eval_loss,
        ),
        ("learning_rate", "Current learning rate", p.learning_rate),
        (
            "eta_seconds",
            "Seconds until totalSteps at the current rate",
            p.eta_seconds,
        ),
        (
            "last_checkpoint_blocking_seconds",
            "Seconds the newest checkpoint blocked training (the rest is written in the background)",
            p.last_checkpoint.as_ref().and_then(|c| c.blocking_seconds),
        ),
    ]
}

fn resource_metrics(r: &mut Registry, res: &ResourceUsage) {
    r.register(
        "process_cpu_seconds",
        "CPU seconds (user + system) this trainer process has used",
        ConstCounter::new(res.cpu_seconds),
    );
    if let Some(u) = res.cpu_utilization {
        r.register(
            "process_cpu_utilization",
            "CPU seconds per second since the previous scrape (1 = one core busy)",
            ConstGauge::new(u),
        );
    }
    let gauges = [
        (
            "process_resident_memory_bytes",
            "Resident memory of this trainer process (VmRSS)",
            res.rss_bytes,
        ),
        (
            "process_peak_resident_memory_bytes",
            "Peak resident memory of this trainer process (VmHWM)",
            res.peak_rss_bytes,
        ),
        (
            "process_threads",
            "Threads of this trainer process",
            res.threads,
        ),
    ];
    for (name, help, v) in gauges {
        r.register(name, help, ConstGauge::new(v));
    }
    if let Some(gpu) = &res.gpu {
        r.register(
            "gpu_utilization",
            "Share of NVML's last sample period in which a kernel ran on this rank's GPU (0..1)",
            ConstGauge::new(gpu.utilization),
        );
        let gauges = [
            (
                "gpu_memory_used_bytes",
                "Device memory in use on this rank's GPU (NVML, all processes)",
                gpu.memory_used_bytes,
            ),
            (
                "gpu_peak_memory_used_bytes",
                "Highest device memory in use this process has read",
                gpu.peak_memory_used_bytes,
            ),
            (
                "gpu_memory_total_bytes",
                "Device memory of this rank's GPU",
                gpu.memory_total_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            r.register(name, help, ConstGauge::new(v));
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct StatLabels {
    stat: &'static str,
}

/// The gang's spread of one resource: `stat` mean, min, max, and the ranks of the extremes.
fn gang_metrics(r: &mut Registry, g: &GangResources) {
    let spreads = [
        (
            "gang_cpu_utilization",
            "CPU seconds per second over the ranks (stat: mean, min, max)",
            &g.cpu_utilization,
        ),
        (
            "gang_resident_memory_bytes",
            "Resident memory over the ranks (stat: mean, min, max)",
            &g.rss_bytes,
        ),
        (
            "gang_gpu_utilization",
            "GPU utilisation over the ranks, 0..1 (stat: mean, min, max)",
            &g.gpu_utilization,
        ),
        (
            "gang_gpu_memory_used_bytes",
            "GPU memory in use over the ranks (stat: mean, min, max)",
            &g.gpu_memory_used_bytes,
        ),
    ];
    for (name, help, spread) in spreads {
        let Some(s) = spread else { continue };
        let family = Family::<StatLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (stat, v) in [
            ("mean", s.mean),
            ("min", s.min),
            ("max", s.max),
            ("min_rank", f64::from(s.min_rank)),
            ("max_rank", f64::from(s.max_rank)),
        ] {
            family.get_or_create(&StatLabels { stat }).set(v);
        }
        r.register(name, help, family);
    }
    r.register(
        "gang_ranks_reporting",
        "Ranks whose resources reached rank 0 in the last summary",
        ConstGauge::new(i64::from(g.ranks)),
    );
}

fn data_metrics(r: &mut Registry, d: &DataStats) {
    let ints = [
        (
            "data_train_lines",
            "Sentence pairs in the training files, before filtering",
            d.train_lines,
        ),
        (
            "data_train_pairs",
            "Sentence pairs trained on, after filtering",
            d.train_pairs,
        ),
        (
            "data_train_tokens",
            "Source + target tokens of the pairs trained on",
            d.train_tokens,
        ),
        (
            "data_vocabulary_size",
            "Subword vocabulary size",
            d.vocabulary_size,
        ),
        (
            "data_filtered_empty",
            "Training pairs dropped for an empty side",
            d.filtered_empty,
        ),
        (
            "data_filtered_long",
            "Training pairs dropped for a side longer than data.maxSentenceTokens",
            d.filtered_long,
        ),
        ("data_valid_pairs", "Validation pairs", d.valid_pairs),
        (
            "data_valid_truncated",
            "Validation pairs truncated to data.maxSentenceTokens for the loss",
            d.valid_truncated,
        ),
    ];
    for (name, help, v) in ints {
        r.register(name, help, ConstGauge::new(v));
    }
    r.register(
        "data_mean_source_tokens",
        "Mean source sentence length in tokens",
        ConstGauge::new(d.mean_source_tokens),
    );
    r.register(
        "data_mean_target_tokens",
        "Mean target sentence length in tokens",
        ConstGauge::new(d.mean_target_tokens),
    );
}

fn unix_seconds(rfc3339: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()?;
    u64::try_from(t.unix_timestamp()).ok()
}

/// What the training loop tells the world besides `/progress`: the data stats at start (log
/// and report) and, on rank 0, each step as TensorBoard scalars and (under `ferrotrain
/// launch`) the progress file. A TensorBoard write that fails (disk full) is logged once and
/// stops the events, never the training.
pub struct Reporter {
    board: Option<TrainingBoard>,
    progress_file: Option<ProgressFile>,
}

/// Rank 0's report, kept in the file the launcher named (FERROTRAIN_PROGRESS_FILE) for its
/// recovery ledger: replaced atomically (write, then rename) after every step, so a rank
/// killed at any moment leaves its last step for the ledger's lost steps (about 50 µs a
/// step: a 1.5 KB JSON file).
struct ProgressFile {
    path: std::path::PathBuf,
    failed: bool,
}

impl ProgressFile {
    fn from_env() -> Option<Self> {
        let path = std::env::var_os(ferrotrain_api::env::FERROTRAIN_PROGRESS_FILE)?;
        Some(ProgressFile {
            path: path.into(),
            failed: false,
        })
    }

    fn update(&mut self, p: &Progress) {
        if self.failed {
            return;
        }
        let tmp = self.path.with_extension("tmp");
        let written = serde_json::to_vec(p)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(&tmp, json))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "progress file stopped");
            self.failed = true;
        }
    }
}

impl Reporter {
    /// Call once the progress holds the starting step (and any resume point).
    /// `FERROTRAIN_ATTEMPT` (the operator's and the launcher's attempt number, 0 without)
    /// names the TensorBoard run directory, `<job dir>/tensorboard/attempt-<N>` or
    /// `<tensorboard.dir>/<job>/attempt-<N>`.
    pub fn start(
        progress: &SharedProgress,
        leader: bool,
        job_dir: &Path,
        config: &TensorBoardConfig,
        data: &DataStats,
    ) -> Self {
        let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
        p.data = Some(data.clone());
        if !leader {
            return Reporter {
                board: None,
                progress_file: None,
            };
        }
        let progress_file = ProgressFile::from_env();
        tracing::info!(
            train_lines = data.train_lines,
            train_pairs = data.train_pairs,
            train_tokens = data.train_tokens,
            vocabulary_size = data.vocabulary_size,
            mean_source_tokens = format!("{:.1}", data.mean_source_tokens),
            mean_target_tokens = format!("{:.1}", data.mean_target_tokens),
            filtered_empty = data.filtered_empty,
            filtered_long = data.filtered_long,
            valid_pairs = data.valid_pairs,
            valid_truncated = data.valid_truncated,
            "data"
        );
        if !config.enabled {
            return Reporter {
                board: None,
                progress_file,
            };
        }
        let attempt = std::env::var(ferrotrain_api::env::FERROTRAIN_ATTEMPT)
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let root = match &config.dir {
            Some(dir) => Path::new(dir).join(job_dir.file_name().unwrap_or_default()),
            None => job_dir.join("tensorboard"),
        };
        let dir = tensorboard::attempt_dir(&root, attempt);
        let board = match TrainingBoard::create(&dir, &p) {
            Ok(board) => {
                tracing::info!(path = %board.path().display(), "writing TensorBoard events");
                Some(board)
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "no TensorBoard events");
                None
            }
        };
        Reporter {
            board,
            progress_file,
        }
    }

    /// After each step, with the step's own loss and gradient norm and the updated report.
    pub fn step(&mut self, p: &Progress, loss: f64, grad_norm: f64) {
        self.with_board(|b| b.report(p, loss, Some(grad_norm)));
        if let Some(f) = self.progress_file.as_mut() {
            f.update(p);
        }
    }

    /// At the end of the run (the final checkpoint is complete by then).
    pub fn finish(&mut self, progress: &SharedProgress) {
        let p = progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.with_board(|b| b.finish(&p));
        if let Some(f) = self.progress_file.as_mut() {
            f.update(&p);
        }
    }

    fn with_board(&mut self, write: impl FnOnce(&mut TrainingBoard) -> Result<()>) {
        if let Some(board) = self.board.as_mut()
            && let Err(e) = write(board)
        {
            tracing::warn!(error = %e, "TensorBoard events stopped");
            self.board = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrotrain_api::{CheckpointInfo, GpuUsage};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    fn full_progress() -> Progress {
        Progress {
            phase: TrainerPhase::Training,
            step: 1234,
            total_steps: 20000,
            epoch: 3,
            samples: 1_234_000,
            world_size: 4,
            steps_per_second: Some(2.5),
            samples_per_second: Some(320.0),
            tokens_per_second: Some(5210.75),
            step_time_seconds: Some(0.4),
            comm_fraction: Some(0.125),
            loss: Some(3.5),
            eval_loss: Some(3.75),
            eval_bleu: Some(21.5),
            eval_step: Some(1000),
            best_eval_loss: Some(3.625),
            learning_rate: Some(0.0007),
            eta_seconds: Some(7500.0),
            last_checkpoint: Some(CheckpointInfo {
                step: 1000,
                size_bytes: 61_234_567,
                time: "2026-01-02T03:04:05Z".into(),
                blocking_seconds: Some(0.0625),
                ..Default::default()
            }),
            resumed_from_step: Some(500),
            attempt_first_step_time: Some("2026-01-02T03:00:00Z".parse().unwrap()),
            round: 0,
            round_ends: Vec::new(),
            gang_resources: Some(GangResources {
                ranks: 4,
                cpu_utilization: Some(ferrotrain_api::progress::Spread {
                    mean: 1.5,
                    min: 0.25,
                    min_rank: 3,
                    max: 2.0,
                    max_rank: 1,
                }),
                ..Default::default()
            }),
            parameters: 9_876_543,
            peak_memory_bytes: Some(1 << 30),
            resources: Some(ResourceUsage {
                cpu_seconds: 12.5,
                cpu_utilization: Some(1.75),
                rss_bytes: 3 << 20,
                peak_rss_bytes: 5 << 20,
                threads: 9,
                gpu: Some(GpuUsage {
                    utilization: 0.875,
                    memory_used_bytes: 7 << 30,
                    peak_memory_used_bytes: 9 << 30,
                    memory_total_bytes: 80 << 30,
                }),
            }),
            data: Some(DataStats {
                train_lines: 29000,
                train_pairs: 28990,
                train_tokens: 800_000,
                vocabulary_size: 8000,
                mean_source_tokens: 13.5,
                mean_target_tokens: 14.25,
                filtered_empty: 4,
                filtered_long: 6,
                valid_pairs: 1014,
                valid_truncated: 2,
            }),
        }
    }

    fn start(p: Progress) -> (MetricsServer, SharedProgress, SocketAddr) {
        let shared = Arc::new(Mutex::new(p));
        let server = MetricsServer::start(0, shared.clone()).unwrap();
        let port = server.local_addr().port();
        assert_ne!(port, 0);
        (server, shared, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Sends raw bytes, returns (status, lower-cased head, body).
    fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let end = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete response head");
        let head = String::from_utf8(out[..end].to_vec())
            .unwrap()
            .to_lowercase();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, out[end + 4..].to_vec())
    }

    fn get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
        raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    }

    /// Parses OpenMetrics text into (series -> value), checking a TYPE line precedes each
    /// family and the text ends with `# EOF`.
    pub(crate) fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
        let mut values = std::collections::BTreeMap::new();
        let mut typed = std::collections::BTreeMap::new();
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    typed.insert(name.to_string(), kind.to_string()).is_none(),
                    "duplicate TYPE {name}"
                );
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let name = series.split('{').next().unwrap();
            let family = typed
                .iter()
                .find(|(f, kind)| {
                    name == f.as_str()
                        || (kind.as_str() == "counter" && name == format!("{f}_total"))
                })
                .unwrap_or_else(|| panic!("{name} has no TYPE line before it"));
            assert!(family.0.starts_with("ferrotrain_"), "{name}");
            let v = match value {
                "NaN" => f64::NAN,
                "+Inf" | "inf" => f64::INFINITY,
                "-Inf" | "-inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            assert!(
                values.insert(series.to_string(), v).is_none(),
                "duplicate {series}"
            );
        }
        values
    }

    #[test]
    fn metrics_text_has_every_field() {
        let m = parse_metrics(&prometheus_text(&full_progress()));
        let want = [
            ("ferrotrain_step", 1234.0),
            ("ferrotrain_total_steps", 20000.0),
            ("ferrotrain_epoch", 3.0),
            ("ferrotrain_samples", 1_234_000.0),
            ("ferrotrain_world_size", 4.0),
            ("ferrotrain_steps_per_second", 2.5),
            ("ferrotrain_samples_per_second", 320.0),
            ("ferrotrain_tokens_per_second", 5210.75),
            ("ferrotrain_step_time_seconds", 0.4),
            ("ferrotrain_comm_fraction", 0.125),
            ("ferrotrain_loss", 3.5),
            ("ferrotrain_eval_loss", 3.75),
            ("ferrotrain_eval_bleu", 21.5),
            ("ferrotrain_eval_step", 1000.0),
            ("ferrotrain_best_eval_loss", 3.625),
            ("ferrotrain_learning_rate", 0.0007),
            ("ferrotrain_eta_seconds", 7500.0),
            ("ferrotrain_last_checkpoint_step", 1000.0),
            ("ferrotrain_last_checkpoint_bytes", 61_234_567.0),
            ("ferrotrain_last_checkpoint_blocking_seconds", 0.0625),
            (
                "ferrotrain_last_checkpoint_timestamp_seconds",
                1_767_323_045.0,
            ),
            ("ferrotrain_resumed_from_step", 500.0),
            ("ferrotrain_gang_cpu_utilization{stat=\"mean\"}", 1.5),
            ("ferrotrain_gang_cpu_utilization{stat=\"min\"}", 0.25),
            ("ferrotrain_gang_cpu_utilization{stat=\"min_rank\"}", 3.0),
            ("ferrotrain_gang_cpu_utilization{stat=\"max\"}", 2.0),
            ("ferrotrain_gang_cpu_utilization{stat=\"max_rank\"}", 1.0),
            ("ferrotrain_gang_ranks_reporting", 4.0),
            ("ferrotrain_parameters", 9_876_543.0),
            ("ferrotrain_peak_memory_bytes", (1u64 << 30) as f64),
            ("ferrotrain_phase{phase=\"training\"}", 1.0),
            ("ferrotrain_phase{phase=\"starting\"}", 0.0),
            ("ferrotrain_phase{phase=\"evaluating\"}", 0.0),
            ("ferrotrain_phase{phase=\"finished\"}", 0.0),
            ("ferrotrain_process_cpu_seconds_total", 12.5),
            ("ferrotrain_process_cpu_utilization", 1.75),
            ("ferrotrain_process_resident_memory_bytes", (3 << 20) as f64),
            (
                "ferrotrain_process_peak_resident_memory_bytes",
                (5 << 20) as f64,
            ),
            ("ferrotrain_process_threads", 9.0),
            ("ferrotrain_gpu_utilization", 0.875),
            ("ferrotrain_gpu_memory_used_bytes", (7u64 << 30) as f64),
            ("ferrotrain_gpu_peak_memory_used_bytes", (9u64 << 30) as f64),
            ("ferrotrain_gpu_memory_total_bytes", (80u64 << 30) as f64),
            ("ferrotrain_data_train_lines", 29000.0),
            ("ferrotrain_data_train_pairs", 28990.0),
            ("ferrotrain_data_train_tokens", 800_000.0),
            ("ferrotrain_data_vocabulary_size", 8000.0),
            ("ferrotrain_data_filtered_empty", 4.0),
            ("ferrotrain_data_filtered_long", 6.0),
            ("ferrotrain_data_valid_pairs", 1014.0),
            ("ferrotrain_data_valid_truncated", 2.0),
            ("ferrotrain_data_mean_source_tokens", 13.5),
            ("ferrotrain_data_mean_target_tokens", 14.25),
        ];
        for (series, v) in want {
            assert_eq!(m.get(series), Some(&v), "{series}");
        }
        assert_eq!(m.len(), want.len(), "unexpected series: {m:?}");
    }

    #[test]
    fn absent_fields_are_omitted_and_special_floats_kept() {
        let p = Progress {
            step: 7,
            loss: Some(f64::NAN),
            eta_seconds: Some(f64::INFINITY),
            ..Default::default()
        };
        let text = prometheus_text(&p);
        let m = parse_metrics(&text);
        assert_eq!(m["ferrotrain_step"], 7.0);
        assert!(m["ferrotrain_loss"].is_nan());
        assert_eq!(m["ferrotrain_eta_seconds"], f64::INFINITY);
        for absent in [
            "ferrotrain_eval_loss",
            "ferrotrain_comm_fraction",
            "ferrotrain_last_checkpoint_step",
            "ferrotrain_resumed_from_step",
            "ferrotrain_process_",
            "ferrotrain_data_",
            "ferrotrain_gpu_",
        ] {
            assert!(
                !text.contains(absent),
                "{absent} should be omitted:\n{text}"
            );
        }
        assert_eq!(m["ferrotrain_phase{phase=\"starting\"}"], 1.0);
    }

    #[test]
    fn serves_every_endpoint() {
        let (_server, shared, addr) = start(full_progress());

        let (status, _, body) = get(addr, "/healthz");
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));

        let (status, head, body) = get(addr, "/progress");
        assert_eq!(status, 200);
        assert!(head.contains("content-type: application/json"), "{head}");
        let back: Progress = serde_json::from_slice(&body).unwrap();
        // The resources are this process's, read at request time.
        let res = back.resources.clone().unwrap();
        assert!(res.rss_bytes > 1 << 20 && res.threads > 1, "{res:?}");
        assert_eq!(
            Progress {
                resources: None,
                ..back
            },
            Progress {
                resources: None,
                ..full_progress()
            }
        );

        let (status, head, body) = get(addr, "/metrics?name[]=x");
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        let m = parse_metrics(std::str::from_utf8(&body).unwrap());
        assert_eq!(m["ferrotrain_step"], 1234.0);
        assert!(m["ferrotrain_process_resident_memory_bytes"] > 1e6);

        // The server reads the shared progress at request time.
        shared.lock().unwrap().step = 1300;
        let (_, _, body) = get(addr, "/metrics");
        assert_eq!(
            parse_metrics(std::str::from_utf8(&body).unwrap())["ferrotrain_step"],
            1300.0
        );

        assert_eq!(get(addr, "/nope").0, 404);
        assert_eq!(get(addr, "/").0, 404);
        let (status, head, _) = raw(
            addr,
            b"POST /progress HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 405);
        assert!(head.contains("allow: get"), "{head}");
    }

    #[test]
    fn garbage_is_refused_and_the_server_keeps_serving() {
        let (_server, _shared, addr) = start(full_progress());
        for junk in [
            &b"\x00\xff\xfe garbage\r\n\r\n"[..],
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
        ] {
            // hyper answers 4xx, closes, or waits for more: all fine, as long as the next
            // request is served.
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            s.write_all(junk).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            assert!(
                out.is_empty() || out.starts_with(b"HTTP/1.1 4"),
                "{:?}",
                String::from_utf8_lossy(&out)
            );
        }
        // A peer that sends half a request and closes; one that says nothing.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        drop(s);
        let _silent = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        assert_eq!(get(addr, "/healthz").0, 200);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn dropping_the_server_stops_it() {
        let (server, _shared, addr) = start(full_progress());
        assert_eq!(get(addr, "/healthz").0, 200);
        let started = Instant::now();
        drop(server);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            started.elapsed()
        );
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n");
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out);
                assert!(out.is_empty(), "answered after drop");
            }
        }
    }

    #[test]
    fn a_poisoned_lock_still_serves() {
        let (_server, shared, addr) = start(full_progress());
        let s2 = shared.clone();
        let _ = std::thread::spawn(move || {
            let _guard = s2.lock().unwrap();
            panic!("training thread panics while holding the lock");
        })
        .join();
        assert!(shared.is_poisoned());
        assert_eq!(get(addr, "/progress").0, 200);
    }

    #[test]
    fn a_busy_port_is_an_error_not_a_panic() {
        let (server, _shared, _) = start(Progress::default());
        let port = server.local_addr().port();
        assert!(MetricsServer::start(port, Arc::new(Mutex::new(Progress::default()))).is_err());
    }

    #[test]
    fn the_reporter_puts_data_stats_in_the_report_and_writes_events_on_rank_0() {
        let dir = tempfile::tempdir().unwrap();
        let shared: SharedProgress = Default::default();
        let stats = full_progress().data.unwrap();
        let on = TensorBoardConfig {
            enabled: true,
            dir: None,
        };
        let mut follower = Reporter::start(&shared, false, dir.path(), &on, &stats);
        assert!(follower.board.is_none());
        follower.step(&full_progress(), 1.0, 2.0);
        assert!(!dir.path().join("tensorboard").exists());
        let mut leader = Reporter::start(&shared, true, dir.path(), &on, &stats);
        assert_eq!(shared.lock().unwrap().data.as_ref(), Some(&stats));
        let path = leader.board.as_ref().unwrap().path().to_path_buf();
        let before = std::fs::metadata(&path).unwrap().len();
        leader.step(&full_progress(), 1.0, 2.0);
        // Flushed at each report.
        assert!(std::fs::metadata(&path).unwrap().len() > before);
        assert!(path.parent().unwrap().ends_with("tensorboard/attempt-0"));
        // A configured directory holds <job>/attempt-<N>; disabled writes nothing.
        let job = dir.path().join("job-a");
        let elsewhere = TensorBoardConfig {
            enabled: true,
            dir: Some(dir.path().join("tb").to_string_lossy().into_owned()),
        };
        let leader = Reporter::start(&shared, true, &job, &elsewhere, &stats);
        let path = leader.board.as_ref().unwrap().path();
        assert!(
            path.starts_with(dir.path().join("tb/job-a/attempt-0")),
            "{path:?}"
        );
        let off = TensorBoardConfig {
            enabled: false,
            dir: None,
        };
        assert!(
            Reporter::start(&shared, true, &job, &off, &stats)
                .board
                .is_none()
        );
        assert!(!job.join("tensorboard").exists());
    }
}
