//! A running simulator: it registers the nodes, starts their heartbeats and the hollow
//! kubelet, answers its control endpoint (snapshots, poll intervals, readiness), and deletes
//! the nodes when it stops or is dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::config::Config;
use super::pods::{self, JobView};
use super::shared::{Shared, State, Stats};
use super::{kubelet, nodes, serve};

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
