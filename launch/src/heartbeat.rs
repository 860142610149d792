//! Heartbeats between the agents of a round: a node cut off from the others (a network
//! partition, a frozen or stopped node) ends the round within the heartbeat timeout, long
//! before its peers' collective timeout or Kubernetes' NotReady, and never goes on training
//! on its own side.
//!
//! ```text
//! agent/<r>/beat/<node>    ADD 1 by each node but 0, every second, on a connection of its own
//! agent/<r>/lost/<node>    SET by node 0 for a member whose beat stood still for the timeout:
//!                          the seconds it was silent
//! agent/<r>/failed         SET to `lost` by node 0 then: every watcher wakes (watch.rs)
//! ```
//!
//! Node 0 (which hosts the store) reads the counters on its own clock, so no two clocks are
//! compared. A node whose beat does not go through for the timeout stops its own ranks: it is
//! cut off, and its peers have ended the round without it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::auth::Auth;
use crate::keys;
use crate::store::{self, StoreClient};

/// How often a node beats, and node 0 looks.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// The value of `agent/<r>/failed` when node 0 ended the round for a lost node.
pub const LOST: &[u8] = b"lost";

/// Node 0's view of one member's beat: the last count and when it last changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Beat {
    pub node: usize,
    count: i64,
    changed: Instant,
}

impl Beat {
    pub fn new(node: usize, now: Instant) -> Self {
        Beat {
            node,
            count: 0,
            changed: now,
        }
    }

    /// Records the count read at `now`.
    pub fn saw(&mut self, count: i64, now: Instant) {
        if count != self.count {
            self.count = count;
            self.changed = now;
        }
    }

    /// How long the beat has stood still at `now`.
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.changed)
    }
}

/// The members whose beat stood still for `timeout` at `now`, with how long.
pub fn silent(beats: &[Beat], now: Instant, timeout: Duration) -> Vec<(usize, Duration)> {
    beats
        .iter()
        .map(|b| (b.node, b.silent_for(now)))
        .filter(|(_, d)| *d >= timeout)
        .collect()
}

/// The round's heartbeat thread: on node 0 it watches the members' beats, on any other node
/// it beats. Either way it raises `fired` when the round must end for a lost node, and
/// `lost` says that this was why (no collective can complete: the ranks are stopped without
/// waiting for a checkpoint they cannot agree on).
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
}

/// Where the round's store is and who is in the round.
pub struct Round<'a> {
    pub host: &'a str,
    pub port: u16,
    pub auth: &'a Auth,
    pub round: u64,
    /// This agent's node.
    pub node: usize,
    /// The round's other member nodes (node 0 watches them).
    pub others: Vec<usize>,
}

impl Heartbeat {
    pub fn start(
        r: Round<'_>,
        timeout: Duration,
        fired: Arc<AtomicBool>,
        lost: Arc<AtomicBool>,
    ) -> store::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = StoreClient::connect(r.host, r.port, r.auth, deadline)?.with_timeout(timeout);
        let stop = Arc::new(AtomicBool::new(false));
        // Once the round ends for any reason its members stop at their own pace: a node that
        // finished stopping its ranks and beats no more is not lost.
        let (s, f) = (stop.clone(), fired.clone());
        let over = move || s.load(Ordering::SeqCst) || f.load(Ordering::SeqCst);
        let end = move || {
            lost.store(true, Ordering::SeqCst);
            fired.store(true, Ordering::SeqCst);
        };
        let (round, node, others) = (r.round, r.node, r.others);
        let reconnect = (r.host.to_string(), r.port, r.auth.clone());
        std::thread::Builder::new()
            .name("agent-heartbeat".into())
            .spawn(move || {
                let ended = if node == 0 {
                    watch_beats(client, round, &others, timeout, &over)
                } else {
                    beat(client, reconnect, round, node, timeout, &over)
                };
                if ended {
                    end();
                }
            })
            .map_err(store::StoreError::Start)?;
        Ok(Heartbeat { stop })
    }

    /// Ends the thread (within a beat).
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Node 0: reads every member's beat; true once one stood still for `timeout` (then it is
/// marked lost and the round failed).
fn watch_beats(
    mut client: StoreClient,
    round: u64,
    others: &[usize],
    timeout: Duration,
    over: &dyn Fn() -> bool,
) -> bool {
    let mut beats: Vec<Beat> = others
        .iter()
        .map(|&n| Beat::new(n, Instant::now()))
        .collect();
    while !over() {
        std::thread::sleep(BEAT_EVERY);
        for b in &mut beats {
            match client.add(&keys::beat(round, b.node), 0) {
                Ok(count) => b.saw(count, Instant::now()),
                // Its own store: a failure here is the round's end anyway.
                Err(_) => return false,
            }
        }
        let lost = silent(&beats, Instant::now(), timeout);
        if lost.is_empty() || over() {
            continue;
        }
        for (node, silent) in &lost {
            tracing::warn!(
                "agent: round {round}: node {node} has sent no heartbeat for {:.1} s; \
                 ending the round without it",
                silent.as_secs_f64()
            );
            let secs = format!("{:.1}", silent.as_secs_f64());
            let _ = client.set(&keys::lost(round, *node), secs.as_bytes());
        }
        let _ = client.set(&keys::failed(round), LOST);
        return true;
    }
    false
}

/// Any other node: beats every second; true once no beat went through for `timeout` (the
/// node is cut off from node 0's store).
fn beat(
    client: StoreClient,
    (host, port, auth): (String, u16, Auth),
    round: u64,
    node: usize,
    timeout: Duration,
    over: &dyn Fn() -> bool,
) -> bool {
    let key = keys::beat(round, node);
    let mut client = Some(client);
    let mut last_beat = Instant::now();
    while !over() {
        std::thread::sleep(BEAT_EVERY);
        if client.as_mut().is_some_and(|c| c.add(&key, 1).is_ok()) {
            last_beat = Instant::now();
            continue;
        }
        let left = timeout.saturating_sub(last_beat.elapsed());
        if left.is_zero() {
            if !over() {
                tracing::warn!(
                    "agent: round {round}: no heartbeat reached node 0's store for {:.1} s; \
                     this node is cut off: stopping its ranks",
                    last_beat.elapsed().as_secs_f64()
                );
                return true;
            }
            return false;
        }
        let deadline = Instant::now() + left.min(BEAT_EVERY);
        client = StoreClient::connect(&host, port, &auth, deadline)
            .ok()
            .map(|c| c.with_timeout(left));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_lost_when_its_beat_stands_still_for_the_timeout() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut beats = vec![Beat::new(1, t0), Beat::new(2, t0)];
        beats[0].saw(1, t0 + s(4));
        beats[1].saw(0, t0 + s(4));
        assert!(
            silent(&beats, t0 + s(9), s(10)).is_empty(),
            "within the timeout"
        );
        assert_eq!(
            silent(&beats, t0 + s(10), s(10)),
            vec![(2, s(10))],
            "node 2 never beat; node 1 beat at 4 s"
        );
        beats[0].saw(1, t0 + s(14));
        assert_eq!(
            silent(&beats, t0 + s(14), s(10)),
            vec![(1, s(10)), (2, s(14))],
            "the same count read again is no beat"
        );
    }
}
