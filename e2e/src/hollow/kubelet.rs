//! The hollow kubelet: one watch of every bound pod (kwok's way, not a watch per node), and for
//! those on a hollow node the status a kubelet would write: Running with a loopback pod IP,
//! then terminated (exit code, reason, message) when told, when the job's run is done, or when
//! the pod is deleted, which it then finishes (delete with grace 0, as a kubelet does once
//! the containers stopped). Rank 0 of a ferrotrain gang serves `/progress` at its pod IP.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};

use super::pods::{self, Exit, PodSim, Stage, Todo};
use super::serve::{self, Reply};
use super::shared::Shared;
use super::training;

/// Watches bound pods until aborted.
pub async fn run(shared: Arc<Shared>) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields("spec.nodeName!=");
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut relisted: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod)) => observe(&shared, pod),
            Ok(Event::InitApply(pod)) => {
                if let (Some(seen), Some(uid)) = (relisted.as_mut(), pod.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                observe(&shared, pod);
            }
            Ok(Event::Delete(pod)) => forget(&shared, &pod.metadata.uid.unwrap_or_default()),
            Ok(Event::Init) => relisted = Some(HashSet::new()),
            Ok(Event::InitDone) => {
                // Pods deleted while the watch was down.
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = {
                    let state = shared.state.lock().expect("lock");
                    state
                        .pods
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect()
                };
                for uid in gone {
                    forget(&shared, &uid);
                }
                shared.stats.synced.store(true, Ordering::Relaxed);
            }
            Err(_) => {
                shared.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A pod was added or changed.
fn observe(shared: &Arc<Shared>, pod: Pod) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    let Some(&node_ip) = shared.nodes.get(&node) else {
        return;
    };
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    let todo = {
        let state = shared.state.lock().expect("lock");
        pods::todo(&pod, state.pods.get(&uid))
    };
    match todo {
        Todo::Nothing => {}
        Todo::Start { adopt } => start(shared, pod, uid, node, node_ip, adopt),
        Todo::StopAndDelete => stop(shared, &pod, uid, Exit::sigterm(), true),
        Todo::Terminate(exit) => stop(shared, &pod, uid, exit, false),
    }
}

/// A new pod on a hollow node: an IP, then its Running status after `start_delay`.
fn start(
    shared: &Arc<Shared>,
    pod: Pod,
    uid: String,
    node: String,
    node_ip: Ipv4Addr,
    adopt: bool,
) {
    let ip = {
        let mut state = shared.state.lock().expect("lock");
        let adopted = pods::pod_ip(&pod).filter(|ip| adopt && state.ips.claim(*ip));
        let Some(ip) = adopted.or_else(|| state.ips.take()) else {
            shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        state.pods.insert(
            uid.clone(),
            PodSim {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                node,
                ip,
                stage: Stage::Starting,
                member: pods::member_of(&pod),
            },
        );
        ip
    };
    if adopt {
        running(shared, &uid);
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(shared.config.start_delay).await;
        let body = running_status(&pod, ip, node_ip, Timestamp::now());
        if patch_status(&shared, &pod, &body).await {
            shared.stats.pod_starts.fetch_add(1, Ordering::Relaxed);
            running(&shared, &uid);
        }
    });
}

/// The pod's Running status was written: its gang may be whole now, and its rank 0 serves.
fn running(shared: &Arc<Shared>, uid: &str) {
    let now = Timestamp::now();
    let mut state = shared.state.lock().expect("lock");
    let Some(pod) = state.pods.get_mut(uid) else {
        return;
    };
    if pod.stage != Stage::Starting {
        return;
    }
    pod.stage = Stage::Running;
    let (ip, member) = (pod.ip, pod.member.clone());
    let Some(m) = member else {
        return;
    };
    if m.node_rank == 0 {
        let server = tokio::spawn(serve_rank0(
            shared.clone(),
            m.job.clone(),
            SocketAddr::from((ip, m.metrics_port)),
        ));
        if let Some(old) = state.servers.insert(uid.to_string(), server) {
            old.abort();
        }
    }
    let default = shared.config.pace;
    if state.jobs.running(&m, default, now) {
        let finishes = state
            .jobs
            .jobs
            .get(&m.job)
            .and_then(|j| j.run.finishes_at());
        if let Some(at) = finishes {
            tokio::spawn(finish_at(shared.clone(), m.job.clone(), at));
        }
    }
}

/// Stops the pod's containers with `exit` (after `stop_delay` when it is being deleted, the
/// time a trainer takes to save on SIGTERM), then deletes it when `delete`.
fn stop(shared: &Arc<Shared>, pod: &Pod, uid: String, exit: Exit, delete: bool) {
    let now = Timestamp::now();
    let was = {
        let mut state = shared.state.lock().expect("lock");
        let was = state.pods.get(&uid).map(|p| p.stage);
        match state.pods.get_mut(&uid) {
            Some(p) => p.stage = Stage::Stopped,
            // Deleted before it started: nothing ran, and it is deleted once.
            None if delete => {
                state.pods.insert(
                    uid.clone(),
                    PodSim {
                        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                        name: pod.metadata.name.clone().unwrap_or_default(),
                        node: String::new(),
                        ip: Ipv4Addr::UNSPECIFIED,
                        stage: Stage::Stopped,
                        member: None,
                    },
                );
            }
            None => return,
        }
        if let Some(server) = state.servers.remove(&uid) {
            server.abort();
        }
        let member = state.pods.get(&uid).and_then(|p| p.member.clone());
        if let (Some(Stage::Running), Some(m)) = (was, member) {
            state.jobs.left(&m, now);
        }
        was
    };
    let shared = shared.clone();
    let pod = pod.clone();
    tokio::spawn(async move {
        if delete {
            tokio::time::sleep(shared.config.stop_delay).await;
        }
        if was.is_some() {
            let body = terminated_status(&pod, &exit, Timestamp::now());
            patch_status(&shared, &pod, &body).await;
            shared.stats.pod_stops.fetch_add(1, Ordering::Relaxed);
        }
        if delete {
            finish_deletion(&shared, &pod, &uid).await;
        }
    });
}

/// The pod is gone from the API: its IP and server go, and its gang misses it.
fn forget(shared: &Shared, uid: &str) {
    let now = Timestamp::now();
    let mut state = shared.state.lock().expect("lock");
    let Some(pod) = state.pods.remove(uid) else {
        return;
    };
    state.ips.give_back(pod.ip);
    if let Some(server) = state.servers.remove(uid) {
        server.abort();
    }
    if let (Stage::Running, Some(m)) = (pod.stage, pod.member) {
        state.jobs.left(&m, now);
    }
}

/// When the run reaches its total steps: every running pod of the attempt exits 0, rank 0
/// with its final report as the termination message (what the trainer writes).
async fn finish_at(shared: Arc<Shared>, job: pods::JobKey, at: Timestamp) {
    let wait = at.duration_since(Timestamp::now());
    if let Ok(wait) = std::time::Duration::try_from(wait) {
        tokio::time::sleep(wait).await;
    }
    let now = Timestamp::now();
    let targets: Vec<(String, PodSim, String)> = {
        let mut state = shared.state.lock().expect("lock");
        let Some(j) = state.jobs.jobs.get_mut(&job) else {
            return;
        };
        if j.finished || !j.run.finished(now) {
            // The gang broke before the end: its next whole start schedules the finish.
            return;
        }
        j.finished = true;
        let (attempt, report) = (j.run.attempt(), j.run.report(now));
        state
            .pods
            .iter()
            .filter(|(_, p)| p.stage == Stage::Running)
            .filter(|(_, p)| {
                p.member
                    .as_ref()
                    .is_some_and(|m| m.job == job && m.attempt == attempt)
            })
            .map(|(uid, p)| {
                let rank0 = p.member.as_ref().is_some_and(|m| m.node_rank == 0);
                let message = if rank0 {
                    report.to_termination_message()
                } else {
                    String::new()
                };
                (uid.clone(), p.clone(), message)
            })
            .collect()
    };
    let api_pods =
        |p: &PodSim| -> Api<Pod> { Api::namespaced(shared.client.clone(), &p.namespace) };
    for (uid, p, message) in targets {
        // The pod as it is now (its containers' names and images).
        let Ok(pod) = api_pods(&p).get(&p.name).await else {
            continue;
        };
        let exit = Exit {
            code: 0,
            reason: "Completed".into(),
            message,
        };
        stop(&shared, &pod, uid, exit, false);
    }
}

/// Deletes the pod with grace 0, if it is still this very pod.
async fn finish_deletion(shared: &Shared, pod: &Pod, uid: &str) {
    let Ok(_permit) = shared.writes.acquire().await else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(
        shared.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    shared.stats.pod_deletes.fetch_add(1, Ordering::Relaxed);
    match api.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => {
            shared.failed("delete pod", &name, &e);
        }
    }
}

/// Patches the pod's status (a few writes at a time); false when it failed (gone: quietly).
async fn patch_status(shared: &Shared, pod: &Pod, body: &Value) -> bool {
    let Ok(_permit) = shared.writes.acquire().await else {
        return false;
    };
    let api: Api<Pod> = Api::namespaced(
        shared.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let name = pod.metadata.name.clone().unwrap_or_default();
    shared
        .stats
        .pod_status_writes
        .fetch_add(1, Ordering::Relaxed);
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => shared.failed("patch pod status", &name, &e),
    }
}

/// Rank 0's HTTP server at the pod's IP and metrics port, until aborted.
async fn serve_rank0(shared: Arc<Shared>, job: pods::JobKey, addr: SocketAddr) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            shared.stats.bind_errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("hollow: binding {addr} for {}/{}: {e}", job.0, job.1);
            return;
        }
    };
    let handler_shared = shared.clone();
    let handler = Arc::new(move |path: &str| rank0_reply(&handler_shared, &job, path));
    serve::serve(listener, handler).await;
}

fn rank0_reply(shared: &Shared, job: &pods::JobKey, path: &str) -> Reply {
    let now = Timestamp::now();
    let mut state = shared.state.lock().expect("lock");
    let Some(j) = state.jobs.jobs.get(job) else {
        return Reply::NotFound;
    };
    let (silent, report) = (j.silent, j.run.report(now));
    match path.split('?').next().unwrap_or_default() {
        "/progress" => {
            shared.stats.polls.fetch_add(1, Ordering::Relaxed);
            let log = state.polls.entry(job.clone()).or_default();
            let at = Instant::now();
            if let Some(last) = log.last.replace(at) {
                log.intervals.push((at - last).as_secs_f64());
            }
            if silent {
                Reply::Silent
            } else {
                Reply::Json(serde_json::to_string(&report).expect("a report serializes"))
            }
        }
        "/metrics" if !silent => Reply::Text(training::metrics_text(&report)),
        "/healthz" => Reply::Text("ok\n".into()),
        _ => Reply::NotFound,
    }
}

/// Containers' names and images.
type Containers = Vec<(String, String)>;

/// The pod's containers and init containers.
fn container_names(pod: &Pod) -> (Containers, Containers) {
    let names = |cs: &[k8s_openapi::api::core::v1::Container]| -> Containers {
        cs.iter()
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .collect()
    };
    let spec = pod.spec.as_ref();
    (
        spec.map(|s| names(&s.containers)).unwrap_or_default(),
        spec.and_then(|s| s.init_containers.as_deref())
            .map(names)
            .unwrap_or_default(),
    )
}

fn condition(type_: &str, status: bool, now: &str) -> Value {
    json!({"type": type_, "status": if status { "True" } else { "False" }, "lastTransitionTime": now})
}

/// What a kubelet writes once the pod's containers run.
pub fn running_status(pod: &Pod, ip: Ipv4Addr, node_ip: Ipv4Addr, now: Timestamp) -> Value {
    let now = now.to_string();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let (containers, inits) = container_names(pod);
    let status = |(name, image): &(String, String), state: Value, ready: bool| {
        json!({
            "name": name, "image": image, "imageID": format!("hollow://{image}"),
            "containerID": format!("hollow://{uid}/{name}"),
            "ready": ready, "started": ready, "restartCount": 0, "state": state
        })
    };
    let running = json!({"running": {"startedAt": now}});
    let done = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}});
    json!({"status": {
        "phase": "Running",
        "hostIP": node_ip.to_string(), "hostIPs": [{"ip": node_ip.to_string()}],
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
        "startTime": now,
        "conditions": [
            condition("PodReadyToStartContainers", true, &now),
            condition("Initialized", true, &now),
            condition("ContainersReady", true, &now),
            condition("Ready", true, &now)
        ],
        "containerStatuses": containers.iter().map(|c| status(c, running.clone(), true)).collect::<Vec<_>>(),
        "initContainerStatuses": inits.iter().map(|c| status(c, done.clone(), false)).collect::<Vec<_>>()
    }})
}

/// What a kubelet writes once the pod's containers exited with `exit`.
pub fn terminated_status(pod: &Pod, exit: &Exit, now: Timestamp) -> Value {
    let now = now.to_string();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or_else(|| now.clone(), |t| t.0.to_string());
    let (containers, _) = container_names(pod);
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, image)| {
            let mut terminated = json!({
                "exitCode": exit.code, "reason": exit.reason,
                "startedAt": started, "finishedAt": now,
                "containerID": format!("hollow://{uid}/{name}")
            });
            if name == "trainer" && !exit.message.is_empty() {
                terminated["message"] = json!(exit.message);
            }
            json!({
                "name": name, "image": image, "imageID": format!("hollow://{image}"),
                "containerID": format!("hollow://{uid}/{name}"),
                "ready": false, "started": false, "restartCount": 0,
                "state": {"terminated": terminated}
            })
        })
        .collect();
    json!({"status": {
        "phase": if exit.code == 0 { "Succeeded" } else { "Failed" },
        "conditions": [condition("ContainersReady", false, &now), condition("Ready", false, &now)],
        "containerStatuses": statuses
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "j-0-0", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "trainer", "image": "ferrotrain/trainer:x"}]},
            "status": {"startTime": "2026-01-01T00:00:00Z"}
        }))
        .unwrap()
    }

    #[test]
    fn the_running_status_has_the_ip_and_a_running_trainer() {
        let ip = Ipv4Addr::new(127, 43, 0, 5);
        let body = running_status(&pod(), ip, Ipv4Addr::new(127, 44, 0, 1), Timestamp::now());
        let parsed: Pod = serde_json::from_value(json!({"status": body["status"]})).unwrap();
        let status = parsed.status.unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("127.43.0.5"));
        let trainer = &status.container_statuses.unwrap()[0];
        assert!(trainer.state.as_ref().unwrap().running.is_some());
        assert!(trainer.ready);
    }

    #[test]
    fn a_terminated_status_carries_the_exit_and_the_trainers_message() {
        let exit = Exit {
            code: 3,
            reason: "Error".into(),
            message: "missing data".into(),
        };
        let body = terminated_status(&pod(), &exit, Timestamp::now());
        let parsed: Pod = serde_json::from_value(json!({"status": body["status"]})).unwrap();
        let status = parsed.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let t = status.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(
            (t.exit_code, t.message.as_deref()),
            (3, Some("missing data"))
        );
        assert_eq!(t.started_at.unwrap().0.to_string(), "2026-01-01T00:00:00Z");
    }
}
