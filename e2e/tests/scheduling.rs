//! Shared clusters: a gang held by a queue waits as Queued (never restarted by the start-up
//! timeout) and runs once admitted; two gangs that do not both fit are placed one whole at a
//! time by Kubernetes' own gang scheduling where the API server serves it (scripts/e2e.sh
//! --gates), and where it does not the jobs say so and still finish.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, WAIT, copy_job, pods_of, wait_status};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

/// A cluster-scoped object made for one test, deleted when the test ends (also on failure).
struct ClusterObject {
    resource: ApiResource,
    name: String,
}

impl Drop for ClusterObject {
    fn drop(&mut self) {
        let (resource, name) = (self.resource.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                if let Ok(client) = Client::try_default().await {
                    let api: Api<DynamicObject> = Api::all_with(client, &resource);
                    let _ = api.delete(&name, &Default::default()).await;
                }
            });
        })
        .join();
    }
}

fn admission(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create_cluster_object(
    client: &Client,
    resource: ApiResource,
    body: Value,
) -> ClusterObject {
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    let object: DynamicObject = serde_json::from_value(body).unwrap();
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {} {name}: {e}", resource.kind));
    ClusterObject { resource, name }
}

/// Stands in for Kueue's webhook: a MutatingAdmissionPolicy (GA in 1.36) that gates every pod
/// carrying the queue label in namespace `ns`, as Kueue's `kueue.x-k8s.io/admission` gate does.
async fn queue_gate(client: &Client, ns: &str) -> Vec<ClusterObject> {
    let name = format!("{ns}-queue-gate");
    let policy = create_cluster_object(
        client,
        admission("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]
                }]},
                "matchConditions": [{
                    "name": "queued",
                    "expression": "has(object.metadata.labels) && 'kueue.x-k8s.io/queue-name' in object.metadata.labels"
                }],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression":
                        "Object{spec: Object.spec{schedulingGates: [Object.spec.schedulingGates{name: \"kueue.x-k8s.io/admission\"}]}}"
                    }
                }]
            }
        }),
    )
    .await;
    let binding = create_cluster_object(
        client,
        admission("MutatingAdmissionPolicyBinding", "mutatingadmissionpolicybindings"),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
            }
        }),
    )
    .await;
    wait_until_gated(client, ns).await;
    vec![binding, policy]
}

/// A new policy takes a moment to reach the admission chain: wait until a dry-run pod with
/// the queue label comes back gated.
async fn wait_until_gated(client: &Client, ns: &str) {
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "gate-probe-", "labels": {"kueue.x-k8s.io/queue-name": "probe"}},
        "spec": {"containers": [{"name": "probe", "image": "probe.invalid/none"}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let started = Instant::now();
    loop {
        let gated = pods.create(&params, &probe).await.ok().is_some_and(|p| {
            p.spec
                .and_then(|s| s.scheduling_gates)
                .is_some_and(|g| !g.is_empty())
        });
        if gated {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "the MutatingAdmissionPolicy never gated a pod"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn condition(s: &DistributedTrainingStatus, type_: &str) -> (String, String, String) {
    s.condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_gated_gang_is_queued_not_restarted_and_runs_once_admitted() {
    const STARTUP_TIMEOUT: u64 = 15;
    let ns = TestNamespace::create("queued").await;
    let _gate = queue_gate(&ns.client, &ns.name).await;
    let mut spec = copy_job(2, 100, None);
    spec["queueName"] = json!("team-a");
    spec["startupTimeoutSeconds"] = json!(STARTUP_TIMEOUT);
    ns.create_job("queued", spec).await;
    let created = Instant::now();

    let queued = wait_status(&ns.jobs(), "queued", "phase Queued", WAIT, |s| {
        s.phase == Phase::Queued
    })
    .await;
    let (_, reason, message) = condition(&queued, "Running");
    assert_eq!(reason, "Queued");
    assert!(message.contains("kueue.x-k8s.io/admission"), "{message}");
    assert!(message.contains("team-a"), "{message}");
    // Past the start-up timeout: still Queued, nothing restarted.
    let past = Duration::from_secs(STARTUP_TIMEOUT + 10);
    tokio::time::sleep(past.saturating_sub(created.elapsed())).await;
    let still = ns.jobs().get("queued").await.unwrap().status.unwrap();
    assert_eq!(
        (still.phase, still.attempt, still.restarts),
        (Phase::Queued, 0, 0),
        "{still:?}"
    );

    // Kueue's admission removes the gate from every pod of the group.
    for pod in pods_of(&ns.pods(), "queued").await {
        let name = pod.metadata.name.unwrap();
        let ungate = json!({"spec": {"schedulingGates": null}});
        ns.pods()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&ungate))
            .await
            .unwrap_or_else(|e| panic!("ungating {name}: {e}"));
    }
    let done = wait_status(
        &ns.jobs(),
        "queued",
        "Succeeded after admission",
        TRAIN_WAIT,
        |s| s.phase == Phase::Succeeded,
    )
    .await;
    assert_eq!((done.attempt, done.restarts), (0, 0), "{done:?}");
    let (status, reason, _) = condition(&done, "Queued");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Admitted"));
}

/// Whether the API server serves Kubernetes' own gang scheduling API (scripts/e2e.sh --gates).
async fn native_gang_served(client: &Client) -> bool {
    let groups = client.list_api_groups().await.expect("discovery");
    groups.groups.iter().any(|g| {
        g.name == "scheduling.k8s.io" && g.versions.iter().any(|v| v.version == "v1alpha2")
    })
}

/// Milli-CPUs left on `node`: allocatable minus the requests of the pods bound to it.
async fn free_millicpu(client: &Client, node: &str) -> i64 {
    let n = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    let allocatable = n.status.unwrap().allocatable.unwrap()["cpu"].0.clone();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    let requested: i64 = pods
        .items
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .flat_map(|p| p.spec.as_ref().unwrap().containers.clone())
        .filter_map(|c| c.resources?.requests?.get("cpu").map(|q| millis(&q.0)))
        .sum();
    millis(&allocatable) - requested
}

fn millis(q: &str) -> i64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => (q.parse::<f64>().unwrap() * 1000.0) as i64,
    }
}

/// (bound, total) pods of the job's current attempt.
async fn bound(ns: &TestNamespace, job: &str) -> (usize, usize) {
    let pods = pods_of(&ns.pods(), job).await;
    let bound = pods
        .iter()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .count();
    (bound, pods.len())
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh; --gates for the native path)"]
async fn two_gangs_that_do_not_both_fit_are_placed_one_whole_at_a_time() {
    let ns = TestNamespace::create("gangs").await;
    let native = native_gang_served(&ns.client).await;
    // Both gangs on one node, each pod a third of its free CPU: three of the four fit.
    let node = "ft-node-1";
    let cpu = free_millicpu(&ns.client, node).await / 3 - 10;
    let job = |steps: u64| {
        let mut spec = copy_job(2, steps, None);
        spec["resources"] = json!({"requests": {"cpu": format!("{cpu}m"), "memory": "256Mi"}, "limits": {"memory": "1Gi"}});
        spec["podTemplate"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        spec["startupTimeoutSeconds"] = json!(0);
        spec
    };
    ns.create_job("first", job(600)).await;
    wait_status(&ns.jobs(), "first", "Running", TRAIN_WAIT, |s| {
        s.phase == Phase::Running
    })
    .await;
    ns.create_job("second", job(50)).await;

    // While the first runs, watch the second's placement.
    let mut seen = BTreeMap::new();
    loop {
        let first = ns
            .jobs()
            .get("first")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        let placement = bound(&ns, "second").await;
        *seen.entry(placement).or_insert(0) += 1;
        if first.phase == Phase::Succeeded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let second = wait_status(&ns.jobs(), "second", "Succeeded", TRAIN_WAIT, |s| {
        s.phase == Phase::Succeeded
    })
    .await;
    let (status, reason, message) = condition(&second, "GangScheduling");
    eprintln!(
        "native gang API served: {native}; the second gang's (bound, pods) while the first ran: {seen:?}; GangScheduling {status} {reason}: {message}"
    );
    if native {
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "NativePodGroup")
        );
        assert!(
            seen.keys().all(|(b, _)| *b == 0),
            "no pod of the waiting gang may hold a place: {seen:?}"
        );
    } else {
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "NativeApiNotServed"),
            "{message}"
        );
    }
    assert_eq!((second.attempt, second.restarts), (0, 0), "{second:?}");
}
