//! Which checkpoints in the bucket are complete: a sealed manifest naming its own step, files
//! of the sizes it lists, and a writer the fence still trusts for that step.

use super::client::Bucket;
use super::fence::{self, BucketFence};
use super::manifest::{MANIFEST_FILE, Manifest};
use crate::error::Result;

impl Bucket {
    /// Every checkpoint complete in the bucket, oldest first: a manifest that is sealed,
    /// names its own step, lists files of the sizes the bucket holds, and was not written by
    /// a writer superseded before it (see [`fence`]). Anything else is skipped with a warning
    /// naming the object.
    pub fn complete(&self) -> Result<Vec<Manifest>> {
        let fence = fence::read(self)?.map(|(f, _)| f);
        let mut out = Vec::new();
        for (step, files) in self.list_steps()? {
            if !files.iter().any(|(name, _)| name == MANIFEST_FILE) {
                continue;
            }
            let path = self.step_object(step, MANIFEST_FILE);
            match self.manifest(step, &files, fence.as_ref()) {
                Ok(m) => out.push(m),
                Err(why) => {
                    tracing::warn!(object = %path, reason = %why, "skipping a checkpoint in the bucket")
                }
            }
        }
        Ok(out)
    }

    fn manifest(
        &self,
        step: u64,
        listed: &[(String, u64)],
        fence: Option<&BucketFence>,
    ) -> Result<Manifest, String> {
        let path = self.step_object(step, MANIFEST_FILE);
        let (bytes, _) = self
            .get(&path)
            .map_err(|e| e.to_string())?
            .ok_or("the manifest vanished")?;
        let m = Manifest::decode(&bytes)?;
        if m.step != step {
            return Err(format!("the manifest says step {}", m.step));
        }
        m.check_sizes(listed)?;
        if let Some(fence) = fence {
            fence.trusts(&m)?;
        }
        Ok(m)
    }
}
