//! The agent's watchers: threads with store connections of their own that wake the agent's
//! supervision loop (which polls a flag every 25 ms) when the round must end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::Auth;
use crate::group::GroupOutcome;
use crate::store::{self, StoreClient, StoreError};
use crate::{heartbeat, keys, members};

/// The longest single blocking GET of the watcher (it loops).
const WATCH_SLICE: Duration = Duration::from_secs(60);
/// How often node 0 looks for late nodes while a round runs without them.
const GROW_POLL: Duration = Duration::from_secs(1);

/// The mark of a round that ended on a rank that did not answer its peers in a collective
/// (`agent/<r>/failed`): every collective waits on it, so the other nodes stop their ranks
/// within the short grace of a lost node instead of waiting for a save that cannot happen.
pub const STUCK: &[u8] = b"stuck";

/// What a node whose own rank ended the round (`outcome`) marks it with: [`STUCK`] when that
/// rank timed out on a silent peer, else the node's number.
pub fn end_mark(node: usize, outcome: &GroupOutcome) -> Vec<u8> {
    match outcome {
        GroupOutcome::Failed(f) if f.silent_peer().is_some() => STUCK.to_vec(),
        _ => node.to_string().into_bytes(),
    }
}

/// A thread blocked on `agent/<round>/failed` through a connection of its own: it raises
/// `fired` when any node's rank failed, or when the store is gone (node 0 lost), and `lost`
/// too when no rank can save before it stops: node 0 ended the round for a member that sent
/// no heartbeat (heartbeat.rs), or a rank did not answer its peers ([`STUCK`]).
pub struct Watcher {
    pub fired: Arc<AtomicBool>,
    pub lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    pub fn start(host: &str, port: u16, auth: &Auth, round: u64) -> store::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut client = StoreClient::connect(host, port, auth, deadline)?;
        let (fired, lost, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (f, l, s) = (fired.clone(), lost.clone(), stop.clone());
        let key = keys::failed(round);
        let thread = std::thread::Builder::new()
            .name("agent-watch".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    match client.try_get(&key, WATCH_SLICE) {
                        Ok(Some(why)) => {
                            if why == heartbeat::LOST || why == STUCK {
                                l.store(true, Ordering::SeqCst);
                            }
                            break;
                        }
                        Ok(None) => continue,
                        Err(e) => {
                            if !s.load(Ordering::SeqCst) {
                                tracing::warn!("agent: lost the rendezvous store: {e}");
                            }
                            break;
                        }
                    }
                }
                f.store(true, Ordering::SeqCst);
            })
            .map_err(StoreError::Start)?;
        Ok(Watcher {
            fired,
            lost,
            stop,
            thread: Some(thread),
        })
    }

    /// Ends the watch (the thread may sit in a GET for up to a slice: it is left to finish).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(self.thread.take());
    }
}

/// Node 0, while a round runs with fewer nodes than the gang: a late node arrived (its pod
/// is back) -> marks the round to end for a resize (`agent/<r>/resize`) and wakes every
/// agent's [`Watcher`] (`agent/<r>/failed`). The trainers stop together on SIGTERM, rank 0
/// saving a checkpoint, and the next round has every node.
pub struct Grower {
    stop: Arc<AtomicBool>,
}

impl Grower {
    pub fn start(
        host: &str,
        port: u16,
        auth: &Auth,
        round: u64,
        members: usize,
    ) -> store::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut client = StoreClient::connect(host, port, auth, deadline)?;
        let (grow, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (g, s) = (grow.clone(), stop.clone());
        std::thread::Builder::new()
            .name("agent-grow".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    // Woken by a late agent's knock (at once), else a look every GROW_POLL.
                    let knocked = client.try_get(&keys::knock(round), GROW_POLL);
                    if members::late(&mut client, round, members).unwrap_or(0) == 0 {
                        if matches!(knocked, Ok(Some(_)) | Err(_)) {
                            std::thread::sleep(GROW_POLL);
                        }
                        continue;
                    }
                    let marked = client
                        .set(&keys::resize(round), b"grow")
                        .and_then(|()| client.set(&keys::failed(round), b"resize"));
                    if marked.is_ok() {
                        tracing::info!(
                            "agent: a node is back: round {round} ends so that the gang grows"
                        );
                        g.store(true, Ordering::SeqCst);
                    }
                    return;
                }
            })
            .map_err(StoreError::Start)?;
        Ok(Grower { stop })
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
