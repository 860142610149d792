//! A network partition on a real cluster: rank 1's pod is cut off from every other pod and
//! from Kubernetes (its network namespace drops every packet and its node's kubelet is
//! stopped: `ferrotrain_e2e::partition`), while its processes keep running. The launchers'
//! heartbeats end the round within the heartbeat timeout, long before Kubernetes calls the node
//! NotReady; the cut-off trainer stops; the operator replaces the pod alone once Kubernetes
//! lets it; and the cut-off launcher, when its network comes back, finds its node held by the
//! replacement and leaves instead of joining a round.
//!
//! Both tests stop a kubelet, so they run alone (.config/nextest.toml), and each job's two
//! pods are placed on different nodes (a required anti-affinity, dropped before the cut so
//! that the replacement may go anywhere). They need the cluster kit's nodes on this machine
//! (root: its kubelets' pid files, the pods' network namespaces), not a kind cluster.

use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_e2e::partition::Partition;
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, launchers_of, pods_of, trainers_of, wait_first_checkpoint,
    wait_for, wait_rank0, wait_status,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// The launchers' default heartbeat timeout (`--heartbeat-timeout-seconds`).
const HEARTBEAT_SECONDS: f64 = 10.0;

/// A 2-pod copy job whose pods must run on different nodes, with a rendezvous timeout long
/// enough for Kubernetes to call the node lost and the operator to replace the pod.
fn apart_job(job: &str) -> Value {
    let mut spec = copy_job(2, 1_000_000, Some(&format!("{job}-checkpoints")));
    // Elastic or not is each test's own choice.
    spec.as_object_mut().unwrap().remove("elastic");
    spec["trainer"]["distributed"]["rendezvousTimeoutSeconds"] = json!(600);
    spec["podTemplate"]["labels"] = json!({SPREAD: job});
    spec["podTemplate"]["affinity"] = json!({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {SPREAD: job}},
            "topologyKey": "kubernetes.io/hostname"
        }]
    }});
    spec
}

/// The label the first pods spread by. Their anti-affinity is symmetric (no pod with the
/// label may join them), so the replacement must come without it.
const SPREAD: &str = "e2e.ferrotrain.dev/spread";

/// Starts the job, waits until both ranks train, then drops the anti-affinity and its label
/// (seen by the operator before anything else happens) so that a replacement may share a
/// node with rank 0.
async fn start_apart(ns: &TestNamespace, job: &str, spec: Value) {
    ns.create_checkpoint_claim(&format!("{job}-checkpoints"))
        .await;
    ns.create_job(job, spec).await;
    wait_first_checkpoint(ns, job).await;
    stepping_at(ns, job, 2).await;
    let patch = json!({"spec": {"podTemplate": {"affinity": null, "labels": null}}});
    let patched = ns
        .jobs()
        .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("dropping the anti-affinity");
    let generation = patched.metadata.generation;
    wait_status(&ns.jobs(), job, "the new generation observed", WAIT, |s| {
        s.observed_generation >= generation
    })
    .await;
}

/// Rank 0's round and that round's first step, once it steps at world size `world`.
async fn stepping_at(ns: &TestNamespace, job: &str, world: u32) -> (u64, Timestamp) {
    let what = format!("rank 0 stepping at world size {world}");
    wait_rank0(ns, &format!("{job}-0-0"), &what, |p| {
        p.attempt_first_step_time
            .filter(|_| p.world_size == world)
            .map(|t| (p.round, t))
    })
    .await
}

/// Rank 1's pod: its UID and node.
async fn rank1(ns: &TestNamespace, job: &str) -> (String, String) {
    let pod: Pod = ns.pods().get(&format!("{job}-0-1")).await.expect("rank 1");
    let uid = pod.metadata.uid.expect("a UID");
    let node = pod.spec.and_then(|s| s.node_name).expect("placed");
    (uid, node)
}

/// Waits (bounded) until rank 1's pod is a new one, running: its UID and when it started.
async fn replacement_running(ns: &TestNamespace, job: &str, old: &str) -> (String, Timestamp) {
    wait_for("rank 1's replacement running", WAIT, || async {
        let pods = pods_of(&ns.pods(), job).await;
        let pod = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&format!("{job}-0-1")));
        let uid = pod.and_then(|p| p.metadata.uid.clone());
        let started = pod
            .and_then(|p| {
                p.status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()
                    .cloned()
            })
            .and_then(|c| c.state?.running?.started_at)
            .map(|t| t.0);
        let seen = format!("{uid:?} started {started:?}");
        match (uid, started) {
            (Some(uid), Some(at)) if uid != old => (Some((uid, at)), seen),
            _ => (None, seen),
        }
    })
    .await
}

/// Waits (at most `seconds`) until `list` finds no process: `what`.
async fn all_gone(what: &str, seconds: u64, list: impl Fn() -> Vec<u32>) {
    wait_for(what, Duration::from_secs(seconds), || async {
        let left = list();
        (left.is_empty().then_some(()), format!("{left:?}"))
    })
    .await;
}

/// The status once the round the partition ended is counted: blamed on rank 1's node as cut
/// off, in the same attempt.
async fn counted_as_cut_off(ns: &TestNamespace, job: &str) -> DistributedTrainingStatus {
    let s = wait_status(&ns.jobs(), job, "the round counted", WAIT, |s| {
        s.round >= 1 && s.last_failure.is_some()
    })
    .await;
    let f = s.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank, s.attempt),
        ("AgentLost", Some(1), 0),
        "{f:?}"
    );
    assert!(
        f.message
            .contains("was cut off: its launcher sent no heartbeat"),
        "{}",
        f.message
    );
    s
}

/// When the round the cut ended was seen to end, as node 0's launcher recorded it (the
/// ledger in the status: the record that ended with `AgentLost`).
fn cut_detected(s: &DistributedTrainingStatus) -> Timestamp {
    let records = &s.recovery.as_ref().expect("the ledger").attempts;
    records
        .iter()
        .filter_map(|r| r.end.as_ref())
        .find(|e| e.reason == "AgentLost")
        .unwrap_or_else(|| panic!("a record ended by AgentLost: {records:?}"))
        .detected_at
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn an_elastic_gang_trains_on_without_a_cut_off_pod_and_fences_it_when_it_returns() {
    let ns = TestNamespace::create("partition").await;
    let mut spec = apart_job("partition");
    spec["elastic"] = json!({"minReplicas": 1, "waitSeconds": 5});
    start_apart(&ns, "partition", spec).await;
    let (old, node) = rank1(&ns, "partition").await;

    let cut_at = Timestamp::now();
    let cut_clock = Instant::now();
    let mut partition = Partition::cut(&old, &node);
    let (round, first) = stepping_at(&ns, "partition", 1).await;
    let took = first.duration_since(cut_at).as_secs_f64();
    println!("rank 1's pod cut off -> round {round} steps at world size 1 {took:.1} s later");
    assert!(
        took < HEARTBEAT_SECONDS + 10.0,
        "training went on at world size 1 {took:.1} s after the cut (heartbeat {HEARTBEAT_SECONDS} s + 10 s)"
    );
    // The cut-off trainer stopped: it can write nothing more and join no round.
    all_gone("the cut-off pod's trainer to stop", 30, || {
        trainers_of(&old)
    })
    .await;
    counted_as_cut_off(&ns, "partition").await;

    // Kubernetes calls the node lost; the operator replaces the pod alone, and the gang
    // grows back with the replacement.
    let (new, started) = replacement_running(&ns, "partition", &old).await;
    let (grown, whole_at) = stepping_at(&ns, "partition", 2).await;
    println!(
        "replacement {new} running {:.0} s after the cut; round {grown} steps at world size 2 {:.1} s after it started",
        started.duration_since(cut_at).as_secs_f64(),
        whole_at.duration_since(started).as_secs_f64()
    );

    // The partition heals (the kubelet stays stopped, so nothing but the fence ends it): the
    // cut-off launcher finds node 1 held by the replacement and leaves.
    assert_eq!(
        launchers_of(&old).len(),
        1,
        "the cut-off launcher still waits for the store when its network comes back"
    );
    partition.restore_network().expect("the network back");
    all_gone("the cut-off launcher to leave the gang", 60, || {
        launchers_of(&old)
    })
    .await;
    let after = wait_status(
        &ns.jobs(),
        "partition",
        "the job after the heal",
        WAIT,
        |s| s.phase == Phase::Running,
    )
    .await;
    assert_eq!(after.attempt, 0, "no gang restart: {after:?}");
    let now = stepping_at(&ns, "partition", 2).await;
    assert_eq!(now.0, grown, "the stale launcher ended no round");
    partition.heal().expect("the partition healed");
    println!(
        "cut off for {:.0} s in all",
        cut_clock.elapsed().as_secs_f64()
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn without_elasticity_a_cut_off_pod_is_replaced_alone_and_the_gang_is_whole_again() {
    let ns = TestNamespace::create("cutoff").await;
    start_apart(&ns, "cutoff", apart_job("cutoff")).await;
    let (old, node) = rank1(&ns, "cutoff").await;

    let cut_at = Timestamp::now();
    let mut partition = Partition::cut(&old, &node);
    // The gang cannot train without rank 1: node 0's launcher waits for it.
    let (new, started) = replacement_running(&ns, "cutoff", &old).await;
    let (round, first) = stepping_at(&ns, "cutoff", 2).await;
    let s = counted_as_cut_off(&ns, "cutoff").await;
    let detected = cut_detected(&s).duration_since(cut_at).as_secs_f64();
    let after_start = first.duration_since(started).as_secs_f64();
    println!(
        "rank 1's pod cut off -> its round ended {detected:.1} s later; replacement {new} running \
         {:.0} s after the cut; round {round} steps with it {after_start:.1} s after it started",
        started.duration_since(cut_at).as_secs_f64()
    );
    assert!(
        detected < HEARTBEAT_SECONDS + 5.0,
        "the round ended {detected:.1} s after the cut (heartbeat {HEARTBEAT_SECONDS} s + 5 s)"
    );
    assert!(
        after_start < 20.0,
        "the gang trained again {after_start:.1} s after the replacement started"
    );
    assert_eq!(
        (s.attempt, s.restarts),
        (0, 1),
        "one in-place restart, no gang restart: {s:?}"
    );
    partition.heal().expect("the partition healed");
}
