//! What the training loop tells the world besides `/progress`: the shared progress report
//! the server reads, the data stats at start, and on rank 0 each step as TensorBoard
//! scalars and (under `ferrotrain launch`) the progress file.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrotrain_api::checksummed;
use ferrotrain_api::config::TensorBoardConfig;
use ferrotrain_api::{DataStats, Progress, ResourceUsage};

use crate::error::Result;
use crate::resources::ResourceSampler;
use crate::tensorboard::{self, TrainingBoard};

/// The progress shared between the training loop (writer) and the server (reader).
pub type SharedProgress = Arc<Mutex<Progress>>;

/// What the training loop tells the world besides `/progress`: the data stats at start (log
/// and report) and, on rank 0, each step as TensorBoard scalars and (under `ferrotrain
/// launch`) the progress file. A TensorBoard write that fails (disk full) is logged once and
/// stops the events, never the training.
pub struct Reporter {
    board: Option<TrainingBoard>,
    progress_file: Option<ProgressFile>,
}

/// Rank 0's report, kept in the file the launcher named (FERROTRAIN_PROGRESS_FILE) for its
/// recovery ledger and for the gang's report node 0's launcher serves: replaced atomically
/// (write, then rename) after every step, so a rank killed at any moment leaves its last step
/// for the ledger's lost steps (about 50 µs a step: a 1.5 KB JSON file), with this process's
/// resources read at most every [`RESOURCES_EVERY`]. Sealed with its CRC-32C
/// ([`checksummed`]): the ledger counts no step from a damaged one.
struct ProgressFile {
    path: std::path::PathBuf,
    failed: bool,
    resources: ResourceSampler,
    /// When the resources were last read, and what they were.
    sampled: Option<(Instant, Option<ResourceUsage>)>,
}

/// How often the progress file's resources are read again (a read of /proc, and NVML on a GPU).
const RESOURCES_EVERY: Duration = Duration::from_secs(2);

impl ProgressFile {
    fn from_env() -> Option<Self> {
        let path = std::env::var_os(ferrotrain_api::env::FERROTRAIN_PROGRESS_FILE)?;
        Some(ProgressFile {
            path: path.into(),
            failed: false,
            resources: ResourceSampler::default(),
            sampled: None,
        })
    }

    /// This process's resources, read again when the last reading is [`RESOURCES_EVERY`] old.
    fn resources(&mut self) -> Option<ResourceUsage> {
        let now = Instant::now();
        match &self.sampled {
            Some((at, usage)) if now.duration_since(*at) < RESOURCES_EVERY => usage.clone(),
            _ => {
                let usage = self.resources.sample();
                self.sampled = Some((now, usage.clone()));
                usage
            }
        }
    }

    fn update(&mut self, p: &Progress) {
        if self.failed {
            return;
        }
        let mut p = p.clone();
        p.resources = self.resources().or(p.resources);
        let tmp = self.path.with_extension("tmp");
        let written = checksummed::seal(&p, checksummed::CRC_FIELD)
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

    /// Between steps, when the report changed without a step (the last save failed): the
    /// progress file says it too.
    pub fn update(&mut self, p: &Progress) {
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
    use ferrotrain_api::{DataStats, Progress};

    use super::*;

    fn full_progress() -> Progress {
        Progress {
            step: 1234,
            loss: Some(3.5),
            data: Some(DataStats {
                train_lines: 29_000,
                train_pairs: 28_990,
                train_tokens: 750_000,
                vocabulary_size: 8000,
                ..DataStats::default()
            }),
            ..Progress::default()
        }
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
