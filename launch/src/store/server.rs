//! The store's server: one thread per connection, each read and write bounded, a cap on
//! connections; a connection's will applied when it ends.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::{Result, StoreError};
use super::protocol::{OK, REFUSED, Request, TIMED_OUT, read_frame, write_frame};
use super::values::{Full, Values, check_key};
use crate::auth::{Auth, Channel};
use crate::refused::{self, Reason};

/// Connections served at once; more are closed at accept (hostile floods).
const MAX_CONNECTIONS: usize = 256;
/// How long an authenticated client may stay silent between requests (one with a will may
/// stay longer: TCP keepalive watches it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest a GET may block on the server.
const MAX_GET_WAIT: Duration = Duration::from_secs(3600);
/// How often a GET blocked on a missing key looks whether its client is still there: one
/// that went away must not hold a thread and a connection slot until its wait runs out.
const PEER_CHECK: Duration = Duration::from_millis(250);
/// TCP keepalive of a connection with a will: its peer is called gone after about
/// idle + interval x probes of silence (a host that vanished without closing it).
const KEEPALIVE: (i32, i32, i32) = (10, 5, 3);

#[derive(Default)]
pub(super) struct State {
    values: Mutex<Values>,
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
    /// The port it serves on (the one bound when asked for port 0).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

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
    // Applied however this function returns.
    let mut will = Will { state, last: None };
    loop {
        let frame = match read_frame(&mut stream) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) if will.last.is_some() && is_idle(&e) => continue,
            Err(e) => {
                stats.dropped_frames.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("rendezvous store: dropping {peer}: {e}");
                // A frame over the cap or cut short is the peer's doing; a reset is not.
                if matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) {
                    refused::count(Reason::BadFrame, peer, "rendezvous store");
                }
                return;
            }
        };
        let Some(request) = Request::parse(&frame) else {
            stats.dropped_frames.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("rendezvous store: malformed request from {peer}");
            refused::count(Reason::BadFrame, peer, "rendezvous store");
            return;
        };
        let response = match request {
            Request::Will { key, value } => match check_key(&key) {
                Ok(()) => {
                    if will.last.is_none() {
                        keep_alive(&stream);
                    }
                    will.last = (!key.is_empty()).then_some((key, value));
                    Some(vec![OK])
                }
                Err(full) => Some(refusal(full)),
            },
            other => handle(other, state, &stream),
        };
        let Some(response) = response else {
            stats.dropped_frames.fetch_add(1, Ordering::Relaxed);
            refused::count(Reason::BadFrame, peer, "rendezvous store");
            return;
        };
        if write_frame(&mut stream, &response).is_err() {
            return;
        }
    }
}

/// A read that timed out on a silent connection (not a broken one).
fn is_idle(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A connection's last word, set when the connection ends unless its key is set by then.
struct Will<'s> {
    state: &'s State,
    last: Option<(String, Vec<u8>)>,
}

impl Drop for Will<'_> {
    fn drop(&mut self) {
        let Some((key, value)) = self.last.take() else {
            return;
        };
        let mut values = self.state.values.lock().expect("store lock");
        if values.insert_if_vacant(key, value) {
            drop(values);
            self.state.changed.notify_all();
        }
    }
}

/// TCP keepalive on a connection with a will: a peer whose host vanished (no FIN, no RST)
/// ends it, and its will is applied, instead of it idling forever.
fn keep_alive(stream: &TcpStream) {
    let fd = stream.as_raw_fd();
    let (idle, interval, probes) = KEEPALIVE;
    let set = |level: i32, name: i32, value: i32| {
        // SAFETY: an int option on a socket this function borrows.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes);
}

/// Executes one request (not a will: that is the connection's) from `client`; `None` when it
/// is malformed.
fn handle(request: Request, state: &State, client: &TcpStream) -> Option<Vec<u8>> {
    match request {
        Request::Set { key, value } => {
            let set = state.values.lock().expect("store lock").insert(key, value);
            if let Err(full) = set {
                return Some(refusal(full));
            }
            state.changed.notify_all();
            Some(vec![OK])
        }
        Request::Get { key, wait } => {
            let deadline = Instant::now() + wait.min(MAX_GET_WAIT);
            let mut values = state.values.lock().expect("store lock");
            loop {
                if let Some(v) = values.get(&key) {
                    let mut out = Vec::with_capacity(1 + v.len());
                    out.push(OK);
                    out.extend_from_slice(v);
                    return Some(out);
                }
                let now = Instant::now();
                if now >= deadline || peer_gone(client) {
                    return Some(vec![TIMED_OUT]);
                }
                values = state
                    .changed
                    .wait_timeout(values, (deadline - now).min(PEER_CHECK))
                    .expect("store lock")
                    .0;
            }
        }
        Request::Add { key, delta } => {
            let mut values = state.values.lock().expect("store lock");
            let current = match values.get(&key) {
                Some(v) if v.len() == 8 => i64::from_le_bytes(v[..].try_into().ok()?),
                Some(_) => return None,
                None => 0,
            };
            let new = current.wrapping_add(delta);
            if let Err(full) = values.insert(key, new.to_le_bytes().to_vec()) {
                return Some(refusal(full));
            }
            drop(values);
            state.changed.notify_all();
            let mut out = vec![OK];
            out.extend_from_slice(&new.to_le_bytes());
            Some(out)
        }
        Request::Will { .. } => None,
    }
}

/// The answer to a write past one of the store's limits: the limit, in words.
fn refusal(full: Full) -> Vec<u8> {
    let mut out = vec![REFUSED];
    out.extend(full.to_string().bytes());
    out
}

/// Whether the client closed its side or the connection broke (the answer would go nowhere).
fn peer_gone(client: &TcpStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: client.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; a zero timeout never blocks.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
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
