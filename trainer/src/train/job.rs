//! A run's contract: what it is given, the files it keeps in the job directory, and what it
//! returns.

use std::path::PathBuf;

use ferrotrain_api::{CheckpointInfo, TrainerConfig};

use crate::distributed::RankEnv;

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
