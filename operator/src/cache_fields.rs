//! What the caches keep of pods and nodes, and which node changes wake the jobs on a node. At
//! fleet scale the caches are most of the operator's memory (bench/operator-fleet.sh: 1,000
//! nodes, 4,000 pods), and a node's status refreshes are most of its events: the operator reads
//! a node's Ready condition and a pod's labels, owner, node, claims, gates and status, nothing
//! else.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod, PodSpec};
use kube::ResourceExt;
use kube::runtime::watcher;

/// A node as the cache keeps it: its name, uid and Ready condition (status, reason and
/// transition time; not the heartbeat, which changes every refresh). A kubelet's Node also
/// carries its images, capacity, addresses and system info: several KB each.
pub fn trim_node(node: &mut Node) {
    let meta = &mut node.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    node.spec = None;
    let ready = node
        .status
        .take()
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|mut c| {
            c.last_heartbeat_time = None;
            c.message = None;
            c
        });
    node.status = Some(NodeStatus {
        conditions: ready.map(|c| vec![c]),
        ..NodeStatus::default()
    });
}

/// A pod as the cache keeps it: metadata (labels, owner, times), its node, claims and
/// scheduling gates, and its whole status. The containers (image, command, environment,
/// mounts, probes: most of a ferrotrain pod's bytes) are read by nobody after the create.
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    if let Some(spec) = pod.spec.take() {
        let claims = spec.volumes.map(|vs| {
            vs.into_iter()
                .filter(|v| v.persistent_volume_claim.is_some())
                .collect::<Vec<_>>()
        });
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            scheduling_gates: spec.scheduling_gates,
            volumes: claims.filter(|c| !c.is_empty()),
            containers: Vec::new(),
            ..PodSpec::default()
        });
    }
}

/// What the jobs on a node care about: whether it is Ready and since when.
fn readiness(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    ready.map(|c| &c.status).hash(&mut h);
    ready
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_second())
        .hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// The nodes whose readiness changed (or that appeared or went): a node's status refresh
/// (every few minutes per kubelet, more on busy nodes) wakes no job.
pub fn readiness_changes<S>(events: S) -> impl Stream<Item = Result<Node, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<Node>, watcher::Error>>,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    events
        .map(move |event| match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let hash = readiness(&node);
                let changed = seen.insert(node.name_any(), hash) != Some(hash);
                Ok(changed.then_some(node))
            }
            Ok(watcher::Event::Delete(node)) => {
                seen.remove(&node.name_any());
                Ok(Some(node))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        })
        .filter_map(|r| async move { r.transpose() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use serde_json::json;

    fn node(ready: &str, transition: &str, heartbeat: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"a": "b"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {
                "images": [{"names": ["registry/image:1"], "sizeBytes": 1}],
                "capacity": {"cpu": "96"},
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": ready, "lastTransitionTime": transition,
                     "lastHeartbeatTime": heartbeat, "message": "kubelet is posting ready status"}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_trimmed_node_keeps_what_the_operator_reads() {
        let full = node("False", "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z");
        let mut trimmed = full.clone();
        trim_node(&mut trimmed);
        assert_eq!(
            crate::observe::node_not_ready_since(&trimmed),
            crate::observe::node_not_ready_since(&full)
        );
        let status = trimmed.status.unwrap();
        assert_eq!((status.images, status.capacity), (None, None));
        assert_eq!(status.conditions.unwrap().len(), 1);
        assert_eq!(trimmed.spec, None);
    }

    #[test]
    fn a_trimmed_pod_looks_the_same_to_the_state_machine() {
        use crate::fixtures::{PodExt, api_pod, trainer_running};
        let mut full = api_pod(1, 0)
            .with_trainer(trainer_running())
            .on_node("n1")
            .with_ip("10.0.0.9");
        let spec = full.spec.as_mut().unwrap();
        spec.volumes = Some(vec![
            serde_json::from_value(
                json!({"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}),
            )
            .unwrap(),
            serde_json::from_value(json!({"name": "tmp", "emptyDir": {}})).unwrap(),
        ]);
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        assert!(trimmed.spec.as_ref().unwrap().containers.is_empty());
        assert_eq!(
            crate::observe::pod_view(&trimmed, None),
            crate::observe::pod_view(&full, None)
        );
    }

    #[tokio::test]
    async fn only_readiness_changes_and_deletions_pass() {
        let apply = |n: Node| Ok(watcher::Event::Apply(n));
        let events = vec![
            Ok(watcher::Event::InitApply(node(
                "True",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:00:00Z",
            ))),
            // A heartbeat: nothing the jobs read changed.
            apply(node("True", "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z")),
            apply(node(
                "False",
                "2026-01-01T00:06:00Z",
                "2026-01-01T00:06:00Z",
            )),
            apply(node(
                "False",
                "2026-01-01T00:06:00Z",
                "2026-01-01T00:07:00Z",
            )),
            Ok(watcher::Event::Delete(node(
                "False",
                "2026-01-01T00:06:00Z",
                "2026-01-01T00:07:00Z",
            ))),
        ];
        let passed: Vec<Node> = readiness_changes(stream::iter(events))
            .map(|r| r.unwrap())
            .collect()
            .await;
        let ready: Vec<String> = passed
            .iter()
            .map(|n| {
                n.status.as_ref().unwrap().conditions.as_ref().unwrap()[1]
                    .status
                    .clone()
            })
            .collect();
        assert_eq!(
            ready,
            ["True", "False", "False"],
            "first, the change, the deletion"
        );
    }
}
