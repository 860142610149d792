//! A writer opening its job's bucket: claim the fence after the newest complete checkpoint,
//! fetch the bucket's newest checkpoint when the local directory has nothing as new (a new
//! node, an emptyDir, a lost claim), and start the upload thread. Each step acts on what was
//! read in full: a store failing past its retries fails the start (retried by the launcher or
//! the operator), never a checkpoint skipped.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ferrotrain_api::DurableCheckpoint;
use ferrotrain_api::config::CheckpointPolicy;

use super::client::Bucket;
use super::fence;
use super::listing::Survey;
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
    let complete = take_over(&bucket, writer, bucket.survey()?)?;
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

/// Claims the bucket after the newest complete checkpoint of `survey` (every one of them stays
/// trusted), then lists it again: a checkpoint the previous writer committed between the
/// survey and the claim (it read the fence before the claim) was committed before the
/// takeover, and the claim moves past it. The complete checkpoints, oldest first.
fn take_over(bucket: &Bucket, writer: &WriterId, survey: Survey) -> Result<Vec<Manifest>> {
    let mut complete = survey.complete;
    let newest = complete.last().map(|m| m.step);
    fence::claim(bucket, writer, newest)?;
    let late = bucket.complete_past(newest, survey.fence.as_ref())?;
    if let Some(m) = late.last() {
        tracing::info!(
            step = m.step,
            "a checkpoint was committed during the takeover: claiming after it"
        );
        fence::claim(bucket, writer, Some(m.step))?;
        complete.extend(late);
    }
    Ok(complete)
}

/// Downloads the newest complete checkpoint of the bucket newer than `local` into `root`; a
/// damaged one (what it holds is not what its manifest says) is skipped (named) for the next
/// older. A store that fails past its retries is an error (the round or attempt is retried):
/// training from an older state than the bucket holds would lose what it holds.
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
