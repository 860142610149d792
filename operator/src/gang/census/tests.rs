//! The census of an attempt's ranks: running, succeeded, gone, on a lost node, waiting to
//! start (and past the start-up timeout), and where each was placed.

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase, condition};

use crate::fixtures::{
    NO_FIT, PULL, cond, deleting, exited, node_lost, pending, restarting_status, running,
    running_status, starting_status, status, stuck,
};
use crate::gang::tests::{Row, del, ran_with_both_pods_seen, run};
use crate::gang::*;

/// Rows of the table of every decision ([`crate::gang::tests`]).
pub(in crate::gang) fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "all pods pending",
            status: status(Phase::Pending, 0, 0, vec![]),
            pods: vec![pending(0, 0), pending(0, 1)],
            phase: Phase::Starting,
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "all pods running",
            status: status(
                Phase::Starting,
                0,
                0,
                vec![cond(condition::CREATED, true, 0)],
            ),
            pods: vec![running(0, 0), running(0, 1)],
            phase: Phase::Running,
            events: vec!["Running"],
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "steady running is quiet",
            status: running_status(0, 0),
            pods: vec![running(0, 0), running(0, 1)],
            phase: Phase::Running,
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "one rank done, other still running",
            status: running_status(0, 0),
            pods: vec![exited(0, 0, 0, "", 90), running(0, 1)],
            phase: Phase::Running,
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "pod deleted",
            status: running_status(0, 0),
            pods: vec![running(0, 0)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "pod being evicted",
            status: running_status(0, 0),
            pods: vec![running(0, 0), deleting(running(0, 1), 95)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "node NotReady within grace: wait",
            status: running_status(0, 0),
            pods: vec![running(0, 0), node_lost(running(0, 1), 80)],
            phase: Phase::Running,
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "node lost past grace: restart",
            status: running_status(0, 0),
            pods: vec![running(0, 0), node_lost(running(0, 1), 30)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "unschedulable pod: Starting, shown once",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "Unschedulable", NO_FIT)],
            phase: Phase::Starting,
            events: vec!["Unschedulable"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "unschedulable past the startup timeout: gang restart",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "Unschedulable", NO_FIT)],
            now: 700,
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "image pull back-off within the startup timeout: Starting, shown once",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "ImagePullBackOff", PULL)],
            phase: Phase::Starting,
            events: vec!["ImagePullBackOff"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "image pull error past the startup timeout: Failed, no restart",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "ErrImagePull", "not found")],
            now: 600,
            phase: Phase::Failed,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "invalid image name: Failed at once",
            status: starting_status(0, 0),
            pods: vec![
                stuck(0, 0, "InvalidImageName", "couldn't parse image name"),
                pending(0, 1),
            ],
            now: 5,
            phase: Phase::Failed,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "missing ConfigMap key past the startup timeout: Failed",
            status: starting_status(0, 0),
            pods: vec![
                running(0, 0),
                stuck(
                    0,
                    1,
                    "CreateContainerConfigError",
                    "configmap \"x\" not found",
                ),
            ],
            now: 601,
            phase: Phase::Failed,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "ContainerCreating within the startup timeout: normal, quiet",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "ContainerCreating", "")],
            now: 300,
            phase: Phase::Starting,
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "ContainerCreating past the startup timeout: gang restart",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "ContainerCreating", "")],
            now: 650,
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "pending without a word past the startup timeout: gang restart",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), pending(0, 1)],
            now: 650,
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "startup timeout 0 waits for ever (and still shows why)",
            spec: |s| s.startup_timeout_seconds = 0,
            status: starting_status(0, 0),
            pods: vec![running(0, 0), stuck(0, 1, "ImagePullBackOff", PULL)],
            now: 100_000,
            phase: Phase::Starting,
            events: vec!["ImagePullBackOff"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "startup timeout ahead: requeue at it",
            status: starting_status(0, 0),
            pods: vec![running(0, 0), pending(0, 1)],
            now: 590,
            phase: Phase::Starting,
            requeue: Some(10),
            ..Row::default()
        },
    ]
}

fn assert_rank_1_blamed_on_node_1(d: &Decision) {
    let f = d.status.last_failure.as_ref().expect("a failure");
    assert_eq!(
        (f.reason.as_str(), f.node_rank, f.node.as_deref()),
        ("PodDeleted", Some(1), Some("node-1")),
        "{f:?}"
    );
    let ledger = d.status.recovery.as_ref().expect("the ledger");
    let end = ledger.attempts[0].end.as_ref().expect("attempt 0 ended");
    assert_eq!((end.rank, end.node.as_deref()), (Some(1), Some("node-1")));
}

/// What `kubectl describe dt` shows for an image that cannot be pulled: while it waits, and
/// when the start-up timeout ends the attempt.
#[test]
fn an_unpullable_image_is_shown_then_fails_the_job_at_the_startup_timeout() {
    let row = Row {
        status: starting_status(0, 0),
        pods: vec![running(0, 0), stuck(0, 1, "ImagePullBackOff", PULL)],
        now: 40,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Starting);
    let c = d.status.condition(condition::RUNNING).unwrap();
    let shown = format!("Running {} {}: {}", c.status, c.reason, c.message);
    assert_eq!(
        shown,
        "Running False ImagePullBackOff: pod mt-0-1 (rank 1) waits: ImagePullBackOff: Back-off pulling image \"registry.example/ferrotrain:nope\""
    );
    assert_eq!(
        d.events,
        vec![EventNote {
            warning: true,
            reason: "ImagePullBackOff",
            note: c.message.clone(),
            round: Some(0),
        }]
    );
    // The kubelet alternates ErrImagePull and ImagePullBackOff: one reason, one event.
    let flip = Row {
        status: d.status.clone(),
        pods: vec![
            running(0, 0),
            stuck(0, 1, "ErrImagePull", "manifest unknown"),
        ],
        now: 70,
        ..row
    };
    let d2 = run(&flip);
    assert!(d2.events.is_empty(), "{:?}", d2.events);

    let late = Row {
        status: d2.status.clone(),
        now: 600,
        ..flip
    };
    let d3 = run(&late);
    assert_eq!(d3.status.phase, Phase::Failed);
    let f = d3.status.condition(condition::FAILED).unwrap();
    let shown = format!("Failed {} {}: {}", f.status, f.reason, f.message);
    assert_eq!(
        shown,
        "Failed True ImagePullBackOff: rank 1 (pod mt-0-1): ImagePullBackOff: not running 600s after its creation: ErrImagePull: manifest unknown"
    );
    let reasons: Vec<_> = d3.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["RankFailed", "Failed"]);
    assert_eq!(d3.status.restarts, 0);
}

/// What `kubectl describe dt` shows for a gang that cannot be scheduled.
#[test]
fn an_unschedulable_gang_shows_the_schedulers_message_and_restarts_at_the_startup_timeout() {
    let row = Row {
        status: starting_status(0, 0),
        pods: vec![running(0, 0), stuck(0, 1, "Unschedulable", NO_FIT)],
        now: 40,
        ..Row::default()
    };
    let d = run(&row);
    let c = d.status.condition(condition::RUNNING).unwrap();
    let shown = format!("Running {} {}: {}", c.status, c.reason, c.message);
    assert_eq!(
        shown,
        format!("Running False Unschedulable: pod mt-0-1 (rank 1) waits: Unschedulable: {NO_FIT}")
    );
    assert_eq!(d.events.len(), 1);
    assert_eq!(
        (d.events[0].warning, d.events[0].reason),
        (true, "Unschedulable")
    );
    assert_eq!(d.events[0].note, c.message);
    // Every reconcile after: no new event, no change.
    let again = run(&Row {
        status: d.status.clone(),
        pods: row.pods.clone(),
        now: 70,
        ..Row::default()
    });
    assert!(again.events.is_empty());
    assert_eq!(again.status, d.status);

    let late = run(&Row {
        status: d.status.clone(),
        now: 600,
        ..row
    });
    assert_eq!(late.status.phase, Phase::Restarting);
    let r = late.status.condition(condition::RESTARTING).unwrap();
    assert_eq!(r.reason, "Unschedulable");
    assert_eq!(
        r.message,
        format!(
            "rank 1 (pod mt-0-1): Unschedulable: not running 600s after its creation: Unschedulable: {NO_FIT}"
        )
    );
    assert_eq!(late.status.restarts_by_cause.get("Unschedulable"), Some(&1));
}

#[test]
fn replica_counts_follow_the_current_attempt() {
    let row = Row {
        spec: |s| s.replicas = 3,
        status: running_status(1, 1),
        pods: vec![
            running(1, 0),
            running(1, 1),
            pending(1, 2),
            exited(0, 0, 1, "", 1),
        ],
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Starting);
    assert_eq!(
        (
            d.status.replicas,
            d.status.running_replicas,
            d.status.succeeded_replicas
        ),
        (3, 2, 0)
    );
}

#[test]
fn placement_records_each_bound_pod_once_and_is_cleared_by_the_next_attempt() {
    let s = ran_with_both_pods_seen();
    let placed: Vec<(i32, &str, Option<&str>, &str)> = s
        .placement
        .iter()
        .map(|p| {
            (
                p.node_rank,
                p.pod.as_str(),
                p.uid.as_deref(),
                p.node.as_str(),
            )
        })
        .collect();
    assert_eq!(
        placed,
        [
            (0, "mt-0-0", Some("uid-0-0"), "node-0"),
            (1, "mt-0-1", Some("uid-0-1"), "node-1")
        ]
    );
    // An unbound pod is not placed.
    let mut unbound = pending(0, 1);
    unbound.node = None;
    let d = run(&Row {
        status: status(Phase::Pending, 0, 0, vec![]),
        pods: vec![pending(0, 0), unbound],
        ..Row::default()
    });
    assert_eq!(d.status.placement.len(), 1);
    // Attempt 1 starts: attempt 0's placement goes.
    let mut restarting = restarting_status(0, 1, 0);
    restarting.placement = s.placement.clone();
    let d = run(&Row {
        status: restarting,
        pods: vec![],
        now: 100,
        ..Row::default()
    });
    assert_eq!(d.status.attempt, 1);
    assert!(d.status.placement.is_empty(), "{:?}", d.status.placement);
}

#[test]
fn a_pod_seen_terminating_names_its_node() {
    let s = ran_with_both_pods_seen();
    let d = run(&Row {
        status: s,
        pods: vec![running(0, 0), deleting(running(0, 1), 50)],
        now: 51,
        ..Row::default()
    });
    assert_rank_1_blamed_on_node_1(&d);
}

#[test]
fn a_pod_gone_between_two_reconciles_still_names_its_node() {
    // The trainer saved and exited on SIGTERM before the next reconcile: the pod is gone
    // from the cache without ever being seen terminating.
    let s = ran_with_both_pods_seen();
    let d = run(&Row {
        status: s,
        pods: vec![running(0, 0)],
        now: 51,
        ..Row::default()
    });
    assert_rank_1_blamed_on_node_1(&d);
}

#[test]
fn an_operator_restarted_between_the_pods_start_and_its_deletion_names_its_node() {
    // The new operator reads the status from the API server (JSON) and never saw the pod.
    let written = serde_json::to_value(ran_with_both_pods_seen()).unwrap();
    let read: DistributedTrainingStatus = serde_json::from_value(written).unwrap();
    let d = run(&Row {
        status: read,
        pods: vec![running(0, 0)],
        now: 51,
        ..Row::default()
    });
    assert_rank_1_blamed_on_node_1(&d);
}

#[test]
fn a_rank_that_finished_first_still_counts_as_present_in_the_running_condition() {
    let d = run(&Row {
        status: running_status(0, 0),
        pods: vec![running(0, 0), exited(0, 1, 0, "", 50)],
        now: 60,
        ..Row::default()
    });
    assert_eq!(d.status.phase, Phase::Running);
    let c = d.status.condition(condition::RUNNING).expect("Running");
    assert_eq!(c.message, "all 2 pods of attempt 0 run");
}
