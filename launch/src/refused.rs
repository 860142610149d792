//! Connections refused by this process's rendezvous store or ring listeners, by reason: a
//! counter per reason for the progress report (`rejectedConnections`, and
//! `ferrotrain_rejected_connections_total{reason}` in /metrics), and one info log line with
//! the peer's address at most every [`LOG_EVERY`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::auth::HandshakeError;

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The peer's proof failed: another token, attempt or round.
    BadToken,
    /// Not a ferrotrain endpoint at all (bad magic bytes).
    NotFerrotrain,
    /// A ferrotrain endpoint of the other channel (a ring peer at the store, or back).
    WrongChannel,
    /// The handshake broke off or timed out.
    Handshake,
    /// An authenticated peer sent a malformed frame.
    BadFrame,
    /// The store was at its connection limit, or a ring listener at its limit of
    /// handshakes in flight.
    TooManyConnections,
    /// A ring peer proved the token but announced a rank other than the listener's
    /// previous one.
    WrongRank,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::BadToken,
        Reason::NotFerrotrain,
        Reason::WrongChannel,
        Reason::Handshake,
        Reason::BadFrame,
        Reason::TooManyConnections,
        Reason::WrongRank,
    ];

    /// The label value in /metrics and the key in the progress report.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadToken => "bad_token",
            Reason::NotFerrotrain => "not_ferrotrain",
            Reason::WrongChannel => "wrong_channel",
            Reason::Handshake => "handshake",
            Reason::BadFrame => "bad_frame",
            Reason::TooManyConnections => "too_many_connections",
            Reason::WrongRank => "wrong_rank",
        }
    }

    /// The reason of a failed handshake.
    pub fn of(e: &HandshakeError) -> Reason {
        match e {
            HandshakeError::BadMac => Reason::BadToken,
            HandshakeError::BadMagic => Reason::NotFerrotrain,
            HandshakeError::WrongChannel => Reason::WrongChannel,
            HandshakeError::Io(_) => Reason::Handshake,
        }
    }

    fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

static COUNTS: [AtomicU64; Reason::ALL.len()] = [const { AtomicU64::new(0) }; Reason::ALL.len()];
/// When the last line was logged, and how many refusals it did not mention since.
static LOG: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
/// At most one log line per this long: a flood must not flood the log too.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts a refused connection from `peer` (`what`: the store or the ring).
pub fn count(reason: Reason, peer: SocketAddr, what: &str) {
    COUNTS[reason.index()].fetch_add(1, Ordering::Relaxed);
    let mut log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    match *log {
        Some((at, ref mut unsaid)) if now.duration_since(at) < LOG_EVERY => *unsaid += 1,
        Some((_, unsaid)) => {
            tracing::info!(
                "{what}: refused a connection from {peer} ({}); {unsaid} more refused in the last {} s",
                reason.as_str(),
                LOG_EVERY.as_secs()
            );
            *log = Some((now, 0));
        }
        None => {
            tracing::info!(
                "{what}: refused a connection from {peer} ({})",
                reason.as_str()
            );
            *log = Some((now, 0));
        }
    }
}

/// The counts so far, reasons with none left out.
pub fn snapshot() -> BTreeMap<String, u64> {
    Reason::ALL
        .iter()
        .map(|r| {
            (
                r.as_str().to_string(),
                COUNTS[r.index()].load(Ordering::Relaxed),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// `a` plus `b`, reason by reason.
pub fn merged(mut a: BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    for (reason, n) in b {
        *a.entry(reason.clone()).or_default() += n;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_reason_and_merged() {
        let peer: SocketAddr = "10.0.0.9:4000".parse().unwrap();
        let before = snapshot();
        count(Reason::BadToken, peer, "test");
        count(Reason::BadToken, peer, "test");
        count(Reason::of(&HandshakeError::BadMagic), peer, "test");
        let after = snapshot();
        let grew =
            |r: &str| after.get(r).copied().unwrap_or(0) - before.get(r).copied().unwrap_or(0);
        assert_eq!((grew("bad_token"), grew("not_ferrotrain")), (2, 1));
        let other = BTreeMap::from([("bad_token".to_string(), 5), ("bad_frame".to_string(), 1)]);
        let m = merged(BTreeMap::from([("bad_token".to_string(), 2)]), &other);
        assert_eq!(m["bad_token"], 7);
        assert_eq!(m["bad_frame"], 1);
    }
}
