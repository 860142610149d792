//! Checkpoints: `<root>/step-00000000/{model,optimizer}.safetensors + trainer.json`, written
//! to a temporary directory off the training thread, fsynced and renamed, so a directory
//! named step-* is always complete. Retention keeps the newest K and the best N.
//!
//! The protocol, in order (docs/checkpoints.md says the same for users):
//! 1. `save` copies every tensor into plain CPU bytes on the calling thread (the only part
//!    that blocks training) and hands them to a background thread.
//! 2. The background thread writes `.tmp-step-XXXXXXXX-<pid>/` in the same parent, fsyncs
//!    each file and the directory, renames it to `step-XXXXXXXX`, fsyncs the parent.
//! 3. Then retention: checkpoints to drop are first renamed back to a `.tmp-step-*` name and
//!    only then removed, so a crash mid-delete never leaves a half-empty `step-*` directory.
//!
//! `latest()` trusts a `step-*` directory only when all three files are there, trainer.json
//! parses and names the same step, and both safetensors headers describe exactly the bytes
//! the files hold. Anything else is skipped with a warning.
//!
//! One writer at a time (fencing): a rank 0 opens the job directory with
//! [`CheckpointStore::open_writer`], which records its [`WriterId`] (attempt + job
//! incarnation) in `fence.json`. A writer of an older attempt of the same incarnation is
//! refused there, and a running writer re-reads the fence before each commit and before
//! retention, so a stale rank 0 (a pod of an earlier attempt still running after a node
//! partition) never commits once a newer attempt has started. The newer writer moves the
//! older writers' in-flight temporary directories aside before removing them, so the stale
//! writer's rename fails instead of committing a half-deleted directory.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use ferrotrain_api::CheckpointInfo;
use ferrotrain_api::config::CheckpointPolicy;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::dist::RankEnv;
use crate::error::{Reason, Result, TrainError};

/// The model's weights, by variable path.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's state tensors, by name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// [`TrainerState`] as JSON.
pub const STATE_FILE: &str = "trainer.json";
/// Prefix of every directory this module writes before it is complete (or while it is being
/// deleted); `CheckpointStore::new` removes leftovers.
pub const TEMP_PREFIX: &str = ".tmp-step-";

/// The fence: which writer owns the job directory (see [`WriterId`]).
pub const FENCE_FILE: &str = "fence.json";

const STEP_PREFIX: &str = "step-";
/// A safetensors header larger than this is treated as corrupt (the reference
/// implementation uses the same bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// trainer.json: what a resume needs besides the tensors.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainerState {
    pub step: u64,
    /// Global data position: examples consumed over all ranks.
    pub samples: u64,
    pub epoch: u64,
    /// The run's seed; dropout is re-seeded from (seed, step) every step.
    pub seed: u64,
    pub config_digest: String,
    pub world_size: u32,
    pub train_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub eval_bleu: Option<f64>,
    /// RFC 3339 time the save started.
    pub time: String,
    /// Wall-clock seconds of training so far, over every run of the job: `maxSeconds` and a
    /// time-horizon schedule count from here after a resume. 0 in older checkpoints.
    #[serde(default)]
    pub train_seconds: f64,
}

/// Named tensors (variable path -> tensor).
pub type Named = Vec<(String, Tensor)>;

/// A checkpoint read back.
pub struct Loaded {
    pub dir: PathBuf,
    pub model: Named,
    pub optimizer: Named,
    pub state: TrainerState,
}

/// Who writes a job directory's checkpoints. Writers are ordered by attempt within one
/// incarnation of the job; a writer of another incarnation (the job object was recreated, or
/// a new `ferrotrain launch`) takes over, since nothing orders it against the old one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WriterId {
    /// The gang's attempt (FERROTRAIN_ATTEMPT): grows with every restart of the job.
    pub attempt: u64,
    /// A digest of the job's rendezvous token: the operator's Secret lives as long as the
    /// job object, `ferrotrain launch` draws one per invocation. Never the token itself.
    pub incarnation: String,
}

impl WriterId {
    /// The writer identity of a rank from its env contract.
    pub fn of_rank(rank: &RankEnv) -> WriterId {
        WriterId::new(rank.attempt, &rank.token)
    }

    pub fn new(attempt: u64, rendezvous_token: &str) -> WriterId {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"ferrotrain checkpoint fence v1\0")
            .chain_update(rendezvous_token.as_bytes())
            .finalize();
        let incarnation = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        WriterId {
            attempt,
            incarnation,
        }
    }

    /// A writer of a later attempt of the same incarnation: `self` must stop writing.
    fn superseded_by(&self, other: &WriterId) -> bool {
        other.incarnation == self.incarnation && other.attempt > self.attempt
    }
}

/// `fence.json`: the writer plus where it ran, for humans reading the directory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fence {
    #[serde(flatten)]
    writer: WriterId,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    time: String,
}

/// Points of a background save, reported to a [`SaveHook`]. For tests that need to stop a
/// save at a known point (a crash mid-write, a slow disk); production code sets no hook.
#[doc(hidden)]
#[derive(Debug)]
pub enum SaveEvent<'a> {
    /// The temporary directory exists and nothing is written yet.
    Started { step: u64, temp_dir: &'a Path },
    /// One file is complete and fsynced inside the temporary directory.
    FileWritten {
        step: u64,
        temp_dir: &'a Path,
        file: &'static str,
    },
    /// The checkpoint is renamed into place and the parent is fsynced (retention not yet run).
    Renamed { step: u64, dir: &'a Path },
}

#[doc(hidden)]
pub type SaveHook = Arc<dyn Fn(SaveEvent<'_>) + Send + Sync>;

/// The checkpoints of one job.
pub struct CheckpointStore {
    root: PathBuf,
    policy: CheckpointPolicy,
    in_flight: Option<JoinHandle<Result<CheckpointInfo>>>,
    /// Written by the background thread when a save completes; read by progress reports.
    last: Arc<Mutex<Option<CheckpointInfo>>>,
    hook: Option<SaveHook>,
    /// Set by `open_writer`: every commit is checked against the fence.
    writer: Option<WriterId>,
}

impl CheckpointStore {
    /// `root` is `<checkpoint dir>/<job>`; created if missing. Reads without claiming the
    /// directory and deletes nothing (a `translate` next to a running job must not touch its
    /// in-flight saves); its saves are not fenced. Training opens with [`Self::open_writer`].
    pub fn new(root: &Path, policy: CheckpointPolicy) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| io_err("creating", root, e))?;
        let store = CheckpointStore {
            root: root.to_path_buf(),
            policy,
            in_flight: None,
            last: Arc::new(Mutex::new(None)),
            hook: None,
            writer: None,
        };
        if let Some((dir, state)) = store.latest()? {
            let info = CheckpointInfo {
                step: state.step,
                size_bytes: dir_size(&dir),
                time: modified_rfc3339(&dir.join(STATE_FILE)).unwrap_or(state.time),
                blocking_seconds: None,
                save_seconds: None,
            };
            *lock(&store.last) = Some(info);
        }
        Ok(store)
    }

    /// Opens `root` as its one writer: claims the fence for `writer` (an error when a later
    /// attempt of the same job holds it: this rank 0 is stale and must not write), then
    /// removes what earlier writers left half done. Their in-flight temporary directories
    /// are first renamed aside, so a stale writer still running cannot commit them.
    pub fn open_writer(root: &Path, policy: CheckpointPolicy, writer: WriterId) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| io_err("creating", root, e))?;
        claim_fence(root, &writer)?;
        sweep_temporaries(root, &writer);
        let mut store = Self::new(root, policy)?;
        store.writer = Some(writer);
        Ok(store)
    }

    /// The directory this store writes into.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The newest complete checkpoint's directory and state (ignores temporary and
    /// unreadable directories, with a warning).
    pub fn latest(&self) -> Result<Option<(PathBuf, TrainerState)>> {
        let mut steps = step_dirs(&self.root)?;
        steps.sort_by_key(|s| std::cmp::Reverse(s.0));
        for (step, dir) in steps {
            match inspect(&dir, step) {
                Ok(state) => return Ok(Some((dir, state))),
                Err(why) => {
                    tracing::warn!(dir = %dir.display(), reason = %why, "skipping an incomplete or corrupt checkpoint")
                }
            }
        }
        Ok(None)
    }

    /// Every complete checkpoint, oldest first.
    pub fn complete(&self) -> Result<Vec<(PathBuf, TrainerState)>> {
        complete_checkpoints(&self.root)
    }

    /// Reads a checkpoint directory.
    pub fn load(dir: &Path) -> Result<Loaded> {
        let step = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_step_dir_name);
        let state = read_state(dir).map_err(|e| TrainError::Other(e.into()))?;
        if let Some(step) = step
            && step != state.step
        {
            return Err(TrainError::Other(
                format!(
                    "checkpoint {}: trainer.json says step {} but the directory is step {step}",
                    dir.display(),
                    state.step
                )
                .into(),
            ));
        }
        let model =
            read_safetensors(&dir.join(MODEL_FILE)).map_err(|e| TrainError::Other(e.into()))?;
        let optimizer =
            read_safetensors(&dir.join(OPTIMIZER_FILE)).map_err(|e| TrainError::Other(e.into()))?;
        Ok(Loaded {
            dir: dir.to_path_buf(),
            model,
            optimizer,
            state,
        })
    }

    /// Starts saving: copies the tensors to CPU memory now (the only part that blocks the
    /// training thread) and writes them on a background thread. Waits for the previous save
    /// first. Returns the seconds the caller was blocked.
    ///
    /// If the previous save failed, its error is returned and this save is not started.
    pub fn save(&mut self, model: &Named, optimizer: &Named, state: TrainerState) -> Result<f64> {
        let started = Instant::now();
        self.wait()?;
        let model = snapshot(model)?;
        let optimizer = snapshot(optimizer)?;
        let blocking = started.elapsed().as_secs_f64();

        let job = SaveJob {
            root: self.root.clone(),
            policy: self.policy.clone(),
            model,
            optimizer,
            state,
            blocking,
            started,
            hook: self.hook.clone(),
            writer: self.writer.clone(),
        };
        let last = self.last.clone();
        let handle = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || -> Result<CheckpointInfo> {
                let info = job.run()?;
                *lock(&last) = Some(info.clone());
                Ok(info)
            })
            .map_err(|e| {
                TrainError::Other(Reason::caused("cannot start the checkpoint writer", e))
            })?;
        self.in_flight = Some(handle);
        Ok(blocking)
    }

    /// Waits for the save in flight, if any; returns the newest completed checkpoint, if any.
    /// An error of the background write surfaces here.
    pub fn wait(&mut self) -> Result<Option<CheckpointInfo>> {
        if let Some(handle) = self.in_flight.take() {
            match handle.join() {
                Ok(result) => {
                    result?;
                }
                Err(_) => {
                    return Err(TrainError::Other("the checkpoint writer panicked".into()));
                }
            }
        }
        Ok(self.last_completed())
    }

    /// The newest checkpoint completed so far without waiting (for progress reports).
    pub fn last_completed(&self) -> Option<CheckpointInfo> {
        lock(&self.last).clone()
    }

    /// Calls `hook` at fixed points of every later background save (tests only).
    #[doc(hidden)]
    pub fn set_save_hook(&mut self, hook: SaveHook) {
        self.hook = Some(hook);
    }
}

impl Drop for CheckpointStore {
    /// A save in flight is finished, not abandoned: the run may be ending on an error and
    /// the checkpoint being written is the one the next attempt resumes from.
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::error!(error = %e, "the last checkpoint save failed");
        }
    }
}

/// `step-00000042`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:08}")
}

/// The step of a `step-XXXXXXXX` directory name (at least 8 digits, nothing else).
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Which steps retention keeps: the newest `keep_latest`, the `keep_best` with the lowest
/// eval loss (a checkpoint without one, or with NaN, is never "best"), and always the newest.
/// `checkpoints` is (step, eval loss), in any order.
pub fn retained_steps(
    checkpoints: &[(u64, Option<f64>)],
    keep_latest: u32,
    keep_best: u32,
) -> std::collections::BTreeSet<u64> {
    let mut by_step: Vec<u64> = checkpoints.iter().map(|c| c.0).collect();
    by_step.sort_unstable_by(|a, b| b.cmp(a));
    let mut keep: std::collections::BTreeSet<u64> = by_step
        .iter()
        .take(keep_latest.max(1) as usize)
        .copied()
        .collect();
    let mut scored: Vec<(f64, u64)> = checkpoints
        .iter()
        .filter_map(|&(step, loss)| loss.filter(|l| !l.is_nan()).map(|l| (l, step)))
        .collect();
    // Lowest loss first; among equal losses the newer checkpoint wins.
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    keep.extend(scored.iter().take(keep_best as usize).map(|s| s.1));
    keep
}

// ---------------------------------------------------------------------------------------
// The background write.

/// A tensor copied out of libtorch: the writer thread never touches libtorch.
struct Snapshot {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn snapshot(tensors: &Named) -> Result<Vec<Snapshot>> {
    let _guard = tch::no_grad_guard();
    let mut out = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let kind = tensor.f_kind()?;
        let dtype = dtype_of(kind).ok_or_else(|| {
            TrainError::Other(
                format!("checkpoint: tensor {name} has unsupported kind {kind:?}").into(),
            )
        })?;
        let numel = tensor.numel();
        let mut bytes = vec![0u8; numel * kind.elt_size_in_bytes()];
        // Moves device tensors to the host and makes strided ones contiguous on the way.
        tensor.f_copy_data_u8(&mut bytes, numel)?;
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        out.push(Snapshot {
            name: name.clone(),
            dtype,
            shape,
            bytes,
        });
    }
    Ok(out)
}

struct SaveJob {
    root: PathBuf,
    policy: CheckpointPolicy,
    model: Vec<Snapshot>,
    optimizer: Vec<Snapshot>,
    state: TrainerState,
    blocking: f64,
    /// When `save` was called: `saveSeconds` runs from here to the commit.
    started: Instant,
    hook: Option<SaveHook>,
    writer: Option<WriterId>,
}

impl SaveJob {
    /// Refuses to go on when a later writer holds the fence; `temp` (ours) is removed.
    fn check_fence(&self, temp: Option<&Path>) -> Result<()> {
        let Some(writer) = &self.writer else {
            return Ok(());
        };
        let Err(e) = still_owner(&self.root, writer) else {
            return Ok(());
        };
        if let Some(temp) = temp
            && let Err(err) = fs::remove_dir_all(temp)
        {
            tracing::warn!(dir = %temp.display(), error = %err, "cannot remove a fenced save");
        }
        Err(e)
    }

    fn run(self) -> Result<CheckpointInfo> {
        let step = self.state.step;
        let name = step_dir_name(step);
        let temp = self.root.join(temp_dir_name(step, self.writer.as_ref()));
        let dir = self.root.join(&name);
        if temp.exists() {
            fs::remove_dir_all(&temp).map_err(|e| io_err("removing", &temp, e))?;
        }
        fs::create_dir(&temp).map_err(|e| io_err("creating", &temp, e))?;
        let hook = |event: SaveEvent<'_>| {
            if let Some(h) = &self.hook {
                h(event)
            }
        };
        hook(SaveEvent::Started {
            step,
            temp_dir: &temp,
        });
        // Checked once the temporary directory exists: a newer writer that fenced us before
        // it was created is seen here; one that fences us later moves it aside.
        self.check_fence(Some(&temp))?;

        let mut size = 0;
        size += write_safetensors(&temp.join(MODEL_FILE), &self.model)?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: &temp,
            file: MODEL_FILE,
        });
        size += write_safetensors(&temp.join(OPTIMIZER_FILE), &self.optimizer)?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: &temp,
            file: OPTIMIZER_FILE,
        });
        let json = serde_json::to_vec_pretty(&self.state).map_err(|e| {
            TrainError::Other(Reason::caused("checkpoint: encoding trainer.json", e))
        })?;
        size += write_synced(&temp.join(STATE_FILE), |w| w.write_all(&json))?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: &temp,
            file: STATE_FILE,
        });
        sync_dir(&temp)?;
        self.check_fence(Some(&temp))?;

        // The same step can be saved twice (a periodic save that is also the final one, or
        // a re-run over a step whose directory is corrupt): move the old one out of the way.
        // A crash between the two renames leaves the older checkpoints, never a partial one.
        let replaced = self.root.join(format!(
            "{TEMP_PREFIX}{step:08}-{}-replaced",
            std::process::id()
        ));
        let had_old = dir.exists();
        if had_old {
            fs::rename(&dir, &replaced).map_err(|e| io_err("moving aside", &dir, e))?;
        }
        fs::rename(&temp, &dir).map_err(|e| io_err("renaming", &temp, e))?;
        sync_dir(&self.root)?;
        if had_old && let Err(e) = fs::remove_dir_all(&replaced) {
            tracing::warn!(dir = %replaced.display(), error = %e, "cannot remove a replaced checkpoint");
        }
        hook(SaveEvent::Renamed { step, dir: &dir });

        let info = CheckpointInfo {
            step,
            size_bytes: size,
            time: now_rfc3339(),
            blocking_seconds: Some(self.blocking),
            save_seconds: Some(self.started.elapsed().as_secs_f64()),
        };
        // A stale writer must not delete what the newer one may be resuming from.
        if let Err(e) = self.check_fence(None) {
            tracing::warn!(error = %e, "retention skipped");
        } else if let Err(e) = apply_retention(&self.root, &self.policy) {
            tracing::warn!(error = %e, "checkpoint retention failed; old checkpoints are kept");
        }
        tracing::info!(step, bytes = size, dir = %dir.display(), "checkpoint saved");
        Ok(info)
    }
}

fn apply_retention(root: &Path, policy: &CheckpointPolicy) -> Result<()> {
    let complete = complete_checkpoints(root)?;
    let scored: Vec<(u64, Option<f64>)> = complete
        .iter()
        .map(|(_, s)| (s.step, s.eval_loss))
        .collect();
    let keep = retained_steps(&scored, policy.keep_latest, policy.keep_best);
    for (dir, state) in complete {
        if keep.contains(&state.step) {
            continue;
        }
        // Rename first: a crash mid-delete then leaves a temp dir, not a broken step-* one.
        let doomed = root.join(format!(
            "{TEMP_PREFIX}{:08}-{}-deleted",
            state.step,
            std::process::id()
        ));
        fs::rename(&dir, &doomed).map_err(|e| io_err("moving aside", &dir, e))?;
        fs::remove_dir_all(&doomed).map_err(|e| io_err("removing", &doomed, e))?;
        tracing::info!(step = state.step, "removed checkpoint (retention)");
    }
    sync_dir(root)
}

// ---------------------------------------------------------------------------------------
// Fencing.

/// `.tmp-step-XXXXXXXX-a<attempt>-<pid>` (`-<pid>` alone for an unfenced store): the
/// attempt tells a human whose save it was.
fn temp_dir_name(step: u64, writer: Option<&WriterId>) -> String {
    let pid = std::process::id();
    match writer {
        Some(w) => format!("{TEMP_PREFIX}{step:08}-a{}-{pid}", w.attempt),
        None => format!("{TEMP_PREFIX}{step:08}-{pid}"),
    }
}

fn read_fence(root: &Path) -> Result<Option<Fence>> {
    let path = root.join(FENCE_FILE);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            TrainError::Other(Reason::caused(
                format!("checkpoint: {} is not a fence", path.display()),
                e,
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("reading", &path, e)),
    }
}

fn stale_writer_error(root: &Path, ours: &WriterId, fence: &Fence) -> TrainError {
    TrainError::Other(
        format!(
            "checkpoint: attempt {} of this job took over {} (host {}, pid {}, {}); this rank 0 \
         of attempt {} is stale and writes no checkpoint",
            fence.writer.attempt,
            root.display(),
            fence.host,
            fence.pid,
            fence.time,
            ours.attempt
        )
        .into(),
    )
}

/// Writes the fence for `writer` unless a later attempt holds it. The file is replaced
/// atomically (temporary file, fsync, rename, fsync of the directory), then read back: when
/// two writers race, the later attempt rewrites it, the earlier one sees it and gives up.
fn claim_fence(root: &Path, writer: &WriterId) -> Result<()> {
    for _ in 0..3 {
        if let Some(fence) = read_fence(root)? {
            if writer.superseded_by(&fence.writer) {
                return Err(stale_writer_error(root, writer, &fence));
            }
            if fence.writer.incarnation != writer.incarnation {
                tracing::info!(
                    attempt = writer.attempt,
                    "taking over checkpoints written by another incarnation of the job"
                );
            }
        }
        let fence = Fence {
            writer: writer.clone(),
            host: hostname(),
            pid: std::process::id(),
            time: now_rfc3339(),
        };
        let json = serde_json::to_vec(&fence)
            .map_err(|e| TrainError::Other(Reason::caused("checkpoint: encoding the fence", e)))?;
        let temp = root.join(format!(".{FENCE_FILE}.{}", std::process::id()));
        write_synced(&temp, |w| w.write_all(&json))?;
        let path = root.join(FENCE_FILE);
        fs::rename(&temp, &path).map_err(|e| io_err("renaming", &temp, e))?;
        sync_dir(root)?;
        match read_fence(root)? {
            Some(now) if now.writer == *writer => return Ok(()),
            Some(now) if writer.superseded_by(&now.writer) => {
                return Err(stale_writer_error(root, writer, &now));
            }
            // An older writer overwrote ours between its check and its rename: claim again.
            _ => continue,
        }
    }
    Err(TrainError::Other(
        format!(
            "checkpoint: cannot claim {}: other writers keep replacing {FENCE_FILE}",
            root.display()
        )
        .into(),
    ))
}

/// Ok while `writer` holds the fence; the error names the writer that took over.
fn still_owner(root: &Path, writer: &WriterId) -> Result<()> {
    match read_fence(root)? {
        Some(fence) if fence.writer == *writer => Ok(()),
        Some(fence) => Err(stale_writer_error(root, writer, &fence)),
        None => Err(TrainError::Other(
            format!(
                "checkpoint: {} vanished from {}; not committing",
                FENCE_FILE,
                root.display()
            )
            .into(),
        )),
    }
}

/// Removes every `.tmp-step-*` directory: the caller now owns the fence, so they belong to
/// crashed saves or to stale writers. Each is renamed first (still under the temporary
/// prefix): a stale writer's later rename of its directory then fails, where a directory
/// being removed under it could have been committed half empty.
fn sweep_temporaries(root: &Path, writer: &WriterId) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut swept = Vec::new();
    for (i, entry) in entries.flatten().enumerate() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(TEMP_PREFIX) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let aside = root.join(format!(
            "{TEMP_PREFIX}swept-a{}-{}-{i}",
            writer.attempt,
            std::process::id()
        ));
        tracing::info!(dir = %entry.path().display(), "removing an incomplete checkpoint left by an earlier writer");
        match fs::rename(entry.path(), &aside) {
            Ok(()) => swept.push(aside),
            // Committed or removed by its writer in the meantime.
            Err(e) => {
                tracing::warn!(dir = %entry.path().display(), error = %e, "cannot move an incomplete checkpoint aside")
            }
        }
    }
    for dir in swept {
        if let Err(e) = fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an incomplete checkpoint");
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Directory scanning and validation.

fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| io_err("listing", root, e))? {
        let entry = entry.map_err(|e| io_err("listing", root, e))?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step_dir_name) else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push((step, entry.path()));
        }
    }
    Ok(out)
}

fn complete_checkpoints(root: &Path) -> Result<Vec<(PathBuf, TrainerState)>> {
    let mut steps = step_dirs(root)?;
    steps.sort_by_key(|s| s.0);
    Ok(steps
        .into_iter()
        .filter_map(|(step, dir)| inspect(&dir, step).ok().map(|state| (dir, state)))
        .collect())
}

/// Cheap completeness check: reads trainer.json and the two safetensors headers only.
fn inspect(dir: &Path, step: u64) -> Result<TrainerState, String> {
    let state = read_state(dir)?;
    if state.step != step {
        return Err(format!(
            "trainer.json says step {}, the directory says {step}",
            state.step
        ));
    }
    for file in [MODEL_FILE, OPTIMIZER_FILE] {
        let path = dir.join(file);
        let mut f = File::open(&path).map_err(|e| format!("{file}: {e}"))?;
        let len = f.metadata().map_err(|e| format!("{file}: {e}"))?.len();
        read_header(&mut f, len).map_err(|e| format!("{file}: {e}"))?;
    }
    Ok(state)
}

fn read_state(dir: &Path) -> Result<TrainerState, String> {
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------
// safetensors: 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}, then the
// tensors' bytes back to back (little-endian, row-major). Readable by the Python
// `safetensors` package and by `tch::Tensor::read_safetensors`.

#[derive(Debug)]
struct HeaderEntry {
    name: String,
    kind: Kind,
    shape: Vec<i64>,
    begin: usize,
    end: usize,
}

fn dtype_of(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Bool => "BOOL",
        Kind::Uint8 => "U8",
        Kind::Int8 => "I8",
        Kind::Int16 => "I16",
        Kind::Int => "I32",
        Kind::Int64 => "I64",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Float => "F32",
        Kind::Double => "F64",
        _ => return None,
    })
}

fn kind_of(dtype: &str) -> Option<Kind> {
    Some(match dtype {
        "BOOL" => Kind::Bool,
        "U8" => Kind::Uint8,
        "I8" => Kind::Int8,
        "I16" => Kind::Int16,
        "I32" => Kind::Int,
        "I64" => Kind::Int64,
        "BF16" => Kind::BFloat16,
        "F16" => Kind::Half,
        "F32" => Kind::Float,
        "F64" => Kind::Double,
        _ => return None,
    })
}

/// Writes one safetensors file and fsyncs it; returns its size in bytes.
fn write_safetensors(path: &Path, tensors: &[Snapshot]) -> Result<u64> {
    let mut header = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    metadata.insert("format".into(), "pt".into());
    header.insert("__metadata__".into(), metadata.into());
    let mut offset = 0usize;
    for t in tensors {
        if header.contains_key(&t.name) {
            return Err(TrainError::Other(
                format!("checkpoint: duplicate tensor name {}", t.name).into(),
            ));
        }
        let end = offset + t.bytes.len();
        header.insert(
            t.name.clone(),
            serde_json::json!({ "dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&header)
        .map_err(|e| TrainError::Other(Reason::caused("checkpoint: encoding a header", e)))?;
    // Pad so the data starts 8-byte aligned, as the reference writer does.
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    write_synced(path, |w| {
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        for t in tensors {
            w.write_all(&t.bytes)?;
        }
        Ok(())
    })
}

/// Parses and checks a header against the file length: every tensor's byte range matches its
/// dtype and shape, the ranges tile the data section exactly, and the file is not shorter or
/// longer than that. Leaves `f` positioned at the start of the data. Entries come back in
/// file order.
fn read_header(f: &mut File, file_len: u64) -> Result<Vec<HeaderEntry>, String> {
    let mut len_bytes = [0u8; 8];
    f.read_exact(&mut len_bytes)
        .map_err(|e| format!("reading the header length: {e}"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(format!(
            "header length {header_len} does not fit a file of {file_len} bytes"
        ));
    }
    let mut json = vec![0u8; header_len as usize];
    f.read_exact(&mut json)
        .map_err(|e| format!("reading the header: {e}"))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&json).map_err(|e| format!("header is not a JSON object: {e}"))?;
    let mut entries = Vec::with_capacity(header.len());
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: &str| format!("tensor {name}: {why}");
        let dtype = value
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no dtype"))?;
        let kind = kind_of(dtype).ok_or_else(|| bad(&format!("unsupported dtype {dtype}")))?;
        let shape: Vec<u64> = value
            .get("shape")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .ok_or_else(|| bad("no shape"))?;
        let offsets: [u64; 2] = value
            .get("data_offsets")
            .and_then(|o| serde_json::from_value(o.clone()).ok())
            .ok_or_else(|| bad("no data_offsets"))?;
        let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let bytes = numel.and_then(|n| n.checked_mul(kind.elt_size_in_bytes() as u64));
        if offsets[1] < offsets[0] || Some(offsets[1] - offsets[0]) != bytes {
            return Err(bad("data_offsets do not match dtype and shape"));
        }
        let shape = shape
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<Result<Vec<i64>, _>>();
        entries.push(HeaderEntry {
            name: name.clone(),
            kind,
            shape: shape.map_err(|_| bad("dimension too large"))?,
            begin: offsets[0] as usize,
            end: offsets[1] as usize,
        });
    }
    entries.sort_by_key(|e| (e.begin, e.end));
    let mut expected = 0usize;
    for e in &entries {
        if e.begin != expected {
            return Err(format!(
                "tensor {} starts at {} but the previous one ends at {expected}",
                e.name, e.begin
            ));
        }
        expected = e.end;
    }
    let data_len = file_len - 8 - header_len;
    if expected as u64 != data_len {
        return Err(format!(
            "header describes {expected} data bytes but the file holds {data_len} (truncated or padded)"
        ));
    }
    Ok(entries)
}

/// Reads a safetensors file fully, after checking its header; tensors in file order.
pub fn read_safetensors(path: &Path) -> Result<Named, String> {
    let fail = |e: String| format!("{}: {e}", path.display());
    let mut f = File::open(path).map_err(|e| fail(e.to_string()))?;
    let len = f.metadata().map_err(|e| fail(e.to_string()))?.len();
    let entries = read_header(&mut f, len).map_err(fail)?;
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(|e| fail(e.to_string()))?;
    entries
        .into_iter()
        .map(|e| {
            let t = Tensor::f_from_data_size(&data[e.begin..e.end], &e.shape, e.kind)
                .map_err(|err| fail(format!("tensor {}: {err}", e.name)))?;
            Ok((e.name, t))
        })
        .collect()
}

/// The element-wise mean of several models' weights (checkpoint averaging). Every model must
/// hold the same tensor names, in the same order, with the same shapes.
pub fn average_weights(models: Vec<Named>) -> Result<Named, String> {
    let count = models.len();
    let mut models = models.into_iter();
    let mut sum = models.next().ok_or("no weights to average")?;
    for (i, other) in models.enumerate() {
        if other.len() != sum.len() {
            return Err(format!(
                "model {} holds {} tensors, model 0 holds {}",
                i + 1,
                other.len(),
                sum.len()
            ));
        }
        for ((name, acc), (other_name, t)) in sum.iter_mut().zip(&other) {
            if name != other_name || acc.size() != t.size() {
                return Err(format!(
                    "model {} holds {other_name} {:?} where model 0 holds {name} {:?}",
                    i + 1,
                    t.size(),
                    acc.size()
                ));
            }
            *acc += t;
        }
    }
    if count > 1 {
        for (_, acc) in sum.iter_mut() {
            *acc /= count as f64;
        }
    }
    Ok(sum)
}

// ---------------------------------------------------------------------------------------
// Small helpers.

fn write_synced(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_err("creating", path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    body(&mut w).map_err(|e| io_err("writing", path, e))?;
    let file = w
        .into_inner()
        .map_err(|e| io_err("writing", path, e.into_error()))?;
    file.sync_all().map_err(|e| io_err("fsyncing", path, e))?;
    Ok(file
        .metadata()
        .map_err(|e| io_err("reading", path, e))?
        .len())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsyncing", dir, e))
}

fn dir_size(dir: &Path) -> u64 {
    [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]
        .iter()
        .filter_map(|f| fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn now_rfc3339() -> String {
    format_rfc3339(time::OffsetDateTime::now_utc())
}

fn format_rfc3339(t: time::OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn modified_rfc3339(path: &Path) -> Option<String> {
    let modified = fs::metadata(path).ok()?.modified().ok()?;
    Some(format_rfc3339(time::OffsetDateTime::from(modified)))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> TrainError {
    TrainError::Other(Reason::caused(
        format!("checkpoint: {what} {}", path.display()),
        e,
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use tch::Device;

    #[test]
    fn averaging_weights_takes_the_element_wise_mean_of_matching_tensors() {
        let model = |w: &[f32], b: f32| -> Named {
            vec![
                ("w".into(), Tensor::from_slice(w)),
                ("b".into(), Tensor::from_slice(&[b])),
            ]
        };
        let avg = average_weights(vec![
            model(&[1.0, 2.0], 3.0),
            model(&[3.0, 6.0], 5.0),
            model(&[5.0, 1.0], 1.0),
        ])
        .unwrap();
        assert_eq!(Vec::<f32>::try_from(&avg[0].1).unwrap(), [3.0, 3.0]);
        assert_eq!(Vec::<f32>::try_from(&avg[1].1).unwrap(), [3.0]);
        let single = average_weights(vec![model(&[1.0, 2.0], 3.0)]).unwrap();
        assert_eq!(Vec::<f32>::try_from(&single[0].1).unwrap(), [1.0, 2.0]);

        let renamed = vec![("v".to_string(), Tensor::from_slice(&[0f32, 0.0]))];
        let err = average_weights(vec![model(&[1.0, 2.0], 3.0), renamed]).unwrap_err();
        assert!(err.contains("1 tensors"), "{err}");
        let reshaped = model(&[1.0, 2.0, 3.0], 0.0);
        let err = average_weights(vec![model(&[1.0, 2.0], 3.0), reshaped]).unwrap_err();
        assert!(err.contains("w [3]"), "{err}");
        assert!(average_weights(Vec::new()).is_err());
    }

    fn policy(keep_latest: u32, keep_best: u32) -> CheckpointPolicy {
        CheckpointPolicy {
            every_steps: 100,
            every_seconds: None,
            keep_latest,
            keep_best,
        }
    }

    fn state(step: u64, eval_loss: Option<f64>) -> TrainerState {
        TrainerState {
            step,
            samples: step * 64,
            epoch: step / 1000,
            seed: 7,
            config_digest: "sha256:abc".into(),
            world_size: 2,
            train_loss: Some(3.25),
            eval_loss,
            eval_bleu: eval_loss.map(|l| 40.0 - l),
            time: "2026-01-02T03:04:05Z".into(),
            train_seconds: step as f64 * 0.5,
        }
    }

    fn model(scale: i64) -> Named {
        tch::manual_seed(scale);
        let opts = (Kind::Float, Device::Cpu);
        vec![
            (
                "encoder.layer0.attn.q.weight".into(),
                Tensor::randn([8 * scale, 8], opts),
            ),
            (
                "encoder.layer0.attn.q.bias".into(),
                Tensor::randn([8 * scale], opts),
            ),
            // Non-contiguous: must be written as its logical (row-major) values.
            (
                "decoder.out.weight_t".into(),
                Tensor::randn([4, 6], opts).transpose(0, 1),
            ),
            (
                "embed.half".into(),
                Tensor::randn([3, 5], (Kind::Half, Device::Cpu)),
            ),
            (
                "embed.bf16".into(),
                Tensor::randn([5], (Kind::BFloat16, Device::Cpu)),
            ),
            ("scalar.step".into(), Tensor::from(42i64)),
            ("mask".into(), Tensor::from_slice(&[true, false, true])),
            ("empty".into(), Tensor::zeros([0, 3], opts)),
            (
                "special".into(),
                Tensor::from_slice(&[f32::NAN, f32::INFINITY, -0.0, 1e-45]),
            ),
        ]
    }

    fn optimizer() -> Named {
        vec![
            ("adamw.step".into(), Tensor::from(17i64)),
            (
                "adamw.exp_avg.encoder.layer0.attn.q.weight".into(),
                Tensor::randn([8, 8], (Kind::Float, Device::Cpu)),
            ),
            (
                "adamw.exp_avg_sq.encoder.layer0.attn.q.weight".into(),
                Tensor::rand([8, 8], (Kind::Double, Device::Cpu)),
            ),
        ]
    }

    fn bytes_of(t: &Tensor) -> Vec<u8> {
        let numel = t.numel();
        let mut out = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.copy_data_u8(&mut out, numel);
        out
    }

    fn assert_same(a: &Named, b: &Named) {
        assert_eq!(a.len(), b.len());
        for ((na, ta), (nb, tb)) in a.iter().zip(b) {
            assert_eq!(na, nb);
            assert_eq!(ta.kind(), tb.kind(), "{na}");
            assert_eq!(ta.size(), tb.size(), "{na}");
            assert_eq!(bytes_of(ta), bytes_of(tb), "{na} differs bitwise");
        }
    }

    fn names(root: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn save_now(store: &mut CheckpointStore, step: u64, eval_loss: Option<f64>) {
        store
            .save(&model(1), &optimizer(), state(step, eval_loss))
            .unwrap();
        store.wait().unwrap();
    }

    #[test]
    fn step_dir_names_round_trip() {
        assert_eq!(step_dir_name(0), "step-00000000");
        assert_eq!(step_dir_name(1234), "step-00001234");
        assert_eq!(step_dir_name(123_456_789), "step-123456789");
        assert_eq!(parse_step_dir_name("step-00001234"), Some(1234));
        assert_eq!(parse_step_dir_name("step-123456789"), Some(123_456_789));
        for bad in [
            "step-1234",
            "step-0000123a",
            "step--0000123",
            "step-+0001234",
            "xstep-00001234",
            ".tmp-step-00001234-7",
        ] {
            assert_eq!(parse_step_dir_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn round_trip_keeps_names_bits_and_state() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(3, 1)).unwrap();
        assert!(store.latest().unwrap().is_none());
        assert!(store.last_completed().is_none());
        let (m, o) = (model(2), optimizer());
        let blocking = store.save(&m, &o, state(100, Some(2.5))).unwrap();
        let info = store.wait().unwrap().expect("a completed checkpoint");
        assert_eq!(info.step, 100);
        assert_eq!(info.blocking_seconds, Some(blocking));
        assert!(
            time::OffsetDateTime::parse(&info.time, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{}",
            info.time
        );
        let dir = tmp.path().join("step-00000100");
        let on_disk: u64 = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]
            .iter()
            .map(|f| fs::metadata(dir.join(f)).unwrap().len())
            .sum();
        assert_eq!(info.size_bytes, on_disk);
        assert_eq!(store.last_completed(), Some(info));
        assert_eq!(names(tmp.path()), ["step-00000100"]);

        let (latest_dir, latest_state) = store.latest().unwrap().unwrap();
        assert_eq!(latest_dir, dir);
        assert_eq!(latest_state, state(100, Some(2.5)));
        let loaded = CheckpointStore::load(&dir).unwrap();
        assert_eq!(loaded.dir, dir);
        assert_eq!(loaded.state, state(100, Some(2.5)));
        assert_same(&m, &loaded.model);
        assert_same(&o, &loaded.optimizer);
        // The non-contiguous tensor reads back with its logical layout.
        assert_eq!(loaded.model[2].1.size(), [6, 4]);
    }

    #[test]
    fn files_are_standard_safetensors() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(1, 0)).unwrap();
        save_now(&mut store, 5, None);
        // tch's reader is the reference `safetensors` crate.
        let mut theirs =
            Tensor::read_safetensors(tmp.path().join("step-00000005").join(MODEL_FILE)).unwrap();
        theirs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut ours = model(1);
        ours.sort_by(|a, b| a.0.cmp(&b.0));
        assert_same(&ours, &theirs);
        let raw = fs::read(tmp.path().join("step-00000005").join(MODEL_FILE)).unwrap();
        let header_len = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0, "data section is 8-byte aligned");
        let json = std::str::from_utf8(&raw[8..8 + header_len]).unwrap();
        assert!(json.contains("\"encoder.layer0.attn.q.weight\""), "{json}");
    }

    #[test]
    fn half_written_checkpoints_are_never_chosen() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut store = CheckpointStore::new(root, policy(100, 0)).unwrap();
        for step in [100, 200, 300, 400, 500, 600, 700] {
            save_now(&mut store, step, None);
        }
        drop(store);
        let dir = |s: u64| root.join(step_dir_name(s));
        // A crash before the rename: a complete-looking temp dir with a higher step.
        let temp = root.join(".tmp-step-00000800-4242");
        copy_dir(&dir(700), &temp);
        fs::rename(&temp, root.join("ignored")).unwrap();
        copy_dir(&dir(700), &temp);
        // A step dir without optimizer.safetensors.
        fs::remove_file(dir(700).join(OPTIMIZER_FILE)).unwrap();
        // Truncated trainer.json.
        truncate_by(&dir(600).join(STATE_FILE), 10);
        // Truncated safetensors: tensor data cut short.
        truncate_by(&dir(500).join(MODEL_FILE), 4);
        // Truncated inside the header.
        fs::write(
            dir(400).join(OPTIMIZER_FILE),
            &fs::read(dir(400).join(OPTIMIZER_FILE)).unwrap()[..20],
        )
        .unwrap();
        // Extra bytes after the data.
        let mut padded = fs::read(dir(300).join(MODEL_FILE)).unwrap();
        padded.extend_from_slice(&[0; 8]);
        fs::write(dir(300).join(MODEL_FILE), padded).unwrap();
        // trainer.json from another step.
        fs::write(
            dir(200).join(STATE_FILE),
            serde_json::to_vec(&state(900, None)).unwrap(),
        )
        .unwrap();
        // Not step directories at all.
        fs::create_dir(root.join("step-999")).unwrap();
        fs::write(root.join("step-00000999"), b"a file, not a directory").unwrap();
        fs::create_dir(root.join("tokenizer")).unwrap();

        let store = CheckpointStore::new(root, policy(100, 0)).unwrap();
        assert!(temp.exists(), "a reader removes nothing");
        let store = {
            drop(store);
            CheckpointStore::open_writer(root, policy(100, 0), writer(0)).unwrap()
        };
        assert!(!temp.exists(), "the writer removes stale temp dirs");
        assert!(root.join("tokenizer").exists() && root.join("ignored").exists());
        let (latest, st) = store.latest().unwrap().unwrap();
        assert_eq!(latest, dir(100));
        assert_eq!(st.step, 100);
        assert_eq!(store.last_completed().map(|i| i.step), Some(100));
        assert_eq!(store.complete().unwrap().len(), 1);

        for (step, needle) in [
            (500, "truncated"),
            (400, "header"),
            (300, "padded"),
            (200, "step 900"),
            (600, "trainer.json"),
            (700, "optimizer"),
        ] {
            let err = match CheckpointStore::load(&dir(step)) {
                Ok(_) => panic!("step {step} loaded"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains(needle) || err.contains("No such file"),
                "step {step}: {err}"
            );
        }
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    fn truncate_by(path: &Path, n: u64) {
        let f = fs::OpenOptions::new().write(true).open(path).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len - n).unwrap();
    }

    #[test]
    fn retention_table() {
        let l = |v: &[(u64, Option<f64>)], k: u32, b: u32| {
            retained_steps(v, k, b).into_iter().collect::<Vec<_>>()
        };
        let five = [
            (100, Some(3.0)),
            (200, Some(2.0)),
            (300, Some(2.5)),
            (400, Some(2.2)),
            (500, Some(2.4)),
        ];
        type Case = (&'static str, Vec<(u64, Option<f64>)>, u32, u32, Vec<u64>);
        let cases: Vec<Case> = vec![
            ("nothing saved", vec![], 2, 1, vec![]),
            ("one", vec![(100, None)], 1, 1, vec![100]),
            ("latest only", five.to_vec(), 2, 0, vec![400, 500]),
            (
                "latest + best older",
                five.to_vec(),
                2,
                1,
                vec![200, 400, 500],
            ),
            (
                "best already among latest",
                five.to_vec(),
                4,
                1,
                vec![200, 300, 400, 500],
            ),
            ("two best", five.to_vec(), 1, 2, vec![200, 400, 500]),
            (
                "keep more than exist",
                five.to_vec(),
                10,
                10,
                vec![100, 200, 300, 400, 500],
            ),
            (
                "keepLatest 0 still keeps the newest",
                five.to_vec(),
                0,
                1,
                vec![200, 500],
            ),
            (
                "None never best",
                vec![(100, None), (200, Some(9.0)), (300, None)],
                1,
                1,
                vec![200, 300],
            ),
            (
                "NaN never best",
                vec![(100, Some(f64::NAN)), (200, Some(9.0)), (300, None)],
                1,
                2,
                vec![200, 300],
            ),
            (
                "no eval at all",
                vec![(100, None), (200, None), (300, None)],
                1,
                3,
                vec![300],
            ),
            (
                "tie goes to newer",
                vec![(100, Some(1.0)), (200, Some(1.0)), (300, Some(5.0))],
                1,
                1,
                vec![200, 300],
            ),
            (
                "unordered input",
                vec![(500, None), (100, Some(0.5)), (300, None)],
                2,
                1,
                vec![100, 300, 500],
            ),
        ];
        for (name, input, k, b, want) in cases {
            assert_eq!(l(&input, k, b), want, "{name}");
        }
    }

    #[test]
    fn retention_on_disk_deletes_only_dropped_complete_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir(root).ok();
        fs::create_dir(root.join("tokenizer")).unwrap();
        fs::create_dir(root.join("step-00000001")).unwrap(); // broken: left for a human
        let mut store = CheckpointStore::new(root, policy(2, 1)).unwrap();
        for (step, loss) in [
            (100, Some(3.0)),
            (200, Some(1.5)),
            (300, Some(2.0)),
            (400, None),
            (500, Some(2.5)),
        ] {
            save_now(&mut store, step, loss);
        }
        assert_eq!(
            names(root),
            [
                "step-00000001",
                "step-00000200",
                "step-00000400",
                "step-00000500",
                "tokenizer"
            ]
        );
    }

    /// A hook that blocks the writer at `Started` of the given step until released, and logs
    /// every event.
    fn gate(
        store: &mut CheckpointStore,
        hold_step: u64,
    ) -> (mpsc::Sender<()>, Arc<Mutex<Vec<String>>>) {
        let (release, wait_for) = mpsc::channel::<()>();
        let wait_for = Mutex::new(wait_for);
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        store.set_save_hook(Arc::new(move |event: SaveEvent<'_>| {
            let line = match &event {
                SaveEvent::Started { step, .. } => format!("started {step}"),
                SaveEvent::FileWritten { step, file, .. } => format!("wrote {step} {file}"),
                SaveEvent::Renamed { step, .. } => format!("renamed {step}"),
            };
            lock(&log2).push(line);
            if let SaveEvent::Started { step, .. } = event
                && step == hold_step
            {
                let _ = lock(&wait_for).recv_timeout(std::time::Duration::from_secs(30));
            }
        }));
        (release, log)
    }

    #[test]
    fn save_returns_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        let (release, log) = gate(&mut store, 100);
        store
            .save(&model(4), &optimizer(), state(100, None))
            .unwrap();
        // save() returned while the writer is held before writing a byte.
        assert!(!tmp.path().join("step-00000100").exists());
        assert!(store.last_completed().is_none());
        release.send(()).unwrap();
        assert_eq!(store.wait().unwrap().map(|i| i.step), Some(100));
        assert_eq!(
            *lock(&log),
            [
                "started 100",
                "wrote 100 model.safetensors",
                "wrote 100 optimizer.safetensors",
                "wrote 100 trainer.json",
                "renamed 100"
            ]
        );
    }

    #[test]
    fn tensors_are_copied_at_save_time() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        let (release, _log) = gate(&mut store, 100);
        let mut m: Named = vec![("w".into(), Tensor::ones([16], (Kind::Float, Device::Cpu)))];
        store.save(&m, &optimizer(), state(100, None)).unwrap();
        // Training goes on and updates the weights in place while the write is pending.
        let _ = m[0].1.fill_(7.0);
        release.send(()).unwrap();
        store.wait().unwrap();
        let loaded = CheckpointStore::load(&tmp.path().join("step-00000100")).unwrap();
        assert_eq!(loaded.model[0].1.sum(Kind::Float).double_value(&[]), 16.0);
    }

    #[test]
    fn a_second_save_waits_for_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(5, 1)).unwrap();
        let (release, log) = gate(&mut store, 100);
        store
            .save(&model(1), &optimizer(), state(100, None))
            .unwrap();
        let log2 = log.clone();
        let second = std::thread::spawn(move || {
            let (m, o) = (model(1), optimizer());
            store.save(&m, &o, state(200, None)).unwrap();
            lock(&log2).push("second save returned".into());
            store.wait().unwrap();
            store
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !lock(&log).iter().any(|l| l == "second save returned"),
            "{:?}",
            lock(&log)
        );
        release.send(()).unwrap();
        let store = second.join().unwrap();
        let log = lock(&log).clone();
        let at = |s: &str| {
            log.iter()
                .position(|l| l == s)
                .unwrap_or_else(|| panic!("{s} missing in {log:?}"))
        };
        assert!(at("renamed 100") < at("second save returned"));
        assert!(at("renamed 100") < at("started 200"));
        assert_eq!(store.latest().unwrap().unwrap().1.step, 200);
    }

    #[test]
    fn a_failed_write_surfaces_at_wait_and_at_the_next_save() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("job");
        let mut store = CheckpointStore::new(&root, policy(2, 1)).unwrap();
        // The volume goes away under the trainer: root is replaced by a plain file.
        fs::remove_dir(&root).unwrap();
        fs::write(&root, b"not a directory").unwrap();
        store
            .save(&model(1), &optimizer(), state(100, None))
            .unwrap();
        let err = store.wait().unwrap_err().to_string();
        assert!(err.contains("checkpoint"), "{err}");
        store
            .save(&model(1), &optimizer(), state(200, None))
            .unwrap();
        assert!(
            store
                .save(&model(1), &optimizer(), state(300, None))
                .is_err()
        );
    }

    #[test]
    fn saving_the_same_step_twice_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        save_now(&mut store, 100, Some(4.0));
        save_now(&mut store, 100, Some(3.0));
        assert_eq!(names(tmp.path()), ["step-00000100"]);
        assert_eq!(store.latest().unwrap().unwrap().1.eval_loss, Some(3.0));
    }

    fn writer(attempt: u64) -> WriterId {
        WriterId::new(attempt, "token of the job")
    }

    fn temp_dirs(root: &Path) -> Vec<String> {
        names(root)
            .into_iter()
            .filter(|n| n.starts_with(TEMP_PREFIX))
            .collect()
    }

    #[test]
    fn a_stale_writer_cannot_commit_after_a_newer_attempt_fenced_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut old = CheckpointStore::open_writer(root, policy(3, 0), writer(1)).unwrap();
        save_now(&mut old, 100, None);
        // The old rank 0 starts a save (its SIGTERM save, or it runs on behind a partition)...
        let (release, log) = gate(&mut old, 200);
        old.save(&model(1), &optimizer(), state(200, None)).unwrap();
        while !lock(&log).iter().any(|l| l == "started 200") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(temp_dirs(root).len(), 1, "{:?}", names(root));
        assert!(temp_dirs(root)[0].contains("-a1-"), "{:?}", names(root));
        // ...and attempt 2 starts: it takes the fence and moves the old save aside.
        let new = CheckpointStore::open_writer(root, policy(3, 0), writer(2)).unwrap();
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
        release.send(()).unwrap();
        let err = old.wait().unwrap_err().to_string();
        assert!(err.contains("checkpoint"), "{err}");
        assert!(!root.join(step_dir_name(200)).exists());
        // A later save of the stale writer is refused at the fence, and leaves nothing.
        old.save(&model(1), &optimizer(), state(300, None)).unwrap();
        let err = old.wait().unwrap_err().to_string();
        assert!(
            err.contains("attempt 2 of this job took over") && err.contains("stale"),
            "{err}"
        );
        assert!(!root.join(step_dir_name(300)).exists());
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
        assert_eq!(new.latest().unwrap().unwrap().1.step, 100);
        // Nor can a stale rank 0 that starts late open the directory at all.
        let late = CheckpointStore::open_writer(root, policy(3, 0), writer(1));
        let err = late.err().expect("a stale writer is refused").to_string();
        assert!(err.contains("attempt 2 of this job took over"), "{err}");
        assert!(err.contains("attempt 1 is stale"), "{err}");
    }

    #[test]
    fn the_newer_attempts_save_in_flight_is_untouched_by_the_old_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut old = CheckpointStore::open_writer(root, policy(5, 0), writer(4)).unwrap();
        let mut new = CheckpointStore::open_writer(root, policy(5, 0), writer(5)).unwrap();
        let (release, log) = gate(&mut new, 500);
        new.save(&model(2), &optimizer(), state(500, None)).unwrap();
        while !lock(&log).iter().any(|l| l == "started 500") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let in_flight = temp_dirs(root);
        assert_eq!(in_flight.len(), 1);
        assert!(in_flight[0].contains("-a5-"), "{in_flight:?}");
        // The old writer saves the same step: refused, and only its own temp dir goes.
        old.save(&model(1), &optimizer(), state(500, None)).unwrap();
        assert!(old.wait().is_err());
        assert_eq!(temp_dirs(root), in_flight);
        release.send(()).unwrap();
        assert_eq!(new.wait().unwrap().map(|i| i.step), Some(500));
        let loaded = CheckpointStore::load(&root.join(step_dir_name(500))).unwrap();
        assert_same(&model(2), &loaded.model);
    }

    #[test]
    fn the_fence_orders_attempts_of_one_job_and_lets_a_new_job_take_over() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(3)).unwrap());
        let fence: serde_json::Value =
            serde_json::from_slice(&fs::read(root.join(FENCE_FILE)).unwrap()).unwrap();
        assert_eq!(fence["attempt"], 3);
        assert_eq!(fence["incarnation"], writer(3).incarnation.as_str());
        assert_eq!(fence["pid"], std::process::id());
        // Never the token itself.
        assert!(
            !fs::read_to_string(root.join(FENCE_FILE))
                .unwrap()
                .contains("token")
        );
        // The same attempt again (its rank 0 restarted in place), a later one: fine.
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(3)).unwrap());
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(4)).unwrap());
        assert!(CheckpointStore::open_writer(root, policy(1, 0), writer(2)).is_err());
        // A recreated job (another rendezvous token) starts at attempt 0 and takes over; the
        // old job's writer is then stale whatever its attempt.
        let mut recreated =
            CheckpointStore::open_writer(root, policy(1, 0), WriterId::new(0, "new token"))
                .unwrap();
        save_now(&mut recreated, 10, None);
        let mut old = CheckpointStore::new(root, policy(1, 0)).unwrap();
        old.writer = Some(writer(4));
        old.save(&model(1), &optimizer(), state(20, None)).unwrap();
        assert!(old.wait().is_err());
        assert_eq!(recreated.latest().unwrap().unwrap().1.step, 10);
        // Writers of an older trainer's temp dir names are swept too.
        fs::create_dir(root.join(".tmp-step-00000030-4242")).unwrap();
        drop(recreated);
        drop(
            CheckpointStore::open_writer(root, policy(1, 0), WriterId::new(1, "new token"))
                .unwrap(),
        );
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
    }

    #[test]
    fn a_save_reports_how_long_it_took_until_its_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open_writer(tmp.path(), policy(1, 0), writer(0)).unwrap();
        let blocking = store.save(&model(1), &optimizer(), state(1, None)).unwrap();
        let info = store.wait().unwrap().unwrap();
        let total = info.save_seconds.expect("measured");
        assert!(total >= blocking && total < 60.0, "{total} vs {blocking}");
    }

    /// Prints how long a transformer-sized save blocks the caller versus how long it takes
    /// in total (`cargo test --lib checkpoint::tests::measure -- --ignored --nocapture`).
    #[test]
    #[ignore = "measurement, prints numbers"]
    fn measure_60mb_save() {
        let tmp =
            tempfile::tempdir_in(std::env::var("CKPT_MEASURE_DIR").unwrap_or_else(|_| ".".into()))
                .unwrap();
        let mut store = CheckpointStore::new(tmp.path(), policy(2, 1)).unwrap();
        // ~20 MB of weights + 2x that of AdamW moments = ~60 MB, in 64 tensors.
        let opts = (Kind::Float, Device::Cpu);
        let m: Named = (0..64)
            .map(|i| (format!("layer{i}.weight"), Tensor::randn([80, 1000], opts)))
            .collect();
        let o: Named = m
            .iter()
            .flat_map(|(n, t)| {
                [
                    (format!("exp_avg.{n}"), t.randn_like()),
                    (format!("exp_avg_sq.{n}"), t.rand_like()),
                ]
            })
            .collect();
        for round in 0..3 {
            let start = Instant::now();
            let blocking = store.save(&m, &o, state(100 * (round + 1), None)).unwrap();
            let info = store.wait().unwrap().unwrap();
            let total = start.elapsed().as_secs_f64();
            println!(
                "save {round}: {} bytes, blocking {:.4}s, total {:.4}s",
                info.size_bytes, blocking, total
            );
        }
        let start = Instant::now();
        let (dir, _) = store.latest().unwrap().unwrap();
        println!("latest(): {:.4}s", start.elapsed().as_secs_f64());
        let start = Instant::now();
        CheckpointStore::load(&dir).unwrap();
        println!("load: {:.4}s", start.elapsed().as_secs_f64());
    }
}
