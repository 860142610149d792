//! What the bench sees happen, as it happens: one watch each on the bench namespace's jobs and
//! pods and on the operators' Lease, timestamped on arrival (the API server's times have
//! one-second resolution). Cheaper for the API server than listing 1,500 jobs every second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrotrain_api::crd::{DistributedTraining, Phase};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::task::JoinHandle;

/// A job as last seen.
#[derive(Clone, Debug, Default)]
pub struct JobSeen {
    pub phase: Phase,
    pub step: u64,
    pub attempt: i32,
    pub restarts: i32,
    /// When its phase last became Running.
    pub running_since: Option<Instant>,
    /// Whether its Created condition is False (the API refused a pod).
    pub create_refused: bool,
}

/// A pod as last seen.
#[derive(Clone, Debug, Default)]
pub struct PodSeen {
    pub uid: String,
    pub job: String,
    pub node: Option<String>,
    pub running: bool,
}

/// Everything seen so far.
#[derive(Debug, Default)]
pub struct Seen {
    pub jobs: HashMap<String, JobSeen>,
    pub pods: HashMap<String, PodSeen>,
    /// Each new pod (a new UID): when, its name, its job.
    pub pod_adds: Vec<(Instant, String, String)>,
    /// Each pod gone from the API (its deletion finished): when, its name.
    pub pod_deletes: Vec<(Instant, String)>,
    /// Each change of a job after its creation (the operator's status writes): when, which.
    pub job_writes: Vec<(Instant, String)>,
    /// The Lease's holder and when it became so.
    pub holder: Option<(String, Instant)>,
}

impl Seen {
    pub fn running_pods(&self) -> usize {
        self.pods.values().filter(|p| p.running).count()
    }

    /// Jobs in `phase`.
    pub fn in_phase(&self, phase: Phase) -> usize {
        self.jobs.values().filter(|j| j.phase == phase).count()
    }

    /// Jobs Running with a step reported.
    pub fn stepping(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.phase == Phase::Running && j.step > 0)
            .count()
    }
}

/// The watches; dropped, they stop.
pub struct Tracker {
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Tracker {
    /// Watches jobs and pods in `ns` and the Lease `lease` in `ns`.
    pub fn start(client: &Client, ns: &str, lease: &str) -> Tracker {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let jobs: Api<DistributedTraining> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
        let lease_fields = format!("metadata.name={lease}");
        let tasks = vec![
            tokio::spawn(watch_jobs(jobs, seen.clone())),
            tokio::spawn(watch_pods(pods, seen.clone())),
            tokio::spawn(watch_lease(leases, lease_fields, seen.clone())),
        ];
        Tracker { seen, tasks }
    }

    /// Reads what was seen.
    pub fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().expect("lock"))
    }
}

fn job_seen(dt: &DistributedTraining, before: Option<&JobSeen>) -> JobSeen {
    let status = dt.status.clone().unwrap_or_default();
    let running = status.phase == Phase::Running;
    let was_running = before.is_some_and(|b| b.phase == Phase::Running);
    JobSeen {
        phase: status.phase,
        step: status.progress.as_ref().map_or(0, |p| p.report.step),
        attempt: status.attempt,
        restarts: status.restarts,
        running_since: match (running, was_running) {
            (true, true) => before.and_then(|b| b.running_since),
            (true, false) => Some(Instant::now()),
            (false, _) => None,
        },
        create_refused: status
            .conditions
            .iter()
            .any(|c| c.type_ == "Created" && c.status == "False"),
    }
}

async fn watch_jobs(api: Api<DistributedTraining>, seen: Arc<Mutex<Seen>>) {
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let (dt, live) = match event {
            Ok(Event::Apply(dt)) => (dt, true),
            Ok(Event::InitApply(dt)) => (dt, false),
            Ok(Event::Delete(dt)) => {
                let name = dt.metadata.name.unwrap_or_default();
                seen.lock().expect("lock").jobs.remove(&name);
                continue;
            }
            _ => continue,
        };
        let name = dt.metadata.name.clone().unwrap_or_default();
        let mut s = seen.lock().expect("lock");
        let known = s.jobs.contains_key(&name);
        let next = job_seen(&dt, s.jobs.get(&name));
        s.jobs.insert(name.clone(), next);
        if live && known {
            s.job_writes.push((Instant::now(), name));
        }
    }
}

async fn watch_pods(api: Api<Pod>, seen: Arc<Mutex<Seen>>) {
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(Event::Apply(p) | Event::InitApply(p)) => p,
            Ok(Event::Delete(p)) => {
                let name = p.metadata.name.unwrap_or_default();
                let mut s = seen.lock().expect("lock");
                if s.pods.get(&name).map(|x| &x.uid) == p.metadata.uid.as_ref() {
                    s.pods.remove(&name);
                }
                s.pod_deletes.push((Instant::now(), name));
                continue;
            }
            _ => continue,
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let job = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("ferrotrain.dev/job").cloned())
            .unwrap_or_default();
        let running = pod.metadata.deletion_timestamp.is_none()
            && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let mut s = seen.lock().expect("lock");
        if s.pods.get(&name).is_none_or(|p| p.uid != uid) {
            s.pod_adds.push((Instant::now(), name.clone(), job.clone()));
        }
        s.pods.insert(
            name,
            PodSeen {
                uid,
                job,
                node,
                running,
            },
        );
    }
}

async fn watch_lease(api: Api<Lease>, fields: String, seen: Arc<Mutex<Seen>>) {
    let mut events = watcher(api, watcher::Config::default().fields(&fields))
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(Event::Apply(lease) | Event::InitApply(lease)) = event else {
            continue;
        };
        let holder = lease
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        let mut s = seen.lock().expect("lock");
        if s.holder.as_ref().is_none_or(|(h, _)| *h != holder) {
            s.holder = Some((holder, Instant::now()));
        }
    }
}
