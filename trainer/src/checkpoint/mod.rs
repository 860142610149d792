//! Checkpoints: `<root>/step-00000000/{model,optimizer}.safetensors + trainer.json`, written
//! to a temporary directory off the training thread, fsynced and renamed, so a directory
//! named step-* is always complete. Retention keeps the newest K and the best N.
//!
//! The protocol, in order (docs/checkpoint-saves.md says the same for users):
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

mod average;
mod bucket;
mod fence;
mod io;
mod layout;
mod retention;
mod safetensors;
mod save;
mod state;
mod store;

#[cfg(test)]
mod fixtures;

pub use average::average_weights;
pub use bucket::{Bucket, MANIFEST_FILE, Manifest, is_bucket_url, mirror};
pub use fence::{FENCE_FILE, WriterId};
pub use layout::{
    MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TEMP_PREFIX, parse_step_dir_name, step_dir_name,
};
pub use retention::retained_steps;
pub use safetensors::{Named, read_safetensors, tensors_from_bytes};
pub use save::{SaveEvent, SaveHook};
pub use state::TrainerState;
pub use store::{CheckpointStore, Loaded};
