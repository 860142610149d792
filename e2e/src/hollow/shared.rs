//! What the simulator's tasks share (its kubelet, its nodes' heartbeats, its control
//! endpoint): the client, the config, the nodes, the pods' and jobs' state behind one lock,
//! the counters, and the bound on API writes in flight.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::config::Config;
use super::pods;

/// The simulator's counters (what it cost the API server, what it did).
#[derive(Debug, Default)]
pub struct Stats {
    pub lease_renewals: AtomicU64,
    pub node_status_writes: AtomicU64,
    pub pod_status_writes: AtomicU64,
    pub pod_deletes: AtomicU64,
    pub pod_starts: AtomicU64,
    pub pod_stops: AtomicU64,
    pub polls: AtomicU64,
    pub write_errors: AtomicU64,
    pub watch_errors: AtomicU64,
    pub bind_errors: AtomicU64,
    /// The pod watch has listed once.
    pub synced: AtomicBool,
}

/// The intervals between one job's /progress polls (the operator's reconciles of it).
#[derive(Debug, Default)]
pub struct PollLog {
    pub(super) last: Option<Instant>,
    pub(super) intervals: Vec<f64>,
}

/// What the simulator holds.
pub(crate) struct State {
    pub(super) pods: HashMap<String, pods::PodSim>,
    pub(super) servers: HashMap<String, JoinHandle<()>>,
    pub(super) jobs: pods::Jobs,
    pub(super) ips: pods::IpPool,
    pub(super) polls: HashMap<pods::JobKey, PollLog>,
    /// Nodes whose Lease is no longer renewed.
    pub(super) silenced: HashSet<String>,
    /// Nodes that report Ready=False.
    pub(super) not_ready: HashSet<String>,
    /// Each node's readiness as last written, and since when.
    pub(super) readiness: HashMap<String, (bool, Timestamp)>,
}

pub(crate) struct Shared {
    pub(super) client: Client,
    pub(super) config: Config,
    /// Every node and its InternalIP.
    pub(super) nodes: BTreeMap<String, Ipv4Addr>,
    pub(super) state: Mutex<State>,
    pub(super) stats: Stats,
    pub(super) writes: Semaphore,
}

impl Shared {
    /// Counts and logs a failed write; false.
    pub(super) fn failed(&self, what: &str, name: &str, error: &kube::Error) -> bool {
        let n = self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        if n < 20 {
            eprintln!("hollow: {what} {name}: {error}");
        }
        false
    }

    pub(super) fn is_silenced(&self, node: &str) -> bool {
        self.state.lock().expect("lock").silenced.contains(node)
    }

    pub(super) fn is_not_ready(&self, node: &str) -> bool {
        self.state.lock().expect("lock").not_ready.contains(node)
    }

    /// Since when `node` is `ready` as of `now`: the time of the last change, or `now` when it
    /// changes (or is written the first time) now.
    pub(super) fn readiness_since(&self, node: &str, ready: bool, now: Timestamp) -> Timestamp {
        let mut state = self.state.lock().expect("lock");
        readiness_since(&mut state.readiness, node, ready, now)
    }
}

/// Since when a node is `ready` as of `now`, by the readiness last written of each node
/// (`seen`): the time of its last change, or `now` when it changes (or is first written) now.
pub(super) fn readiness_since(
    seen: &mut HashMap<String, (bool, Timestamp)>,
    node: &str,
    ready: bool,
    now: Timestamp,
) -> Timestamp {
    let entry = seen.entry(node.to_string()).or_insert((ready, now));
    if entry.0 != ready {
        *entry = (ready, now);
    }
    entry.1
}
