//! The progress report rank 0 serves at `/progress` and the operator copies into
//! `DistributedTraining.status.progress`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the trainer is doing right now.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TrainerPhase {
    /// Loading data, learning the tokenizer, building the model, rendezvous.
    #[default]
    Starting,
    /// Taking optimizer steps.
    Training,
    /// Computing validation loss / BLEU.
    Evaluating,
    /// Reached maxSteps (or maxSeconds) and saved the final checkpoint.
    Finished,
}

/// The newest complete checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointInfo {
    /// Optimizer step the checkpoint holds.
    pub step: u64,
    /// Bytes on disk (model + optimizer + metadata).
    pub size_bytes: u64,
    /// When it became complete (RFC 3339, UTC).
    pub time: String,
    /// Seconds the training thread was blocked by this save (the rest is written in the
    /// background).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_seconds: Option<f64>,
    /// Seconds from the start of this save to its commit (the copy plus the background
    /// write): what a save on SIGTERM needs, so the operator sizes the pods' termination
    /// grace from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_seconds: Option<f64>,
}

/// A checkpoint complete in the object store (its manifest written).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DurableCheckpoint {
    /// Optimizer step the checkpoint holds.
    pub step: u64,
    /// Where it is: `s3://BUCKET/PREFIX/<job>/step-<step>/`.
    pub url: String,
    /// When its manifest was written (RFC 3339, UTC).
    pub time: String,
    /// Seconds from the save's start to its manifest in the bucket (local write + upload);
    /// absent for a checkpoint found in the bucket at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_seconds: Option<f64>,
    /// The upload's rate, bytes per second (absent as above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_bytes_per_second: Option<f64>,
    /// Why the newest local checkpoint is not in the bucket yet, when its upload failed (it is
    /// retried with the next save's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_error: Option<String>,
}

/// A checkpoint save that failed, newest first: while the disk under the checkpoints refuses
/// writes (full, over quota, read-only, failing), training goes on and the next due save tries
/// again; the first save that completes clears it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointError {
    /// The step whose save failed last.
    pub step: u64,
    /// Why, as the disk said it: the path and the error (`No space left on device`, `Disk
    /// quota exceeded`, `Read-only file system`, `Input/output error`).
    pub message: String,
    /// When the first of these failed saves failed: no checkpoint has completed since, so the
    /// newest is `lastCheckpoint`, and losing the whole gang now costs every step after it.
    pub since: jiff::Timestamp,
    /// Saves that failed since the last one that completed.
    pub failed_saves: u64,
}

/// A training run's progress. All rates are averaged over a recent window of steps.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// What the trainer is doing.
    pub phase: TrainerPhase,
    /// Optimizer steps completed.
    pub step: u64,
    /// Steps the run will take (`maxSteps`).
    pub total_steps: u64,
    /// Passes over the training data started so far (0-based).
    pub epoch: u64,
    /// Training examples consumed so far, over all ranks (the global data position).
    pub samples: u64,
    /// Ranks exchanging gradients.
    pub world_size: u32,
    /// Optimizer steps per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_second: Option<f64>,
    /// Training examples per second, all ranks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second: Option<f64>,
    /// Source + target tokens (without padding) per second, all ranks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Wall-clock seconds per optimizer step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_seconds: Option<f64>,
    /// Share of step time spent waiting on gradient exchange, in [0, 1]. Near 1 means the
    /// network (or a slow peer) is the bottleneck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_fraction: Option<f64>,
    /// Training loss (label-smoothed cross-entropy per target token), recent average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Validation loss (plain cross-entropy per target token) at the last evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// Corpus BLEU on the validation set at the last evaluation (sacreBLEU 13a, cased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_bleu: Option<f64>,
    /// Step of the last evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_step: Option<u64>,
    /// Best validation loss so far and its step: when evalLoss rises while loss falls, the
    /// model is overfitting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_eval_loss: Option<f64>,
    /// Current learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// Seconds until training ends, as rank 0 estimates them: the steps left to `totalSteps`
    /// at the recent step rate, plus the evaluations still to come (each as long as the last
    /// one), but no more than the training time `maxSeconds` leaves. 0 once the run finished
    /// or `step` reached `totalSteps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    /// The newest complete checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointInfo>,
    /// The newest checkpoint complete in the bucket (`trainer.checkpoint.store`): what a
    /// restart on another node resumes from. Behind `lastCheckpoint` while an upload runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_checkpoint: Option<DurableCheckpoint>,
    /// The last checkpoint save failed, and none has completed since (absent while saves
    /// complete). The run trains on when the disk refused the write, and ends when it was
    /// the final save (a retryable error, so the next round saves it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_error: Option<CheckpointError>,
    /// Checkpoint saves that failed in this run of the trainer, counted from its start.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checkpoint_save_failures: u64,
    /// Step this run resumed from (absent for a fresh start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from_step: Option<u64>,
    /// Where this run's state came from: `peers` (a rank of the last round that was left
    /// alive: nothing was trained twice but the step in flight) or `checkpoint` (no rank
    /// held a state as new); absent for a fresh start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healed_from: Option<crate::recovery::HealedFrom>,
    /// When this attempt's first training step completed (start-up, rendezvous and restore
    /// end there): the recovery ledger's time to first step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_first_step_time: Option<jiff::Timestamp>,
    /// In-place restarts: the round of the attempt these ranks run in (0 until the first
    /// in-place restart; docs/distributed.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u64,
    /// Connections refused by the rendezvous store and rank 0's ring listener since they
    /// started, by reason (bad_token, not_ferrotrain, wrong_channel, handshake, bad_frame,
    /// too_many_connections, wrong_rank): something other than this job's ranks connects
    /// (docs/security.md).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rejected_connections: std::collections::BTreeMap<String, u64>,
    /// In-place restarts: how each earlier round of this attempt ended, as node 0's launcher
    /// recorded it. For the operator's recovery ledger; not kept in the status as such.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(skip)]
    pub round_ends: Vec<crate::recovery::RoundEnd>,
    /// The precision the ranks train in, and why (`precision: auto` decides at start-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionChoice>,
    /// `fp16`: the dynamic loss scale now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// `fp16`: optimizer steps this run of the trainer skipped because the gradients
    /// overflowed (held an inf or NaN); the data position moved on past them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
    /// Model parameters.
    #[serde(default)]
    pub parameters: u64,
    /// Peak resident memory of rank 0, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// CPU, memory and threads of rank 0's process (absent until the first report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceUsage>,
    /// Every rank's resources, summarised: the gang's mean and its extreme ranks (updated
    /// every logEverySteps, with the step's own all-reduce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_resources: Option<GangResources>,
    /// The training set as loaded: sizes, lengths, what was filtered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataStats>,
    /// True while rank 0 of a script of your own (spec.pytorch) has reported no step (a
    /// script that does not call `ferrotrain.report`, or has not yet): the report holds the
    /// rounds only, and stall detection waits for a first report.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_step_reports: bool,
}

/// The precision a run trains in: what the config asked for, what the trainer uses and why.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrecisionChoice {
    /// The config's `precision`.
    pub requested: crate::config::Precision,
    /// The precision of the matrix multiplies (never `auto`).
    pub used: crate::config::Precision,
    /// Why: the hardware that decided `auto`, or that the config asked for it.
    pub reason: String,
}

/// One resource over the ranks: the mean, and the lowest and highest rank.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// Mean over the ranks that reported.
    pub mean: f64,
    /// The lowest value.
    pub min: f64,
    /// The rank with the lowest value.
    pub min_rank: u32,
    /// The highest value.
    pub max: f64,
    /// The rank with the highest value.
    pub max_rank: u32,
}

impl Spread {
    /// Over `(rank, value)` pairs; None when there are none.
    pub fn of(values: impl IntoIterator<Item = (u32, f64)>) -> Option<Spread> {
        let mut n = 0usize;
        let mut s = Spread {
            mean: 0.0,
            min: f64::INFINITY,
            min_rank: 0,
            max: f64::NEG_INFINITY,
            max_rank: 0,
        };
        for (rank, v) in values {
            n += 1;
            s.mean += v;
            if v < s.min {
                (s.min, s.min_rank) = (v, rank);
            }
            if v > s.max {
                (s.max, s.max_rank) = (v, rank);
            }
        }
        (n > 0).then(|| Spread {
            mean: s.mean / n as f64,
            ..s
        })
    }
}

/// The gang's use of its machines: is one rank starved (CPU utilization far below the
/// mean), is one near its memory limit (resident memory's max), are the GPUs busy.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GangResources {
    /// Ranks that reported.
    pub ranks: u32,
    /// CPU seconds per second (1.0 = one core busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_utilization: Option<Spread>,
    /// Resident memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<Spread>,
    /// GPU utilization, 0..1 (CUDA ranks with NVML only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<Spread>,
    /// GPU memory in use, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_bytes: Option<Spread>,
}

impl GangResources {
    /// Values per rank in [`GangResources::slots`].
    pub const SLOTS: usize = 4;
    const MIB: f64 = 1024.0 * 1024.0;

    /// One rank's usage as the values it adds to its slots of the step's all-reduce (f32:
    /// memory in MiB; -1 for a value it does not have).
    pub fn slots(r: Option<&ResourceUsage>) -> [f32; Self::SLOTS] {
        let Some(r) = r else {
            return [-1.0; Self::SLOTS];
        };
        let gpu = r.gpu.as_ref();
        [
            r.cpu_utilization.map_or(-1.0, |u| u as f32),
            (r.rss_bytes as f64 / Self::MIB) as f32,
            gpu.map_or(-1.0, |g| g.utilization as f32),
            gpu.map_or(-1.0, |g| (g.memory_used_bytes as f64 / Self::MIB) as f32),
        ]
    }

    /// The summary of every rank's slots (rank r's at `r * SLOTS`), as the all-reduce
    /// summed them; None when no rank had a reading.
    pub fn from_slots(all: &[f64]) -> Option<GangResources> {
        let ranks: Vec<&[f64]> = all.chunks_exact(Self::SLOTS).collect();
        let column = |i: usize, scale: f64| {
            Spread::of(
                ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s[i] >= 0.0)
                    .map(|(r, s)| (r as u32, s[i] * scale)),
            )
        };
        let g = GangResources {
            ranks: ranks.iter().filter(|s| s[1] >= 0.0).count() as u32,
            cpu_utilization: column(0, 1.0),
            rss_bytes: column(1, Self::MIB),
            gpu_utilization: column(2, 1.0),
            gpu_memory_used_bytes: column(3, Self::MIB),
        };
        (g.ranks > 0).then_some(g)
    }
}

/// One trainer process's use of the machine, from /proc/self (Linux).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    /// CPU seconds (user + system) the process has used since it started.
    pub cpu_seconds: f64,
    /// CPU seconds per wall-clock second over the last report interval: 1.0 is one core
    /// busy, 2.0 two cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_utilization: Option<f64>,
    /// Resident memory now (VmRSS), bytes.
    pub rss_bytes: u64,
    /// Peak resident memory (VmHWM), bytes.
    pub peak_rss_bytes: u64,
    /// Threads of the process.
    pub threads: u64,
    /// On CUDA: the GPU this rank uses, as NVML reports it (absent on CPU or without NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuUsage>,
}

/// One GPU's use, from NVML (libnvidia-ml, loaded at run time).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuUsage {
    /// Share of the last sample period (1/6 s to 1 s, by GPU) in which a kernel ran, 0..1.
    pub utilization: f64,
    /// Device memory in use (all processes), bytes.
    pub memory_used_bytes: u64,
    /// Highest `memoryUsedBytes` this process has read.
    pub peak_memory_used_bytes: u64,
    /// Device memory, bytes.
    pub memory_total_bytes: u64,
}

/// The training data as the trainer loaded it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataStats {
    /// Sentence pairs (lines) in the training files, before filtering.
    pub train_lines: u64,
    /// Sentence pairs trained on, after filtering.
    pub train_pairs: u64,
    /// Source + target subword tokens of the pairs trained on (without BOS/EOS).
    pub train_tokens: u64,
    /// Subword vocabulary size (special tokens included).
    pub vocabulary_size: u64,
    /// Mean source sentence length in tokens over the pairs trained on.
    pub mean_source_tokens: f64,
    /// Mean target sentence length in tokens over the pairs trained on.
    pub mean_target_tokens: f64,
    /// Training pairs dropped because a side is empty.
    pub filtered_empty: u64,
    /// Training pairs dropped because a side is longer than `data.maxSentenceTokens`.
    pub filtered_long: u64,
    /// Validation pairs.
    pub valid_pairs: u64,
    /// Validation pairs truncated to `data.maxSentenceTokens` for the loss (BLEU sees them
    /// whole).
    pub valid_truncated: u64,
}

/// The most a container's termination message may hold (the kubelet keeps 4096 bytes; the
/// trainer's writer cuts at 4000).
pub const TERMINATION_MESSAGE_LIMIT: usize = 4000;

/// Marks a termination message that is a final [`Progress`] (rank 0 after finishing), not a
/// one-line failure reason.
pub const FINAL_PROGRESS_PREFIX: &str = "ferrotrain-progress ";

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Progress {
    /// The parts of this report the recovery ledger uses.
    pub fn step_report(&self) -> crate::recovery::StepReport {
        crate::recovery::StepReport {
            round: self.round,
            step: self.step,
            resumed_from_step: self.resumed_from_step,
            first_step_at: self.attempt_first_step_time,
            checkpoint_step: self.last_checkpoint.as_ref().map(|c| c.step),
            skipped_steps: self.skipped_steps,
            healed_from: self.healed_from,
            world_size: (self.world_size > 0).then_some(self.world_size),
        }
    }

    /// The final report as a termination message: the prefix and compact JSON within
    /// [`TERMINATION_MESSAGE_LIMIT`]; optional detail goes first when it would not fit
    /// (rank 0's /progress server is gone once training ends, so this is how the final step,
    /// eval and checkpoint reach the job's status).
    pub fn to_termination_message(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or_default();
        let json = fit_json(
            value,
            TERMINATION_MESSAGE_LIMIT - FINAL_PROGRESS_PREFIX.len(),
        );
        format!("{FINAL_PROGRESS_PREFIX}{json}")
    }

    /// The report in a termination message written by [`Self::to_termination_message`];
    /// None for any other message (a failure reason, a bring-your-own image's text).
    pub fn from_termination_message(message: &str) -> Option<Progress> {
        let json = message.trim().strip_prefix(FINAL_PROGRESS_PREFIX)?;
        serde_json::from_str(json).ok()
    }
}

/// Optional report fields, in the order they are left out when a report is too long for a
/// termination message: detail first, then rates; step, losses, eval and the checkpoint stay.
/// Round ends and refusals go last: they can be long (one entry a round, a reason a key), and
/// the operator reads them from the polls while the job runs (issue 44: without them a report
/// of 60 round ends overflowed its message, which the kubelet then cut into invalid JSON).
const DROPPED_FIRST: [&str; 12] = [
    "data",
    "precision",
    "resources",
    "peakMemoryBytes",
    "samplesPerSecond",
    "tokensPerSecond",
    "stepTimeSeconds",
    "commFraction",
    "learningRate",
    "stepsPerSecond",
    "roundEnds",
    "rejectedConnections",
];

/// Compact JSON of `value` (an object) in at most `limit` bytes when dropping
/// [`DROPPED_FIRST`] keys gets it there.
fn fit_json(mut value: serde_json::Value, limit: usize) -> String {
    let mut json = value.to_string();
    for key in DROPPED_FIRST {
        if json.len() <= limit {
            break;
        }
        if let Some(object) = value.as_object_mut()
            && object.remove(key).is_some()
        {
            json = value.to_string();
        }
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished() -> Progress {
        Progress {
            phase: TrainerPhase::Finished,
            step: 2000,
            total_steps: 2000,
            world_size: 2,
            loss: Some(0.0042),
            eval_loss: Some(0.0031),
            eval_step: Some(2000),
            last_checkpoint: Some(CheckpointInfo {
                step: 2000,
                size_bytes: 1 << 20,
                time: "2026-11-23T12:00:00Z".into(),
                blocking_seconds: Some(0.01),
                save_seconds: Some(0.4),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_final_report_round_trips_through_the_termination_message() {
        let message = finished().to_termination_message();
        assert!(message.starts_with(FINAL_PROGRESS_PREFIX), "{message}");
        assert!(!message.contains('\n'));
        assert_eq!(
            Progress::from_termination_message(&message),
            Some(finished())
        );
    }

    #[test]
    fn the_gang_summary_names_the_starved_rank_and_the_largest() {
        let usage = |cpu: f64, rss_mib: u64, gpu: Option<f64>| ResourceUsage {
            cpu_utilization: Some(cpu),
            rss_bytes: rss_mib << 20,
            gpu: gpu.map(|u| GpuUsage {
                utilization: u,
                memory_used_bytes: 1 << 30,
                ..Default::default()
            }),
            ..Default::default()
        };
        // What the all-reduce sums: every rank fills its own slots, the others add 0.
        let ranks = [
            Some(usage(1.0, 500, Some(0.9))),
            Some(usage(0.25, 700, Some(0.3))),
            None,
        ];
        let mut sum = vec![0.0f64; ranks.len() * GangResources::SLOTS];
        for (r, u) in ranks.iter().enumerate() {
            for (i, v) in GangResources::slots(u.as_ref()).iter().enumerate() {
                sum[r * GangResources::SLOTS + i] += f64::from(*v);
            }
        }
        let g = GangResources::from_slots(&sum).unwrap();
        assert_eq!(g.ranks, 2, "rank 2 had no reading yet");
        let cpu = g.cpu_utilization.unwrap();
        assert_eq!(
            (cpu.min, cpu.min_rank, cpu.max, cpu.max_rank),
            (0.25, 1, 1.0, 0)
        );
        assert_eq!(cpu.mean, 0.625);
        let rss = g.rss_bytes.unwrap();
        assert_eq!((rss.max, rss.max_rank), (700.0 * 1048576.0, 1));
        let gpu = g.gpu_utilization.unwrap();
        assert!((gpu.min - 0.3).abs() < 1e-6 && gpu.min_rank == 1);
        assert_eq!(g.gpu_memory_used_bytes.unwrap().mean, (1u64 << 30) as f64);
        assert_eq!(GangResources::from_slots(&[-1.0; 8]), None);
    }

    #[test]
    fn failure_reasons_are_not_reports() {
        for message in [
            "",
            "stopped by SIGTERM at step 5; checkpoint step 5 is complete",
            "{\"step\": 3}",
            "ferrotrain-progress not json",
        ] {
            assert_eq!(
                Progress::from_termination_message(message),
                None,
                "{message}"
            );
        }
    }

    /// The report a Python script's rank 0 is checked against (python/tests/test_progress.py
    /// opens this file, sealed here): what the package reads is what Rust seals. Regenerate
    /// with FERROTRAIN_REGENERATE=1 after a change to the format.
    #[test]
    fn the_python_packages_fixture_is_what_rust_seals() {
        let report = Progress {
            phase: TrainerPhase::Training,
            step: 1234,
            total_steps: 2000,
            world_size: 4,
            steps_per_second: Some(2.5),
            loss: Some(3.25),
            eval_loss: Some(3.5),
            eval_step: Some(1000),
            eta_seconds: Some(306.4),
            resumed_from_step: Some(1200),
            healed_from: Some(crate::recovery::HealedFrom::Peers),
            ..Default::default()
        };
        let sealed = crate::checksummed::seal(&report, crate::checksummed::CRC_FIELD).unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../python/tests/fixtures/progress-sealed-by-rust.json");
        if std::env::var_os("FERROTRAIN_REGENERATE").is_some() {
            std::fs::write(&path, &sealed).unwrap();
        }
        let committed = std::fs::read(&path).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&committed),
            String::from_utf8_lossy(&sealed),
            "{} is stale: FERROTRAIN_REGENERATE=1 cargo test -p ferrotrain-api",
            path.display()
        );
    }

    #[test]
    fn an_oversized_report_drops_optional_detail_to_fit() {
        let mut value = serde_json::to_value(finished()).unwrap();
        value["data"] = serde_json::Value::String("x".repeat(5000));
        value["learningRate"] = 1e-3.into();
        let fitted = fit_json(value, 1000);
        assert!(fitted.len() <= 1000, "{}", fitted.len());
        let back: Progress = serde_json::from_str(&fitted).unwrap();
        // Only what had to go went: the rest of the report is whole.
        assert_eq!(back.learning_rate, Some(1e-3));
        assert_eq!(
            back,
            Progress {
                learning_rate: Some(1e-3),
                ..finished()
            }
        );
        assert!(finished().to_termination_message().len() <= TERMINATION_MESSAGE_LIMIT);
    }
}
