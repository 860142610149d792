//! Every API request the plugin makes, counted by kind (list, watch, get, exec, ...), by a
//! layer of its API client: `--stats` prints them, so that what a `watch` costs the API server
//! is measured, not assumed (one list and one long watch, renewed every few minutes; never a
//! loop of GETs).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The requests made so far, by kind; shared by every clone of the client.
#[derive(Clone, Debug)]
pub struct RequestCounts {
    inner: Arc<Mutex<BTreeMap<String, u64>>>,
    since: Instant,
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            inner: Arc::default(),
            since: Instant::now(),
        }
    }
}

impl RequestCounts {
    fn record(&self, kind: String) {
        *self
            .inner
            .lock()
            .expect("request counts")
            .entry(kind)
            .or_default() += 1;
    }

    /// The counts by kind.
    pub fn by_kind(&self) -> BTreeMap<String, u64> {
        self.inner.lock().expect("request counts").clone()
    }

    /// Requests in all.
    pub fn total(&self) -> u64 {
        self.by_kind().values().sum()
    }

    /// Time since the client was built.
    pub fn elapsed(&self) -> Duration {
        self.since.elapsed()
    }

    /// `3 API requests in 95.2 s (0.032/s): 1 list, 2 watch`.
    pub fn summary(&self) -> String {
        summary(&self.by_kind(), self.elapsed())
    }
}

/// The line `--stats` prints.
pub fn summary(by_kind: &BTreeMap<String, u64>, elapsed: Duration) -> String {
    let total: u64 = by_kind.values().sum();
    let seconds = elapsed.as_secs_f64();
    let rate = if seconds > 0.0 {
        total as f64 / seconds
    } else {
        0.0
    };
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let requests = if total == 1 { "request" } else { "requests" };
    format!(
        "{total} API {requests} in {seconds:.1} s ({rate:.3}/s): {}",
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        }
    )
}

/// The kind of a request: the verb kube-client marks each with (list, watch, get, create,
/// patch, delete, logs, log_stream, exec), else the HTTP method.
pub fn kind_of<B>(request: &http::Request<B>) -> String {
    request.extensions().get::<&'static str>().map_or_else(
        || request.method().as_str().to_lowercase(),
        |k| k.to_string(),
    )
}

/// The layer that counts into a [`RequestCounts`].
#[derive(Clone, Debug)]
pub struct CountLayer(pub RequestCounts);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: self.0.clone(),
        }
    }
}

/// A service whose requests are counted.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    counts: RequestCounts,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.counts.record(kind_of(&request));
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_the_verb_kube_marks_them_with() {
        let mut marked = http::Request::get("/apis/x").body(()).unwrap();
        marked.extensions_mut().insert("watch");
        assert_eq!(kind_of(&marked), "watch");
        let plain = http::Request::post("/apis/x").body(()).unwrap();
        assert_eq!(kind_of(&plain), "post");
    }

    #[test]
    fn the_summary_says_how_many_of_each_and_the_rate() {
        let counts = BTreeMap::from([("list".to_string(), 1), ("watch".to_string(), 2)]);
        assert_eq!(
            summary(&counts, Duration::from_secs(100)),
            "3 API requests in 100.0 s (0.030/s): 1 list, 2 watch"
        );
        assert_eq!(
            summary(&BTreeMap::new(), Duration::ZERO),
            "0 API requests in 0.0 s (0.000/s): none"
        );
        let one = BTreeMap::from([("get".to_string(), 1)]);
        assert_eq!(
            summary(&one, Duration::from_secs(2)),
            "1 API request in 2.0 s (0.500/s): 1 get"
        );
    }
}
