//! Recovery in the shapes GPU users run, at the example's defaults (examples/copy-dt.yaml as
//! shipped, only `replicas` and `procsPerReplica` changed): one pod of two ranks (one node of
//! GPUs) and two pods of two ranks. Every failure that leaves a rank alive restarts the ranks
//! in place, in the same pods, from the step the gang last completed (the survivors hand it
//! over), and blames the rank that failed; a one-pod job whose pod goes away has no survivor
//! and starts again from the checkpoint its rank 0 saved on the way out.

use std::collections::BTreeMap;

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{HealedFrom, Timestamp};
use ferrotrain_e2e::rounds::{RoundStart, ended_round, lost_before, round_started};
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, kill_launcher_from_host, pods_of, signal_local_rank,
    wait_first_checkpoint, wait_spare, wait_status,
};
use serde_json::json;

/// The goal for the next step after a failure that leaves a rank alive is 2 s at the
/// median (bench/restart-speed.sh measures it); a test beside another on two cores gets slack.
const STEPS_AGAIN_WITHIN: f64 = 3.0;

/// A running job of `replicas` pods of `procs` ranks, past its first checkpoint.
async fn training(ns: &TestNamespace, job: &str, replicas: i32, procs: i32) {
    let claim = format!("{job}-checkpoints");
    ns.create_checkpoint_claim(&claim).await;
    let mut spec = copy_job(replicas, 1_000_000, Some(&claim));
    spec["procsPerReplica"] = json!(procs);
    ns.create_job(job, spec).await;
    wait_first_checkpoint(ns, job).await;
}

async fn uids(ns: &TestNamespace, job: &str) -> BTreeMap<String, String> {
    pods_of(&ns.pods(), job)
        .await
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect()
}

/// What one failure cost: the time from it to the next round's first step and the steps
/// trained twice; prints both under `what`.
struct Cost {
    next: RoundStart,
    seconds: f64,
    lost: u64,
}

async fn cost(ns: &TestNamespace, job: &str, round: u64, at: Timestamp, what: &str) -> Cost {
    let next = round_started(ns, &format!("{job}-0-0"), round + 1).await;
    let seconds = next.seconds_after(at);
    let lost = lost_before(ns, job, round, &next).await;
    println!(
        "{job}: {what} -> round {} steps at world size {} {seconds:.2} s later, from {:?} at \
         step {:?}; {lost} step(s) trained twice",
        next.round, next.world_size, next.healed_from, next.resumed_from
    );
    Cost {
        next,
        seconds,
        lost,
    }
}

/// Kills (`signal` KILL or STOP) local rank `local` of pod `node` in round `round`, once its
/// agent has a spare waiting; checks the gang steps again in place within
/// [`STEPS_AGAIN_WITHIN`] (plus `detect` for a failure seen only after a while) from its
/// peers, and that the status blames global rank `node * procs + local` with `why`.
async fn fail_in_place(
    ns: &TestNamespace,
    job: &str,
    (node, local, procs): (i32, usize, i32),
    signal: &str,
    round: u64,
    why: &str,
    detect: f64,
) -> DistributedTrainingStatus {
    let pod = format!("{job}-0-{node}");
    let gang = uids(ns, job).await;
    wait_spare(&ns.pods(), &pod).await;
    let at = Timestamp::now();
    signal_local_rank(&ns.pods(), &pod, Some(local), signal).await;
    let rank = node * procs + local as i32;
    let c = cost(
        ns,
        job,
        round,
        at,
        &format!("{signal} of rank {rank}'s trainer"),
    )
    .await;
    assert_eq!(
        c.next.healed_from,
        Some(HealedFrom::Peers),
        "from the survivors"
    );
    assert!(c.lost <= 1, "{} steps trained twice", c.lost);
    assert!(
        c.seconds < STEPS_AGAIN_WITHIN + detect,
        "the next step {:.2} s after it (goal < {} s)",
        c.seconds,
        STEPS_AGAIN_WITHIN + detect
    );
    let counted = wait_status(&ns.jobs(), job, "the round counted", WAIT, |s| {
        s.round as u64 > round && s.last_failure.as_ref().is_some_and(|f| f.reason == why)
    })
    .await;
    let f = counted.last_failure.clone().expect("checked");
    assert_eq!(
        (f.rank, f.node_rank, f.pod.as_deref()),
        (Some(rank), Some(node), Some(pod.as_str())),
        "the rank that failed is blamed, on its pod: {f:?}"
    );
    assert_eq!(counted.attempt, 0, "the same attempt");
    assert_eq!(uids(ns, job).await, gang, "the same pods");
    counted
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn one_pod_of_two_ranks_restarts_in_place_from_its_peer_and_from_the_checkpoint_when_the_pod_goes()
 {
    let ns = TestNamespace::create("onepod").await;
    let job = "onepod";
    training(&ns, job, 1, 2).await;
    // Local rank 1 killed, then local rank 0 (rank 0 itself: rank 1 holds the state), then
    // local rank 1 stopped (its launcher sees it frozen within 1 s).
    fail_in_place(&ns, job, (0, 1, 2), "KILL", 0, reason::KILLED, 0.0).await;
    fail_in_place(&ns, job, (0, 0, 2), "KILL", 1, reason::KILLED, 0.0).await;
    let s = fail_in_place(&ns, job, (0, 1, 2), "STOP", 2, reason::FROZEN, 1.0).await;
    assert_eq!(s.restarts, 3, "three restarts in place: {s:?}");

    // The pod goes away: nobody survives to hand over a state. Its rank 0 saves a checkpoint
    // on SIGTERM, and the replacement starts from it.
    let before = uids(&ns, job).await;
    let at = Timestamp::now();
    ns.pods()
        .delete(&format!("{job}-0-0"), &Default::default())
        .await
        .unwrap();
    let next = round_started(&ns, &format!("{job}-0-0"), 4).await;
    let took = next.seconds_after(at);
    let (record, _) = ended_round(&ns, job, 3).await;
    println!(
        "{job}: its pod deleted -> round {} steps {took:.1} s later, from {:?} at step {:?}; \
         round 3 reached step {:?}, {:?} step(s) trained twice",
        next.round, next.healed_from, next.resumed_from, record.last_step, record.lost_steps
    );
    assert_eq!(
        next.healed_from,
        Some(HealedFrom::Checkpoint),
        "no survivor"
    );
    assert_ne!(uids(&ns, job).await, before, "a new pod");
    assert!(
        record.lost_steps.unwrap_or(0) <= 1,
        "the SIGTERM checkpoint keeps the steps: {record:?}"
    );
    let counted = wait_status(&ns.jobs(), job, "running again", WAIT, |s| {
        s.phase == Phase::Running && s.round == 4
    })
    .await;
    assert_eq!(
        (counted.attempt, counted.restarts),
        (0, 3),
        "a disruption spends no restart: {counted:?}"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn two_pods_of_two_ranks_restart_in_place_whichever_rank_fails() {
    let ns = TestNamespace::create("twobytwo").await;
    let job = "twobytwo";
    training(&ns, job, 2, 2).await;
    // Pod 1's second rank, pod 1's first rank (local rank 0 on node 1), pod 0's second rank
    // killed.
    fail_in_place(&ns, job, (1, 1, 2), "KILL", 0, reason::KILLED, 0.0).await;
    fail_in_place(&ns, job, (1, 0, 2), "KILL", 1, reason::KILLED, 0.0).await;
    fail_in_place(&ns, job, (0, 1, 2), "KILL", 2, reason::KILLED, 0.0).await;
    // Pod 1's second rank stopped: its launcher sees it frozen within 1 s.
    fail_in_place(&ns, job, (1, 1, 2), "STOP", 3, reason::FROZEN, 1.0).await;

    // Pod 1's launcher killed (the OOM killer): the pod fails and is replaced alone; the
    // example is elastic, so pod 0's two ranks train on at once, then the gang grows back.
    let gang = uids(&ns, job).await;
    let at = Timestamp::now();
    kill_launcher_from_host(&gang[&format!("{job}-0-1")]);
    let alone = cost(&ns, job, 4, at, "pod 1's launcher killed").await;
    assert_eq!(alone.next.world_size, 2, "pod 0's two ranks train on");
    assert!(alone.lost <= 1 && alone.seconds < STEPS_AGAIN_WITHIN);
    let whole = round_started(&ns, &format!("{job}-0-0"), alone.next.round + 1).await;
    let lost = lost_before(&ns, job, alone.next.round, &whole).await;
    println!(
        "{job}: whole again (world size {}) {:.1} s after the kill, {lost} step(s) trained twice",
        whole.world_size,
        whole.seconds_after(at)
    );
    assert_eq!(whole.world_size, 4);
    let now = uids(&ns, job).await;
    assert_eq!(now[&format!("{job}-0-0")], gang[&format!("{job}-0-0")]);
    assert_ne!(now[&format!("{job}-0-1")], gang[&format!("{job}-0-1")]);
}
