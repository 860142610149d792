//! Rank 0's HTTP endpoint: `/metrics` (Prometheus / OpenMetrics text), `/progress` (JSON
//! `Progress`), `/healthz`; and the `Reporter` the training loop hands each step to (data
//! stats at start, TensorBoard events).
//!
//! The server is axum on a current-thread tokio runtime of its own thread, and the metrics
//! are encoded by prometheus-client: the libraries the operator's endpoints use. Training
//! never waits on it: a request clones the progress under the lock and encodes outside it.
//! The process's CPU, memory and threads are read from /proc at request time.

mod prometheus;
mod reporter;
mod server;

#[cfg(test)]
mod fixtures;

pub use prometheus::{METRICS_CONTENT_TYPE, prometheus_text};
pub use reporter::{Reporter, SharedProgress};
pub use server::{MetricsServer, Source, gang_source, rank_source};
