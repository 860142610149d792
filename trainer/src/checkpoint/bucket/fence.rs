//! One writer per job in the bucket: `fence.json` names it and the newest complete step when
//! it took over. It is replaced only by a conditional PUT on the ETag read (or created only if
//! absent), so of two writers claiming at once one wins and the other reads again. A writer
//! re-reads it before each manifest; since a stale writer could still pass that check just
//! before a takeover, readers also distrust a manifest of a superseded writer whose step is
//! past the fence's `claimedAfter`: nothing a stale writer commits after the takeover counts.

use std::time::SystemTime;

use ferrotrain_api::checksummed;
use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::client::Bucket;
use super::manifest::Manifest;
use crate::checkpoint::fence::{FENCE_FILE, WriterId};
use crate::error::{Reason, Result, TrainError};
use crate::rfc3339::{self, Resolution};

/// `fence.json` in the bucket.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct BucketFence {
    pub(super) writer: WriterId,
    /// The newest complete step when this writer took over (none: the bucket was empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) claimed_after: Option<u64>,
    #[serde(default)]
    pub(super) time: String,
}

impl BucketFence {
    /// Whether a manifest counts under this fence: not when its writer was superseded by this
    /// fence's and its step is past the takeover.
    pub(super) fn trusts(&self, m: &Manifest) -> Result<(), String> {
        let after = self.claimed_after.unwrap_or(0);
        let late = self.claimed_after.is_none() || m.step > after;
        if m.writer.superseded_by(&self.writer) && late {
            return Err(format!(
                "written by attempt {} after attempt {} took over the bucket (at step {after})",
                m.writer.attempt, self.writer.attempt
            ));
        }
        Ok(())
    }
}

/// The fence and its ETag, `None` when there is none. A damaged fence is refused (fail
/// closed), as on disk.
pub(super) fn read(bucket: &Bucket) -> Result<Option<(BucketFence, Option<String>)>> {
    let path = bucket.object(FENCE_FILE);
    let Some((bytes, e_tag)) = bucket.get(&path)? else {
        return Ok(None);
    };
    let fence = checksummed::open(&bytes, checksummed::CRC_FIELD).map_err(|why: String| {
        TrainError::Other(
            format!(
                "checkpoint bucket: {}/{FENCE_FILE} is not a valid fence ({why}); once no older \
                 rank 0 of this job runs, delete the object and the next attempt claims the bucket",
                bucket.url()
            )
            .into(),
        )
    })?;
    Ok(Some((fence, e_tag)))
}

fn stale(bucket: &Bucket, ours: &WriterId, fence: &BucketFence) -> TrainError {
    TrainError::Other(
        format!(
            "checkpoint bucket {}: attempt {} of this job took over ({}); this rank 0 of attempt \
             {} is stale and commits nothing",
            bucket.url(),
            fence.writer.attempt,
            fence.time,
            ours.attempt
        )
        .into(),
    )
}

/// Claims the bucket for `writer` unless a later attempt holds it; `newest` is the newest
/// complete step in the bucket now (the fence's `claimedAfter`).
pub(super) fn claim(bucket: &Bucket, writer: &WriterId, newest: Option<u64>) -> Result<()> {
    for _ in 0..5 {
        let current = read(bucket)?;
        if let Some((fence, _)) = &current
            && writer.superseded_by(&fence.writer)
        {
            return Err(stale(bucket, writer, fence));
        }
        let fence = BucketFence {
            writer: writer.clone(),
            claimed_after: newest,
            time: rfc3339::format(SystemTime::now(), Resolution::Second),
        };
        let bytes = checksummed::seal(&fence, checksummed::CRC_FIELD).map_err(|e| {
            TrainError::Other(Reason::caused("checkpoint bucket: encoding the fence", e))
        })?;
        let mode = match current {
            Some((_, e_tag)) => PutMode::Update(UpdateVersion {
                e_tag,
                version: None,
            }),
            None => PutMode::Create,
        };
        if put_fence(bucket, bytes, PutOptions::from(mode))? {
            return Ok(());
        }
        // Another writer replaced it between our read and our write: read again.
    }
    Err(TrainError::Other(
        format!(
            "checkpoint bucket {}: other writers keep replacing {FENCE_FILE}",
            bucket.url()
        )
        .into(),
    ))
}

/// Writes the fence if it is still the one read (`opts`); false when another writer replaced
/// it first. A try whose answer was lost but that was written reads as replaced: the next
/// round reads our own fence back and writes it again.
fn put_fence(bucket: &Bucket, bytes: Vec<u8>, opts: PutOptions) -> Result<bool> {
    let path = bucket.object(FENCE_FILE);
    let payload = PutPayload::from(bytes);
    bucket.retried("claiming the fence", || {
        let put = bucket.block_on(bucket.store.put_opts(&path, payload.clone(), opts.clone()));
        match put {
            Ok(_) => Ok(true),
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    })
}

/// Ok while `writer` holds the bucket's fence.
pub(super) fn still_owner(bucket: &Bucket, writer: &WriterId) -> Result<()> {
    match read(bucket)? {
        Some((fence, _)) if fence.writer == *writer => Ok(()),
        Some((fence, _)) => Err(stale(bucket, writer, &fence)),
        None => Err(TrainError::Other(
            format!(
                "checkpoint bucket {}: {FENCE_FILE} vanished; not committing",
                bucket.url()
            )
            .into(),
        )),
    }
}
