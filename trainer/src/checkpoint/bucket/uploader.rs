//! The upload thread: each checkpoint committed locally is handed over (its files hard-linked
//! aside, so local retention cannot delete them mid-upload) and sent to the bucket while
//! training goes on. One upload at a time; a checkpoint committed while one is in flight
//! waits, and a newer one replaces it (uploads never fall further behind than one
//! checkpoint). A failed upload is reported in the progress (`durableCheckpoint.uploadError`)
//! and does not stop training: the next checkpoint is uploaded in full.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ferrotrain_api::DurableCheckpoint;
use ferrotrain_api::config::CheckpointPolicy;

use super::client::Bucket;
use super::transfer::FILES;
use crate::checkpoint::fence::WriterId;
use crate::checkpoint::io::io_err;
use crate::checkpoint::layout::TEMP_PREFIX;
use crate::error::Result;
use crate::lock::lock;
use crate::rfc3339::{self, Resolution};

/// A committed checkpoint waiting for its upload.
struct Job {
    /// Hard links of its files, removed after the upload.
    dir: PathBuf,
    step: u64,
    eval_loss: Option<f64>,
    /// When its save started (`durableSeconds` counts from here).
    started: Instant,
}

#[derive(Default)]
struct Queue {
    next: Option<Job>,
    busy: bool,
    closed: bool,
    durable: Option<DurableCheckpoint>,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// Uploads committed checkpoints to the bucket in the background.
pub struct Uploader {
    bucket: Arc<Bucket>,
    shared: Arc<Shared>,
}

impl Uploader {
    /// Starts the upload thread for `writer`; `durable` is the bucket's newest complete
    /// checkpoint at start.
    pub fn start(
        bucket: Arc<Bucket>,
        writer: WriterId,
        policy: CheckpointPolicy,
        durable: Option<DurableCheckpoint>,
    ) -> Result<Uploader> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                durable,
                ..Queue::default()
            }),
            changed: Condvar::new(),
        });
        let worker = Worker {
            bucket: bucket.clone(),
            shared: shared.clone(),
            writer,
            policy,
        };
        std::thread::Builder::new()
            .name("checkpoint-upload".into())
            .spawn(move || worker.run())
            .map_err(|e| io_err("starting the upload thread for", Path::new(bucket.url()), e))?;
        Ok(Uploader { bucket, shared })
    }

    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Hands the checkpoint committed in `dir` to the upload thread.
    pub fn enqueue(&self, dir: &Path, step: u64, eval_loss: Option<f64>, started: Instant) {
        let root = dir.parent().unwrap_or(dir);
        let aside = root.join(format!(
            "{TEMP_PREFIX}{step:08}-upload-{}",
            std::process::id()
        ));
        if let Err(e) = link_files(dir, &aside) {
            tracing::warn!(step, error = %e, "cannot hand a checkpoint to its upload; the next one goes up");
            return;
        }
        let job = Job {
            dir: aside,
            step,
            eval_loss,
            started,
        };
        let mut q = lock(&self.shared.queue);
        if let Some(replaced) = q.next.replace(job) {
            tracing::info!(
                step = replaced.step,
                newer = step,
                "a newer checkpoint replaces one still waiting for its upload"
            );
            let _ = fs::remove_dir_all(&replaced.dir);
        }
        self.shared.changed.notify_all();
    }

    /// The newest checkpoint complete in the bucket, with the last upload's error if it failed.
    pub fn durable(&self) -> Option<DurableCheckpoint> {
        lock(&self.shared.queue).durable.clone()
    }

    /// Waits until every checkpoint handed over is in the bucket (or failed), at most
    /// `limit`. True when nothing is left to upload.
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut q = lock(&self.shared.queue);
        while q.busy || q.next.is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = self
                .shared
                .changed
                .wait_timeout(q, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

impl Drop for Uploader {
    /// The thread stops after the upload in flight; what is still waiting is left (the caller
    /// flushes first when it must be durable).
    fn drop(&mut self) {
        let mut q = lock(&self.shared.queue);
        q.closed = true;
        if let Some(job) = q.next.take() {
            let _ = fs::remove_dir_all(&job.dir);
        }
        self.shared.changed.notify_all();
    }
}

struct Worker {
    bucket: Arc<Bucket>,
    shared: Arc<Shared>,
    writer: WriterId,
    policy: CheckpointPolicy,
}

impl Worker {
    fn run(self) {
        while let Some(job) = self.next_job() {
            let outcome = self.upload(&job);
            let _ = fs::remove_dir_all(&job.dir);
            let mut q = lock(&self.shared.queue);
            match outcome {
                Ok(durable) => q.durable = Some(durable),
                Err(why) => {
                    let mut durable = q.durable.take().unwrap_or_default();
                    durable.upload_error = Some(why);
                    q.durable = Some(durable);
                }
            }
            q.busy = false;
            self.shared.changed.notify_all();
        }
    }

    fn next_job(&self) -> Option<Job> {
        let mut q = lock(&self.shared.queue);
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.next.take() {
                q.busy = true;
                return Some(job);
            }
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn upload(&self, job: &Job) -> Result<DurableCheckpoint, String> {
        let began = Instant::now();
        let bytes = self
            .bucket
            .upload(&job.dir, job.step, job.eval_loss, &self.writer)
            .map_err(|e| {
                let why = format!("step {}: {e}", job.step);
                tracing::warn!(step = job.step, error = %e, "checkpoint upload failed; it stays on the local disk only");
                why
            })?;
        let seconds = began.elapsed().as_secs_f64();
        let durable = DurableCheckpoint {
            step: job.step,
            url: self.bucket.step_url(job.step),
            time: rfc3339::format(SystemTime::now(), Resolution::Second),
            durable_seconds: Some(job.started.elapsed().as_secs_f64()),
            upload_bytes_per_second: Some(bytes as f64 / seconds.max(1e-6)),
            upload_error: None,
        };
        tracing::info!(
            step = job.step,
            bytes,
            upload_seconds = seconds,
            "checkpoint step {} durable in {}",
            job.step,
            durable.url
        );
        if let Err(e) = self.bucket.retain(&self.policy, &self.writer) {
            tracing::warn!(error = %e, "bucket retention failed; old checkpoints are kept");
        }
        Ok(durable)
    }
}

/// Hard-links (or, across file systems, copies) a checkpoint's files into `aside`.
fn link_files(dir: &Path, aside: &Path) -> Result<()> {
    if aside.exists() {
        fs::remove_dir_all(aside).map_err(|e| io_err("removing", aside, e))?;
    }
    fs::create_dir(aside).map_err(|e| io_err("creating", aside, e))?;
    for name in FILES {
        let (from, to) = (dir.join(name), aside.join(name));
        if fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to).map_err(|e| io_err("copying", &from, e))?;
        }
    }
    Ok(())
}
