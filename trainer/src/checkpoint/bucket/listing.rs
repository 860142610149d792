//! Which checkpoints in the bucket are complete: a sealed manifest naming its own step, files
//! of the sizes it lists, and a writer the fence still trusts for that step. Only a manifest
//! read in full and found wrong is skipped; one that could not be read fails the survey, so
//! that nothing (a start, the fence's `claimedAfter`, retention) acts on a partial view.

use std::collections::BTreeMap;

use super::client::Bucket;
use super::fence::{self, BucketFence};
use super::manifest::{MANIFEST_FILE, Manifest};
use crate::error::Result;

/// What the bucket holds, from one listing read in full and every manifest in it read in
/// full.
#[derive(Debug)]
pub(super) struct Survey {
    /// The fence when the survey began.
    pub(super) fence: Option<BucketFence>,
    /// Every object under `step-*/`, by step: (file name, size).
    pub(super) steps: BTreeMap<u64, Vec<(String, u64)>>,
    /// The complete checkpoints among them, oldest first.
    pub(super) complete: Vec<Manifest>,
}

impl Bucket {
    /// Every checkpoint complete in the bucket, oldest first (see [`Bucket::survey`]).
    pub fn complete(&self) -> Result<Vec<Manifest>> {
        Ok(self.survey()?.complete)
    }

    /// Reads the fence, the listing and every manifest in it. A manifest counts when it is
    /// sealed, names its own step, lists files of the sizes the bucket holds, and was not
    /// written by a writer superseded before it (see [`fence`]); any other is skipped with a
    /// warning naming the object. A fence, listing or manifest that could not be read (the
    /// store failing past its retries) is an error: never a skip.
    pub(super) fn survey(&self) -> Result<Survey> {
        let fence = fence::read(self)?.map(|(f, _)| f);
        let steps = self.list_steps()?;
        let complete = self.complete_among(&steps, fence.as_ref(), None)?;
        Ok(Survey {
            fence,
            steps,
            complete,
        })
    }

    /// The checkpoints complete in the bucket now past step `after`, judged under `fence`
    /// (one read earlier): what a writer committed since a survey under that fence.
    pub(super) fn complete_past(
        &self,
        after: Option<u64>,
        fence: Option<&BucketFence>,
    ) -> Result<Vec<Manifest>> {
        let steps = self.list_steps()?;
        self.complete_among(&steps, fence, after)
    }

    /// The complete checkpoints among `steps` (past `after`, if given), oldest first.
    fn complete_among(
        &self,
        steps: &BTreeMap<u64, Vec<(String, u64)>>,
        fence: Option<&BucketFence>,
        after: Option<u64>,
    ) -> Result<Vec<Manifest>> {
        let mut complete = Vec::new();
        for (&step, files) in steps.range(after.map_or(0, |a| a + 1)..) {
            if !files.iter().any(|(name, _)| name == MANIFEST_FILE) {
                continue;
            }
            let path = self.step_object(step, MANIFEST_FILE);
            // Gone since the listing: another writer's retention removed it.
            let Some((bytes, _)) = self.get(&path)? else {
                tracing::warn!(object = %path, "a manifest in the listing is gone; skipping it");
                continue;
            };
            match judge(step, &bytes, files, fence) {
                Ok(m) => complete.push(m),
                Err(why) => {
                    tracing::warn!(object = %path, reason = %why, "skipping a checkpoint in the bucket")
                }
            }
        }
        Ok(complete)
    }
}

/// The manifest of step `step` read in full (`bytes`), if it counts; else what is wrong.
fn judge(
    step: u64,
    bytes: &[u8],
    listed: &[(String, u64)],
    fence: Option<&BucketFence>,
) -> Result<Manifest, String> {
    let m = Manifest::decode(bytes)?;
    if m.step != step {
        return Err(format!("the manifest says step {}", m.step));
    }
    m.check_sizes(listed)?;
    if let Some(fence) = fence {
        fence.trusts(&m)?;
    }
    Ok(m)
}
