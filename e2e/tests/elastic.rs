//! Elastic world size on a real cluster: a 3-pod job with `elastic.minReplicas: 2` whose
//! deleted pod cannot be placed again trains on at world size 2 (same attempt, no restart),
//! and grows back to 3 once the replacement can be scheduled.

use std::time::Instant;

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, wait_first_checkpoint, wait_for, wait_rank0, wait_status,
};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const LABEL: &str = "e2e.ferrotrain.dev/elastic";
const WAIT_SECONDS: u64 = 10;

/// Sets (or with None removes) `LABEL` on `node`.
async fn label_node(client: &Client, node: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {LABEL: value}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("labelling {node}: {e}"));
}

/// Rank 0's round and that round's first step, once it steps at world size `world`; prints
/// how each earlier round ended (what a failure of the timing below needs to be read).
async fn stepping_at(ns: &TestNamespace, world: u32) -> (u64, Timestamp) {
    let what = format!("rank 0 stepping at world size {world}");
    let (round, first, ends) = wait_rank0(ns, "elastic-0-0", &what, |p| {
        p.attempt_first_step_time
            .filter(|_| p.world_size == world)
            .map(|t| (p.round, t, p.round_ends.clone()))
    })
    .await;
    for e in ends {
        eprintln!(
            "  round {} ended at {}: {} (rank {:?}, {:?}): {}",
            e.round, e.end.failed_at, e.end.reason, e.end.rank, e.end.node, e.message
        );
    }
    (round, first)
}

fn resized(s: &ferrotrain_api::crd::DistributedTrainingStatus) -> (String, String) {
    s.condition(condition::RESIZED)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_lost_pod_that_cannot_be_placed_leaves_a_smaller_gang_that_grows_back() {
    let ns = TestNamespace::create("elastic").await;
    ns.create_checkpoint_claim("elastic-checkpoints").await;
    let mut spec = copy_job(3, 1_000_000, Some("elastic-checkpoints"));
    spec["elastic"] = json!({"minReplicas": 2, "waitSeconds": WAIT_SECONDS});
    ns.create_job("elastic", spec).await;
    wait_first_checkpoint(&ns, "elastic").await;
    // The whole gang trains before a pod is taken away: a pod late for round 0 (once here,
    // a pod's agent had not reached the store when round 0 began) is elastic's to leave out
    // too, and joins at a later checkpoint.
    stepping_at(&ns, 3).await;

    // Pods created from now on need a node label no node has: rank 2's replacement cannot
    // be placed (the running pods keep their placement).
    // The operator must have seen the change before the deletion: a replacement made from
    // the spec it had before would be placed.
    let selector = json!({"spec": {"podTemplate": {"nodeSelector": {LABEL: ns.name}}}});
    let patched = ns
        .jobs()
        .patch("elastic", &PatchParams::default(), &Patch::Merge(&selector))
        .await
        .expect("the node selector");
    let generation = patched.metadata.generation;
    wait_status(
        &ns.jobs(),
        "elastic",
        "the new generation observed",
        WAIT,
        |s| s.observed_generation >= generation,
    )
    .await;
    let old_uid = ns.pods().get("elastic-0-2").await.unwrap().metadata.uid;
    let deleted = Timestamp::now();
    let deleted_clock = Instant::now();
    ns.pods()
        .delete("elastic-0-2", &Default::default())
        .await
        .expect("deleting rank 2's pod");

    let (round, first) = stepping_at(&ns, 2).await;
    let took = first.duration_since(deleted).as_secs_f64();
    eprintln!("rank 2's pod deleted -> round {round} steps at world size 2 {took:.1} s later");
    assert!(
        took < (WAIT_SECONDS + 5) as f64,
        "training went on at world size 2 {took:.1} s after the deletion (wait {WAIT_SECONDS} s + 5 s)"
    );
    let shrunk = wait_status(&ns.jobs(), "elastic", "Resized Shrunk", WAIT, |s| {
        s.current_world_size == Some(2)
    })
    .await;
    assert_eq!(resized(&shrunk), ("True".into(), "Shrunk".into()));
    let running = shrunk
        .condition(condition::RUNNING)
        .map(|c| c.message.as_str());
    assert_eq!(
        running,
        Some("2 of 3 pods of attempt 0 run; the gang trains without the others (see Resized)")
    );
    assert_eq!(
        (shrunk.attempt, shrunk.phase),
        (0, Phase::Running),
        "no gang restart: {shrunk:?}"
    );
    // The replacement is created once the deleted pod is gone, which can be after the gang
    // already trains without it.
    let phase = wait_for("rank 2's replacement", WAIT, || async {
        let pod = ns
            .pods()
            .get_opt("elastic-0-2")
            .await
            .expect("rank 2's pod");
        let seen = pod.as_ref().map(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            format!("uid {:?}, phase {phase:?}", p.metadata.uid)
        });
        let seen = seen.unwrap_or_else(|| "no pod".into());
        let replacement = pod.filter(|p| p.metadata.uid != old_uid);
        (replacement.map(|p| p.status.and_then(|s| s.phase)), seen)
    })
    .await;
    eprintln!(
        "rank 2's replacement created {:.1} s after the deletion",
        deleted_clock.elapsed().as_secs_f64()
    );
    assert_eq!(phase.as_deref(), Some("Pending"), "it cannot be placed");

    // Capacity is back: a node gets the label and the gang grows to 3 at its next round.
    let nodes = Api::<Node>::all(ns.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let node = nodes.items[0].metadata.name.clone().unwrap();
    label_node(&ns.client, &node, Some(&ns.name)).await;
    let grown = stepping_at(&ns, 3).await;
    label_node(&ns.client, &node, None).await;
    eprintln!(
        "labelled {node} -> round {} steps at world size 3; shrunk for {:.0} s in all",
        grown.0,
        deleted_clock.elapsed().as_secs_f64()
    );
    // currentWorldSize is only there while fewer ranks train.
    let whole = wait_status(&ns.jobs(), "elastic", "Resized WholeGang", WAIT, |s| {
        s.current_world_size.is_none() && resized(s) == ("False".into(), "WholeGang".into())
    })
    .await;
    assert_eq!(whole.attempt, 0, "the same attempt throughout: {whole:?}");
    // The pod's departure is one restart (PodLeaving); the resizes are not restarts.
    assert!(whole.restarts <= 1, "{whole:?}");
}
