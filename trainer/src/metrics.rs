//! Rank 0's HTTP endpoint: `/metrics` (Prometheus text), `/progress` (JSON `Progress`),
//! `/healthz`. A tiny HTTP/1.1 server on its own thread; training never waits on it.
//!
//! The accept loop polls a non-blocking listener (so dropping the server stops it within
//! one poll interval, with no self-connect trick), and every connection gets its own
//! short-lived thread with read/write timeouts and an overall deadline, so a slow or
//! half-open client costs one thread for a few seconds and never blocks the next scrape.
//! One request per connection (`Connection: close`): scrapers and the operator open a new
//! connection per poll anyway.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrotrain_api::{Progress, TrainerPhase};

use crate::error::{Result, TrainError};

/// The progress shared between the training loop (writer) and the server (reader).
pub type SharedProgress = Arc<Mutex<Progress>>;

/// How often the accept loop looks at the stop flag when no one connects.
const ACCEPT_POLL: Duration = Duration::from_millis(25);
/// Per read/write on a connection.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// A whole request must arrive within this, however slowly it trickles in.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Request line + headers; we never read a body.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Connections served at once; more are closed immediately.
const MAX_CONNECTIONS: usize = 32;

/// A running server; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `0.0.0.0:port` (port 0 = ephemeral) and serves until dropped.
    pub fn start(port: u16, progress: SharedProgress) -> Result<Self> {
        let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
            TrainError::Other(format!("metrics: cannot listen on port {port}: {e}"))
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| TrainError::Other(format!("metrics: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TrainError::Other(format!("metrics: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = std::thread::Builder::new()
            .name("metrics-accept".into())
            .spawn(move || accept_loop(listener, progress, stop2))
            .map_err(|e| {
                TrainError::Other(format!("metrics: cannot start the server thread: {e}"))
            })?;
        tracing::info!(%addr, "serving /metrics, /progress and /healthz");
        Ok(MetricsServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            // Returns within one ACCEPT_POLL; the listener closes when the thread ends.
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: TcpListener, progress: SharedProgress, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    continue; // dropped: closes the connection
                }
                active.fetch_add(1, Ordering::SeqCst);
                let (progress, active2) = (progress.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        serve_connection(stream, &progress);
                        active2.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                // EMFILE and friends: back off rather than spin.
                tracing::warn!(error = %e, "metrics: accept failed");
                std::thread::sleep(ACCEPT_POLL * 4);
            }
        }
    }
}

/// One request, one response, close. Errors only ever end this connection.
fn serve_connection(mut stream: TcpStream, progress: &SharedProgress) {
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(Some(IO_TIMEOUT)).is_err()
        || stream.set_write_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return;
    }
    let response = match read_request_head(&mut stream) {
        Some(head) => respond(&head, progress),
        None => return, // timed out, closed early or I/O error: nothing useful to say
    };
    let _ = stream.write_all(&response);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Reads up to the blank line ending the headers. `Some(bytes)` also when the request is too
/// large or the peer closed before finishing (the bytes then fail to parse and get a 400).
fn read_request_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if find_head_end(&buf).is_some() || buf.len() >= MAX_REQUEST_BYTES {
            return Some(buf);
        }
        if Instant::now() >= deadline {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return if buf.is_empty() { None } else { Some(buf) },
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// The full HTTP response to a request head.
fn respond(head: &[u8], progress: &SharedProgress) -> Vec<u8> {
    let Some(end) = find_head_end(head) else {
        let status = if head.len() >= MAX_REQUEST_BYTES {
            431
        } else {
            400
        };
        return response(status, "text/plain; charset=utf-8", b"bad request\n");
    };
    let Ok(text) = std::str::from_utf8(&head[..end]) else {
        return response(400, "text/plain; charset=utf-8", b"bad request\n");
    };
    let request_line = text.split("\r\n").next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return response(400, "text/plain; charset=utf-8", b"bad request\n");
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return response(400, "text/plain; charset=utf-8", b"bad request\n");
    }
    if method != "GET" {
        return response(405, "text/plain; charset=utf-8", b"method not allowed\n");
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    match path {
        "/healthz" => response(200, "text/plain; charset=utf-8", b"ok"),
        "/progress" => {
            let snapshot = snapshot(progress);
            match serde_json::to_vec(&snapshot) {
                Ok(body) => response(200, "application/json", &body),
                Err(_) => response(
                    500,
                    "text/plain; charset=utf-8",
                    b"cannot encode progress\n",
                ),
            }
        }
        "/metrics" => {
            let body = prometheus_text(&snapshot(progress));
            response(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                body.as_bytes(),
            )
        }
        _ => response(404, "text/plain; charset=utf-8", b"not found\n"),
    }
}

/// Copies the progress out so the training loop's lock is held only for a clone.
fn snapshot(progress: &SharedProgress) -> Progress {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

fn response(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n",
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Prometheus text exposition of a progress report.
///
/// Every metric is a gauge named `ferrotrain_*`; a field the report does not have yet (no
/// evaluation so far, no checkpoint) is left out rather than exported as 0.
pub fn prometheus_text(progress: &Progress) -> String {
    let mut out = String::with_capacity(4096);
    let p = progress;

    out.push_str("# HELP ferrotrain_phase What the trainer is doing (1 for the current phase).\n");
    out.push_str("# TYPE ferrotrain_phase gauge\n");
    for (phase, label) in [
        (TrainerPhase::Starting, "starting"),
        (TrainerPhase::Training, "training"),
        (TrainerPhase::Evaluating, "evaluating"),
        (TrainerPhase::Finished, "finished"),
    ] {
        let _ = writeln!(
            out,
            "ferrotrain_phase{{phase=\"{label}\"}} {}",
            u8::from(p.phase == phase)
        );
    }

    let int = |v: u64| Some(v.to_string());
    let opt_int = |v: Option<u64>| v.map(|v| v.to_string());
    let opt_f = |v: Option<f64>| v.map(format_float);
    let ckpt = p.last_checkpoint.as_ref();
    let metrics: [(&str, &str, Option<String>); 24] = [
        ("step", "Optimizer steps completed.", int(p.step)),
        (
            "total_steps",
            "Steps the run will take (maxSteps).",
            int(p.total_steps),
        ),
        (
            "epoch",
            "Passes over the training data started so far (0-based).",
            int(p.epoch),
        ),
        (
            "samples",
            "Training examples consumed so far over all ranks (the global data position).",
            int(p.samples),
        ),
        (
            "world_size",
            "Ranks exchanging gradients.",
            int(u64::from(p.world_size)),
        ),
        (
            "steps_per_second",
            "Optimizer steps per second, recent average.",
            opt_f(p.steps_per_second),
        ),
        (
            "samples_per_second",
            "Training examples per second over all ranks, recent average.",
            opt_f(p.samples_per_second),
        ),
        (
            "tokens_per_second",
            "Source+target tokens (no padding) per second over all ranks, recent average.",
            opt_f(p.tokens_per_second),
        ),
        (
            "step_time_seconds",
            "Wall-clock seconds per optimizer step, recent average.",
            opt_f(p.step_time_seconds),
        ),
        (
            "comm_fraction",
            "Share of step time spent waiting on gradient exchange (0..1).",
            opt_f(p.comm_fraction),
        ),
        (
            "loss",
            "Training loss (label-smoothed cross-entropy per target token), recent average.",
            opt_f(p.loss),
        ),
        (
            "eval_loss",
            "Validation loss (cross-entropy per target token) at the last evaluation.",
            opt_f(p.eval_loss),
        ),
        (
            "eval_bleu",
            "Corpus BLEU on the validation set at the last evaluation (sacreBLEU 13a, cased).",
            opt_f(p.eval_bleu),
        ),
        (
            "eval_step",
            "Step of the last evaluation.",
            opt_int(p.eval_step),
        ),
        (
            "best_eval_loss",
            "Lowest validation loss so far.",
            opt_f(p.best_eval_loss),
        ),
        (
            "learning_rate",
            "Current learning rate.",
            opt_f(p.learning_rate),
        ),
        (
            "eta_seconds",
            "Seconds until totalSteps at the current rate.",
            opt_f(p.eta_seconds),
        ),
        (
            "last_checkpoint_step",
            "Step held by the newest complete checkpoint.",
            ckpt.and_then(|c| int(c.step)),
        ),
        (
            "last_checkpoint_bytes",
            "Size on disk of the newest complete checkpoint.",
            ckpt.and_then(|c| int(c.size_bytes)),
        ),
        (
            "last_checkpoint_blocking_seconds",
            "Seconds the newest checkpoint blocked training (the rest is written in the background).",
            ckpt.and_then(|c| opt_f(c.blocking_seconds)),
        ),
        (
            "last_checkpoint_timestamp_seconds",
            "Unix time the newest checkpoint became complete.",
            ckpt.and_then(|c| unix_seconds(&c.time)),
        ),
        (
            "resumed_from_step",
            "Step this run resumed from (absent for a fresh start).",
            opt_int(p.resumed_from_step),
        ),
        ("parameters", "Model parameters.", int(p.parameters)),
        (
            "peak_memory_bytes",
            "Peak resident memory of rank 0.",
            opt_int(p.peak_memory_bytes),
        ),
    ];
    for (name, help, value) in metrics {
        let Some(value) = value else { continue };
        let _ = write!(
            out,
            "# HELP ferrotrain_{name} {help}\n# TYPE ferrotrain_{name} gauge\nferrotrain_{name} {value}\n"
        );
    }
    out
}

/// Prometheus spells the special values NaN, +Inf and -Inf.
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        // Debug is the shortest representation that round-trips (uses exponents when long).
        format!("{v:?}")
    }
}

fn unix_seconds(rfc3339: &str) -> Option<String> {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .ok()?;
    Some(t.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrotrain_api::CheckpointInfo;

    fn full_progress() -> Progress {
        Progress {
            phase: TrainerPhase::Training,
            step: 1234,
            total_steps: 20000,
            epoch: 3,
            samples: 1_234_000,
            world_size: 4,
            steps_per_second: Some(2.5),
            samples_per_second: Some(320.0),
            tokens_per_second: Some(5210.75),
            step_time_seconds: Some(0.4),
            comm_fraction: Some(0.125),
            loss: Some(3.5),
            eval_loss: Some(3.75),
            eval_bleu: Some(21.5),
            eval_step: Some(1000),
            best_eval_loss: Some(3.625),
            learning_rate: Some(0.0007),
            eta_seconds: Some(7500.0),
            last_checkpoint: Some(CheckpointInfo {
                step: 1000,
                size_bytes: 61_234_567,
                time: "2026-01-02T03:04:05Z".into(),
                blocking_seconds: Some(0.0625),
            }),
            resumed_from_step: Some(500),
            parameters: 9_876_543,
            peak_memory_bytes: Some(1 << 30),
        }
    }

    fn start(p: Progress) -> (MetricsServer, SharedProgress, SocketAddr) {
        let shared = Arc::new(Mutex::new(p));
        let server = MetricsServer::start(0, shared.clone()).unwrap();
        let port = server.local_addr().port();
        assert_ne!(port, 0);
        (server, shared, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Sends raw bytes, returns (status, headers, body).
    fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        let end = find_head_end(&out).expect("a complete response head");
        let head = String::from_utf8(out[..end].to_vec()).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let body = out[end + 4..].to_vec();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        (status, head, body)
    }

    fn get(addr: SocketAddr, path: &str) -> (u16, String, Vec<u8>) {
        raw(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: test\r\n\r\n").as_bytes(),
        )
    }

    /// Parses exposition text into (series -> value), checking HELP/TYPE precede each family.
    fn parse_prometheus(text: &str) -> std::collections::BTreeMap<String, f64> {
        let mut values = std::collections::BTreeMap::new();
        let mut typed = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                let name = it.next().unwrap();
                assert_eq!(it.next(), Some("gauge"), "{line}");
                assert!(typed.insert(name.to_string()), "duplicate TYPE {name}");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let family = series.split('{').next().unwrap();
            assert!(
                typed.contains(family),
                "{family} has no TYPE line before it"
            );
            assert!(
                family.starts_with("ferrotrain_")
                    && family.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{family}"
            );
            let v = match value {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            assert!(
                values.insert(series.to_string(), v).is_none(),
                "duplicate {series}"
            );
        }
        values
    }

    #[test]
    fn prometheus_text_has_every_field() {
        let m = parse_prometheus(&prometheus_text(&full_progress()));
        let want = [
            ("ferrotrain_step", 1234.0),
            ("ferrotrain_total_steps", 20000.0),
            ("ferrotrain_epoch", 3.0),
            ("ferrotrain_samples", 1_234_000.0),
            ("ferrotrain_world_size", 4.0),
            ("ferrotrain_steps_per_second", 2.5),
            ("ferrotrain_samples_per_second", 320.0),
            ("ferrotrain_tokens_per_second", 5210.75),
            ("ferrotrain_step_time_seconds", 0.4),
            ("ferrotrain_comm_fraction", 0.125),
            ("ferrotrain_loss", 3.5),
            ("ferrotrain_eval_loss", 3.75),
            ("ferrotrain_eval_bleu", 21.5),
            ("ferrotrain_eval_step", 1000.0),
            ("ferrotrain_best_eval_loss", 3.625),
            ("ferrotrain_learning_rate", 0.0007),
            ("ferrotrain_eta_seconds", 7500.0),
            ("ferrotrain_last_checkpoint_step", 1000.0),
            ("ferrotrain_last_checkpoint_bytes", 61_234_567.0),
            ("ferrotrain_last_checkpoint_blocking_seconds", 0.0625),
            (
                "ferrotrain_last_checkpoint_timestamp_seconds",
                1_767_323_045.0,
            ),
            ("ferrotrain_resumed_from_step", 500.0),
            ("ferrotrain_parameters", 9_876_543.0),
            ("ferrotrain_peak_memory_bytes", (1u64 << 30) as f64),
            ("ferrotrain_phase{phase=\"training\"}", 1.0),
            ("ferrotrain_phase{phase=\"starting\"}", 0.0),
            ("ferrotrain_phase{phase=\"evaluating\"}", 0.0),
            ("ferrotrain_phase{phase=\"finished\"}", 0.0),
        ];
        for (series, v) in want {
            assert_eq!(m.get(series), Some(&v), "{series}");
        }
        assert_eq!(m.len(), want.len(), "unexpected series: {m:?}");
    }

    #[test]
    fn absent_fields_are_omitted_and_special_floats_spelled_right() {
        let p = Progress {
            step: 7,
            loss: Some(f64::NAN),
            eta_seconds: Some(f64::INFINITY),
            ..Default::default()
        };
        let text = prometheus_text(&p);
        let m = parse_prometheus(&text);
        assert_eq!(m["ferrotrain_step"], 7.0);
        assert!(m["ferrotrain_loss"].is_nan());
        assert!(text.contains("ferrotrain_eta_seconds +Inf\n"));
        for absent in [
            "ferrotrain_eval_loss",
            "ferrotrain_comm_fraction",
            "ferrotrain_last_checkpoint_step",
            "ferrotrain_resumed_from_step",
        ] {
            assert!(
                !text.contains(absent),
                "{absent} should be omitted:\n{text}"
            );
        }
        assert_eq!(m["ferrotrain_phase{phase=\"starting\"}"], 1.0);
        assert_eq!(format_float(1e-7), "1e-7");
        assert_eq!(format_float(-0.5), "-0.5");
    }

    #[test]
    fn serves_every_endpoint() {
        let (_server, shared, addr) = start(full_progress());

        let (status, head, body) = get(addr, "/healthz");
        assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
        assert!(head.contains("Connection: close"));

        let (status, head, body) = get(addr, "/progress");
        assert_eq!(status, 200);
        assert!(head.contains("Content-Type: application/json"), "{head}");
        let back: Progress = serde_json::from_slice(&body).unwrap();
        assert_eq!(back, full_progress());

        let (status, head, body) = get(addr, "/metrics?name[]=x");
        assert_eq!(status, 200);
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        let m = parse_prometheus(std::str::from_utf8(&body).unwrap());
        assert_eq!(m["ferrotrain_step"], 1234.0);

        // The server reads the shared progress at request time.
        shared.lock().unwrap().step = 1300;
        let (_, _, body) = get(addr, "/metrics");
        assert_eq!(
            parse_prometheus(std::str::from_utf8(&body).unwrap())["ferrotrain_step"],
            1300.0
        );

        assert_eq!(get(addr, "/nope").0, 404);
        assert_eq!(get(addr, "/").0, 404);
        let (status, head, _) = raw(
            addr,
            b"POST /progress HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        );
        assert_eq!(status, 405);
        assert!(head.contains("Allow: GET"));
        assert_eq!(raw(addr, b"DELETE /metrics HTTP/1.0\r\n\r\n").0, 405);
    }

    #[test]
    fn garbage_is_answered_400_and_the_server_keeps_serving() {
        let (_server, _shared, addr) = start(full_progress());
        for junk in [
            &b"\x00\xff\xfe garbage\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"\xc3\x28 /metrics HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                raw(addr, junk).0,
                400,
                "{:?}",
                String::from_utf8_lossy(junk)
            );
        }
        // Too long a head: 431, never an unbounded read.
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(&huge); // the server may close before taking it all
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(
            out.is_empty() || out.starts_with(b"HTTP/1.1 431"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        // A peer that sends half a request and closes.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metr").unwrap();
        drop(s);
        assert_eq!(get(addr, "/healthz").0, 200);
    }

    #[test]
    fn a_silent_client_does_not_block_the_next_request() {
        let (_server, _shared, addr) = start(full_progress());
        // Half-open: connects, says nothing, keeps the socket open.
        let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut trickle = TcpStream::connect(addr).unwrap();
        trickle.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
        let started = Instant::now();
        assert_eq!(get(addr, "/progress").0, 200);
        assert!(
            started.elapsed() < IO_TIMEOUT,
            "answered only after {:?}",
            started.elapsed()
        );
        // The silent ones are cut off by the server's read timeout, not kept forever.
        let mut s = silent.into_iter().next().unwrap();
        s.set_read_timeout(Some(REQUEST_DEADLINE + Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 16];
        let closed_at = Instant::now();
        let n = s.read(&mut buf);
        assert!(matches!(n, Ok(0) | Err(_)));
        assert!(closed_at.elapsed() < REQUEST_DEADLINE + Duration::from_secs(4));
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
        // The listener is closed: connecting is refused (or, at worst, closed unanswered).
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}"),
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
        assert!(MetricsServer::start(port, Arc::new(Mutex::new(Progress::default()))).is_err());
    }
}
