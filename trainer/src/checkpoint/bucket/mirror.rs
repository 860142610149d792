//! A job's bucket read from anywhere: `ferrotrain select --job s3://...` and `translate
//! --checkpoint s3://...` mirror the job's files and complete checkpoints into a local cache
//! (each checked as a resume checks it; those already there are not fetched again) and work
//! on the copy.

use std::io::Write;
use std::path::{Path, PathBuf};

use ferrotrain_api::config::{BucketUrl, ObjectStore as StoreConfig};

use super::client::Bucket;
use super::transfer::Download;
use crate::checkpoint::io::{io_err, write_synced};
use crate::checkpoint::layout::{complete_checkpoints, parse_step_dir_name, step_dir_name};
use crate::error::{Result, TrainError};

/// Whether a path argument names a bucket.
pub fn is_bucket_url(arg: &Path) -> bool {
    arg.to_str().is_some_and(|s| s.starts_with("s3://"))
}

/// Mirrors `s3://BUCKET/PREFIX/JOB[/step-XXXXXXXX]` into the cache; returns the local path
/// of what it names (the job's directory, or that checkpoint's). The server and credentials
/// come from the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
pub fn mirror(arg: &Path, job_files: &[&str]) -> Result<PathBuf> {
    let text = arg.to_str().unwrap_or_default().trim_end_matches('/');
    let bad = |why: String| TrainError::Config(format!("{text}: {why}").into());
    let (rest, step) = match text.rsplit_once('/') {
        Some((rest, last)) => match parse_step_dir_name(last) {
            Some(step) => (rest, Some(step)),
            None => (text, None),
        },
        None => (text, None),
    };
    let (parent, job) = rest
        .rsplit_once('/')
        .filter(|(p, _)| p.len() > "s3:/".len())
        .ok_or_else(|| bad("name a job: s3://BUCKET/PREFIX/JOB".into()))?;
    let url = BucketUrl::parse(parent).map_err(bad)?;
    let endpoint = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.is_empty()));
    let config = StoreConfig {
        url: parent.to_string(),
        endpoint,
        region: None,
    };
    let bucket = Bucket::connect(&config, job)?;
    let root = cache_dir().join(&url.bucket).join(&url.prefix).join(job);
    std::fs::create_dir_all(&root).map_err(|e| io_err("creating", &root, e))?;
    fetch_job_files(&bucket, &root, job_files)?;
    let have: Vec<u64> = complete_checkpoints(&root)?
        .iter()
        .map(|(_, s)| s.step)
        .collect();
    let complete = bucket.complete()?;
    if complete.is_empty() {
        return Err(bad(
            "the bucket holds no complete checkpoint of this job".into()
        ));
    }
    for m in complete.iter().filter(|m| !have.contains(&m.step)) {
        match bucket.download(m, &root) {
            Ok(_) => {}
            Err(Download::Damaged(why)) => {
                tracing::warn!(step = m.step, reason = %why, "skipping a damaged checkpoint of the bucket")
            }
            Err(Download::Failed(e)) => return Err(e),
        }
    }
    tracing::info!(bucket = %bucket.url(), cache = %root.display(), "mirrored the job's checkpoints");
    Ok(match step {
        Some(step) => root.join(step_dir_name(step)),
        None => root,
    })
}

fn fetch_job_files(bucket: &Bucket, root: &Path, names: &[&str]) -> Result<()> {
    for name in names {
        if let Some((bytes, _)) = bucket.get(&bucket.object(name))? {
            write_synced(&root.join(name), |w| w.write_all(&bytes))?;
        }
    }
    Ok(())
}

/// `$XDG_CACHE_HOME/ferrotrain/buckets` (`~/.cache/...`; the temporary directory without a
/// home).
fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ferrotrain")
        .join("buckets")
}

impl Bucket {
    /// Uploads the job's own files (its config, its vocabulary) beside its checkpoints, so
    /// that `select` and `translate` can work from the bucket alone.
    pub fn put_job_files(&self, root: &Path, names: &[&str]) -> Result<()> {
        for name in names {
            let local = root.join(name);
            let Ok(bytes) = std::fs::read(&local) else {
                continue;
            };
            self.put(&self.object(name), bytes.into(), "writing")?;
        }
        Ok(())
    }
}
