//! A writer opening its job's bucket: claim the fence, fetch the bucket's newest checkpoint
//! when the local directory has nothing as new (a new node, an emptyDir, a lost claim), and
//! start the upload thread.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ferrotrain_api::DurableCheckpoint;
use ferrotrain_api::config::CheckpointPolicy;

use super::client::Bucket;
use super::fence;
use super::manifest::Manifest;
use super::transfer::Download;
use super::uploader::Uploader;
use crate::checkpoint::fence::WriterId;
use crate::checkpoint::layout::newest_complete;
use crate::error::Result;

/// Opens `bucket` (the job's, whose local directory is `root`) as `writer`'s, resumable from
/// and uploading to.
pub fn attach(
    root: &Path,
    bucket: Bucket,
    policy: &CheckpointPolicy,
    writer: &WriterId,
) -> Result<Uploader> {
    // Read once: claiming after the newest complete step leaves every one of them trusted.
    let complete = bucket.complete()?;
    fence::claim(&bucket, writer, complete.last().map(|m| m.step))?;
    let local = newest_complete(root)?.map(|(_, s)| s.step);
    fetch_newer(&bucket, &complete, local, root)?;
    let durable = complete.last().map(|m| DurableCheckpoint {
        step: m.step,
        url: bucket.step_url(m.step),
        time: m.time.clone(),
        ..DurableCheckpoint::default()
    });
    Uploader::start(Arc::new(bucket), writer.clone(), policy.clone(), durable)
}

/// Downloads the newest complete checkpoint of the bucket newer than `local` into `root`; a
/// damaged one is skipped (named) for the next older. A store that fails mid-way is an error
/// (the round or attempt is retried): training from an older state than the bucket holds
/// would lose what it holds.
fn fetch_newer(
    bucket: &Bucket,
    complete: &[Manifest],
    local: Option<u64>,
    root: &Path,
) -> Result<()> {
    for m in complete.iter().rev() {
        if local.is_some_and(|step| step >= m.step) {
            return Ok(());
        }
        let began = Instant::now();
        match bucket.download(m, root) {
            Ok(_) => {
                let bytes: u64 = m.files.iter().map(|f| f.size).sum();
                let seconds = began.elapsed().as_secs_f64();
                tracing::info!(
                    step = m.step,
                    bytes,
                    seconds,
                    "resuming from the bucket: downloaded step {} from {} ({:.1} MB/s)",
                    m.step,
                    bucket.step_url(m.step),
                    bytes as f64 / 1e6 / seconds.max(1e-6)
                );
                return Ok(());
            }
            Err(Download::Damaged(why)) => tracing::warn!(
                step = m.step,
                checkpoint = %bucket.step_url(m.step),
                reason = %why,
                "skipping a damaged checkpoint of the bucket"
            ),
            Err(Download::Failed(e)) => return Err(e),
        }
    }
    Ok(())
}
