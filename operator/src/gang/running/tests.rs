//! Running names the pod that waits, once per attempt and reason, the worst of several.

use ferrotrain_api::crd::{Phase, condition};

use crate::fixtures::{NO_FIT, cond, pending, starting_status, status, stuck, t};
use crate::gang::PodView;
use crate::gang::tests::{Row, run};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

#[test]
fn each_attempt_reports_its_stuck_pod_once() {
    // Attempt 0 timed out unschedulable; after the backoff attempt 1 launches.
    let mut s = status(
        Phase::Restarting,
        0,
        1,
        vec![
            cond(condition::CREATED, true, 0),
            cond(condition::RESTARTING, true, 600),
        ],
    );
    s.conditions.push(Condition {
        reason: "Unschedulable".into(),
        ..cond(condition::RUNNING, false, 600)
    });
    let relaunch = run(&Row {
        status: s,
        now: 610,
        ..Row::default()
    });
    assert_eq!(relaunch.status.attempt, 1);
    let c = relaunch.status.condition(condition::RUNNING).unwrap();
    assert_eq!(c.reason, "PodsStarting");
    // Its pods are unschedulable too: said again, once.
    let mut s = relaunch.status.clone();
    s.phase = Phase::Starting;
    let pods: Vec<PodView> = [pending(1, 0), stuck(1, 1, "Unschedulable", NO_FIT)]
        .into_iter()
        .map(|p| PodView {
            created: Some(t(610)),
            ..p
        })
        .collect();
    let row = Row {
        status: s,
        pods: pods.clone(),
        now: 620,
        attempt: 1,
        ..Row::default()
    };
    let d = run(&row);
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["Unschedulable"]);
    assert!(
        d.events[0].note.contains("pod mt-1-1"),
        "{}",
        d.events[0].note
    );
    let d2 = run(&Row {
        status: d.status.clone(),
        now: 650,
        ..row
    });
    assert!(d2.events.is_empty());
    // Scheduled at last: the condition stops blaming it.
    let d3 = run(&Row {
        status: d.status.clone(),
        pods: pods
            .iter()
            .map(|p| PodView {
                waiting: None,
                ..p.clone()
            })
            .collect(),
        now: 660,
        attempt: 1,
        ..Row::default()
    });
    let c = d3.status.condition(condition::RUNNING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PodsStarting")
    );
}

#[test]
fn the_worst_of_several_stuck_pods_is_shown_and_the_others_counted() {
    let row = Row {
        spec: |s| s.replicas = 3,
        status: starting_status(0, 0),
        pods: vec![
            stuck(0, 0, "Unschedulable", NO_FIT),
            stuck(
                0,
                1,
                "CreateContainerConfigError",
                "secret \"hf-token\" not found",
            ),
            stuck(0, 2, "Unschedulable", NO_FIT),
        ],
        ..Row::default()
    };
    let d = run(&row);
    let c = d.status.condition(condition::RUNNING).unwrap();
    assert_eq!(c.reason, "CreateContainerConfigError");
    assert_eq!(
        c.message,
        "pod mt-0-1 (rank 1) waits: CreateContainerConfigError: secret \"hf-token\" not found (and 2 more pods wait)"
    );
}
