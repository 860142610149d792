//! Moving one checkpoint between the local directory and the bucket: an upload (every file,
//! multipart when large, then the manifest once the fence still names us), a download
//! (checked against the manifest, then as any local checkpoint, then renamed into place), and
//! retention in the bucket (manifests first).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ferrotrain_api::config::CheckpointPolicy;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};

use super::client::Bucket;
use super::fence;
use super::manifest::{MANIFEST_FILE, Manifest, ManifestFile, crc_hex};
use super::retry::TryError;
use crate::checkpoint::fence::WriterId;
use crate::checkpoint::io::{io_err, sync_dir, write_synced};
use crate::checkpoint::layout::{
    MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TEMP_PREFIX, inspect, step_dir_name,
};
use crate::checkpoint::retention::retained_steps;
use crate::error::{Reason, Result, TrainError};
use crate::rfc3339::{self, Resolution};

/// The files of a checkpoint, in the order they are uploaded (the manifest comes after).
pub(super) const FILES: [&str; 3] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];
/// Parts in flight at once per file.
const PARTS_IN_FLIGHT: usize = 4;

/// Why a download did not complete.
#[derive(Debug)]
pub enum Download {
    /// What the bucket holds is not what the manifest says (a file of another size or CRC,
    /// missing, or a checkpoint that does not read back): skip it for an older one.
    Damaged(String),
    /// The store or the local disk failed (unreachable, refused, full): try again later,
    /// never train from an older state instead.
    Failed(TrainError),
}

impl Bucket {
    /// Uploads the committed checkpoint in `dir` (step `step`) and commits it with its
    /// manifest, unless a later writer holds the fence. The files are read as they go up:
    /// the CRC-32C in the manifest is of the bytes sent. Returns the bytes sent.
    pub(super) fn upload(
        &self,
        dir: &Path,
        step: u64,
        eval_loss: Option<f64>,
        writer: &WriterId,
    ) -> Result<u64> {
        let mut files = Vec::new();
        let mut bytes = 0;
        for name in FILES {
            let file = self.upload_file(&dir.join(name), step, name)?;
            bytes += file.size;
            files.push(file);
        }
        let manifest = Manifest {
            step,
            files,
            writer: writer.clone(),
            time: rfc3339::format(SystemTime::now(), Resolution::Second),
            eval_loss,
        };
        self.commit(&manifest)?;
        Ok(bytes)
    }

    /// Writes `manifest` if its writer still holds the fence, read again before each try: a
    /// writer superseded while the PUT was being retried must not commit after the takeover.
    /// Read once more after the PUT: a takeover in between may or may not count the
    /// checkpoint (it does when the PUT landed first), so it is not reported durable.
    fn commit(&self, manifest: &Manifest) -> Result<()> {
        let body = PutPayload::from(manifest.encode().map_err(|e| {
            TrainError::Other(Reason::caused("checkpoint bucket: encoding a manifest", e))
        })?);
        let path = self.step_object(manifest.step, MANIFEST_FILE);
        self.retried(&format!("writing {path}"), || {
            fence::still_owner(self, &manifest.writer).map_err(TryError::Stop)?;
            self.block_on(self.store.put(&path, body.clone()))?;
            Ok::<_, TryError>(())
        })?;
        fence::still_owner(self, &manifest.writer)
    }

    /// Uploads one file (in parts above the bucket's part size); its name, size and CRC-32C.
    fn upload_file(&self, local: &Path, step: u64, name: &str) -> Result<ManifestFile> {
        let path = self.step_object(step, name);
        let len = fs::metadata(local)
            .map_err(|e| io_err("reading", local, e))?
            .len();
        let (crc, size) = if len < self.part_bytes as u64 {
            let body = fs::read(local).map_err(|e| io_err("reading", local, e))?;
            let sums = (crc32c::crc32c(&body), body.len() as u64);
            self.put(&path, PutPayload::from(body), "uploading")?;
            sums
        } else {
            // A multipart upload that fails is aborted and started again from the first byte.
            self.retried(&format!("uploading {path}"), || {
                self.put_parts(local, &path)
            })?
        };
        Ok(ManifestFile {
            name: name.to_string(),
            size,
            crc32c: crc_hex(crc),
        })
    }

    /// Uploads `local` as `path` in parts of the bucket's part size, [`PARTS_IN_FLIGHT`] at
    /// once; its CRC-32C and size. A failure aborts the upload (no parts left behind on the
    /// store).
    fn put_parts(&self, local: &Path, path: &ObjectPath) -> Result<(u32, u64), TryError> {
        let disk = |what, e| TryError::Stop(io_err(what, local, e));
        let mut file = File::open(local).map_err(|e| disk("opening", e))?;
        // The parts go up as tasks of the bucket's runtime, spawned by `write`.
        let _runtime = self.enter_runtime();
        let upload = self.block_on(self.store.put_multipart(path))?;
        let mut parts = WriteMultipart::new_with_chunk_size(upload, self.part_bytes);
        let (mut crc, mut size, mut chunk) = (0u32, 0u64, vec![0; self.part_bytes]);
        loop {
            let n = match read_full(&mut file, &mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = self.block_on(parts.abort());
                    return Err(disk("reading", e));
                }
            };
            crc = crc32c::crc32c_append(crc, &chunk[..n]);
            size += n as u64;
            if let Err(e) = self.block_on(parts.wait_for_capacity(PARTS_IN_FLIGHT)) {
                let _ = self.block_on(parts.abort());
                return Err(e.into());
            }
            parts.write(&chunk[..n]);
        }
        // Every part sent before the completion, so that a failed part aborts the upload too.
        if let Err(e) = self.block_on(parts.wait_for_capacity(0)) {
            let _ = self.block_on(parts.abort());
            return Err(e.into());
        }
        self.block_on(parts.finish())?;
        Ok((crc, size))
    }

    /// Downloads checkpoint `m` into `root` as `step-XXXXXXXX/`: into a temporary directory,
    /// each file checked against the manifest's size and CRC-32C, then the checkpoint as a
    /// whole (trainer.json, the safetensors' data), then renamed into place.
    pub fn download(&self, m: &Manifest, root: &Path) -> Result<PathBuf, Download> {
        let temp = root.join(format!(
            "{TEMP_PREFIX}{:08}-download-{}",
            m.step,
            std::process::id()
        ));
        let local = |what: &str, path: &Path, e| Download::Failed(io_err(what, path, e));
        if temp.exists() {
            fs::remove_dir_all(&temp).map_err(|e| local("removing", &temp, e))?;
        }
        fs::create_dir_all(&temp).map_err(|e| local("creating", &temp, e))?;
        let dir = root.join(step_dir_name(m.step));
        let done = self.download_into(m, &temp).and_then(|()| {
            inspect(&temp, m.step, true).map_err(Download::Damaged)?;
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(|e| local("replacing", &dir, e))?;
            }
            fs::rename(&temp, &dir).map_err(|e| local("renaming", &temp, e))?;
            sync_dir(root).map_err(Download::Failed)
        });
        if done.is_err() {
            let _ = fs::remove_dir_all(&temp);
        }
        done.map(|()| dir)
    }

    fn download_into(&self, m: &Manifest, temp: &Path) -> Result<(), Download> {
        for want in &m.files {
            let path = self.step_object(m.step, &want.name);
            let (body, _) = self
                .get(&path)
                .map_err(Download::Failed)?
                .ok_or_else(|| Download::Damaged(format!("{path} vanished")))?;
            let crc = crc_hex(crc32c::crc32c(&body));
            if body.len() as u64 != want.size || crc != want.crc32c {
                return Err(Download::Damaged(format!(
                    "{path} holds {} bytes with CRC-32C {crc}; the manifest says {} bytes, {}",
                    body.len(),
                    want.size,
                    want.crc32c
                )));
            }
            write_synced(&temp.join(&want.name), |w| w.write_all(&body))
                .map_err(Download::Failed)?;
        }
        sync_dir(temp).map_err(Download::Failed)
    }

    /// Retention in the bucket, by `writer` while it holds the fence: the steps `policy`
    /// keeps among the complete ones; each other checkpoint loses its manifest first (it
    /// stops counting), then its files. Files of an upload cut short (no manifest) older than
    /// the newest complete checkpoint go too. It acts on a [`Bucket::survey`] read in full:
    /// when anything could not be read, it deletes nothing.
    pub(super) fn retain(&self, policy: &CheckpointPolicy, writer: &WriterId) -> Result<()> {
        let survey = self.survey()?;
        if survey.fence.as_ref().is_none_or(|f| f.writer != *writer) {
            // Another writer took over: retention is its own.
            return Ok(());
        }
        let complete = &survey.complete;
        let scored: Vec<_> = complete.iter().map(|m| (m.step, m.eval_loss)).collect();
        let keep = retained_steps(&scored, policy.keep_latest, policy.keep_best);
        let Some(newest) = complete.last().map(|m| m.step) else {
            return Ok(());
        };
        for (step, files) in survey.steps {
            let counted = complete.iter().any(|m| m.step == step);
            if keep.contains(&step) || (!counted && step >= newest) {
                continue;
            }
            let mut names: Vec<_> = files.into_iter().map(|(name, _)| name).collect();
            names.sort_by_key(|n| n != MANIFEST_FILE);
            for name in names {
                self.delete(&self.step_object(step, &name))?;
            }
            tracing::info!(step, bucket = %self.url(), "removed checkpoint from the bucket (retention)");
        }
        Ok(())
    }
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
