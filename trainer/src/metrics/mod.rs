//! Rank 0's HTTP endpoint: `/metrics` (Prometheus / OpenMetrics text), `/progress` (JSON
//! `Progress`), `/healthz`; and the `Reporter` the training loop hands each step to (data
//! stats at start, TensorBoard events).
//!
//! The server and the exposition are the launcher's (`ferrotrain_launch::endpoint`: node 0's
//! launcher serves its gang's report with them); this module gives them a rank's own report.
//! Training never waits on it: a request clones the progress under the lock and encodes
//! outside it. The process's CPU, memory and threads are read from /proc at request time.

mod reporter;
mod server;

pub use ferrotrain_launch::endpoint::MetricsServer;
pub use reporter::{Reporter, SharedProgress};
pub use server::{rank_source, serve_rank};
