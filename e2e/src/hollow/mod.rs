//! Hollow nodes: a kubelet simulator for measuring the operator at fleet scale on one machine
//! (kwok, Kubernetes WithOut Kubelet, is the model: its node-heartbeat-with-lease,
//! pod-ready, pod-complete and pod-delete stages are what this does, in Rust, for ferrotrain's
//! pods). It registers N Node objects with CPU, memory and `nvidia.com/gpu` capacity on a real
//! API server, keeps them Ready (Lease renewals, status refreshes), and plays the kubelet for
//! the pods the real scheduler binds to them: Running with a pod IP on the loopback
//! (127.<block>.x.y), then Succeeded or Failed when told, and deleted when deleted. Rank 0 of a
//! ferrotrain gang serves `/progress` and `/metrics` at its pod IP on the trainer's metrics
//! port, with steps advancing while the whole gang runs, so the operator's status path is
//! exercised as for real pods. No containers run.
//!
//! Hollow nodes carry the label and the NoSchedule taint `ferrotrain.dev/hollow=<name>`: only
//! pods that tolerate it (and select it) land there, so real kubelet nodes and hollow ones
//! coexist. Pods of a hollow job are steered by its pod template's annotations:
//! - `hollow.ferrotrain.dev/steps-per-second`, `hollow.ferrotrain.dev/total-steps`: the pace
//!   (default: the simulator's); at the total every pod exits 0, rank 0 with the final report
//!   as its termination message, as the trainer does;
//! - `hollow.ferrotrain.dev/progress: silent`: rank 0 accepts /progress requests and never
//!   answers;
//! - `hollow.ferrotrain.dev/exit: "<code>[:<reason>[:<message>]]"` on a running pod (set it
//!   with `kubectl annotate`): its containers exit so, now.

mod kubelet;
pub mod nodes;
pub mod pods;
mod serve;
pub mod training;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

pub use pods::{Exit, JobView};
pub use training::Pace;

/// Label and taint key of hollow nodes (value: the simulator's name).
pub const HOLLOW_LABEL: &str = "ferrotrain.dev/hollow";
/// Pod annotation: steps per second of the job's simulated run.
pub const ANNOTATION_STEPS_PER_SECOND: &str = "hollow.ferrotrain.dev/steps-per-second";
/// Pod annotation: the run's total steps (it finishes there).
pub const ANNOTATION_TOTAL_STEPS: &str = "hollow.ferrotrain.dev/total-steps";
/// Pod annotation: `silent` makes rank 0's /progress hang.
pub const ANNOTATION_PROGRESS: &str = "hollow.ferrotrain.dev/progress";
/// Pod annotation: `<code>[:<reason>[:<message>]]` stops the pod's containers so.
pub const ANNOTATION_EXIT: &str = "hollow.ferrotrain.dev/exit";
/// The operator's label naming a pod's job.
pub const JOB_LABEL: &str = "ferrotrain.dev/job";

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Config {
    /// Nodes are `<name>-0000`..., labelled and tainted `ferrotrain.dev/hollow=<name>`.
    pub name: String,
    pub nodes: usize,
    pub cpu: String,
    pub memory: String,
    pub gpus: u32,
    pub max_pods: u32,
    /// Pod IPs are 127.<ip_block>.x.y, node IPs 127.<ip_block + 1>.x.y.
    pub ip_block: u8,
    /// The nodes' Lease duration, and how often each is renewed (a kubelet: 40 s and 10 s).
    pub lease_duration: Duration,
    pub renew_interval: Duration,
    /// How often each node's status is refreshed (a kubelet: 5 minutes when nothing changes).
    pub status_interval: Duration,
    /// From a pod's binding to its Running status.
    pub start_delay: Duration,
    /// From a pod's deletion to its containers' exit (a trainer saving on SIGTERM).
    pub stop_delay: Duration,
    /// The pace of jobs whose pods do not say.
    pub pace: Pace,
    /// API writes in flight at most.
    pub write_concurrency: usize,
}

impl Config {
    /// The defaults, for the simulator `name`.
    pub fn named(name: &str) -> Config {
        Config {
            name: name.to_string(),
            nodes: 20,
            cpu: "96".into(),
            memory: "1Ti".into(),
            gpus: 8,
            max_pods: 110,
            ip_block: 43,
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(300),
            start_delay: Duration::ZERO,
            stop_delay: Duration::from_secs(1),
            pace: Pace {
                steps_per_second: 1.0,
                total_steps: 1_000_000,
            },
            write_concurrency: 16,
        }
    }
}

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
    last: Option<Instant>,
    intervals: Vec<f64>,
}

/// What the simulator holds.
pub(crate) struct State {
    pods: HashMap<String, pods::PodSim>,
    servers: HashMap<String, JoinHandle<()>>,
    jobs: pods::Jobs,
    ips: pods::IpPool,
    polls: HashMap<pods::JobKey, PollLog>,
    /// Nodes whose Lease is no longer renewed.
    silenced: HashSet<String>,
    /// Nodes that report Ready=False.
    not_ready: HashSet<String>,
    /// Each node's readiness as last written, and since when.
    readiness: HashMap<String, (bool, Timestamp)>,
}

pub(crate) struct Shared {
    client: Client,
    config: Config,
    /// Every node and its InternalIP.
    nodes: BTreeMap<String, Ipv4Addr>,
    state: Mutex<State>,
    stats: Stats,
    writes: Semaphore,
}

impl Shared {
    /// Counts and logs a failed write; false.
    fn failed(&self, what: &str, name: &str, error: &kube::Error) -> bool {
        let n = self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        if n < 20 {
            eprintln!("hollow: {what} {name}: {error}");
        }
        false
    }

    fn is_silenced(&self, node: &str) -> bool {
        self.state.lock().expect("lock").silenced.contains(node)
    }

    fn is_not_ready(&self, node: &str) -> bool {
        self.state.lock().expect("lock").not_ready.contains(node)
    }

    /// Since when `node` is `ready` as of `now`: the time of the last change, or `now` when it
    /// changes (or is written the first time) now.
    fn readiness_since(&self, node: &str, ready: bool, now: Timestamp) -> Timestamp {
        let mut state = self.state.lock().expect("lock");
        nodes::readiness_since(&mut state.readiness, node, ready, now)
    }
}

/// A snapshot of the simulator, for the bench (as JSON) and the tests.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub nodes: usize,
    pub pods: usize,
    pub pods_running: usize,
    pub jobs: BTreeMap<String, JobView>,
    pub counters: BTreeMap<String, u64>,
}

/// A running simulator. [`Simulator::shutdown`] deletes its nodes; so does dropping it,
/// bounded, should a test fail first.
pub struct Simulator {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    shut_down: bool,
}

impl Simulator {
    /// Registers the nodes (every one, or an error naming how many failed), starts their
    /// heartbeats and the pod watch, and waits until the watch has listed the pods.
    pub async fn start(client: Client, config: Config) -> Result<Simulator, String> {
        let nodes: BTreeMap<String, Ipv4Addr> = (0..config.nodes)
            .map(|i| {
                (
                    nodes::node_name(&config.name, i),
                    nodes::node_ip(config.ip_block, i),
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            client,
            writes: Semaphore::new(config.write_concurrency.max(1)),
            state: Mutex::new(State {
                pods: HashMap::new(),
                servers: HashMap::new(),
                jobs: pods::Jobs::default(),
                ips: pods::IpPool::new(config.ip_block),
                polls: HashMap::new(),
                silenced: HashSet::new(),
                not_ready: HashSet::new(),
                readiness: HashMap::new(),
            }),
            config,
            nodes,
            stats: Stats::default(),
        });
        let mut sim = Simulator {
            shared: shared.clone(),
            tasks: vec![tokio::spawn(kubelet::run(shared.clone()))],
            shut_down: false,
        };
        let failed = nodes::register(&shared).await;
        if failed > 0 {
            sim.shutdown().await;
            return Err(format!(
                "{failed} of {} hollow nodes could not be registered",
                shared.nodes.len()
            ));
        }
        sim.tasks
            .push(tokio::spawn(nodes::heartbeats(shared.clone())));
        let started = Instant::now();
        while !shared.stats.synced.load(Ordering::Relaxed) {
            if started.elapsed() > Duration::from_secs(60) {
                sim.shutdown().await;
                return Err("the hollow kubelet's pod watch did not list within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(sim)
    }

    /// The nodes' names.
    pub fn node_names(&self) -> Vec<String> {
        self.shared.nodes.keys().cloned().collect()
    }

    /// The simulator's name (its nodes' label and taint value).
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// Jobs, pods and counters now.
    pub fn snapshot(&self) -> Snapshot {
        snapshot(&self.shared)
    }

    /// The intervals between each job's /progress polls since the last call (`ns/name`).
    pub fn take_poll_intervals(&self) -> BTreeMap<String, Vec<f64>> {
        take_polls(&self.shared)
    }

    /// Nodes that report Ready (true) or NotReady (false) from now on; how many statuses it
    /// wrote.
    pub async fn set_ready(&self, names: &[String], ready: bool) -> usize {
        mark_ready(&self.shared, names, ready);
        write_readiness(&self.shared, names, ready).await
    }

    /// Stops (false) or resumes (true) renewing these nodes' Leases: the node lifecycle
    /// controller calls a node whose Lease expired NotReady, as for a lost kubelet.
    pub fn set_heartbeats(&self, names: &[String], on: bool) {
        let mut state = self.shared.state.lock().expect("lock");
        for n in names {
            if on {
                state.silenced.remove(n);
            } else {
                state.silenced.insert(n.clone());
            }
        }
    }

    /// Serves [`Snapshot`] at `/snapshot`, the poll intervals at `/polls` (each call takes
    /// them), and `/nodes/not-ready?names=a,b` / `/nodes/ready?names=a,b` (those nodes report
    /// so from now on; answered with how many it knows, their statuses written after) on
    /// `listener`, until the simulator stops.
    pub fn serve_control(&mut self, listener: tokio::net::TcpListener) -> SocketAddr {
        let addr = listener.local_addr().expect("a bound listener");
        let shared = self.shared.clone();
        let handler = Arc::new(move |path: &str| control(&shared, path));
        self.tasks
            .push(tokio::spawn(serve::serve(listener, handler)));
        addr
    }

    /// Stops the heartbeats, the watch and every pod's server, then deletes the nodes
    /// (their Leases go with them). Returns how many nodes it deleted.
    pub async fn shutdown(&mut self) -> usize {
        self.shut_down = true;
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let servers: Vec<JoinHandle<()>> = {
            let mut state = self.shared.state.lock().expect("lock");
            state.servers.drain().map(|(_, s)| s).collect()
        };
        for server in servers {
            server.abort();
        }
        nodes::delete_all(
            &self.shared.client,
            &self.shared.config.name,
            Duration::from_secs(120),
        )
        .await
    }
}

/// What the control endpoint answers (see [`Simulator::serve_control`]).
fn control(shared: &Arc<Shared>, path: &str) -> serve::Reply {
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    match route {
        "/snapshot" => serve::Reply::Json(
            serde_json::to_string(&snapshot(shared)).expect("a snapshot serializes"),
        ),
        "/polls" => {
            serve::Reply::Json(serde_json::to_string(&take_polls(shared)).expect("polls serialize"))
        }
        "/nodes/ready" | "/nodes/not-ready" => {
            let ready = route == "/nodes/ready";
            let names: Vec<String> = query
                .strip_prefix("names=")
                .unwrap_or_default()
                .split(',')
                .filter(|n| shared.nodes.contains_key(*n))
                .map(str::to_string)
                .collect();
            mark_ready(shared, &names, ready);
            let known = names.len();
            let shared = shared.clone();
            tokio::spawn(async move { write_readiness(&shared, &names, ready).await });
            serve::Reply::Json(format!("{{\"nodes\":{known}}}"))
        }
        _ => serve::Reply::NotFound,
    }
}

/// From now on, `names` report Ready (true) or NotReady (false) at each status refresh.
fn mark_ready(shared: &Shared, names: &[String], ready: bool) {
    let mut state = shared.state.lock().expect("lock");
    for n in names {
        if ready {
            state.not_ready.remove(n);
        } else {
            state.not_ready.insert(n.clone());
        }
    }
}

/// Writes the status of `names` now, 16 at a time; how many it wrote.
async fn write_readiness(shared: &Arc<Shared>, names: &[String], ready: bool) -> usize {
    let limit = Arc::new(Semaphore::new(16));
    let mut writes = tokio::task::JoinSet::new();
    for name in names {
        let Some(ip) = shared.nodes.get(name).copied() else {
            continue;
        };
        let (shared, name, limit) = (shared.clone(), name.clone(), limit.clone());
        writes.spawn(async move {
            let _permit = limit.acquire_owned().await;
            nodes::set_status(&shared, &name, ip, ready).await
        });
    }
    writes.join_all().await.into_iter().filter(|w| *w).count()
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if self.shut_down {
            return;
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        // The caller's runtime may be unwinding: delete the nodes from a thread with a
        // runtime of its own.
        let client = self.shared.client.clone();
        let name = self.shared.config.name.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the hollow nodes' cleanup");
            runtime.block_on(nodes::delete_all(&client, &name, Duration::from_secs(60)))
        });
        let _ = cleanup.join();
    }
}

fn snapshot(shared: &Shared) -> Snapshot {
    let now = Timestamp::now();
    let state = shared.state.lock().expect("lock");
    let s = &shared.stats;
    let counters = [
        ("leaseRenewals", &s.lease_renewals),
        ("nodeStatusWrites", &s.node_status_writes),
        ("podStatusWrites", &s.pod_status_writes),
        ("podDeletes", &s.pod_deletes),
        ("podStarts", &s.pod_starts),
        ("podStops", &s.pod_stops),
        ("polls", &s.polls),
        ("writeErrors", &s.write_errors),
        ("watchErrors", &s.watch_errors),
        ("bindErrors", &s.bind_errors),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.load(Ordering::Relaxed)))
    .collect();
    Snapshot {
        nodes: shared.nodes.len(),
        pods: state.pods.len(),
        pods_running: state
            .pods
            .values()
            .filter(|p| p.stage == pods::Stage::Running)
            .count(),
        jobs: pods::job_views(&state.jobs, now),
        counters,
    }
}

fn take_polls(shared: &Shared) -> BTreeMap<String, Vec<f64>> {
    let mut state = shared.state.lock().expect("lock");
    state
        .polls
        .iter_mut()
        .map(|((ns, name), log)| (format!("{ns}/{name}"), std::mem::take(&mut log.intervals)))
        .collect()
}
