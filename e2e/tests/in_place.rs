//! Recovery on a real cluster, at the defaults users get (examples/copy-dt.yaml as shipped:
//! the pods' own termination grace, its backoff, elastic down to one pod): a trainer that dies
//! or freezes restarts in a new round in the same pods; a pod that goes (deleted, evicted, its
//! launcher killed) leaves the other to train on until its replacement joins. Every round
//! starts from the step the gang last completed, taken from a surviving rank (not the
//! checkpoint): at most the step in flight is trained twice.

use std::collections::BTreeMap;

use ferrotrain_api::crd::{DistributedTrainingStatus, FailureInfo, Phase};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{EndCause, HealedFrom, Timestamp};
use ferrotrain_e2e::rounds::{
    RoundStart, ended_round, lost_at_most_the_step_in_flight, round_started,
};
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, exec, kill_launcher_from_host, pods_of, signal_trainer,
    wait_first_checkpoint, wait_spare, wait_status,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use serde_json::json;

/// How soon after a failure that leaves a rank alive the gang steps again: the goal
/// is 2 s at the median (bench/restart-speed.sh); a test that runs beside another on two
/// cores gets some slack.
const STEPS_AGAIN_WITHIN: f64 = 3.0;

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

/// A running 2-pod copy job of the example past its first checkpoint.
async fn training(ns: &TestNamespace, job: &str) {
    training_with(
        ns,
        job,
        copy_job(2, 1_000_000, Some(&format!("{job}-checkpoints"))),
    )
    .await;
}

async fn training_with(ns: &TestNamespace, job: &str, spec: serde_json::Value) {
    ns.create_checkpoint_claim(&format!("{job}-checkpoints"))
        .await;
    ns.create_job(job, spec).await;
    wait_first_checkpoint(ns, job).await;
}

/// Round `ended` of `job` lost at most the step in flight, and round `ended + 1` (`next`)
/// started from its peers; prints the count under `what`.
async fn nothing_lost(ns: &TestNamespace, job: &str, ended: u64, next: &RoundStart, what: &str) {
    let (record, _) = ended_round(ns, job, ended).await;
    let lost = lost_at_most_the_step_in_flight(&record, next);
    println!(
        "{what}: round {} resumed from step {:?} ({:?}), {lost} step(s) trained twice",
        ended + 1,
        next.resumed_from,
        next.healed_from
    );
}

/// A pod of a 2-pod elastic job went at `gone_at` (pod `pod` of rank `rank`, not node 0):
/// the other trains on alone in round 1 at once, and the gang is whole again in round 2 with
/// the replacement; neither round trains a step twice beyond the one in flight.
async fn trains_on_alone_then_whole_again(
    ns: &TestNamespace,
    job: &str,
    gang: &BTreeMap<String, String>,
    gone_at: Timestamp,
    what: &str,
) {
    let rank0 = format!("{job}-0-0");
    let alone = round_started(ns, &rank0, 1).await;
    let took = alone.seconds_after(gone_at);
    println!(
        "{what} -> round 1 steps at world size {} {took:.2} s later",
        alone.world_size
    );
    assert_eq!(alone.world_size, 1, "the other trains on alone");
    nothing_lost(ns, job, 0, &alone, what).await;
    assert!(
        took < STEPS_AGAIN_WITHIN,
        "{what}: stepping again {took:.2} s later (goal < {STEPS_AGAIN_WITHIN} s)"
    );
    let whole = round_started(ns, &rank0, 2).await;
    println!(
        "{what} -> whole again (round 2, world size {}) {:.1} s after it",
        whole.world_size,
        whole.seconds_after(gone_at)
    );
    assert_eq!(whole.world_size, 2, "the replacement joined");
    nothing_lost(ns, job, 1, &whole, "the replacement joining").await;
    replaced_alone(gang, &uids(ns, job).await, job, 1);
}

/// kill -9 of rank `rank`'s trainer: a new round in the same pods, its first step within
/// [`STEPS_AGAIN_WITHIN`], from the step the gang last completed.
async fn a_killed_trainer(prefix: &str, rank: i32) {
    let ns = TestNamespace::create(prefix).await;
    let job = prefix;
    training(&ns, job).await;
    let gang = uids(&ns, job).await;
    assert_eq!(gang.len(), 2, "{gang:?}");
    let pod = format!("{job}-0-{rank}");
    // The killed rank's agent has a spare trainer waiting for round 1 (libtorch loaded).
    let spare = wait_spare(&ns.pods(), &pod).await;

    let killed_at = Timestamp::now();
    signal_trainer(&ns.pods(), &pod, "KILL").await;
    let next = round_started(&ns, &format!("{job}-0-0"), 1).await;
    let trainer = signal_trainer(&ns.pods(), &pod, "0").await;
    assert_eq!(
        trainer, spare,
        "rank {rank} of round 1 is the spare that waited"
    );
    let took = next.seconds_after(killed_at);
    println!("kill -9 of rank {rank}'s trainer -> round 1's first step {took:.2} s later");
    assert_eq!(next.world_size, 2, "the whole gang, in place");
    nothing_lost(
        &ns,
        job,
        0,
        &next,
        &format!("kill -9 of rank {rank}'s trainer"),
    )
    .await;

    let counted = wait_status(&ns.jobs(), job, "the restart counted", WAIT, |s| {
        s.restarts == 1 && s.round == 1
    })
    .await;
    assert_eq!(counted.attempt, 0, "the same attempt");
    assert_eq!(counted.phase, Phase::Running);
    assert_eq!(uids(&ns, job).await, gang, "the same pods, untouched");
    let f = counted.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank, f.exit_code),
        (reason::KILLED, Some(rank), Some(137)),
        "{f:?}"
    );
    assert!(f.message.contains("SIGKILL"), "{}", f.message);
    assert!(f.node.is_some(), "the node, from status.placement: {f:?}");
    assert_eq!(counted.restarts_by_cause.get(reason::KILLED), Some(&1));
    assert!(
        took < STEPS_AGAIN_WITHIN,
        "the next step came {took:.2} s after the kill (goal < {STEPS_AGAIN_WITHIN} s)"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_killed_trainer_restarts_in_place_in_seconds_from_the_gangs_last_step() {
    a_killed_trainer("inplace", 1).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_killed_rank_0_trainer_restarts_in_place_in_seconds_from_the_gangs_last_step() {
    a_killed_trainer("inplace0", 0).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_frozen_trainer_is_blamed_and_the_gang_restarts_in_place_within_the_timeout() {
    const TIMEOUT: u64 = 10;
    let ns = TestNamespace::create("frozen").await;
    let mut spec = copy_job(2, 1_000_000, Some("frozen-checkpoints"));
    spec["trainer"]["distributed"]["collectiveTimeoutSeconds"] = json!(TIMEOUT);
    training_with(&ns, "frozen", spec).await;
    let gang = uids(&ns, "frozen").await;

    let stopped_at = Timestamp::now();
    signal_trainer(&ns.pods(), "frozen-0-1", "STOP").await;
    let next = round_started(&ns, "frozen-0-0", 1).await;
    let took = next.seconds_after(stopped_at);
    eprintln!("SIGSTOP of rank 1's trainer -> round 1's first step {took:.2} s later");
    nothing_lost(&ns, "frozen", 0, &next, "SIGSTOP of rank 1's trainer").await;
    let counted = wait_status(&ns.jobs(), "frozen", "the restart counted", WAIT, |s| {
        s.restarts == 1
    })
    .await;
    let f = counted.last_failure.clone().expect("the failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank),
        (reason::FROZEN, Some(1)),
        "the frozen rank is blamed, not the peer that timed out: {f:?}"
    );
    assert_eq!(uids(&ns, "frozen").await, gang, "the same pods");
    // Its own launcher notices the stop (1 s), well before the peers' collective timeout.
    assert!(
        took < (TIMEOUT + 3) as f64,
        "stepping again {took:.2} s after the freeze (collective timeout {TIMEOUT} s + 3 s)"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_deleted_pod_leaves_the_other_training_on_until_its_replacement_joins() {
    let ns = TestNamespace::create("replace").await;
    training(&ns, "replace").await;
    let gang = uids(&ns, "replace").await;
    let deleted_at = Timestamp::now();
    ns.pods()
        .delete("replace-0-1", &Default::default())
        .await
        .unwrap();
    trains_on_alone_then_whole_again(&ns, "replace", &gang, deleted_at, "rank 1's pod deleted")
        .await;
    let counted = wait_status(&ns.jobs(), "replace", "the rounds counted", WAIT, |s| {
        s.phase == Phase::Running && s.round == 2
    })
    .await;
    // A disruption: the restart budget is not spent on it.
    assert_eq!((counted.attempt, counted.restarts), (0, 0), "{counted:?}");
    assert_eq!(counted.restarts_by_cause.get(reason::POD_LEAVING), Some(&1));
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn an_evicted_pod_leaves_the_other_training_on_until_its_replacement_joins() {
    let ns = TestNamespace::create("evict").await;
    training(&ns, "evict").await;
    let gang = uids(&ns, "evict").await;
    let evicted_at = Timestamp::now();
    let pods: Api<Pod> = ns.pods();
    pods.evict("evict-0-1", &EvictParams::default())
        .await
        .expect("the Eviction API evicts rank 1's pod (no budget forbids it)");
    trains_on_alone_then_whole_again(&ns, "evict", &gang, evicted_at, "rank 1's pod evicted").await;
    let counted = wait_status(&ns.jobs(), "evict", "the rounds counted", WAIT, |s| {
        s.phase == Phase::Running && s.round == 2
    })
    .await;
    // A disruption: the restart budget is not spent on it.
    assert_eq!((counted.attempt, counted.restarts), (0, 0), "{counted:?}");
}

/// Rank 1's pod is evicted by its own kubelet, not through the API: a container over its
/// `ephemeral-storage` limit (200 MiB written into its /tmp, an emptyDir, against a 100Mi
/// limit). The kubelet kills it with a second of grace and leaves it Failed (reason Evicted),
/// undeleted. It is replaced alone as a deleted pod is: the other trains on from the gang's
/// last step, the gang is whole again, nothing is trained twice, no restart is spent, and the
/// status says why in the kubelet's words.
#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_pod_its_kubelet_evicts_is_replaced_alone_and_told_in_the_kubelets_words() {
    let ns = TestNamespace::create("kevict").await;
    let mut spec = copy_job(2, 1_000_000, Some("kevict-checkpoints"));
    spec["resources"]["limits"]["ephemeral-storage"] = json!("100Mi");
    training_with(&ns, "kevict", spec).await;
    let gang = uids(&ns, "kevict").await;
    exec(
        &ns.pods(),
        "kevict-0-1",
        "head -c 200M /dev/zero > /tmp/fill && echo written",
    )
    .await;
    // The kubelet sums an emptyDir's usage once a minute (volumeStatsAggPeriod), then evicts
    // at its next check: up to about two minutes.
    let whole = wait_status(
        &ns.jobs(),
        "kevict",
        "evicted, replaced, whole again",
        WAIT,
        |s| s.phase == Phase::Running && s.round >= 2,
    )
    .await;
    assert_eq!((whole.attempt, whole.restarts), (0, 0), "{whole:?}");
    assert_eq!(whole.restarts_by_cause.get(reason::DISRUPTED), Some(&1));
    let f = blamed(&whole, reason::DISRUPTED, 1);
    assert!(
        f.message
            .contains("Evicted: Pod ephemeral local storage usage exceeds"),
        "the kubelet's words: {}",
        f.message
    );
    let ledger = whole.recovery.clone().expect("the ledger");
    let round = |r: u64| {
        ledger
            .attempts
            .iter()
            .find(|a| a.attempt == 0 && a.round.unwrap_or(0) == r)
            .cloned()
            .unwrap_or_else(|| panic!("round {r} in {ledger:?}"))
    };
    let (evicted, alone) = (round(0), round(1));
    let end = evicted.end.clone().expect("round 0 ended");
    assert_eq!(end.cause, EndCause::Disruption, "{end:?}");
    assert_eq!(alone.healed_from, Some(HealedFrom::Peers), "{alone:?}");
    assert!(evicted.lost_steps.unwrap_or(0) <= 1, "{evicted:?}");
    let took = end
        .failed_at
        .duration_until(alone.first_step_at.expect("round 1 stepped"))
        .as_secs_f64();
    println!("the kubelet's eviction -> round 1 steps at world size 1 {took:.2} s later");
    assert!(
        took < STEPS_AGAIN_WITHIN,
        "stepping again {took:.2} s after the eviction"
    );
    replaced_alone(&gang, &uids(&ns, "kevict").await, "kevict", 1);
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn node_0s_deleted_pod_is_replaced_alone_and_heals_from_the_other() {
    let ns = TestNamespace::create("replace0").await;
    training(&ns, "replace0").await;
    let gang = uids(&ns, "replace0").await;
    let deleted = Timestamp::now();
    ns.pods()
        .delete("replace0-0-0", &Default::default())
        .await
        .unwrap();
    // Node 0 hosts the gang's store: its replacement starts round 1 with node 1, whose rank
    // holds the state of the step the gang last completed.
    let next = round_started(&ns, "replace0-0-0", 1).await;
    let took = next.seconds_after(deleted);
    println!("node 0's pod deleted -> its replacement's first step in round 1: {took:.1} s");
    nothing_lost(&ns, "replace0", 0, &next, "node 0's pod deleted").await;
    let now = uids(&ns, "replace0").await;
    replaced_alone(&gang, &now, "replace0", 0);
    let counted = wait_status(&ns.jobs(), "replace0", "running again", WAIT, |s| {
        s.phase == Phase::Running && s.round == 1
    })
    .await;
    // A disruption, node 0's too: the restart budget is not spent on it.
    assert_eq!((counted.attempt, counted.restarts), (0, 0), "{counted:?}");
    blamed(&counted, reason::POD_LEAVING, 0);
    // The old pod goes first (its launcher stops at once on SIGTERM), then the new one
    // starts and heals: a pod start, not a stop grace.
    assert!(
        took < 15.0,
        "node 0's replacement stepped {took:.1} s after the delete"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_pod_whose_launcher_was_killed_leaves_the_other_training_on() {
    let ns = TestNamespace::create("agentkill").await;
    training(&ns, "agentkill").await;
    let gang = uids(&ns, "agentkill").await;
    // The pod's own process, the launcher (not a trainer: that one restarts in place), is
    // killed as the OOM killer would: the pod fails with 137. Its will in node 0's store
    // says so at once (no stop grace waited for).
    let killed_at = Timestamp::now();
    kill_launcher_from_host(&gang["agentkill-0-1"]);
    trains_on_alone_then_whole_again(
        &ns,
        "agentkill",
        &gang,
        killed_at,
        "rank 1's launcher killed",
    )
    .await;
    let counted = wait_status(&ns.jobs(), "agentkill", "the rounds counted", WAIT, |s| {
        s.phase == Phase::Running && s.round == 2
    })
    .await;
    assert_eq!(counted.attempt, 0, "{counted:?}");
    // Blamed: the pod whose launcher left a will, not the peer whose ring broke first.
    let ledger = counted.recovery.clone().expect("the ledger");
    let first = ledger
        .attempts
        .iter()
        .find(|a| a.round.unwrap_or(0) == 0)
        .expect("round 0");
    let end = first.end.clone().expect("round 0 ended");
    assert_eq!(end.reason, reason::AGENT_LOST, "{end:?}");
}
