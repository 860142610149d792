//! The pod's HTTP endpoint: `/metrics` (Prometheus / OpenMetrics text), `/progress` (JSON
//! `Progress`), `/healthz`. Node 0's launcher serves its gang's report there (its ranks serve
//! none), so any rank program, ferrotrain's trainer or a PyTorch script, gets the same
//! endpoint; a trainer run alone (`ferrotrain run --metrics-port`) serves its own with the
//! same server.
//!
//! The server is axum on a current-thread tokio runtime of its own thread, and the metrics
//! are encoded by prometheus-client: the libraries the operator's endpoints use. Training
//! never waits on it: a request takes the report from its source and encodes it.

mod prometheus;
mod server;

#[cfg(test)]
mod fixtures;

pub use prometheus::{METRICS_CONTENT_TYPE, prometheus_text};
pub use server::{HEAD_TIMEOUT, MAX_CONNECTIONS, MetricsServer, Source, gang_source};

use ferrotrain_api::env;

/// The pod's port (FERROTRAIN_METRICS_PORT), when it has one: the operator sets it.
pub fn port_from_env() -> Option<u16> {
    std::env::var(env::FERROTRAIN_METRICS_PORT)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Serves the gang's `report` on `port`, or says why it cannot (training goes on without it).
pub fn serve_gang(port: u16, report: crate::report::GangReport) -> Option<MetricsServer> {
    match MetricsServer::serve(port, gang_source(report)) {
        Ok(server) => {
            tracing::info!(addr = %server.local_addr(), "launch: serving the gang's /metrics, /progress, /healthz");
            Some(server)
        }
        Err(e) => {
            tracing::warn!("launch: the gang's /progress is not served: {e}");
            None
        }
    }
}
