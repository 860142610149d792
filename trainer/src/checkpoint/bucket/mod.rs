//! Checkpoints in an S3-compatible bucket (`checkpoint.store`): each checkpoint committed to
//! the local directory is uploaded off the training thread, and a start with nothing newer on
//! disk resumes from the bucket. The same guarantees as on disk:
//!
//! - A checkpoint counts once complete: `<job>/step-XXXXXXXX/` holds model.safetensors,
//!   optimizer.safetensors and trainer.json, then `manifest.json` ([`Manifest`]: every file's
//!   size and CRC-32C, the writer), written last. Files without a manifest (an upload cut
//!   short) are never read and are removed once a newer checkpoint is complete.
//! - One writer: `<job>/fence.json` in the bucket names the writer, replaced only by a
//!   conditional PUT on the ETag read (compare-and-swap); a writer re-reads it before each
//!   manifest, and a manifest a superseded writer wrote after the takeover (a step past the
//!   fence's `claimedAfter`) is not trusted ([`fence`]).
//! - Retention as on disk, each dropped checkpoint's manifest deleted first.
//! - A download is checked against the manifest (sizes and CRC-32C) and then like any local
//!   checkpoint before it is renamed into the local directory.
//! - A store that fails never costs a checkpoint: every request is retried on transient
//!   faults within a bound ([`retry`]); past it a start fails and an upload does not count.
//!   Only a manifest read in full and found wrong is skipped, and retention and the fence act
//!   only on what was read in full ([`listing`]).

mod attach;
mod client;
mod fence;
mod listing;
mod manifest;
mod mirror;
mod retry;
mod transfer;
mod uploader;

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod faulty;
#[cfg(test)]
mod s3_errors;
#[cfg(test)]
mod tests;

pub use attach::attach;
pub use client::Bucket;
pub use manifest::{MANIFEST_FILE, Manifest};
pub use mirror::{is_bucket_url, mirror};
pub use uploader::Uploader;
