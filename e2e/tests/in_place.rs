//! In-place restarts on a real cluster: a trainer process that dies or freezes inside its pod
//! restarts every rank in a new round of the same attempt, in the same pods (same UIDs), in
//! seconds; the job counts it as a restart with the right rank and cause.

use std::collections::BTreeMap;

use ferrotrain_api::crd::{DistributedTrainingStatus, FailureInfo, Phase};
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, kill_launcher_from_host, pods_of, signal_trainer,
    wait_first_checkpoint, wait_rank0, wait_spare, wait_status,
};
use serde_json::json;

async fn uids(ns: &TestNamespace, job: &str) -> BTreeMap<String, String> {
    pods_of(&ns.pods(), job)
        .await
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect()
}

/// Of job `job`'s two pods (UIDs by name, before and `now`), only rank `replaced`'s is new.
fn replaced_alone(
    before: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
    job: &str,
    replaced: i32,
) {
    for rank in 0..2 {
        let pod = format!("{job}-0-{rank}");
        if rank == replaced {
            assert_ne!(
                now.get(&pod),
                before.get(&pod),
                "rank {rank}'s pod replaced"
            );
        } else {
            assert_eq!(now.get(&pod), before.get(&pod), "rank {rank}'s pod kept");
        }
    }
}

/// The job's last failure, checked to blame `reason` on the pod of `node_rank`.
fn blamed(status: &DistributedTrainingStatus, reason: &str, node_rank: i32) -> FailureInfo {
    let f = status.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank),
        (reason, Some(node_rank)),
        "{f:?}"
    );
    f
}

/// A running 2-pod copy job past its first checkpoint, with this collective timeout.
async fn training(ns: &TestNamespace, job: &str, collective_timeout: u64) {
    ns.create_checkpoint_claim(&format!("{job}-checkpoints"))
        .await;
    let mut spec = copy_job(2, 1_000_000, Some(&format!("{job}-checkpoints")));
    spec["trainer"]["distributed"]["collectiveTimeoutSeconds"] = json!(collective_timeout);
    ns.create_job(job, spec).await;
    wait_first_checkpoint(ns, job).await;
}

/// When rank 0 completed its first step of `round` (its own report, through the pod proxy).
async fn first_step_of_round(ns: &TestNamespace, job: &str, round: u64) -> Timestamp {
    let what = format!("rank 0 stepping in round {round}");
    wait_rank0(ns, &format!("{job}-0-0"), &what, |p| {
        p.attempt_first_step_time.filter(|_| p.round == round)
    })
    .await
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_killed_trainer_restarts_in_place_in_seconds_in_the_same_pods() {
    let ns = TestNamespace::create("inplace").await;
    training(&ns, "inplace", 30).await;
    let gang = uids(&ns, "inplace").await;
    assert_eq!(gang.len(), 2, "{gang:?}");
    // Rank 1's agent has a spare trainer waiting for round 1 (libtorch already loaded).
    let spare = wait_spare(&ns.pods(), "inplace-0-1").await;

    let killed_at = Timestamp::now();
    signal_trainer(&ns.pods(), "inplace-0-1", "KILL").await;
    let first = first_step_of_round(&ns, "inplace", 1).await;
    let trainer = signal_trainer(&ns.pods(), "inplace-0-1", "0").await;
    assert_eq!(trainer, spare, "rank 1 of round 1 is the spare that waited");
    let to_step = first.duration_since(killed_at).as_secs_f64();
    eprintln!("kill -9 of rank 1's trainer -> round 1's first step {to_step:.2} s later");

    let counted = wait_status(&ns.jobs(), "inplace", "the restart counted", WAIT, |s| {
        s.restarts == 1 && s.round == 1
    })
    .await;
    assert_eq!(counted.attempt, 0, "the same attempt");
    assert_eq!(counted.phase, Phase::Running);
    assert_eq!(uids(&ns, "inplace").await, gang, "the same pods, untouched");
    let f = counted.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank, f.exit_code),
        ("Killed", Some(1), Some(137)),
        "{f:?}"
    );
    assert!(f.message.contains("SIGKILL"), "{}", f.message);
    assert!(f.node.is_some(), "the node, from status.placement: {f:?}");
    assert_eq!(counted.restarts_by_cause.get("Killed"), Some(&1));
    let ledger = counted.recovery.clone().expect("the ledger");
    let round = ledger.attempts.last().unwrap();
    assert_eq!((round.attempt, round.round), (0, Some(1)), "{ledger:?}");
    assert!(
        to_step < 3.0,
        "the next step came {to_step:.2} s after the kill (goal < 3 s)"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_frozen_trainer_is_blamed_and_the_gang_restarts_in_place_within_the_timeout() {
    const TIMEOUT: u64 = 10;
    let ns = TestNamespace::create("frozen").await;
    training(&ns, "frozen", TIMEOUT).await;
    let gang = uids(&ns, "frozen").await;

    let stopped_at = Timestamp::now();
    signal_trainer(&ns.pods(), "frozen-0-1", "STOP").await;
    let first = first_step_of_round(&ns, "frozen", 1).await;
    let took = first.duration_since(stopped_at).as_secs_f64();
    eprintln!("SIGSTOP of rank 1's trainer -> round 1's first step {took:.2} s later");
    let counted = wait_status(&ns.jobs(), "frozen", "the restart counted", WAIT, |s| {
        s.restarts == 1
    })
    .await;
    let f = counted.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank),
        ("Frozen", Some(1)),
        "the frozen rank is blamed, not the peer that timed out: {f:?}"
    );
    assert_eq!(uids(&ns, "frozen").await, gang, "the same pods");
    // Its own launcher notices the stop (2 s), well before the peers' collective timeout.
    assert!(
        took < (TIMEOUT + 3) as f64,
        "stepping again {took:.2} s after the freeze (collective timeout {TIMEOUT} s + 3 s)"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_deleted_pod_is_replaced_alone_and_training_resumes() {
    let ns = TestNamespace::create("replace").await;
    training(&ns, "replace", 30).await;
    let gang = uids(&ns, "replace").await;
    ns.pods()
        .delete("replace-0-1", &Default::default())
        .await
        .unwrap();
    // Rank 0 steps again in the next round, with rank 1's replacement.
    first_step_of_round(&ns, "replace", 1).await;
    let now = uids(&ns, "replace").await;
    assert_eq!(now.len(), 2, "{now:?}");
    replaced_alone(&gang, &now, "replace", 1);
    let counted = wait_status(&ns.jobs(), "replace", "the round counted", WAIT, |s| {
        s.phase == Phase::Running && s.round == 1
    })
    .await;
    assert_eq!(counted.attempt, 0, "the same attempt");
    blamed(&counted, "PodLeaving", 1);
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn node_0s_deleted_pod_is_replaced_alone_and_the_others_join_its_new_store() {
    let ns = TestNamespace::create("replace0").await;
    training(&ns, "replace0", 30).await;
    let gang = uids(&ns, "replace0").await;
    let deleted = Timestamp::now();
    ns.pods()
        .delete("replace0-0-0", &Default::default())
        .await
        .unwrap();
    // The replacement of node 0 starts round 1 (where node 1 left off), with node 1.
    let stepped = wait_rank0(&ns, "replace0-0-0", "rank 0 stepping in round 1", |p| {
        p.attempt_first_step_time
            .filter(|_| p.round == 1)
            .map(|t| (t, p.resumed_from_step))
    })
    .await;
    println!(
        "node 0's pod deleted -> its replacement's first step in round 1: {:.1} s (resumed from step {:?})",
        stepped.0.duration_since(deleted).as_secs_f64(),
        stepped.1
    );
    assert!(stepped.1.is_some(), "resumed from the checkpoint");
    let now = uids(&ns, "replace0").await;
    replaced_alone(&gang, &now, "replace0", 0);
    let counted = wait_status(&ns.jobs(), "replace0", "running again", WAIT, |s| {
        s.phase == Phase::Running && s.restarts == 1
    })
    .await;
    assert_eq!(counted.attempt, 0, "the same attempt");
    blamed(&counted, "PodLeaving", 0);
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_pod_whose_launcher_was_killed_is_replaced_alone() {
    let ns = TestNamespace::create("agentkill").await;
    training(&ns, "agentkill", 30).await;
    let gang = uids(&ns, "agentkill").await;
    // The pod's own process, the launcher (not a trainer: that one restarts in place), is
    // killed as the OOM killer would: the pod fails with 137.
    let killed_at = Timestamp::now();
    kill_launcher_from_host(&gang["agentkill-0-1"]);
    let first = first_step_of_round(&ns, "agentkill", 1).await;
    println!(
        "launcher of rank 1's pod killed -> round 1's first step with its replacement {:.1} s later",
        first.duration_since(killed_at).as_secs_f64()
    );
    let now = uids(&ns, "agentkill").await;
    replaced_alone(&gang, &now, "agentkill", 1);
    let counted = wait_status(&ns.jobs(), "agentkill", "the round counted", WAIT, |s| {
        s.phase == Phase::Running && s.round == 1
    })
    .await;
    assert_eq!((counted.attempt, counted.restarts), (0, 1), "{counted:?}");
    // Blamed: the pod whose launcher sent no report, not the peer whose ring broke first.
    blamed(&counted, "AgentLost", 1);
}
