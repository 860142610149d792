//! What a failed request to the bucket means, and how long it is tried again. Every request
//! the bucket sends (list, get, put, multipart upload, conditional put, delete) goes through
//! [`Retry::run`] with one classification ([`classify`]):
//!
//! - transient ([`Fault::Transient`]): a 5xx (S3's `503 SlowDown` among them), 429, 408, an
//!   S3 error inside a 200, a timeout, a connection refused or reset, a body cut short. Tried
//!   again with exponential backoff and jitter, until [`Retry::within`] has passed since the
//!   first try or [`Retry::tries`] tries have failed;
//! - refused credentials ([`Fault::Refused`]: 401, 403): a configuration error, never retried;
//! - anything else ([`Fault::Final`]): an answer to act on (not found, a precondition) or a
//!   request the store will never serve; not retried.
//!
//! These come on top of the HTTP client's own retries of each request (object_store's
//! `RetryConfig`), which cannot see a failure after the response's headers nor a body that
//! ends short, and give up after a few tries.

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use object_store::client::{HttpError, HttpErrorKind};

use crate::error::TrainError;

/// What a failed request says about the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    /// Busy, down, unreachable, or the answer was cut short: try again.
    Transient,
    /// The credentials were refused: a configuration error.
    Refused,
    /// Not a fault of the moment: an answer, or a request the store will never serve.
    Final,
}

/// The fault of a store's error.
pub(super) fn classify(e: &object_store::Error) -> Fault {
    use object_store::Error as E;
    match e {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Fault::Refused,
        E::Generic { .. } if transient_cause(e) => Fault::Transient,
        _ => Fault::Final,
    }
}

/// Whether the error's chain holds a transport failure (object_store's `HttpError`: connect,
/// timeout, reset, a body cut short) or an HTTP status the store sends when it is busy or
/// failing. object_store keeps the status in a type it does not export, so the status is read
/// from its text ("Server returned non-2xx status code: 503 Service Unavailable: ...").
fn transient_cause(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<HttpError>().is_some() {
            return true;
        }
        let text = e.to_string();
        if let Some(status) = status_in(&text) {
            return status >= 500 || status == 429 || status == 408;
        }
        // S3 may answer 200 with an error document (CompleteMultipartUpload, CopyObject): AWS
        // asks to retry those.
        if text.contains("Server returned error response") {
            return true;
        }
        next = e.source();
    }
    false
}

/// The status code in object_store's text of a failed response.
fn status_in(text: &str) -> Option<u16> {
    const MARK: &str = "non-2xx status code: ";
    let at = text.find(MARK)? + MARK.len();
    text.get(at..at + 3)?.parse().ok()
}

/// A body that ended before the length its response announced: a transport failure like a
/// reset connection (object_store's own retry of a body needs an ETag, and sees no error when
/// the stream just ends).
pub(super) fn cut_short(what: &str, got: usize, announced: u64) -> object_store::Error {
    let why = std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("{what}: the body ended after {got} of {announced} bytes"),
    );
    object_store::Error::Generic {
        store: "checkpoint bucket",
        source: Box::new(HttpError::new(HttpErrorKind::Interrupted, why)),
    }
}

/// Why one try failed: the store's error, classified; or one that ends the operation at once
/// (a stale writer, the local disk).
#[derive(Debug)]
pub(super) enum TryError {
    Store(object_store::Error),
    Stop(TrainError),
}

impl From<object_store::Error> for TryError {
    fn from(e: object_store::Error) -> Self {
        TryError::Store(e)
    }
}

impl TryError {
    fn fault(&self) -> Fault {
        match self {
            TryError::Store(e) => classify(e),
            TryError::Stop(_) => Fault::Final,
        }
    }
}

/// An operation that did not succeed: its last error, after how many tries and how long.
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) error: TryError,
    pub(super) tries: u32,
    pub(super) elapsed: Duration,
}

/// How long a transient fault is tried again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Retry {
    /// The first wait; each next one doubles, up to `longest`. Each wait is drawn between
    /// half its value and its value (jitter: writers that failed together do not come back
    /// together).
    pub(super) first: Duration,
    pub(super) longest: Duration,
    /// No try starts later than this after the first.
    pub(super) within: Duration,
    /// At most this many tries.
    pub(super) tries: u32,
}

impl Retry {
    /// The bucket's: waits of 0.5, 1, 2, 4, 8, 8, ... s (less jitter) within 45 s, at most 10
    /// tries. A throttling S3 asks for seconds, not milliseconds; past 45 s a start is better
    /// failed and retried by the launcher or the operator, an upload left for the next
    /// checkpoint.
    pub(super) const STORE: Retry = Retry {
        first: Duration::from_millis(500),
        longest: Duration::from_secs(8),
        within: Duration::from_secs(45),
        tries: 10,
    };

    /// The wait before try `n + 1` (n ≥ 1 tries failed).
    pub(super) fn wait(&self, n: u32) -> Duration {
        let full = self
            .first
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(self.longest);
        let half = full / 2;
        let jitter = rand::random_range(0..=half.as_micros() as u64);
        half + Duration::from_micros(jitter)
    }

    /// Runs `op` until it succeeds, fails with an error that is not transient, or the bound
    /// is spent; `what` names it in the log.
    pub(super) fn run<T, E: Into<TryError>>(
        &self,
        what: &str,
        mut op: impl FnMut() -> Result<T, E>,
    ) -> Result<T, Failed> {
        let began = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match op() {
                Ok(done) => return Ok(done),
                Err(e) => e.into(),
            };
            let (wait, elapsed) = (self.wait(tries), began.elapsed());
            if error.fault() != Fault::Transient
                || tries >= self.tries
                || elapsed + wait > self.within
            {
                return Err(Failed {
                    error,
                    tries,
                    elapsed,
                });
            }
            tracing::info!(what, tries, wait = ?wait, error = ?error, "checkpoint bucket: a transient fault; trying again");
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(source: impl StdError + Send + Sync + 'static) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(source),
        }
    }

    /// object_store's text of a failed response (its type is not exported).
    fn status(code: &str) -> object_store::Error {
        let text = format!(
            "Error performing GET http://s3/ckpt/runs/job/step-00000300/manifest.json in 1.2s, \
             after 3 retries, max_retries: 3, retry_timeout: 30s  - Server returned non-2xx \
             status code: {code}: <Error><Code>X</Code></Error>"
        );
        generic(std::io::Error::other(text))
    }

    #[test]
    fn faults_are_classified() {
        let transport = |kind| generic(HttpError::new(kind, std::io::Error::other("x")));
        let path = || "runs/job/fence.json".to_string();
        let cases: Vec<(&str, object_store::Error, Fault)> = vec![
            (
                "503 SlowDown",
                status("503 Service Unavailable"),
                Fault::Transient,
            ),
            ("500", status("500 Internal Server Error"), Fault::Transient),
            ("429", status("429 Too Many Requests"), Fault::Transient),
            ("408", status("408 Request Timeout"), Fault::Transient),
            ("400", status("400 Bad Request"), Fault::Final),
            (
                "timeout",
                transport(HttpErrorKind::Timeout),
                Fault::Transient,
            ),
            (
                "reset",
                transport(HttpErrorKind::Interrupted),
                Fault::Transient,
            ),
            (
                "connect",
                transport(HttpErrorKind::Connect),
                Fault::Transient,
            ),
            ("cut short", cut_short("x", 3, 9), Fault::Transient),
            (
                "error in a 200",
                generic(std::io::Error::other(
                    "Server returned error response: <Error><Code>InternalError</Code></Error>",
                )),
                Fault::Transient,
            ),
            (
                "unknown",
                generic(std::io::Error::other("odd")),
                Fault::Final,
            ),
            (
                "403",
                object_store::Error::PermissionDenied {
                    path: path(),
                    source: "403".into(),
                },
                Fault::Refused,
            ),
            (
                "401",
                object_store::Error::Unauthenticated {
                    path: path(),
                    source: "401".into(),
                },
                Fault::Refused,
            ),
            (
                "404 is an answer",
                object_store::Error::NotFound {
                    path: path(),
                    source: "404".into(),
                },
                Fault::Final,
            ),
            (
                "412 is an answer",
                object_store::Error::Precondition {
                    path: path(),
                    source: "412".into(),
                },
                Fault::Final,
            ),
        ];
        for (name, e, want) in cases {
            assert_eq!(classify(&e), want, "{name}: {e}");
        }
    }

    const QUICK: Retry = Retry {
        first: Duration::from_millis(1),
        longest: Duration::from_millis(4),
        within: Duration::from_secs(10),
        tries: 5,
    };

    #[test]
    fn waits_double_up_to_the_longest_with_jitter() {
        for n in 1..12 {
            let full = Retry::STORE
                .first
                .saturating_mul(1 << (n - 1))
                .min(Retry::STORE.longest);
            let wait = Retry::STORE.wait(n);
            assert!(wait >= full / 2 && wait <= full, "try {n}: {wait:?}");
        }
        let waits: Vec<_> = (0..20).map(|_| Retry::STORE.wait(4)).collect();
        assert!(waits.iter().any(|w| *w != waits[0]), "no jitter: {waits:?}");
    }

    #[test]
    fn a_transient_fault_is_tried_again_within_the_bound_and_others_are_not() {
        let mut calls = 0;
        let done = QUICK.run("x", || {
            calls += 1;
            if calls < 3 {
                Err(status("503 Slow Down"))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(done.unwrap(), 3);
        let mut calls = 0;
        let failed = QUICK
            .run("x", || -> Result<(), _> {
                calls += 1;
                Err(status("503 Slow Down"))
            })
            .unwrap_err();
        assert_eq!((calls, failed.tries), (5, 5));
        for refused in [
            status("400 Bad Request"),
            object_store::Error::PermissionDenied {
                path: String::new(),
                source: "403".into(),
            },
        ] {
            let mut calls = 0;
            let failed = QUICK
                .run("x", || -> Result<(), _> {
                    calls += 1;
                    Err(generic_clone(&refused))
                })
                .unwrap_err();
            assert_eq!((calls, failed.tries), (1, 1), "{refused}");
        }
        // The time bound: no try starts past `within`.
        let slow = Retry {
            within: Duration::from_millis(30),
            tries: 1000,
            ..QUICK
        };
        let began = Instant::now();
        let failed = slow
            .run("x", || -> Result<(), _> {
                Err(status("500 Internal Server Error"))
            })
            .unwrap_err();
        assert!(failed.tries > 3 && failed.tries < 1000, "{}", failed.tries);
        assert!(began.elapsed() < Duration::from_millis(500));
    }

    fn generic_clone(e: &object_store::Error) -> object_store::Error {
        match e {
            object_store::Error::PermissionDenied { path, .. } => {
                object_store::Error::PermissionDenied {
                    path: path.clone(),
                    source: "403".into(),
                }
            }
            other => generic(std::io::Error::other(other.to_string())),
        }
    }
}
