//! The pod's HTTP endpoint: `/metrics`, `/progress` and `/healthz`, served by axum on a
//! current-thread tokio runtime of its own thread, for whichever process owns the pod's port:
//! node 0's launcher (the gang's report, [`gang_source`]) or a rank run alone (its own,
//! trainer/src/metrics). A request takes the report from its [`Source`] and encodes it.
//!
//! Whoever the NetworkPolicy lets reach the port is served, so what a connection may cost is
//! bounded: at most [`MAX_CONNECTIONS`] at once (more are closed at accept and counted as
//! refused, `too_many_connections`), a request head must arrive within [`HEAD_TIMEOUT`]
//! (hyper's own limit on its size, about 400 KiB, holds too), and stopping the server drops
//! every connection at once: a peer that sent half a head kept `axum::serve`'s graceful
//! shutdown, and so rank 0's exit, waiting for ever.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ferrotrain_api::Progress;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;

use super::prometheus::{METRICS_CONTENT_TYPE, prometheus_text};
use crate::refused::{self, Reason as Refusal};
use crate::report::GangReport;

/// Connections served at once (the operator polls with one, a Prometheus scrapes with one).
pub const MAX_CONNECTIONS: usize = 256;
/// How long a request head may take to arrive, idle keep-alive connections included.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a request's report comes from: a rank's own progress (`ferrotrain run`), or node 0's
/// launcher's report of its gang (`ferrotrain launch`, [`GangReport`]).
pub type Source = Arc<dyn Fn() -> Progress + Send + Sync>;

/// What the handlers read.
#[derive(Clone)]
struct ServerState {
    source: Source,
}

/// Node 0's launcher's report of its gang: rank 0's report (whose resources are rank 0's,
/// as it sampled them) with the rounds and the refusals only the launcher knows.
pub fn gang_source(report: GangReport) -> Source {
    Arc::new(move || report.now())
}

/// A running server; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `0.0.0.0:port` (port 0 = ephemeral) and serves `source` until dropped.
    pub fn serve(port: u16, source: Source) -> std::io::Result<Self> {
        let err =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("metrics: port {port}: {e}"));
        let listener = std::net::TcpListener::bind(("0.0.0.0", port)).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        let state = ServerState { source };
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::warn!(error = %e, "metrics: cannot serve"),
                    };
                    tokio::select! {
                        () = serve(listener, router(state)) => {}
                        _ = stopped => {}
                    }
                    // Returning drops the runtime, and with it every connection's task.
                })
            })
            .map_err(err)?;
        Ok(MetricsServer {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Connections are dropped, not waited for: the thread ends at once.
            let _ = thread.join();
        }
    }
}

/// Accepts connections for ever, each served on a task of its own, within the limits above.
async fn serve(listener: tokio::net::TcpListener, router: Router) {
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = open.clone().try_acquire_owned() else {
            refused::count(Refusal::TooManyConnections, peer, "progress server");
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "metrics: connection ended");
            }
        });
    }
}

fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/progress", get(progress))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// The report now.
fn snapshot(state: &ServerState) -> Progress {
    (state.source)()
}

async fn progress(State(state): State<ServerState>) -> impl IntoResponse {
    // Progress holds only numbers and strings: encoding cannot fail (a NaN becomes null).
    let body = serde_json::to_vec(&snapshot(&state)).unwrap_or_default();
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
}

async fn metrics(State(state): State<ServerState>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, METRICS_CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        prometheus_text(&snapshot(&state)),
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::endpoint::fixtures::*;

    type Shared = Arc<Mutex<Progress>>;

    /// A source that reads `shared` at request time, as a rank's or the gang's does.
    fn source_of(shared: &Shared) -> Source {
        let shared = shared.clone();
        Arc::new(move || shared.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn start(p: Progress) -> (MetricsServer, Shared, SocketAddr) {
        let shared = Arc::new(Mutex::new(p));
        let server = MetricsServer::serve(0, source_of(&shared)).unwrap();
        let port = server.local_addr().port();
        assert_ne!(port, 0);
        (server, shared, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Sends raw bytes, returns (status, lower-cased head, body).
    fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let end = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete response head");
        let head = String::from_utf8(out[..end].to_vec())
            .unwrap()
            .to_lowercase();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head, out[end + 4..].to_vec())
    }

    fn get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
        raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    }

    #[test]
    fn serves_every_endpoint() {
        let (_server, shared, addr) = start(full_progress());

        let (status, _, body) = get(addr, "/healthz");
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));

        let (status, head, body) = get(addr, "/progress");
        assert_eq!(status, 200);
        assert!(head.contains("content-type: application/json"), "{head}");
        let back: Progress = serde_json::from_slice(&body).unwrap();
        assert_eq!(back, full_progress());

        let (status, head, body) = get(addr, "/metrics?name[]=x");
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        let m = parse_metrics(std::str::from_utf8(&body).unwrap());
        assert_eq!(m["ferrotrain_step"], 1234.0);

        // The server reads the shared progress at request time.
        shared.lock().unwrap().step = 1300;
        let (_, _, body) = get(addr, "/metrics");
        assert_eq!(
            parse_metrics(std::str::from_utf8(&body).unwrap())["ferrotrain_step"],
            1300.0
        );

        assert_eq!(get(addr, "/nope").0, 404);
        assert_eq!(get(addr, "/").0, 404);
        let (status, head, _) = raw(
            addr,
            b"POST /progress HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 405);
        assert!(head.contains("allow: get"), "{head}");
    }

    #[test]
    fn garbage_is_refused_and_the_server_keeps_serving() {
        let (_server, _shared, addr) = start(full_progress());
        for junk in [
            &b"\x00\xff\xfe garbage\r\n\r\n"[..],
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
        ] {
            // hyper answers 4xx, closes, or waits for more: all fine, as long as the next
            // request is served.
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            s.write_all(junk).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            assert!(
                out.is_empty() || out.starts_with(b"HTTP/1.1 4"),
                "{:?}",
                String::from_utf8_lossy(&out)
            );
        }
        // A peer that sends half a request and closes; one that says nothing.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        drop(s);
        let _silent = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        assert_eq!(get(addr, "/healthz").0, 200);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// Issue 44: a peer that sends half a request head and then nothing must neither hold
    /// its connection for ever nor keep the server from stopping.
    #[test]
    fn a_half_sent_request_does_not_hold_the_server() {
        let (server, _shared, addr) = start(full_progress());
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /progress HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        drop(server);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            started.elapsed()
        );
    }

    /// Issue 44: silent connections past the cap are closed at accept and counted; one
    /// that says nothing is closed after the head timeout; the server serves once they go.
    #[test]
    fn silent_connections_are_capped_counted_and_timed_out() {
        let (_server, _shared, addr) = start(full_progress());
        let refused = || {
            refused::snapshot()
                .get(Refusal::TooManyConnections.as_str())
                .copied()
                .unwrap_or(0)
        };
        let silent: Vec<TcpStream> = (0..MAX_CONNECTIONS + 40)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let until = Instant::now() + Duration::from_secs(20);
        while refused() < 40 {
            assert!(Instant::now() < until, "{} refused", refused());
            std::thread::sleep(Duration::from_millis(10));
        }
        // The first of them is closed by the server once the head timeout passes.
        let mut first = silent.into_iter().next().unwrap();
        first.set_read_timeout(Some(HEAD_TIMEOUT * 2)).unwrap();
        let started = Instant::now();
        assert_eq!(first.read(&mut [0u8; 64]).unwrap_or(0), 0);
        let waited = started.elapsed();
        assert!(waited < HEAD_TIMEOUT + Duration::from_secs(5), "{waited:?}");
        assert_eq!(get(addr, "/healthz").0, 200);
    }

    #[test]
    fn dropping_the_server_stops_it() {
        let (server, _shared, addr) = start(full_progress());
        assert_eq!(get(addr, "/healthz").0, 200);
        let started = Instant::now();
        drop(server);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            started.elapsed()
        );
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n\r\n");
                let mut out = Vec::new();
                let _ = s.read_to_end(&mut out);
                assert!(out.is_empty(), "answered after drop");
            }
        }
    }

    #[test]
    fn a_poisoned_lock_still_serves() {
        let (_server, shared, addr) = start(full_progress());
        let s2 = shared.clone();
        let _ = std::thread::spawn(move || {
            let _guard = s2.lock().unwrap();
            panic!("training thread panics while holding the lock");
        })
        .join();
        assert!(shared.is_poisoned());
        assert_eq!(get(addr, "/progress").0, 200);
    }

    #[test]
    fn a_busy_port_is_an_error_not_a_panic() {
        let (server, _shared, _) = start(Progress::default());
        let port = server.local_addr().port();
        let shared = Arc::new(Mutex::new(Progress::default()));
        assert!(MetricsServer::serve(port, source_of(&shared)).is_err());
    }
}
