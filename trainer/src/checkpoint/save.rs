//! The background write of one checkpoint: a temporary directory, each file written and
//! fsynced, the directory renamed into place and its parent fsynced, then retention. The
//! fence is checked once the temporary directory exists, before the rename and before
//! retention. A save that fails removes its temporary directory: on a full disk, what it
//! wrote is given back.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ferrotrain_api::CheckpointInfo;
use ferrotrain_api::config::CheckpointPolicy;

use super::fence::{WriterId, still_owner, temp_dir_name};
use super::io::{io_err, sync_dir, write_synced};
use super::layout::{MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TEMP_PREFIX, step_dir_name};
use super::retention::apply_retention;
use super::safetensors::{Snapshot, write_safetensors};
use super::state::TrainerState;
use crate::error::{Reason, Result, TrainError};
use crate::rfc3339::{self, Resolution};

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

/// A save handed to the background thread: the tensors already copied out of libtorch.
pub(super) struct SaveJob {
    pub(super) root: PathBuf,
    pub(super) policy: CheckpointPolicy,
    pub(super) model: Vec<Snapshot>,
    pub(super) optimizer: Vec<Snapshot>,
    pub(super) state: TrainerState,
    pub(super) blocking: f64,
    /// When `save` was called: `saveSeconds` runs from here to the commit.
    pub(super) started: Instant,
    pub(super) hook: Option<SaveHook>,
    pub(super) writer: Option<WriterId>,
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

    pub(super) fn run(self) -> Result<CheckpointInfo> {
        let step = self.state.step;
        let temp = self.root.join(temp_dir_name(step, self.writer.as_ref()));
        let dir = self.root.join(step_dir_name(step));
        let written = self.write(&temp, &dir);
        if written.is_err() {
            discard(&temp);
        }
        written
    }

    fn write(&self, temp: &Path, dir: &Path) -> Result<CheckpointInfo> {
        let step = self.state.step;
        if temp.exists() {
            fs::remove_dir_all(temp).map_err(|e| io_err("removing", temp, e))?;
        }
        fs::create_dir(temp).map_err(|e| io_err("creating", temp, e))?;
        let hook = |event: SaveEvent<'_>| {
            if let Some(h) = &self.hook {
                h(event)
            }
        };
        hook(SaveEvent::Started {
            step,
            temp_dir: temp,
        });
        // Checked once the temporary directory exists: a newer writer that fenced us before
        // it was created is seen here; one that fences us later moves it aside.
        self.check_fence(Some(temp))?;

        let mut size = 0;
        size += write_safetensors(&temp.join(MODEL_FILE), &self.model)?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: temp,
            file: MODEL_FILE,
        });
        size += write_safetensors(&temp.join(OPTIMIZER_FILE), &self.optimizer)?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: temp,
            file: OPTIMIZER_FILE,
        });
        let json = self.state.encode().map_err(|e| {
            TrainError::Other(Reason::caused("checkpoint: encoding trainer.json", e))
        })?;
        size += write_synced(&temp.join(STATE_FILE), |w| w.write_all(&json))?;
        hook(SaveEvent::FileWritten {
            step,
            temp_dir: temp,
            file: STATE_FILE,
        });
        sync_dir(temp)?;
        self.check_fence(Some(temp))?;

        // The same step can be saved twice (a periodic save that is also the final one, or
        // a re-run over a step whose directory is corrupt): move the old one out of the way.
        // A crash between the two renames leaves the older checkpoints, never a partial one.
        let replaced = self.root.join(format!(
            "{TEMP_PREFIX}{step:08}-{}-replaced",
            std::process::id()
        ));
        let had_old = dir.exists();
        if had_old {
            fs::rename(dir, &replaced).map_err(|e| io_err("moving aside", dir, e))?;
        }
        if let Err(e) = fs::rename(temp, dir) {
            // The old one back where it was: this save failing must not cost it.
            if had_old && let Err(back) = fs::rename(&replaced, dir) {
                tracing::warn!(dir = %replaced.display(), error = %back, "cannot put a replaced checkpoint back");
            }
            return Err(io_err("renaming", temp, e));
        }
        sync_dir(&self.root)?;
        if had_old && let Err(e) = fs::remove_dir_all(&replaced) {
            tracing::warn!(dir = %replaced.display(), error = %e, "cannot remove a replaced checkpoint");
        }
        hook(SaveEvent::Renamed { step, dir });

        let info = CheckpointInfo {
            step,
            size_bytes: size,
            time: rfc3339::format(SystemTime::now(), Resolution::Second),
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

/// Removes what a failed save left of `temp` (nothing when it was never made, or a fence
/// check or a newer writer already removed it).
fn discard(temp: &Path) {
    match fs::remove_dir_all(temp) {
        Ok(()) => {
            tracing::info!(dir = %temp.display(), "removed a failed save's temporary directory")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %temp.display(), error = %e, "cannot remove a failed save's temporary directory")
        }
    }
}
