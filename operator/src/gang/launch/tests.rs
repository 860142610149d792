//! Launching: an attempt's pods, one checkpoint writer at a time, older attempts' pods deleted,
//! pods stuck on a lost node force-deleted, a refused create, the pods' termination grace.

use std::time::Duration;

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{Phase, TrainingProgress, condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::fixtures::{
    NAME, cond, deleting, exited, node_lost, pending, restarting_status, running, running_status,
    status, t,
};
use crate::gang::tests::{Row, del, launch, run};
use crate::gang::*;

/// Rows of the table of every decision ([`crate::gang::tests`]).
pub(in crate::gang) fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "new job launches attempt 0",
            actions: vec![launch(0, &[0, 1])],
            events: vec!["Created"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "operator restarted after creating one of two pods",
            status: status(Phase::Pending, 0, 0, vec![]),
            pods: vec![pending(0, 0)],
            actions: vec![launch(0, &[1])],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "stuck terminating on a lost node: force-deleted after grace",
            status: status(
                Phase::Restarting,
                0,
                1,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::RESTARTING, true, 95),
                ],
            ),
            pods: vec![
                deleting(node_lost(running(0, 1), 0), 30),
                deleting(running(0, 0), 95),
            ],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![Action::ForceDeletePod(crate::labels::pod_name(NAME, 0, 1))],
            events: vec!["ForceDeleted"],
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "terminating on a lost node within grace: wait",
            status: status(
                Phase::Restarting,
                0,
                1,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::RESTARTING, true, 95),
                ],
            ),
            pods: vec![deleting(node_lost(running(0, 1), 0), 90)],
            phase: Phase::Restarting,
            restarts: 1,
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "old attempts: every pod is deleted, terminated ones too",
            status: running_status(2, 2),
            pods: vec![
                running(2, 0),
                running(2, 1),
                exited(1, 1, 1, "", 10),
                running(1, 0),
                exited(0, 0, 1, "", 5),
            ],
            phase: Phase::Running,
            attempt: 2,
            restarts: 2,
            actions: vec![del(1, 1), del(1, 0), del(0, 0)],
            requeue: Some(5),
            ..Row::default()
        },
    ]
}

fn created_message(d: &Decision) -> String {
    let c = d.status.condition(condition::CREATED).unwrap();
    format!("{} {}: {}", c.status, c.reason, c.message)
}

/// The controller's last launch of attempt 0 stopped at `at` for `reason`.
fn stopped(reason: &'static str, message: &str, at: i64) -> Option<LaunchStop> {
    Some(LaunchStop {
        attempt: 0,
        reason,
        message: message.into(),
        at: t(at),
    })
}

#[test]
fn a_refused_pod_create_is_shown_once_then_fails_the_job_at_the_startup_timeout() {
    let quota = "pods \"mt-0-1\" is forbidden: exceeded quota: compute, requested: cpu=8, used: cpu=60, limited: cpu=64";
    let launching = status(Phase::Pending, 0, 0, vec![]);
    let refused = Row {
        status: launching,
        pods: vec![pending(0, 0)],
        launch_stop: stopped("PodCreateRefused", quota, 10),
        now: 10,
        ..Row::default()
    };
    let d = run(&refused);
    let event = &d.events[0];
    assert!(event.warning);
    assert_eq!(event.reason, "PodCreateRefused");
    assert_eq!(event.note, format!("attempt 0: {quota}"));
    let c = d.status.condition(condition::CREATED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PodCreateRefused")
    );
    assert!(
        d.actions.is_empty(),
        "held back until the retry: {:?}",
        d.actions
    );
    assert_eq!(d.requeue_after, Some(std::time::Duration::from_secs(30)));
    // The same refusal seen again: no second event, the same status.
    let again = run(&Row {
        status: d.status.clone(),
        now: 20,
        ..refused
    });
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.status, d.status);

    // Within the start-up timeout the launch is retried, 30 s after it stopped.
    let row = Row {
        status: d.status.clone(),
        pods: vec![pending(0, 0)],
        launch_stop: stopped("PodCreateRefused", quota, 10),
        now: 300,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Pending);
    assert_eq!(d.actions, vec![launch(0, &[1])]);
    // Past it: Failed with the API's words.
    let d = run(&Row { now: 610, ..row });
    assert_eq!(d.status.phase, Phase::Failed);
    let f = d.status.condition(condition::FAILED).unwrap();
    assert_eq!(f.reason, "PodCreateRefused");
    assert!(
        f.message.contains("exceeded quota: compute"),
        "{}",
        f.message
    );
    assert_eq!(d.actions, vec![del(0, 0)]);
}

#[test]
fn a_name_conflict_is_shown_once_and_the_launch_retried_after_a_while() {
    let taken = "Service ml/mt exists and is not this job's: delete it or rename the job";
    let row = Row {
        status: status(Phase::Pending, 0, 0, vec![]),
        launch_stop: stopped("NameConflict", taken, 100),
        now: 101,
        ..Row::default()
    };
    let d = run(&row);
    let events: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(events, ["NameConflict"], "no 'creating 2 pods'");
    let c = d.status.condition(condition::CREATED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NameConflict")
    );
    assert!(c.message.contains("Service ml/mt exists"), "{}", c.message);
    assert!(d.actions.is_empty());
    let retry = run(&Row {
        status: d.status.clone(),
        now: 130,
        ..row
    });
    assert_eq!(retry.actions, vec![launch(0, &[0, 1])]);
    assert!(
        !retry.events.iter().any(|e| e.reason == "NameConflict"),
        "shown once: {:?}",
        retry.events
    );
    // A stop of an earlier attempt says nothing of this one.
    let later = Row {
        status: status(Phase::Pending, 1, 1, vec![]),
        launch_stop: stopped("NameConflict", taken, 100),
        now: 101,
        ..Row::default()
    };
    assert_eq!(run(&later).actions, vec![launch(1, &[0, 1])]);
}

#[test]
fn the_next_attempt_waits_until_the_old_attempts_pods_are_gone() {
    // Backoff over while rank 0 of attempt 0 still terminates (a SIGTERM save in flight)
    // and rank 1 exited but its pod is still there.
    let row = Row {
        status: restarting_status(0, 1, 50),
        pods: vec![deleting(running(0, 0), 60), exited(0, 1, 137, "", 55)],
        now: 100,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!((d.status.phase, d.status.attempt), (Phase::Pending, 1));
    assert_eq!(
        d.actions,
        [del(0, 1)],
        "no launch while attempt 0's pods exist"
    );
    assert_eq!(
        created_message(&d),
        "False PreviousAttemptTerminating: attempt 1: waiting for 2 pods of attempt 0 to terminate (one checkpoint writer at a time)"
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(5)));

    // One left, terminating: still no launch, the count follows.
    let d = run(&Row {
        status: d.status.clone(),
        pods: vec![deleting(running(0, 0), 60)],
        now: 110,
        attempt: 1,
        ..Row::default()
    });
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert!(
        created_message(&d).contains("waiting for 1 pod of attempt 0"),
        "{}",
        created_message(&d)
    );

    // All gone: attempt 1 launches.
    let d = run(&Row {
        status: d.status.clone(),
        pods: vec![],
        now: 115,
        attempt: 1,
        ..Row::default()
    });
    assert_eq!(d.actions, [launch(1, &[0, 1])]);
    assert_eq!(d.events[0].reason, "Created");
}

#[test]
fn a_pod_stuck_terminating_on_a_lost_node_is_force_deleted_and_then_the_launch_goes_on() {
    let mut waiting = status(
        Phase::Pending,
        1,
        1,
        vec![cond(condition::CREATED, true, 0)],
    );
    waiting.start_time = Some(Time(t(0)));
    let stuck = deleting(node_lost(running(0, 0), 0), 30);
    let d = run(&Row {
        status: waiting.clone(),
        pods: vec![stuck],
        now: 100,
        attempt: 1,
        ..Row::default()
    });
    assert_eq!(
        d.actions,
        [Action::ForceDeletePod(crate::labels::pod_name(NAME, 0, 0))]
    );
    assert_eq!(d.events[0].reason, "ForceDeleted");
    assert!(created_message(&d).contains("waiting for 1 pod of attempt 0"));
    // The force delete removed it from the API: the next reconcile launches.
    let d = run(&Row {
        status: d.status.clone(),
        pods: vec![],
        now: 101,
        attempt: 1,
        ..Row::default()
    });
    assert_eq!(d.actions, [launch(1, &[0, 1])]);
}

#[test]
fn the_termination_grace_is_sized_from_the_last_save() {
    let with_save = |save: Option<f64>, blocking: Option<f64>| {
        let mut s = running_status(0, 0);
        s.progress = Some(TrainingProgress {
            report: Progress {
                last_checkpoint: Some(ferrotrain_api::CheckpointInfo {
                    save_seconds: save,
                    blocking_seconds: blocking,
                    ..Default::default()
                }),
                ..Progress::default()
            },
            ..TrainingProgress::default()
        });
        save_grace_seconds(&s)
    };
    assert_eq!(save_grace_seconds(&running_status(0, 0)), 30, "no save yet");
    assert_eq!(with_save(None, None), 30);
    assert_eq!(
        with_save(Some(2.0), Some(0.1)),
        30,
        "short saves keep the default"
    );
    assert_eq!(with_save(Some(20.0), Some(0.5)), 70);
    assert_eq!(with_save(Some(20.2), None), 71, "rounded up");
    assert_eq!(
        with_save(None, Some(15.0)),
        55,
        "older trainers report the blocking part"
    );
    assert_eq!(with_save(Some(1e6), None), 600, "capped");
    assert_eq!(with_save(Some(f64::NAN), None), 30);
    let mut uploaded = running_status(0, 0);
    uploaded.progress = Some(TrainingProgress {
        report: Progress {
            last_checkpoint: Some(ferrotrain_api::CheckpointInfo {
                save_seconds: Some(2.0),
                ..Default::default()
            }),
            durable_checkpoint: Some(ferrotrain_api::DurableCheckpoint {
                durable_seconds: Some(20.0),
                ..Default::default()
            }),
            ..Progress::default()
        },
        ..TrainingProgress::default()
    });
    assert_eq!(
        save_grace_seconds(&uploaded),
        70,
        "with a bucket, until the save is durable there"
    );
    assert_eq!(launcher_stop_grace_seconds(30), 25);
    assert_eq!(launcher_stop_grace_seconds(70), 65);
}

/// An elastic gang of 3 (min 1) whose pods the scheduler places one by one.
fn elastic(s: &mut ferrotrain_api::crd::DistributedTrainingSpec) {
    crate::fixtures::elastic(s, 3, 1, None);
    s.startup_timeout_seconds = 600;
}

/// Node 0's pod, created and not placed.
fn unplaced_node_0() -> PodView {
    crate::fixtures::unplaced(0, 0)
}

/// An elastic gang of `spec` placed one by one: node 0's pod first, nothing more while it
/// has no node, pods `others` once it has one. The decision while it waits.
fn node_0_first(
    spec: fn(&mut ferrotrain_api::crd::DistributedTrainingSpec),
    others: &[i32],
) -> Decision {
    let first = run(&Row {
        spec,
        ..Row::default()
    });
    assert_eq!(first.actions, vec![launch(0, &[0])]);
    let waits = run(&Row {
        spec,
        status: first.status.clone(),
        pods: vec![unplaced_node_0()],
        now: 130,
        ..Row::default()
    });
    assert!(waits.actions.is_empty(), "{:?}", waits.actions);
    assert_eq!(waits.status.phase, Phase::Pending);
    let placed = run(&Row {
        spec,
        status: waits.status.clone(),
        pods: vec![pending(0, 0)],
        now: 131,
        ..Row::default()
    });
    assert_eq!(placed.actions, vec![launch(0, others)]);
    waits
}

#[test]
fn an_elastic_gang_placed_one_by_one_creates_node_0s_pod_first() {
    let waits = node_0_first(elastic, &[1, 2]);
    let created = waits.status.condition(condition::CREATED).expect("Created");
    assert_eq!(
        (
            created.status.as_str(),
            created.reason.as_str(),
            created.message.as_str()
        ),
        (
            "False",
            "Node0First",
            "attempt 0: node 0's pod mt-0-0 is created first and waits for a node \
             (Unschedulable: 0/2 nodes are available); the other 2 pods are created once it has one"
        )
    );
    // With a gang scheduler the group is placed together: every pod at once.
    let grouped = crate::gang::tests::run_with(
        &Row {
            spec: elastic,
            ..Row::default()
        },
        &crate::scheduling::GangMode::Native(crate::scheduling::NativeApi::V1alpha2),
    );
    assert_eq!(grouped.actions, vec![launch(0, &[0, 1, 2])]);
}

#[test]
fn an_elastic_gang_of_two_waits_for_node_0s_node_before_its_other_pod() {
    // One pod missing, and node 0's has no node yet: the other still waits.
    let waits = node_0_first(
        |s| {
            crate::fixtures::elastic(s, 2, 1, None);
            s.startup_timeout_seconds = 600;
        },
        &[1],
    );
    let created = waits.status.condition(condition::CREATED).expect("Created");
    assert_eq!(created.reason, "Node0First");
}

#[test]
fn node_0s_pod_that_finds_no_node_within_the_startup_timeout_ends_the_attempt() {
    let late = run(&Row {
        spec: elastic,
        status: status(Phase::Pending, 0, 0, vec![]),
        pods: vec![unplaced_node_0()],
        // Created at t(0): the start-up timeout is 600 s.
        now: 601,
        ..Row::default()
    });
    assert_eq!(
        crate::gang::tests::restart_blaming(&late),
        (1, Some(0), "Unschedulable")
    );
}
