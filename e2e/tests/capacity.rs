//! An elastic job and the cluster's free capacity, on a real cluster: a 2-pod job with
//! `elastic.minReplicas: 1`, whose pods are sized so that one fits on a node, starts on the
//! node that is free while another workload holds the second, grows to 2 pods when that
//! workload finishes, shrinks back to 1 when a higher-priority pod preempts its second pod,
//! and grows again when the preemptor is gone: every resize a new round healed from peers, the
//! same attempt, no checkpoint read, no step trained twice. Two more shapes: a job asked at 1
//! pod of 2 ranks grows to 2 pods of 2 ranks into an idle node (elastic.maxReplicas) and back;
//! a 4-pod job with two pods per node, on the default elastic wait, loses both pods of a node
//! to one higher-priority pod and shrinks to 2 from peers, then grows back.
//!
//! Each cycle (preempted, then grown back) is timed: from the preemption to the pod's leaving,
//! and from capacity freeing up to the first step on it. FERROTRAIN_E2E_CYCLES (default 1)
//! runs more of them; bench/elastic-capacity.sh runs 10 and prints p50 / max.

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::recovery::{HealedFrom, Timestamp};
use ferrotrain_e2e::{
    TestNamespace, WAIT, copy_job, trainer_image, wait_for, wait_rank0, wait_status,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;

const JOB: &str = "grow";
/// Rank 0's pod and rank 1's.
const POD_0: &str = "grow-0-0";
const POD_1: &str = "grow-0-1";
/// The priority class of the preemptor (cluster-wide, made once and kept: the same for every
/// run, so nothing is left per run).
const HIGH: &str = "ferrotrain-e2e-preemptor";

/// A CPU quantity in millicores ("100m", "2", "1.5").
fn millis(q: &str) -> i64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(0),
        None => (q.parse::<f64>().unwrap_or(0.0) * 1000.0) as i64,
    }
}

/// Each node's allocatable CPU less what its pods request, in millicores, once no other
/// test's pod holds any (these tests run alone, but the pods of the one before may still be
/// terminating with its namespace).
async fn free_cpu(ns: &TestNamespace) -> BTreeMap<String, i64> {
    wait_for("other tests' pods gone", WAIT, || async {
        let pods = Api::<Pod>::all(ns.client.clone())
            .list(&ListParams::default())
            .await
            .expect("listing pods");
        let others: Vec<String> = pods
            .into_iter()
            .filter(|p| {
                let theirs = p.metadata.namespace.as_deref().unwrap_or_default();
                theirs.starts_with("ft-e2e-") && theirs != ns.name
            })
            .filter_map(|p| p.metadata.name)
            .collect();
        (others.is_empty().then_some(()), format!("{others:?}"))
    })
    .await;
    node_cpu(&ns.client).await
}

/// Each node's allocatable CPU less what its pods request, in millicores.
async fn node_cpu(client: &Client) -> BTreeMap<String, i64> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("listing nodes");
    let mut free: BTreeMap<String, i64> = nodes
        .items
        .iter()
        .map(|n| {
            let cpu = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref()?.get("cpu").cloned());
            (
                n.metadata.name.clone().unwrap_or_default(),
                cpu.map_or(0, |q| millis(&q.0)),
            )
        })
        .collect();
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("listing pods");
    for pod in pods {
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let Some(spec) = pod.spec else { continue };
        let Some(node) = spec.node_name else { continue };
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let requested: i64 = spec
            .containers
            .iter()
            .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu").cloned())
            .map(|q| millis(&q.0))
            .sum();
        *free.entry(node).or_default() -= requested;
    }
    free
}

/// A pod on `node` requesting `cpu` millicores, at `priority` (a class name) if given, that
/// runs until /tmp/done exists (`finish`) and then exits 0.
fn holder(name: &str, node: &str, cpu: i64, priority: Option<&str>) -> Pod {
    let image = trainer_image().unwrap_or_else(|| "ferrotrain/trainer:dev".into());
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "priorityClassName": priority,
            "containers": [{
                "name": "hold", "image": image, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "while [ ! -e /tmp/done ]; do sleep 0.1; done"],
                "resources": {"requests": {"cpu": format!("{cpu}m"), "memory": "16Mi"}}
            }]
        }
    }))
    .unwrap()
}

/// Rank 0's round, its first step's time and the round's source of state, once rank 0 steps
/// at world size `world` in a round after `after`.
async fn stepping_at(
    ns: &TestNamespace,
    world: u32,
    after: Option<u64>,
) -> (u64, Timestamp, Option<HealedFrom>) {
    let what = format!("rank 0 stepping at world size {world}");
    wait_rank0(ns, POD_0, &what, |p| {
        p.attempt_first_step_time
            .filter(|_| p.world_size == world && after.is_none_or(|a| p.round > a))
            .map(|t| (p.round, t, p.healed_from))
    })
    .await
}

/// The job's status once its ledger's last record is round `round` and `also` holds; prints
/// every record (world size, where its state came from, what ended it, steps trained twice).
async fn ledger_at(
    ns: &TestNamespace,
    round: u64,
    also: impl Fn(&ferrotrain_api::crd::DistributedTrainingStatus) -> bool,
) -> ferrotrain_api::crd::DistributedTrainingStatus {
    let last_round = |s: &ferrotrain_api::crd::DistributedTrainingStatus| {
        s.recovery.as_ref()?.attempts.last()?.round
    };
    let done = wait_status(&ns.jobs(), JOB, "the ledger at that round", WAIT, |s| {
        last_round(s) == Some(round) && also(s)
    })
    .await;
    for a in done.recovery.iter().flat_map(|r| &r.attempts) {
        eprintln!(
            "  round {:?}: world {:?}, resumed {:?} from {:?}, ended by {:?}, steps trained twice {:?}",
            a.round,
            a.world_size,
            a.resumed_from_step,
            a.healed_from,
            a.end.as_ref().map(|e| e.reason.as_str()),
            a.lost_steps
        );
    }
    done
}

/// The time `pod` ended (its container's finishedAt), once it did.
async fn finished_at(pods: &Api<Pod>, pod: &str) -> Timestamp {
    wait_for(&format!("{pod} finished"), WAIT, || async {
        let p = pods.get(pod).await.expect("the holder pod");
        let done = p
            .status
            .as_ref()
            .and_then(|s| {
                s.container_statuses
                    .as_ref()?
                    .first()?
                    .state
                    .as_ref()?
                    .terminated
                    .as_ref()
            })
            .and_then(|t| t.finished_at.as_ref().map(|f| f.0));
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        (done, phase)
    })
    .await
}

/// Ends holder pod `name` as a finished job would (exit 0), once it runs (a preemptor is
/// bound only after its victims are gone): its node's CPU is free again.
async fn finish(pods: &Api<Pod>, name: &str) -> Timestamp {
    wait_for(&format!("{name} running"), WAIT, || async {
        let phase = pods
            .get(name)
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .unwrap_or_default();
        ((phase == "Running").then_some(()), phase)
    })
    .await;
    ferrotrain_e2e::exec_in(pods, name, "hold", "touch /tmp/done").await;
    finished_at(pods, name).await
}

/// Holder pod `holder` finishes and the job grows into its room: rank 0's round at world
/// size `world` after round `after`, and the seconds from the holder's end to that round's
/// first step (`what` names the event). The round must heal from peers: no checkpoint read.
async fn grows_when_it_ends(
    ns: &TestNamespace,
    holder: &str,
    world: u32,
    after: u64,
    what: &str,
) -> (u64, f64, Option<f64>) {
    let freed = finish(&ns.pods(), holder).await;
    let (round, grown, healed) = stepping_at(ns, world, Some(after)).await;
    let took = seconds(freed, grown);
    eprintln!("{what} -> round {round} steps at world size {world} {took:.1} s later");
    let ours = growth_breakdown(&ns.pods(), freed, round, grown).await;
    assert_eq!(
        healed,
        Some(HealedFrom::Peers),
        "grown from peers, no checkpoint read"
    );
    (round, took, ours)
}

/// Where a growth's time went, from the launchers' own log lines: the holder's end
/// (`freed`, whole seconds) to the new pod's launcher up (scheduling, container start: the
/// cluster's), its spares ready, node 0 ending the round before `round`, and `round`'s first
/// step at `grown`. Returns ours: the new launcher up to that first step.
async fn growth_breakdown(
    pods: &Api<Pod>,
    freed: Timestamp,
    round: u64,
    grown: Timestamp,
) -> Option<f64> {
    let up = logged_at(pods, POD_1, "agent: node 1 of").await?;
    let ready = logged_at(pods, POD_1, "its spare ranks").await;
    let ended = format!("round {} ends so that the gang grows", round - 1);
    let ended = logged_at(pods, POD_0, &ended).await;
    let since = |from: Option<Timestamp>, to: Option<Timestamp>| {
        from.zip(to)
            .map_or("-".to_string(), |(f, t)| format!("{:.2} s", seconds(f, t)))
    };
    eprintln!(
        "  growth: holder's end -> new launcher up {}; -> its spares ready {}; -> node 0 ends \
         round {} {}; -> first step {}",
        since(Some(freed), Some(up)),
        since(Some(up), ready),
        round - 1,
        since(ready.or(Some(up)), ended),
        since(ended, Some(grown)),
    );
    Some(seconds(up, grown))
}

/// The time of the first line of `pod`'s log that contains `needle` (the launcher's own
/// timestamp, which starts each of its lines).
async fn logged_at(pods: &Api<Pod>, pod: &str, needle: &str) -> Option<Timestamp> {
    let log = pods.logs(pod, &LogParams::default()).await.ok()?;
    let line = log.lines().find(|l| l.contains(needle))?;
    line.split_whitespace().next()?.parse().ok()
}

/// The phase of rank `pod`'s current pod and its UID.
async fn pod_state(pods: &Api<Pod>, pod: &str) -> Option<(String, String)> {
    let p = pods.get_opt(pod).await.ok()??;
    let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
    Some((phase, p.metadata.uid.unwrap_or_default()))
}

fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

async fn ensure_priority_class(client: &Client) {
    let classes: Api<PriorityClass> = Api::all(client.clone());
    if classes
        .get_opt(HIGH)
        .await
        .expect("reading priority classes")
        .is_some()
    {
        return;
    }
    let class: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": HIGH},
        "value": 1_000_000,
        "description": "ferrotrain's e2e tests: a pod that preempts a training job's pod"
    }))
    .unwrap();
    let _ = classes.create(&PostParams::default(), &class).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn an_elastic_job_starts_on_what_fits_grows_into_freed_capacity_and_gives_back_a_preempted_pod()
 {
    let ns = TestNamespace::create("capacity").await;
    let pods = ns.pods();
    ensure_priority_class(&ns.client).await;
    let free = free_cpu(&ns).await;
    assert!(free.len() >= 2, "two nodes needed: {free:?}");
    let least = *free.values().min().unwrap();
    // One job pod fits on a free node, never two.
    let pod_cpu = least / 2 + 100;
    let (node_b, free_b) = free.iter().last().map(|(n, f)| (n.clone(), *f)).unwrap();
    eprintln!("free CPU {free:?}: job pods request {pod_cpu}m; node {node_b} held");

    // Another workload holds node B: a job pod does not fit beside it.
    let blocker = holder("blocker", &node_b, free_b - pod_cpu + 100, None);
    pods.create(&PostParams::default(), &blocker)
        .await
        .expect("the blocker");

    let mut spec = copy_job(2, 1_000_000, None);
    spec["elastic"] = json!({"minReplicas": 1, "waitSeconds": 5});
    spec["resources"]["requests"]["cpu"] = json!(format!("{pod_cpu}m"));
    spec["restartPolicy"]["maxRestarts"] = json!(0);
    let created = Timestamp::now();
    ns.create_job(JOB, spec).await;

    // Starts on what fits.
    let (round, first, _) = stepping_at(&ns, 1, None).await;
    eprintln!(
        "created -> round {round} steps at world size 1 {:.1} s later",
        seconds(created, first)
    );
    let (phase, _) = pod_state(&pods, POD_1).await.expect("rank 1's pod");
    assert_eq!(phase, "Pending", "rank 1's pod waits for capacity");
    let running = wait_status(&ns.jobs(), JOB, "Running on 1 of 2 pods", WAIT, |s| {
        s.phase == Phase::Running && s.current_world_size == Some(1)
    })
    .await;
    let message = running
        .condition(condition::RUNNING)
        .map(|c| c.message.clone());
    assert_eq!(
        message.as_deref(),
        Some("1 of 2 pods of attempt 0 run; the gang trains without the others (see Resized)")
    );

    // The other workload finishes: the job grows into its node.
    let (mut round, took, ours) =
        grows_when_it_ends(&ns, "blocker", 2, round, "blocker finished").await;
    let (mut to_grow, mut ours_to_grow) = (vec![took], vec![ours.unwrap_or(f64::NAN)]);

    let cycles: usize = std::env::var("FERROTRAIN_E2E_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let (mut to_leave, mut to_shrink) = (Vec::new(), Vec::new());
    for cycle in 0..cycles {
        // A higher-priority pod needs node B: the scheduler preempts rank 1's pod.
        let preemptor_name = format!("preemptor-{cycle}");
        let free_b = free_cpu(&ns).await[&node_b];
        let preemptor = holder(&preemptor_name, &node_b, free_b + 200, Some(HIGH));
        let (_, victim) = pod_state(&pods, POD_1).await.expect("rank 1's pod");
        pods.create(&PostParams::default(), &preemptor)
            .await
            .expect("the preemptor");
        let (preempted, left) = preemption(&pods, &victim).await;
        to_leave.push(seconds(preempted, left));
        let (r, shrunk, healed) = stepping_at(&ns, 1, Some(round)).await;
        to_shrink.push(seconds(preempted, shrunk));
        eprintln!(
            "cycle {cycle}: rank 1's pod preempted -> gone {:.1} s later, round {r} steps at world size 1 {:.1} s after the preemption",
            to_leave[cycle], to_shrink[cycle]
        );
        assert_eq!(
            healed,
            Some(HealedFrom::Peers),
            "shrunk without a checkpoint read"
        );
        // The preemptor finishes: rank 1's replacement gets its place back.
        let what = format!("cycle {cycle}: preemptor finished");
        let (r, took, ours) = grows_when_it_ends(&ns, &preemptor_name, 2, r, &what).await;
        round = r;
        to_grow.push(took);
        ours_to_grow.push(ours.unwrap_or(f64::NAN));
        pods.delete(&preemptor_name, &DeleteParams::default())
            .await
            .expect("the preemptor");
    }

    let done = ledger_at(&ns, round, |_| true).await;
    let recovery = done.recovery.clone().expect("the ledger");
    eprintln!(
        "seconds by world size: {:?}",
        recovery.seconds_by_world_size
    );
    eprintln!("capacity freed -> first step on it (s): {to_grow:.1?}");
    eprintln!("new launcher up -> first step on it (s): {ours_to_grow:.2?}");
    eprintln!("preempted -> pod gone (s): {to_leave:.1?}");
    eprintln!("preempted -> first step at the smaller size (s): {to_shrink:.1?}");
    assert_eq!(
        (done.attempt, done.restarts),
        (0, 0),
        "no gang restart, no restart spent: {done:?}"
    );
    assert_eq!(recovery.lost_steps, 0, "no step trained twice");
    assert!(
        recovery.seconds_by_world_size.contains_key("1")
            && recovery.seconds_by_world_size.contains_key("2")
    );
}

/// Rank 1's pod `victim` (its UID) preempted: when the test saw it marked for deletion (the
/// scheduler's preemption; polled every 100 ms, the API's own times are whole seconds) and
/// when it saw the pod end (its launcher exited after handing over) or go.
async fn preemption(pods: &Api<Pod>, victim: &str) -> (Timestamp, Timestamp) {
    let started = std::time::Instant::now();
    let mut marked = None;
    loop {
        assert!(
            started.elapsed() < WAIT,
            "rank 1's pod was not preempted within {WAIT:?}"
        );
        let pod = pods.get_opt(POD_1).await.ok().flatten();
        let now = Timestamp::now();
        let Some(p) = pod.filter(|p| p.metadata.uid.as_deref() == Some(victim)) else {
            return (marked.unwrap_or(now), now);
        };
        if p.metadata.deletion_timestamp.is_some() {
            marked.get_or_insert(now);
        }
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        if let Some(at) = marked
            && (phase == "Succeeded" || phase == "Failed")
        {
            return (at, now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_job_grows_beyond_replicas_into_an_idle_node_and_gives_it_back() {
    let ns = TestNamespace::create("beyond").await;
    let pods = ns.pods();
    let free = free_cpu(&ns).await;
    assert!(free.len() >= 2, "two nodes needed: {free:?}");
    let pod_cpu = *free.values().min().unwrap() / 2 + 100;
    let (node_b, free_b) = free.iter().last().map(|(n, f)| (n.clone(), *f)).unwrap();
    let blocker = holder("blocker", &node_b, free_b - pod_cpu + 100, None);
    pods.create(&PostParams::default(), &blocker)
        .await
        .expect("the blocker");

    // Asked for 1 pod of 2 ranks, up to 2 pods (4 ranks) when there is room.
    let mut spec = copy_job(1, 1_000_000, None);
    spec["procsPerReplica"] = json!(2);
    spec["elastic"] = json!({"minReplicas": 1, "maxReplicas": 2, "waitSeconds": 5});
    spec["resources"]["requests"]["cpu"] = json!(format!("{pod_cpu}m"));
    spec["restartPolicy"]["maxRestarts"] = json!(0);
    ns.create_job(JOB, spec).await;
    let (round, _, _) = stepping_at(&ns, 2, None).await;
    let asked = wait_status(&ns.jobs(), JOB, "Running as asked", WAIT, |s| {
        s.phase == Phase::Running
    })
    .await;
    assert_eq!(
        asked.current_world_size, None,
        "the size asked for: {asked:?}"
    );

    let what = "idle node freed (1 pod of 2 ranks asked for)";
    let (round, _, _) = grows_when_it_ends(&ns, "blocker", 4, round, what).await;
    let status = wait_status(&ns.jobs(), JOB, "Resized Grown", WAIT, |s| {
        s.current_world_size == Some(4)
    })
    .await;
    let resized = status.condition(condition::RESIZED).expect("Resized");
    assert_eq!(
        (resized.status.as_str(), resized.reason.as_str()),
        ("True", "Grown")
    );

    // Rank 1's pod is deleted (as a drain would): back to the size asked for, from peers.
    pods.delete(POD_1, &DeleteParams::default())
        .await
        .expect("deleting rank 1's pod");
    let (round, _, healed) = stepping_at(&ns, 2, Some(round)).await;
    assert_eq!(healed, Some(HealedFrom::Peers));
    let back = wait_status(&ns.jobs(), JOB, "Resized WholeGang", WAIT, |s| {
        s.current_world_size.is_none()
    })
    .await;
    let recovery = back.recovery.clone().expect("the ledger");
    eprintln!(
        "round {round}: back at world size 2 (1 pod); seconds by world size {:?}",
        recovery.seconds_by_world_size
    );
    assert_eq!((back.attempt, back.restarts), (0, 0), "{back:?}");
    assert_eq!(recovery.lost_steps, 0, "no step trained twice");
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_higher_priority_pod_preempts_two_pods_and_the_gang_shrinks_from_peers() {
    let ns = TestNamespace::create("preempt").await;
    let pods = ns.pods();
    ensure_priority_class(&ns.client).await;
    let free = free_cpu(&ns).await;
    assert!(free.len() >= 2, "two nodes needed: {free:?}");
    // Two job pods fit on a node, never three.
    let pod_cpu = *free.values().min().unwrap() / 2 - 50;
    // Every pod fits at the start: the elastic wait (the default's) is not spent.
    let mut spec = copy_job(4, 1_000_000, None);
    spec["elastic"] = json!({"minReplicas": 1});
    spec["resources"]["requests"]["cpu"] = json!(format!("{pod_cpu}m"));
    spec["restartPolicy"]["maxRestarts"] = json!(0);
    ns.create_job(JOB, spec).await;
    let (round, _, _) = stepping_at(&ns, 4, None).await;

    // The node without rank 0's pod (a scheduler would pick it by the pods' priorities; here
    // the preemptor is pinned to it) gets a pod that needs both job pods' CPU.
    let node_of = |p: Pod| p.spec.and_then(|s| s.node_name).unwrap_or_default();
    let node_0 = node_of(pods.get(POD_0).await.expect("rank 0's pod"));
    let node_b = free.keys().find(|n| **n != node_0).cloned().unwrap();
    let victims: Vec<String> = ferrotrain_e2e::pods_of(&pods, JOB)
        .await
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_b.as_str()))
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(victims.len(), 2, "two job pods on {node_b}: {victims:?}");
    let free_b = free_cpu(&ns).await[&node_b];
    let preemptor = holder("preemptor", &node_b, free_b + 2 * pod_cpu - 100, Some(HIGH));
    let preempted = Timestamp::now();
    pods.create(&PostParams::default(), &preemptor)
        .await
        .expect("the preemptor");
    let (shrunk_round, shrunk, healed) = stepping_at(&ns, 2, Some(round)).await;
    eprintln!(
        "preemptor created -> {victims:?} preempted, round {shrunk_round} steps at world size 2 {:.1} s later",
        seconds(preempted, shrunk)
    );
    assert_eq!(healed, Some(HealedFrom::Peers), "no checkpoint read");

    let what = "preemptor finished";
    let (round, _, _) = grows_when_it_ends(&ns, "preemptor", 4, shrunk_round, what).await;
    let done = ledger_at(&ns, round, |s| s.current_world_size.is_none()).await;
    let recovery = done.recovery.clone().expect("the ledger");
    assert_eq!((done.attempt, done.restarts), (0, 0), "{done:?}");
    assert_eq!(recovery.lost_steps, 0, "no step trained twice");
}
