//! The operator's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the process
//! serves), `/readyz` (every watch is synced and none keeps failing; a follower is ready).

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use ferrotrain_api::crd::DistributedTraining;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::metrics::{JobNumbers, Metrics};
use crate::readiness::Readiness;

/// What the endpoints read.
#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    /// Whether this replica's watches are synced and healthy (a follower is ready).
    pub readiness: Arc<Readiness>,
    /// The jobs cache, for the jobs-by-phase gauge (unset until this replica leads).
    pub jobs: Arc<OnceLock<Store<DistributedTraining>>>,
}

/// The routes.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<ServerState>) -> impl IntoResponse {
    state.metrics.set_process();
    if let Some(jobs) = state.jobs.get() {
        let jobs = jobs.state();
        state.metrics.set_jobs(
            jobs.iter()
                .map(|dt| dt.status.as_ref().map(|s| s.phase).unwrap_or_default()),
        );
        state.metrics.set_job_numbers(jobs.iter().filter_map(|dt| {
            let status = dt.status.as_ref();
            Some(JobNumbers {
                namespace: dt.namespace()?,
                job: dt.name_any(),
                phase: status.map(|s| s.phase).unwrap_or_default(),
                restarts: status.map_or(0, |s| s.restarts),
                recovery: status.and_then(|s| s.recovery.as_ref()),
            })
        }));
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn readyz(State(state): State<ServerState>) -> impl IntoResponse {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(port: u16, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn health_readiness_and_metrics() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let readiness = Arc::new(Readiness::default());
        let state = ServerState {
            metrics: Arc::new(Metrics::new()),
            readiness: readiness.clone(),
            jobs: Arc::default(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state, async {
            let _ = stopped.await;
        }));
        let checks = async {
            assert!(get(port, "/healthz").await.starts_with("HTTP/1.1 200"));
            let unready = get(port, "/readyz").await;
            assert!(unready.starts_with("HTTP/1.1 503"), "{unready}");
            readiness.follow();
            assert!(get(port, "/readyz").await.starts_with("HTTP/1.1 200"));
            let metrics = get(port, "/metrics").await;
            assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
            assert!(
                metrics.contains("# TYPE ferrotrain_operator_reconciles counter"),
                "{metrics}"
            );
            assert!(get(port, "/nope").await.starts_with("HTTP/1.1 404"));
        };
        tokio::time::timeout(Duration::from_secs(10), checks)
            .await
            .unwrap();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
