//! A rank's ring listener, until its previous rank has connected: every connection proves the
//! job's token (launch's `Auth`) on a thread of its own, so that a silent one cannot delay the
//! real peer's; the first that proves it and announces the previous rank is the link.
//!
//! Anyone the NetworkPolicy lets through reaches this port, so what it costs is bounded: at
//! most [`MAX_HANDSHAKES`] handshakes run at once (each a thread and a descriptor for up to
//! [`HANDSHAKE_TIMEOUT`]); a connection beyond them is closed at once. Every refusal is
//! counted by reason (`ferrotrain_launch::refused`): `too_many_connections` for those closed
//! at the cap, `wrong_rank` for a peer with the token that announces another rank, the
//! handshake's own reasons otherwise.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferrotrain_launch::auth::{Auth, Channel};
use ferrotrain_launch::refused::{self, Reason};

use crate::error::{Result, TrainError};

/// Handshakes in flight at once. The previous rank needs one (a few while it retries); 32
/// leaves it room beside a burst of strays, and bounds an imposter's half-open connections
/// to 32 threads and descriptors.
pub(super) const MAX_HANDSHAKES: usize = 32;
/// The longest one handshake may take (the real peer's takes milliseconds).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const WHAT: &str = "ring";

/// Accepts connections on `listener` until one proves the token and announces rank `prev`,
/// or fails at `deadline`.
pub(super) fn accept_prev(
    listener: TcpListener,
    prev: u32,
    auth: &Auth,
    deadline: Instant,
) -> Result<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true)?;
    let (tx, rx) = mpsc::channel::<(TcpStream, SocketAddr)>();
    let in_flight = Arc::new(AtomicUsize::new(0));
    loop {
        if let Ok(found) = rx.try_recv() {
            return Ok(found);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(TrainError::Distributed(
                format!("ring: rank {prev} did not connect before the rendezvous timeout").into(),
            ));
        }
        match listener.accept() {
            Ok((stream, addr)) if in_flight.load(Ordering::SeqCst) >= MAX_HANDSHAKES => {
                drop(stream);
                refused::count(Reason::TooManyConnections, addr, WHAT);
            }
            Ok((stream, addr)) => {
                let handshake = Handshake {
                    prev,
                    auth: auth.clone(),
                    timeout: (deadline - now).min(HANDSHAKE_TIMEOUT),
                    _slot: Slot::take(&in_flight),
                };
                let tx = tx.clone();
                let spawned = std::thread::Builder::new()
                    .name("ring-handshake".into())
                    .spawn(move || handshake.run(stream, addr, &tx));
                if let Err(e) = spawned {
                    tracing::warn!("ring: no thread for a handshake: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if let Ok(found) = rx.recv_timeout(Duration::from_millis(5)) {
                    return Ok(found);
                }
            }
            Err(e) => {
                tracing::warn!("ring: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// One handshake slot, given back when the handshake's thread ends (or never starts).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(in_flight: &Arc<AtomicUsize>) -> Slot {
        in_flight.fetch_add(1, Ordering::SeqCst);
        Slot(in_flight.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection's handshake, on its own thread.
struct Handshake {
    prev: u32,
    auth: Auth,
    timeout: Duration,
    _slot: Slot,
}

impl Handshake {
    fn run(
        self,
        mut stream: TcpStream,
        addr: SocketAddr,
        found: &mpsc::Sender<(TcpStream, SocketAddr)>,
    ) {
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        match self.auth.accept(&mut stream, Channel::Ring, self.timeout) {
            Ok(hello) if hello == self.prev => {
                let _ = found.send((stream, addr));
            }
            Ok(hello) => {
                tracing::warn!(
                    "ring: {addr} proved the token as rank {hello}, expected rank {}",
                    self.prev
                );
                refused::count(Reason::WrongRank, addr, WHAT);
            }
            Err(e) => {
                tracing::debug!("ring: rejected {addr}: {e}");
                refused::count(Reason::of(&e), addr, WHAT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(reason: Reason) -> u64 {
        refused::snapshot()
            .get(reason.as_str())
            .copied()
            .unwrap_or(0)
    }

    fn threads() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
        line[8..].trim().parse().unwrap()
    }

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn listening(
        auth: &Auth,
    ) -> (
        SocketAddr,
        std::thread::JoinHandle<Result<(TcpStream, SocketAddr)>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let auth = auth.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        (
            addr,
            std::thread::spawn(move || accept_prev(listener, 1, &auth, deadline)),
        )
    }

    /// `rank`'s side of the handshake, retried while the listener turns it away.
    fn connect_as(addr: SocketAddr, auth: &Auth, rank: u32) -> TcpStream {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let mut s = TcpStream::connect(addr).unwrap();
            match auth.connect(&mut s, Channel::Ring, rank, Duration::from_secs(5)) {
                Ok(()) => return s,
                Err(e) => assert!(Instant::now() < until, "rank {rank} never got in: {e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Issue 44: 150 connections that say nothing hold at most MAX_HANDSHAKES threads; the
    /// others are closed at once and counted; once they go, the real peer gets in.
    #[test]
    fn half_open_connections_past_the_cap_are_closed_counted_and_hold_no_thread() {
        let auth = Auth::new("token", 3);
        let (addr, acceptor) = listening(&auth);
        std::thread::sleep(Duration::from_millis(50));
        let before = threads();
        let silent: Vec<TcpStream> = (0..150)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let closed = (silent.len() - MAX_HANDSHAKES) as u64;
        wait_for("the refusals", || {
            counted(Reason::TooManyConnections) >= closed
        });
        let during = threads();
        println!("threads: {before} before, {during} with 150 half-open connections");
        assert!(
            during <= before + MAX_HANDSHAKES,
            "{during} threads, {before} before"
        );
        assert_eq!(counted(Reason::TooManyConnections), closed);
        drop(silent);
        let link = connect_as(addr, &auth, 1);
        let (_, from) = acceptor.join().unwrap().unwrap();
        assert_eq!(from, link.local_addr().unwrap());
        assert_eq!(counted(Reason::BadToken), 0);
    }

    /// Issue 44: a peer that proves the token but announces another rank is refused and
    /// counted as wrong_rank (it was logged only); the real one is still taken.
    #[test]
    fn a_peer_with_the_token_announcing_another_rank_is_refused_and_counted() {
        let auth = Auth::new("token", 3);
        let (addr, acceptor) = listening(&auth);
        let imposter = connect_as(addr, &auth, 5);
        wait_for("wrong_rank", || counted(Reason::WrongRank) == 1);
        let link = connect_as(addr, &auth, 1);
        let (_, from) = acceptor.join().unwrap().unwrap();
        assert_eq!(from, link.local_addr().unwrap());
        assert_ne!(from, imposter.local_addr().unwrap());
        assert_eq!(counted(Reason::WrongRank), 1);
    }
}
