//! Rank 0's rendezvous key-value store and its client.
//!
//! Every connection starts with the token handshake (`auth`); after it, the client sends
//! length-prefixed request frames (u32 LE length, at most `MAX_FRAME` bytes) and reads one
//! response frame per request:
//!
//! ```text
//! SET  = 1 | key len (u32) | key | value        -> 0
//! GET  = 2 | timeout ms (u64) | key              -> 0 | value    or 1 (timed out)
//! ADD  = 3 | delta (i64) | key                   -> 0 | new value (i64)
//! ```
//!
//! The server spends one thread per connection, every read and write bounded by a timeout,
//! and a cap on concurrent connections; anything malformed drops that connection only.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{Auth, Channel, HandshakeError};
use crate::keys;
use crate::refused::{self, Reason};

/// Why a store request, a connection to the store or the store itself failed. Retryable
/// wherever it surfaces (a rank exits with the retryable code; an agent ends its rounds).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be made before the deadline; `last` says why the last try failed.
    #[error(
        "rendezvous: could not reach the store at {server} in {attempts} attempts before the rendezvous timeout: {last}"
    )]
    Unreachable {
        server: String,
        attempts: u32,
        #[source]
        last: ConnectError,
    },
    /// A request or its answer broke off.
    #[error("rendezvous store at {server}: {what}: {source} (did rank 0 exit?)")]
    Io {
        server: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The store answered something this client did not ask for.
    #[error("rendezvous store at {server}: malformed {what} reply")]
    MalformedReply { server: String, what: &'static str },
    /// A key did not appear in time.
    #[error("rendezvous: `{key}` was not published within {seconds} s (a rank did not join)")]
    NotPublished { key: String, seconds: f64 },
    /// Not every client entered a barrier in time.
    #[error(
        "rendezvous: barrier `{name}` incomplete after {seconds} s: not all {world} ranks arrived"
    )]
    Barrier {
        name: String,
        world: usize,
        seconds: f64,
    },
    /// MASTER_PORT cannot be listened on.
    #[error("rendezvous: cannot listen on {addr} (MASTER_PORT)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The server could not start (its listener or its thread).
    #[error("rendezvous store: cannot start: {0}")]
    Start(#[source] std::io::Error),
}

/// Why one try to connect to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolved to no address")]
    NoAddress { host: String },
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: HandshakeError,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Largest request or response frame; the store only carries addresses and ids.
pub const MAX_FRAME: usize = 1 << 20;
/// Connections served at once; more are closed at accept (hostile floods).
const MAX_CONNECTIONS: usize = 256;
/// How long an authenticated client may stay silent between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest a GET may block on the server.
const MAX_GET_WAIT: Duration = Duration::from_secs(3600);

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OK: u8 = 0;
const TIMED_OUT: u8 = 1;

#[derive(Default)]
struct State {
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// Counts what the server turned away; for tests and logs.
#[derive(Default, Debug)]
pub struct StoreStats {
    pub authenticated: AtomicUsize,
    pub rejected: AtomicUsize,
    pub dropped_frames: AtomicUsize,
}

/// The key-value store rank 0 serves on MASTER_PORT. Stops accepting when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
    pub stats: Arc<StoreStats>,
}

impl StoreServer {
    /// Serves on `listener`; `handshake_timeout` bounds how long an unauthenticated
    /// connection may take to prove itself.
    pub fn start(listener: TcpListener, auth: Auth, handshake_timeout: Duration) -> Result<Self> {
        let addr = listener.local_addr().map_err(StoreError::Start)?;
        listener.set_nonblocking(true).map_err(StoreError::Start)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(StoreStats::default());
        let state = Arc::new(State::default());
        let active = Arc::new(AtomicUsize::new(0));
        let accept_thread = {
            let stop = stop.clone();
            let stats = stats.clone();
            std::thread::Builder::new()
                .name("rdzv-store".into())
                .spawn(move || {
                    accept_loop(
                        listener,
                        auth,
                        handshake_timeout,
                        state,
                        stats,
                        active,
                        stop,
                    )
                })
                .map_err(StoreError::Start)?
        };
        Ok(StoreServer {
            addr,
            stop,
            accept_thread: Some(accept_thread),
            stats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    auth: Auth,
    handshake_timeout: Duration,
    state: Arc<State>,
    stats: Arc<StoreStats>,
    active: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    refused::count(Reason::TooManyConnections, peer, "rendezvous store");
                    continue;
                }
                active.fetch_add(1, Ordering::SeqCst);
                let (auth, state, stats, active) =
                    (auth.clone(), state.clone(), stats.clone(), active.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("rdzv-conn".into())
                        .spawn(move || {
                            serve_connection(
                                stream,
                                peer,
                                &auth,
                                handshake_timeout,
                                &state,
                                &stats,
                            );
                            active.fetch_sub(1, Ordering::SeqCst);
                        });
                if spawned.is_err() {
                    tracing::warn!("rendezvous store: cannot spawn a thread for {peer}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                poll_readable(listener.as_raw_fd(), Duration::from_millis(100));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("rendezvous store: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    auth: &Auth,
    handshake_timeout: Duration,
    state: &State,
    stats: &StoreStats,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    match auth.accept(&mut stream, Channel::Store, handshake_timeout) {
        Ok(_) => {
            stats.authenticated.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("rendezvous store: rejected {peer}: {e}");
            refused::count(Reason::of(&e), peer, "rendezvous store");
            return;
        }
    }
    let _ = stream.set_nodelay(true);
    if stream.set_read_timeout(Some(IDLE_TIMEOUT)).is_err() {
        return;
    }
    loop {
        let request = match read_frame(&mut stream) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                stats.dropped_frames.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("rendezvous store: dropping {peer}: {e}");
                return;
            }
        };
        let Some(response) = handle(&request, state) else {
            stats.dropped_frames.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("rendezvous store: malformed request from {peer}");
            refused::count(Reason::BadFrame, peer, "rendezvous store");
            return;
        };
        if write_frame(&mut stream, &response).is_err() {
            return;
        }
    }
}

/// Executes one request; `None` when it is malformed.
fn handle(request: &[u8], state: &State) -> Option<Vec<u8>> {
    let (&op, body) = request.split_first()?;
    match op {
        OP_SET => {
            let klen = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
            let key = std::str::from_utf8(body.get(4..4usize.checked_add(klen)?)?).ok()?;
            let value = body[4 + klen..].to_vec();
            state
                .values
                .lock()
                .expect("store lock")
                .insert(key.to_string(), value);
            state.changed.notify_all();
            Some(vec![OK])
        }
        OP_GET => {
            let ms = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
            let key = std::str::from_utf8(&body[8..]).ok()?;
            let wait = Duration::from_millis(ms).min(MAX_GET_WAIT);
            let deadline = Instant::now() + wait;
            let mut values = state.values.lock().expect("store lock");
            loop {
                if let Some(v) = values.get(key) {
                    let mut out = Vec::with_capacity(1 + v.len());
                    out.push(OK);
                    out.extend_from_slice(v);
                    return Some(out);
                }
                let now = Instant::now();
                if now >= deadline {
                    return Some(vec![TIMED_OUT]);
                }
                values = state
                    .changed
                    .wait_timeout(values, deadline - now)
                    .expect("store lock")
                    .0;
            }
        }
        OP_ADD => {
            let delta = i64::from_le_bytes(body.get(..8)?.try_into().ok()?);
            let key = std::str::from_utf8(&body[8..]).ok()?;
            let mut values = state.values.lock().expect("store lock");
            let current = match values.get(key) {
                Some(v) if v.len() == 8 => i64::from_le_bytes(v[..].try_into().ok()?),
                Some(_) => return None,
                None => 0,
            };
            let new = current.wrapping_add(delta);
            values.insert(key.to_string(), new.to_le_bytes().to_vec());
            drop(values);
            state.changed.notify_all();
            let mut out = vec![OK];
            out.extend_from_slice(&new.to_le_bytes());
            Some(out)
        }
        _ => None,
    }
}

/// Reads one frame; `Ok(None)` on a clean EOF between frames.
fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte cap"),
        ));
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf)?;
    Ok(Some(buf))
}

fn write_frame(stream: &mut TcpStream, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

/// Waits until `fd` is readable or `timeout` passes.
fn poll_readable(fd: i32, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe {
        libc::poll(&mut pfd, 1, ms);
    }
}

/// A rank's connection to the store.
pub struct StoreClient {
    stream: TcpStream,
    server: String,
    /// Bounds every request that does not carry its own wait.
    timeout: Duration,
    /// Put before every key (the ranks of an in-place round use `round/<r>/`).
    prefix: String,
}

impl StoreClient {
    /// Resolves and connects to `host:port`, retrying name resolution, connection and a
    /// rejected handshake with backoff until `deadline` (DNS records of a new pod appear
    /// late; rank 0 may not listen yet).
    pub fn connect(host: &str, port: u16, auth: &Auth, deadline: Instant) -> Result<Self> {
        let server = format!("{host}:{port}");
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let last_error = match Self::try_connect(host, port, auth, left) {
                Ok(stream) => {
                    return Ok(StoreClient {
                        stream,
                        server,
                        timeout: Duration::from_secs(60),
                        prefix: String::new(),
                    });
                }
                Err(e) => e,
            };
            let now = Instant::now();
            if now + backoff >= deadline {
                return Err(StoreError::Unreachable {
                    server,
                    attempts,
                    last: last_error,
                });
            }
            tracing::debug!("rendezvous: {server} not ready ({last_error}); retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn try_connect(
        host: &str,
        port: u16,
        auth: &Auth,
        left: Duration,
    ) -> std::result::Result<TcpStream, ConnectError> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|source| ConnectError::Resolve {
                host: host.to_string(),
                source,
            })?
            .collect();
        let mut last = ConnectError::NoAddress {
            host: host.to_string(),
        };
        let step = left.clamp(Duration::from_millis(1), Duration::from_secs(10));
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, step) {
                Ok(mut stream) => {
                    let _ = stream.set_nodelay(true);
                    match auth.connect(&mut stream, Channel::Store, u32::MAX, step) {
                        Ok(()) => return Ok(stream),
                        Err(source) => last = ConnectError::Handshake { addr, source },
                    }
                }
                Err(source) => last = ConnectError::Connect { addr, source },
            }
        }
        Err(last)
    }

    /// How long a request may wait for the store beyond its own wait (default 60 s): a
    /// heartbeat's connection gives up sooner.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Every key this client reads or writes from now on is `prefix` + key.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The address this rank reaches rank 0 from: the one other ranks can reach it at.
    pub fn local_ip(&self) -> Result<IpAddr> {
        let addr = self
            .stream
            .local_addr()
            .map_err(self.fail("local address"))?;
        Ok(addr.ip())
    }

    /// The address this rank reached rank 0 at.
    pub fn peer_ip(&self) -> Result<IpAddr> {
        let addr = self.stream.peer_addr().map_err(self.fail("peer address"))?;
        Ok(addr.ip())
    }

    /// `StoreError::Io` of this connection, for `map_err`.
    fn fail(&self, what: &'static str) -> impl Fn(std::io::Error) -> StoreError + use<> {
        let server = self.server.clone();
        move |source| StoreError::Io {
            server: server.clone(),
            what,
            source,
        }
    }

    fn request(&mut self, payload: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let fail = |what: &'static str, source: std::io::Error| StoreError::Io {
            server: self.server.clone(),
            what,
            source,
        };
        self.stream
            .set_read_timeout(Some(self.timeout + wait))
            .map_err(|e| fail("setting timeout", e))?;
        self.stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| fail("setting timeout", e))?;
        write_frame(&mut self.stream, payload).map_err(|e| fail("sending", e))?;
        match read_frame(&mut self.stream) {
            Ok(Some(r)) if !r.is_empty() => Ok(r),
            Ok(_) => Err(fail(
                "reading",
                std::io::Error::new(ErrorKind::UnexpectedEof, "connection closed"),
            )),
            Err(e) => Err(fail("reading", e)),
        }
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.key(key);
        let mut p = vec![OP_SET];
        p.extend_from_slice(&(key.len() as u32).to_le_bytes());
        p.extend_from_slice(key.as_bytes());
        p.extend_from_slice(value);
        self.request(&p, Duration::ZERO)?;
        Ok(())
    }

    /// Waits up to `wait` for `key` to be set.
    pub fn get(&mut self, key: &str, wait: Duration) -> Result<Vec<u8>> {
        self.try_get(key, wait)?
            .ok_or_else(|| StoreError::NotPublished {
                key: self.key(key),
                seconds: wait.as_secs_f64(),
            })
    }

    /// Waits up to `wait` for `key` to be set: None when it was not by then.
    pub fn try_get(&mut self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>> {
        let key = self.key(key);
        let mut p = vec![OP_GET];
        p.extend_from_slice(&(wait.as_millis().min(u64::MAX as u128) as u64).to_le_bytes());
        p.extend_from_slice(key.as_bytes());
        let r = self.request(&p, wait)?;
        Ok((r[0] == OK).then(|| r[1..].to_vec()))
    }

    /// Adds `delta` to the counter `key`; returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let key = self.key(key);
        let mut p = vec![OP_ADD];
        p.extend_from_slice(&delta.to_le_bytes());
        p.extend_from_slice(key.as_bytes());
        let r = self.request(&p, Duration::ZERO)?;
        if r.len() != 9 || r[0] != OK {
            return Err(StoreError::MalformedReply {
                server: self.server.clone(),
                what: "ADD",
            });
        }
        Ok(i64::from_le_bytes(r[1..].try_into().expect("8 bytes")))
    }

    /// Returns once `world` clients have entered the barrier `name`, or fails after `wait`.
    pub fn barrier(&mut self, name: &str, world: usize, wait: Duration) -> Result<()> {
        let arrived = self.add(&keys::barrier_count(name), 1)?;
        if arrived as usize == world {
            self.set(&keys::barrier_done(name), b"1")?;
        }
        match self.get(&keys::barrier_done(name), wait) {
            Ok(_) => Ok(()),
            Err(StoreError::NotPublished { .. }) => Err(StoreError::Barrier {
                name: name.to_string(),
                world,
                seconds: wait.as_secs_f64(),
            }),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(auth: &Auth) -> StoreServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        StoreServer::start(l, auth.clone(), Duration::from_secs(2)).unwrap()
    }

    fn client(srv: &StoreServer, auth: &Auth) -> StoreClient {
        let deadline = Instant::now() + Duration::from_secs(5);
        StoreClient::connect("127.0.0.1", srv.local_addr().port(), auth, deadline).unwrap()
    }

    #[test]
    fn set_get_add_barrier() {
        let auth = Auth::new("tok", 0);
        let srv = server(&auth);
        let mut a = client(&srv, &auth);
        let mut b = client(&srv, &auth);
        a.set("k", b"v").unwrap();
        assert_eq!(b.get("k", Duration::from_secs(1)).unwrap(), b"v");
        assert_eq!(a.add("n", 2).unwrap(), 2);
        assert_eq!(b.add("n", 3).unwrap(), 5);
        let t = std::thread::spawn(move || {
            b.barrier("x", 2, Duration::from_secs(5)).unwrap();
            b
        });
        a.barrier("x", 2, Duration::from_secs(5)).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn get_blocks_until_set_and_times_out() {
        let auth = Auth::new("tok", 0);
        let srv = server(&auth);
        let mut a = client(&srv, &auth);
        let mut b = client(&srv, &auth);
        let t = std::thread::spawn(move || b.get("late", Duration::from_secs(5)).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        a.set("late", b"here").unwrap();
        assert_eq!(t.join().unwrap(), b"here");
        let start = Instant::now();
        let err = a.get("never", Duration::from_millis(200)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(err.to_string().contains("never"), "{err}");
    }

    #[test]
    fn connect_retries_until_the_server_listens() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let auth = Auth::new("tok", 1);
        let a2 = auth.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
            let srv = StoreServer::start(l, a2, Duration::from_secs(2)).unwrap();
            std::thread::sleep(Duration::from_secs(2));
            drop(srv);
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect("127.0.0.1", port, &auth, deadline).unwrap();
        c.set("a", b"b").unwrap();
        t.join().unwrap();
    }

    #[test]
    fn unresolvable_host_fails_at_the_deadline_with_the_cause() {
        let auth = Auth::new("tok", 1);
        let start = Instant::now();
        let deadline = start + Duration::from_millis(500);
        let err = StoreClient::connect("no-such-host.invalid", 1, &auth, deadline)
            .err()
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        let msg = err.to_string();
        assert!(msg.contains("no-such-host.invalid"), "{msg}");
    }

    #[test]
    fn malformed_requests_are_rejected_without_panicking() {
        let state = State::default();
        for bad in [
            &[][..],
            &[9u8][..],
            &[OP_SET, 255, 255, 255, 255][..],
            &[OP_GET, 1, 2][..],
            &[OP_ADD, 1][..],
            &[OP_SET, 1, 0, 0, 0, 0xff][..],
        ] {
            assert!(handle(bad, &state).is_none(), "{bad:?}");
        }
        handle(&[OP_SET, 1, 0, 0, 0, b'k', 1, 2, 3], &state).unwrap();
        // Adding to a non-counter value is malformed, not a panic.
        let mut add = vec![OP_ADD];
        add.extend_from_slice(&1i64.to_le_bytes());
        add.push(b'k');
        assert!(handle(&add, &state).is_none());
    }
}
