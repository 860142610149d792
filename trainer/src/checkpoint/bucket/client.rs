//! The bucket of one job: its S3 client, the object names under `<prefix>/<job>/`, its
//! requests (each under the bucket's [`Retry`]), and its errors (credentials refused is a
//! configuration error naming the Secret they came from, not a failure to retry).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use ferrotrain_api::config::{BucketUrl, ObjectStore as StoreConfig};
use ferrotrain_api::env;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use super::retry::{Failed, Fault, Retry, TryError, classify, cut_short};
use crate::checkpoint::layout::{parse_step_dir_name, step_dir_name};
use crate::error::{Reason, Result, TrainError};

/// One job's checkpoints in a bucket.
pub struct Bucket {
    pub(super) store: Arc<dyn ObjectStore>,
    /// `<prefix>/<job>`.
    root: Path,
    /// `s3://<bucket>/<prefix>/<job>`.
    url: String,
    /// The Secret the credentials came from (FERROTRAIN_STORE_SECRET), for errors.
    secret: Option<String>,
    runtime: tokio::runtime::Runtime,
    /// How long a transient fault is tried again ([`Retry::STORE`]; tests shorten it).
    pub(super) retry: Retry,
    /// Files above this go up in parts of this size ([`PART_BYTES`]; tests shorten it).
    pub(super) part_bytes: usize,
}

/// Files above this go up in parts of this size (S3 allows 10,000 parts of at most 5 GiB).
pub(super) const PART_BYTES: usize = 16 << 20;

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish()
    }
}

impl Bucket {
    /// The bucket of `config` for job `job`, with credentials from the environment
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, ...).
    /// Sends nothing yet.
    pub fn connect(config: &StoreConfig, job: &str) -> Result<Bucket> {
        // The TLS provider of every rustls client in the process (ring, as kube's).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = BucketUrl::parse(&config.url).map_err(|e| config_error(&config.url, e))?;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: std::time::Duration::from_secs(30),
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint.trim_end_matches('/'))
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        } else if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        let store = builder
            .build()
            .map_err(|e| config_error(&config.url, e.to_string()))?;
        let secret = std::env::var(env::FERROTRAIN_STORE_SECRET)
            .ok()
            .filter(|s| !s.is_empty());
        Bucket::with_store(Arc::new(store), &url, job, secret)
    }

    /// A bucket over any object store (tests use an in-memory one).
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        url: &BucketUrl,
        job: &str,
        secret: Option<String>,
    ) -> Result<Bucket> {
        let root = if url.prefix.is_empty() {
            Path::from(job)
        } else {
            Path::from(format!("{}/{job}", url.prefix))
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("checkpoint-bucket")
            .enable_all()
            .build()
            .map_err(|e| TrainError::Other(Reason::caused("checkpoint bucket: a runtime", e)))?;
        Ok(Bucket {
            store,
            url: format!("s3://{}/{root}", url.bucket),
            root,
            secret,
            runtime,
            retry: Retry::STORE,
            part_bytes: PART_BYTES,
        })
    }

    /// `s3://<bucket>/<prefix>/<job>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where step `step` is: `s3://.../step-XXXXXXXX/`.
    pub fn step_url(&self, step: u64) -> String {
        format!("{}/{}/", self.url, step_dir_name(step))
    }

    pub(super) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Enters the bucket's runtime until the guard drops (for calls that spawn its tasks).
    pub(super) fn enter_runtime(&self) -> tokio::runtime::EnterGuard<'_> {
        self.runtime.enter()
    }

    /// `<prefix>/<job>/<name>`.
    pub(super) fn object(&self, name: &str) -> Path {
        self.root.clone().join(name)
    }

    /// `<prefix>/<job>/step-XXXXXXXX/<file>`.
    pub(super) fn step_object(&self, step: u64, file: &str) -> Path {
        self.root.clone().join(step_dir_name(step)).join(file)
    }

    /// An error of the bucket: refused credentials are a configuration error naming the
    /// Secret (the job fails at once instead of restarting into the same refusal); anything
    /// else is retried by the next attempt.
    pub(super) fn error(&self, what: &str, e: object_store::Error) -> TrainError {
        let message = format!("checkpoint bucket {}: {what}", self.url);
        match classify(&e) {
            Fault::Refused => {
                let from = match &self.secret {
                    Some(secret) => format!(
                        "the credentials of Secret {secret} (keys {} and {})",
                        env::STORE_SECRET_KEYS[0],
                        env::STORE_SECRET_KEYS[1]
                    ),
                    None => "the credentials in the environment".into(),
                };
                TrainError::Config(Reason::caused(
                    format!("{message}: the store refused {from}"),
                    e,
                ))
            }
            Fault::Transient | Fault::Final => TrainError::Other(Reason::caused(message, e)),
        }
    }

    /// Runs `op` (one or more requests, `what` in words) under the bucket's [`Retry`]; what
    /// still fails becomes the bucket's error.
    pub(super) fn retried<T, E: Into<TryError>>(
        &self,
        what: &str,
        op: impl FnMut() -> Result<T, E>,
    ) -> Result<T> {
        self.retry
            .run(what, op)
            .map_err(|failed| self.failed(what, failed))
    }

    fn failed(&self, what: &str, failed: Failed) -> TrainError {
        match failed.error {
            TryError::Stop(e) => e,
            TryError::Store(e) if failed.tries > 1 => self.error(
                &format!(
                    "{what} (gave up after {} tries in {:.1} s)",
                    failed.tries,
                    failed.elapsed.as_secs_f64()
                ),
                e,
            ),
            TryError::Store(e) => self.error(what, e),
        }
    }

    /// The object's bytes and ETag, `None` when there is none. The whole body is read in
    /// each try: one cut short is read again, never returned short.
    pub(super) fn get(&self, path: &Path) -> Result<Option<(Bytes, Option<String>)>> {
        self.retried(&format!("reading {path}"), || {
            self.block_on(async {
                let got = match self.store.get(path).await {
                    Ok(got) => got,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                };
                let e_tag = got.meta.e_tag.clone();
                let announced = got.range.end - got.range.start;
                let bytes = got.bytes().await?;
                if bytes.len() as u64 != announced {
                    return Err(cut_short(path.as_ref(), bytes.len(), announced));
                }
                Ok(Some((bytes, e_tag)))
            })
        })
    }

    /// Writes the object (a retried PUT writes the same bytes again).
    pub(super) fn put(&self, path: &Path, payload: PutPayload, what: &str) -> Result<()> {
        self.retried(&format!("{what} {path}"), || {
            self.block_on(self.store.put(path, payload.clone()))
                .map(drop)
        })
    }

    /// Deletes the object (deleting one already gone succeeds: a retried DELETE may find
    /// its first try done).
    pub(super) fn delete(&self, path: &Path) -> Result<()> {
        self.retried(&format!("deleting {path}"), || {
            match self.block_on(self.store.delete(path)) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    /// Every object under `step-*/`, by step: (file name, size). A listing that fails part
    /// way is started again: it is read in full or not at all.
    pub(super) fn list_steps(&self) -> Result<BTreeMap<u64, Vec<(String, u64)>>> {
        let listed: Vec<_> = self.retried("listing", || {
            self.block_on(self.store.list(Some(&self.root)).try_collect::<Vec<_>>())
        })?;
        let mut steps: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
        for meta in listed {
            let parts: Vec<_> = meta.location.parts().collect();
            let n = parts.len();
            if n < 2 {
                continue;
            }
            let Some(step) = parse_step_dir_name(parts[n - 2].as_ref()) else {
                continue;
            };
            let file = parts[n - 1].as_ref().to_string();
            steps.entry(step).or_default().push((file, meta.size));
        }
        Ok(steps)
    }
}

fn config_error(url: &str, why: String) -> TrainError {
    TrainError::Config(format!("checkpoint.store: {url}: {why}").into())
}
