//! The hollow nodes: Node objects with CPU, memory and `nvidia.com/gpu` capacity, tainted so
//! that only pods that tolerate it land there, kept Ready as a kubelet keeps its node Ready:
//! its Lease in kube-node-lease renewed every few seconds (what the node lifecycle controller
//! reads) and its status refreshed every few minutes (kwok's node-heartbeat-with-lease stage
//! does the same).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::config::Config;
use super::labels::HOLLOW_LABEL;
use super::shared::Shared;

/// Where node leases live.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Node `i` of the simulator `prefix`.
pub fn node_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:04}")
}

/// The node's InternalIP: 127.<block + 1>.<i / 250>.<i % 250 + 1> (loopback: nothing is sent
/// there unless someone asks the API server for a hollow pod's logs, which then fails fast).
pub fn node_ip(block: u8, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        block.wrapping_add(1),
        (i / 250) as u8,
        (i % 250 + 1) as u8,
    )
}

/// The Node as a kubelet registers it, status included.
pub fn node_object(config: &Config, name: &str, ip: Ipv4Addr, now: Timestamp) -> Node {
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                HOLLOW_LABEL: config.name,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "hollow"
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}
        },
        "spec": {
            "taints": [{"key": HOLLOW_LABEL, "value": config.name, "effect": "NoSchedule"}]
        }
    });
    node["status"] = node_status(config, ip, true, now, now);
    serde_json::from_value(node).expect("a valid Node")
}

/// The node's status: capacity, the four conditions a kubelet posts, its address. The
/// conditions' heartbeat is `now`; their transition time is `since`, when the node last became
/// Ready or NotReady (a kubelet keeps it across refreshes: a watcher sees a refresh change only
/// the heartbeat).
pub fn node_status(
    config: &Config,
    ip: Ipv4Addr,
    ready: bool,
    since: Timestamp,
    now: Timestamp,
) -> Value {
    let (now, since) = (now.to_string(), since.to_string());
    let condition = |type_: &str, status: bool, reason: &str, message: &str| {
        json!({
            "type": type_,
            "status": if status { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": since
        })
    };
    let capacity = json!({
        "cpu": config.cpu,
        "memory": config.memory,
        "pods": config.max_pods.to_string(),
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": config.gpus.to_string()
    });
    let ready = if ready {
        condition(
            "Ready",
            true,
            "KubeletReady",
            "hollow kubelet is posting ready status",
        )
    } else {
        condition(
            "Ready",
            false,
            "KubeletNotReady",
            "hollow kubelet told to report NotReady",
        )
    };
    json!({
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("MemoryPressure", false, "KubeletHasSufficientMemory", "hollow"),
            condition("DiskPressure", false, "KubeletHasNoDiskPressure", "hollow"),
            condition("PIDPressure", false, "KubeletHasSufficientPID", "hollow"),
            ready
        ],
        "addresses": [
            {"type": "InternalIP", "address": ip.to_string()},
            {"type": "Hostname", "address": ip.to_string()}
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": "hollow", "systemUUID": "hollow", "bootID": "hollow",
            "kernelVersion": "hollow", "osImage": "hollow", "containerRuntimeVersion": "hollow://1",
            "kubeletVersion": "v1.36.2-hollow", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64"
        }
    })
}

/// The node's Lease, owned by the node (deleting the node collects it).
fn lease_object(name: &str, node_uid: &str, duration: Duration, now: Timestamp) -> Lease {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid
            }]
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration.as_secs(),
            "renewTime": MicroTime(now)
        }
    }))
    .expect("a valid Lease")
}

/// Creates every node (status included, patched when the API server dropped it) and its
/// Lease, a few at a time. Returns how many failed.
pub(crate) async fn register(shared: &Arc<Shared>) -> usize {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), LEASE_NAMESPACE);
    let results: Vec<bool> = futures::stream::iter(shared.nodes.iter())
        .map(|(name, ip)| {
            let (nodes, leases) = (nodes.clone(), leases.clone());
            async move { register_one(shared, &nodes, &leases, name, *ip).await }
        })
        .buffer_unordered(shared.config.write_concurrency.max(1))
        .collect()
        .await;
    results.iter().filter(|ok| !**ok).count()
}

async fn register_one(
    shared: &Shared,
    nodes: &Api<Node>,
    leases: &Api<Lease>,
    name: &str,
    ip: Ipv4Addr,
) -> bool {
    let now = Timestamp::now();
    shared.readiness_since(name, true, now);
    let node = node_object(&shared.config, name, ip, now);
    let created = match nodes.create(&PostParams::default(), &node).await {
        Ok(n) => n,
        Err(kube::Error::Api(s)) if s.code == 409 => match nodes.get(name).await {
            Ok(n) => n,
            Err(e) => return shared.failed("get node", name, &e),
        },
        Err(e) => return shared.failed("create node", name, &e),
    };
    let has_capacity = created
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .is_some_and(|c| c.contains_key("nvidia.com/gpu"));
    if !has_capacity && !set_status(shared, name, ip, true).await {
        return false;
    }
    let uid = created.metadata.uid.unwrap_or_default();
    let lease = lease_object(name, &uid, shared.config.lease_duration, now);
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 409 => renew(shared, leases, name).await,
        Err(e) => shared.failed("create lease", name, &e),
    }
}

/// Writes the node's status (Ready or not, heartbeat now).
pub(crate) async fn set_status(shared: &Shared, name: &str, ip: Ipv4Addr, ready: bool) -> bool {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let now = Timestamp::now();
    let since = shared.readiness_since(name, ready, now);
    let body = json!({"status": node_status(&shared.config, ip, ready, since, now)});
    let written = nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&body))
        .await;
    shared
        .stats
        .node_status_writes
        .fetch_add(1, Ordering::Relaxed);
    match written {
        Ok(_) => true,
        Err(e) => shared.failed("patch node status", name, &e),
    }
}

async fn renew(shared: &Shared, leases: &Api<Lease>, name: &str) -> bool {
    let body = json!({"spec": {
        "holderIdentity": name,
        "leaseDurationSeconds": shared.config.lease_duration.as_secs(),
        "renewTime": MicroTime(Timestamp::now())
    }});
    let renewed = leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await;
    shared.stats.lease_renewals.fetch_add(1, Ordering::Relaxed);
    match renewed {
        Ok(_) => true,
        Err(e) => shared.failed("renew lease", name, &e),
    }
}

/// Renews each node's Lease once per `renew_interval`, spread evenly over it (1,000 nodes at
/// 10 s: one renewal every 10 ms, not a burst of 1,000), and refreshes each node's status once
/// per `status_interval`. Runs until the task is aborted.
pub(crate) async fn heartbeats(shared: Arc<Shared>) {
    let names: Vec<(String, Ipv4Addr)> = shared
        .nodes
        .iter()
        .map(|(n, ip)| (n.clone(), *ip))
        .collect();
    if names.is_empty() {
        return;
    }
    let config = &shared.config;
    let per_node = config.renew_interval / names.len() as u32;
    let status_rounds = (config.status_interval.as_secs_f64()
        / config.renew_interval.as_secs_f64().max(0.001))
    .round()
    .max(1.0) as usize;
    let mut tick = tokio::time::interval(per_node.max(Duration::from_micros(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let in_flight = Arc::new(Semaphore::new(config.write_concurrency.max(1)));
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), LEASE_NAMESPACE);
    for n in 0usize.. {
        tick.tick().await;
        let (round, i) = (n / names.len(), n % names.len());
        let (name, ip) = names[i].clone();
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let (shared, leases) = (shared.clone(), leases.clone());
        tokio::spawn(async move {
            if shared.is_silenced(&name) {
                return;
            }
            renew(&shared, &leases, &name).await;
            if (round + i).is_multiple_of(status_rounds) && round > 0 {
                let ready = !shared.is_not_ready(&name);
                set_status(&shared, &name, ip, ready).await;
            }
            drop(permit);
        });
    }
}

/// Deletes every node of the simulator `name` (their Leases go with them); returns how many
/// it deleted. Bounded: gives up after `limit`.
pub async fn delete_all(client: &kube::Client, name: &str, limit: Duration) -> usize {
    let nodes: Api<Node> = Api::all(client.clone());
    let selector = format!("{HOLLOW_LABEL}={name}");
    let work = async {
        let listed = nodes
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let deleted: Vec<bool> = futures::stream::iter(listed)
            .map(|n| {
                let nodes = nodes.clone();
                async move {
                    let name = n.metadata.name.unwrap_or_default();
                    nodes.delete(&name, &DeleteParams::default()).await.is_ok()
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        deleted.into_iter().filter(|d| *d).count()
    };
    tokio::time::timeout(limit, work).await.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hollow::shared::readiness_since;

    #[test]
    fn a_node_has_gpus_a_taint_and_distinct_loopback_addresses() {
        let config = Config {
            gpus: 8,
            ..Config::named("fleet")
        };
        let node = node_object(
            &config,
            &node_name("fleet", 7),
            node_ip(43, 7),
            Timestamp::now(),
        );
        assert_eq!(node.metadata.name.as_deref(), Some("fleet-0007"));
        let status = node.status.unwrap();
        assert_eq!(status.capacity.unwrap()["nvidia.com/gpu"].0, "8");
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        let taints = node.spec.unwrap().taints.unwrap();
        assert_eq!(taints[0].key, HOLLOW_LABEL);
        assert_eq!(taints[0].effect, "NoSchedule");
        assert_ne!(node_ip(43, 249), node_ip(43, 250));
    }

    #[test]
    fn a_refresh_keeps_the_transition_time_and_a_change_moves_it() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut seen = HashMap::new();
        assert_eq!(readiness_since(&mut seen, "n", true, at(0)), at(0));
        assert_eq!(readiness_since(&mut seen, "n", true, at(300)), at(0));
        assert_eq!(readiness_since(&mut seen, "n", false, at(310)), at(310));
        assert_eq!(readiness_since(&mut seen, "n", false, at(600)), at(310));
        let config = Config::named("fleet");
        let status = node_status(&config, node_ip(43, 0), false, at(310), at(600));
        let ready = &status["conditions"][3];
        assert_eq!(
            (&ready["lastTransitionTime"], &ready["lastHeartbeatTime"]),
            (&json!(at(310).to_string()), &json!(at(600).to_string()))
        );
        assert_eq!(node_ip(43, 0), Ipv4Addr::new(127, 44, 0, 1));
    }
}
