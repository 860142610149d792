//! A small HTTP/1.1 server: rank 0's `/progress`, `/metrics` and `/healthz` on a hollow pod's
//! IP, and the simulator's own control endpoint. Dropping (aborting) the serving future closes
//! every connection it accepted.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// An answer.
pub enum Reply {
    Json(String),
    Text(String),
    NotFound,
    /// Never answers (a rank 0 whose /progress hangs): the request is held for a minute, well
    /// past any poll's timeout, then answered 503.
    Silent,
}

/// Answers a request for a path (and its query).
pub type Handler = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// How long a [`Reply::Silent`] holds its request.
const SILENCE: Duration = Duration::from_secs(60);

/// Serves `listener` until dropped.
pub async fn serve(listener: TcpListener, handler: Handler) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, most likely: let connections finish.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        connections.spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let path = request
                    .uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_string();
                let reply = handler(&path);
                async move { Ok::<_, Infallible>(respond(reply).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

async fn respond(reply: Reply) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match reply {
        Reply::Json(body) => (StatusCode::OK, "application/json", body),
        Reply::Text(body) => (StatusCode::OK, "text/plain; version=0.0.4", body),
        Reply::NotFound => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        Reply::Silent => {
            tokio::time::sleep(SILENCE).await;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "silent\n".into(),
            )
        }
    };
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}
