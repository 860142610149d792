//! The gang state machine, one table row per situation.

use std::time::Duration;

use ferrotrain_api::crd::{
    DistributedTrainingSpec, DistributedTrainingStatus, Phase, RestartPolicy, TrainingProgress,
    condition,
};
use ferrotrain_api::{Progress, TrainerPhase, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;
use crate::fixtures::{
    NAME, NO_FIT, PULL, cond, deleting, disrupted, exited, node_lost, pending, pod_view, report,
    restarting_status, running, running_status, spec, starting_status, status, stuck, t,
};
use crate::report;

/// One situation and what must come out of it.
struct Row {
    name: &'static str,
    spec: fn(&mut DistributedTrainingSpec),
    status: DistributedTrainingStatus,
    pods: Vec<PodView>,
    progress: ProgressObservation,
    problems: Vec<String>,
    now: i64,
    generation: i64,
    // expectations
    phase: Phase,
    attempt: i32,
    restarts: i32,
    actions: Vec<Action>,
    events: Vec<&'static str>,
    requeue: Option<u64>,
}

impl Default for Row {
    fn default() -> Self {
        Row {
            name: "",
            spec: |_| {},
            status: DistributedTrainingStatus::default(),
            pods: Vec::new(),
            progress: ProgressObservation::NotPolled,
            problems: Vec::new(),
            now: 100,
            generation: 1,
            phase: Phase::Pending,
            attempt: 0,
            restarts: 0,
            actions: Vec::new(),
            events: Vec::new(),
            requeue: None,
        }
    }
}

fn run(row: &Row) -> Decision {
    let mut s = spec();
    (row.spec)(&mut s);
    let timing = Timing::default();
    decide(&Observed {
        now: t(row.now),
        job: NAME,
        generation: Some(row.generation),
        spec: &s,
        status: &row.status,
        pods: &row.pods,
        progress: row.progress.clone(),
        spec_problems: &row.problems,
        timing: &timing,
    })
}

fn del(attempt: i32, rank: i32) -> Action {
    Action::DeletePod(crate::labels::pod_name(NAME, attempt, rank))
}

fn launch(attempt: i32, ranks: &[i32]) -> Action {
    Action::Launch {
        attempt,
        node_ranks: ranks.to_vec(),
    }
}

fn rows() -> Vec<Row> {
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
            name: "one rank failed retryable: whole gang deleted, backoff",
            status: running_status(0, 0),
            pods: vec![running(0, 0), exited(0, 1, 1, "collective timed out", 90)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "one rank failed permanent: Failed, no restart",
            status: running_status(0, 0),
            pods: vec![
                running(0, 0),
                exited(0, 1, 3, "data/train.en: no such file", 90),
            ],
            phase: Phase::Failed,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "custom permanent exit code",
            spec: |s| s.restart_policy.permanent_exit_codes = vec![42],
            status: running_status(0, 0),
            pods: vec![running(0, 0), exited(0, 1, 3, "", 90)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Restarting"],
            requeue: Some(10),
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
            name: "maxRestarts reached",
            spec: |s| s.restart_policy.max_restarts = 2,
            status: running_status(2, 2),
            pods: vec![running(2, 0), exited(2, 1, 137, "", 90)],
            phase: Phase::Failed,
            attempt: 2,
            restarts: 2,
            actions: vec![del(2, 0)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "maxRestarts 0 fails on the first retryable failure",
            spec: |s| s.restart_policy.max_restarts = 0,
            status: running_status(0, 0),
            pods: vec![running(0, 0), exited(0, 1, 1, "", 90)],
            phase: Phase::Failed,
            actions: vec![del(0, 0)],
            events: vec!["RankFailed", "Failed"],
            ..Row::default()
        },
        Row {
            name: "suspend a running job",
            spec: |s| s.suspend = true,
            status: running_status(0, 0),
            pods: vec![running(0, 0), running(0, 1)],
            phase: Phase::Suspended,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["Suspended"],
            ..Row::default()
        },
        Row {
            name: "created suspended (Kueue): no pods",
            spec: |s| s.suspend = true,
            phase: Phase::Suspended,
            events: vec!["Suspended"],
            ..Row::default()
        },
        Row {
            name: "suspended stays quiet",
            spec: |s| s.suspend = true,
            status: status(
                Phase::Suspended,
                0,
                0,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::SUSPENDED, true, 50),
                ],
            ),
            pods: vec![deleting(running(0, 0), 50)],
            phase: Phase::Suspended,
            ..Row::default()
        },
        Row {
            name: "resume starts the next attempt at once",
            status: status(
                Phase::Suspended,
                0,
                0,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::SUSPENDED, true, 50),
                ],
            ),
            phase: Phase::Pending,
            attempt: 1,
            actions: vec![launch(1, &[0, 1])],
            events: vec!["Resumed", "Created"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "resume of a job created suspended keeps attempt 0",
            status: status(
                Phase::Suspended,
                0,
                0,
                vec![cond(condition::SUSPENDED, true, 0)],
            ),
            phase: Phase::Pending,
            actions: vec![launch(0, &[0, 1])],
            events: vec!["Resumed", "Created"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "deadline passed",
            spec: |s| s.active_deadline_seconds = Some(60),
            status: running_status(0, 0),
            pods: vec![running(0, 0), running(0, 1)],
            phase: Phase::Failed,
            actions: vec![del(0, 0), del(0, 1)],
            events: vec!["Failed"],
            ..Row::default()
        },
        Row {
            name: "deadline ahead: requeue at it",
            spec: |s| s.active_deadline_seconds = Some(102),
            status: running_status(0, 0),
            pods: vec![running(0, 0), running(0, 1)],
            phase: Phase::Running,
            requeue: Some(2),
            ..Row::default()
        },
        Row {
            name: "all ranks succeeded",
            status: running_status(0, 0),
            pods: vec![exited(0, 0, 0, "", 90), exited(0, 1, 0, "", 91)],
            phase: Phase::Succeeded,
            events: vec!["Succeeded"],
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
            name: "ttl after finished",
            spec: |s| s.ttl_seconds_after_finished = Some(60),
            status: DistributedTrainingStatus {
                completion_time: Some(Time(t(30))),
                ..status(Phase::Succeeded, 0, 0, vec![])
            },
            phase: Phase::Succeeded,
            actions: vec![Action::DeleteJob],
            ..Row::default()
        },
        Row {
            name: "ttl not yet",
            spec: |s| s.ttl_seconds_after_finished = Some(60),
            status: DistributedTrainingStatus {
                completion_time: Some(Time(t(50))),
                ..status(Phase::Succeeded, 0, 0, vec![])
            },
            phase: Phase::Succeeded,
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "operator restarted mid-restart, backoff running: nothing to do",
            status: status(
                Phase::Restarting,
                0,
                1,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::RESTARTING, true, 95),
                ],
            ),
            pods: vec![deleting(running(0, 0), 95), exited(0, 1, 1, "", 94)],
            phase: Phase::Restarting,
            restarts: 1,
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "operator restarted mid-restart before deleting: deletes, no double count",
            status: status(
                Phase::Restarting,
                0,
                1,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::RESTARTING, true, 95),
                ],
            ),
            pods: vec![running(0, 0), exited(0, 1, 1, "", 94)],
            phase: Phase::Restarting,
            restarts: 1,
            actions: vec![del(0, 0)],
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "backoff over: the next attempt waits for the old pods to be gone",
            status: status(
                Phase::Restarting,
                0,
                1,
                vec![
                    cond(condition::CREATED, true, 0),
                    cond(condition::RESTARTING, true, 89),
                ],
            ),
            pods: vec![deleting(running(0, 0), 95), exited(0, 1, 1, "", 94)],
            phase: Phase::Pending,
            attempt: 1,
            restarts: 1,
            actions: vec![del(0, 1)],
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "stale status (pods of a newer attempt): wait for the cache",
            status: running_status(0, 0),
            pods: vec![running(1, 0), running(1, 1)],
            phase: Phase::Running,
            requeue: Some(1),
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
        Row {
            name: "invalid trainer config: Failed, no pods, one warning",
            problems: vec!["spec.trainer.data.train: is required for task translation".into()],
            phase: Phase::Failed,
            events: vec!["InvalidSpec"],
            ..Row::default()
        },
        Row {
            name: "invalid spec fixed in a new generation: launches",
            status: invalid_spec_failed(0),
            generation: 2,
            actions: vec![launch(0, &[0, 1])],
            events: vec!["Created"],
            requeue: Some(30),
            ..Row::default()
        },
        Row {
            name: "invalid spec changed but still invalid: Failed again, one warning",
            status: invalid_spec_failed(0),
            generation: 2,
            problems: vec!["spec.trainer.model.dModel: 250 is not divisible by 4".into()],
            phase: Phase::Failed,
            events: vec!["InvalidSpec"],
            ..Row::default()
        },
        Row {
            name: "invalid spec, same generation: stays Failed quietly",
            status: invalid_spec_failed(0),
            problems: vec!["spec.trainer.data.train: is required for task translation".into()],
            phase: Phase::Failed,
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
        Row {
            name: "evicted pod: gang restart that spends no restart",
            status: running_status(0, 0),
            pods: vec![
                running(0, 0),
                disrupted(
                    pod_view(
                        0,
                        1,
                        PodState::Failed(Termination {
                            exit_code: None,
                            reason: "Evicted".into(),
                            message: "The node was low on resource: memory.".into(),
                            finished_at: None,
                        }),
                    ),
                    "Evicted",
                ),
            ],
            phase: Phase::Restarting,
            actions: vec![del(0, 0)],
            events: vec!["Disrupted", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "preempted while running (DisruptionTarget, deleting): no restart spent",
            status: running_status(0, 0),
            pods: vec![
                running(0, 0),
                disrupted(deleting(running(0, 1), 95), "PreemptionByScheduler"),
            ],
            phase: Phase::Restarting,
            actions: vec![del(0, 0)],
            events: vec!["Disrupted", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
        Row {
            name: "drained at maxRestarts: still a restart, not a failure",
            spec: |s| s.restart_policy.max_restarts = 2,
            status: running_status(2, 2),
            pods: vec![
                running(2, 0),
                disrupted(deleting(running(2, 1), 95), "EvictionByEvictionAPI"),
            ],
            phase: Phase::Restarting,
            attempt: 2,
            restarts: 2,
            actions: vec![del(2, 0)],
            events: vec!["Disrupted", "Restarting"],
            requeue: Some(10),
            ..Row::default()
        },
    ]
}

/// Failed at generation 1 for an invalid spec, at attempt `attempt`.
fn invalid_spec_failed(attempt: i32) -> DistributedTrainingStatus {
    let mut failed = cond(condition::FAILED, true, 50);
    failed.reason = reason::INVALID_SPEC.into();
    failed.message = "InvalidSpec: no pods created: spec.trainer.data.train: required".into();
    DistributedTrainingStatus {
        completion_time: Some(Time(t(50))),
        start_time: None,
        ..status(Phase::Failed, attempt, 0, vec![failed])
    }
}

#[test]
fn table() {
    let mut failures = Vec::new();
    for row in rows() {
        let d = run(&row);
        let events: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
        let got = (
            d.status.phase,
            d.status.attempt,
            d.status.restarts,
            &d.actions,
            &events,
            d.requeue_after.map(|r| r.as_secs()),
        );
        let want = (
            row.phase,
            row.attempt,
            row.restarts,
            &row.actions,
            &row.events,
            row.requeue,
        );
        if got != want {
            failures.push(format!("{}:\n   got {got:?}\n  want {want:?}", row.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_decision_is_idempotent_when_replayed_on_its_own_status() {
    // Applying a decision and deciding again from the resulting status (same pods, same
    // time) must not count a second restart or launch a second attempt.
    for row in rows() {
        let first = run(&row);
        let replay = Row {
            status: first.status.clone(),
            ..row
        };
        let second = run(&replay);
        assert_eq!(
            (second.status.attempt, second.status.restarts),
            (first.status.attempt, first.status.restarts),
            "{}",
            replay.name
        );
        assert!(
            !second.events.iter().any(|e| matches!(
                e.reason,
                "Restarting" | "Failed" | "Succeeded" | "Suspended" | "Resumed" | "Running"
            )),
            "{}: replay emitted {:?}",
            replay.name,
            second.events
        );
        assert_eq!(
            second.status, first.status,
            "{}: status not stable",
            replay.name
        );
    }
}

#[test]
fn permanent_failure_reports_the_ranks_termination_message() {
    let row = Row {
        status: running_status(0, 0),
        pods: vec![
            running(0, 0),
            exited(0, 1, 3, "data/train.en: no such file", 90),
        ],
        ..Row::default()
    };
    let d = run(&row);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!(f.reason, "PermanentExitCode");
    assert_eq!(f.exit_code, Some(3));
    assert_eq!(f.node_rank, Some(1));
    assert_eq!(f.pod.as_deref(), Some("mt-0-1"));
    assert_eq!(f.message, "data/train.en: no such file");
    let failed = d.status.condition(condition::FAILED).unwrap();
    assert_eq!(failed.status, "True");
    assert_eq!(
        failed.message,
        "rank 1 (pod mt-0-1) exited with code 3: data/train.en: no such file"
    );
    assert_eq!(d.status.completion_time, Some(Time(t(100))));
}

#[test]
fn the_rank_that_failed_first_is_blamed() {
    let row = Row {
        status: running_status(0, 0),
        pods: vec![
            exited(0, 0, 1, "peer rank 1 closed the connection", 95),
            exited(0, 1, 137, "", 90),
        ],
        ..Row::default()
    };
    let d = run(&row);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!((f.node_rank, f.exit_code), (Some(1), Some(137)));
    assert!(d.status.is_true(condition::RESTARTING));
    assert!(!d.status.is_true(condition::RUNNING));
}

#[test]
fn max_restarts_message_carries_the_last_failure() {
    let row = Row {
        spec: |s| s.restart_policy.max_restarts = 1,
        status: running_status(1, 1),
        pods: vec![running(1, 0), exited(1, 1, 1, "NCCL timeout", 90)],
        ..Row::default()
    };
    let d = run(&row);
    let failed = d.status.condition(condition::FAILED).unwrap();
    assert_eq!(failed.reason, "MaxRestartsReached");
    assert!(
        failed.message.contains("maxRestarts 1 reached"),
        "{}",
        failed.message
    );
    assert!(
        failed.message.contains("NCCL timeout"),
        "{}",
        failed.message
    );
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let mut s = spec();
    s.restart_policy = RestartPolicy {
        backoff_seconds: 10,
        max_backoff_seconds: 60,
        ..RestartPolicy::default()
    };
    let secs: Vec<u64> = (1..=6).map(|r| backoff(&s, r).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 60, 60, 60]);
    s.restart_policy.backoff_seconds = 0;
    assert_eq!(backoff(&s, 5).as_secs(), 0);
}

#[test]
fn progress_is_written_only_when_it_changes() {
    let row = Row {
        status: running_status(0, 0),
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Report(Box::new(report(100, 2.34567))),
        ..Row::default()
    };
    let first = run(&row);
    let p = first.status.progress.clone().unwrap();
    assert_eq!(p.report.step, 100);
    assert_eq!(p.report.loss, Some(2.346));
    assert_eq!(p.eta.as_deref(), Some("7m"));
    assert_eq!(p.updated_at, Some(Time(t(100))));
    assert_eq!(p.estimated_completion_time, Some(Time(t(100 + 450))));
    assert!(first.status.is_true(condition::PROGRESS_AVAILABLE));

    // The same report (up to noise below the shown precision) a poll later: no change at all.
    let again = Row {
        status: first.status.clone(),
        progress: ProgressObservation::Report(Box::new(report(100, 2.345671))),
        now: 105,
        ..row
    };
    let second = run(&again);
    assert_eq!(second.status, first.status);
    assert!(second.events.is_empty());

    // The step advanced: written, with a new update time.
    let advanced = Row {
        progress: ProgressObservation::Report(Box::new(report(110, 2.3))),
        now: 110,
        ..again
    };
    let third = run(&advanced);
    let p = third.status.progress.unwrap();
    assert_eq!(p.report.step, 110);
    assert_eq!(p.updated_at, Some(Time(t(110))));
}

#[test]
fn stalled_progress_restarts_the_gang() {
    let mut s = running_status(0, 0);
    s.progress = Some(TrainingProgress {
        report: report::rounded(&report(100, 2.0)),
        updated_at: Some(Time(t(50))),
        ..TrainingProgress::default()
    });
    s.conditions
        .push(cond(condition::PROGRESS_AVAILABLE, true, 20));
    let row = Row {
        spec: |s| s.stall_timeout_seconds = 60,
        status: s,
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Report(Box::new(report(100, 2.0))),
        now: 111,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Restarting);
    assert!(d.status.is_true(condition::STALLED));
    assert_eq!(d.status.last_failure.as_ref().unwrap().reason, "Stalled");
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["Stalled", "RankFailed", "Restarting"]);
    assert_eq!(d.actions, vec![del(0, 0), del(0, 1)]);

    // Within the timeout: requeue at the moment it would stall.
    let early = Row { now: 100, ..row };
    let d = run(&early);
    assert_eq!(d.status.phase, Phase::Running);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(5)));
}

#[test]
fn stall_detection_is_off_without_a_progress_endpoint() {
    let mut s = running_status(0, 0);
    s.conditions
        .push(cond(condition::PROGRESS_AVAILABLE, false, 20));
    let row = Row {
        spec: |s| s.stall_timeout_seconds = 60,
        status: s,
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Unavailable("connection refused".into()),
        now: 10_000,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Running);
    assert!(d.events.is_empty());
}

#[test]
fn bring_your_own_image_without_progress_is_reported_once() {
    let row = Row {
        status: running_status(0, 0),
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Unavailable("connection refused".into()),
        now: 60,
        ..Row::default()
    };
    // Within the grace period (rank 0 started at t=0, grace 120s): nothing yet.
    let d = run(&row);
    assert!(d.events.is_empty());
    assert!(d.status.condition(condition::PROGRESS_AVAILABLE).is_none());

    let late = Row { now: 200, ..row };
    let d = run(&late);
    let reasons: Vec<_> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["ProgressUnavailable"]);
    let c = d.status.condition(condition::PROGRESS_AVAILABLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NoProgressEndpoint")
    );
    assert!(d.status.progress.is_none());

    let later = Row {
        status: d.status.clone(),
        now: 300,
        ..late
    };
    let d2 = run(&later);
    assert!(d2.events.is_empty());
    assert_eq!(d2.status, d.status);
}

#[test]
fn invalid_spec_fails_with_the_reason_and_one_warning() {
    let row = Row {
        problems: vec!["spec.trainer.model.dModel: 250 is not divisible by model.heads 4".into()],
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.actions, vec![]);
    assert_eq!(d.requeue_after, None);
    assert_eq!(d.status.phase, Phase::Failed);
    let c = d.status.condition(condition::FAILED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "InvalidSpec")
    );
    assert_eq!(
        c.message,
        "InvalidSpec: no pods created: spec.trainer.model.dModel: 250 is not divisible by model.heads 4"
    );
    assert_eq!(d.events.len(), 1);
    assert!(d.events[0].warning);
    assert_eq!(d.events[0].reason, "InvalidSpec");
    assert_eq!(
        d.status.last_failure.as_ref().unwrap().reason,
        "InvalidSpec"
    );
    let again = Row {
        status: d.status.clone(),
        ..row
    };
    let d2 = run(&again);
    assert!(d2.events.is_empty());
    assert_eq!(d2.status, d.status);
}

#[test]
fn a_fixed_spec_starts_the_job_that_failed_for_an_invalid_one() {
    let failed = run(&Row {
        problems: vec!["spec.trainer.data.train: is required".into()],
        ..Row::default()
    });
    let fixed = run(&Row {
        status: failed.status.clone(),
        generation: 2,
        now: 200,
        ..Row::default()
    });
    assert_eq!(fixed.status.phase, Phase::Pending);
    assert_eq!(fixed.actions, vec![launch(0, &[0, 1])]);
    assert_eq!(fixed.status.completion_time, None);
    let c = fixed.status.condition(condition::FAILED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SpecChanged")
    );
    // Pods of the failed attempt still around (made from the old spec): a fresh attempt.
    let mut leftover = failed.status.clone();
    leftover.attempt = 3;
    let d = run(&Row {
        status: leftover,
        pods: vec![deleting(pending(3, 0), 90)],
        generation: 2,
        ..Row::default()
    });
    assert_eq!(d.status.attempt, 4);
    assert!(d.actions.is_empty(), "attempt 3's pod is still there");
    let d = run(&Row {
        status: d.status.clone(),
        generation: 2,
        attempt: 4,
        ..Row::default()
    });
    assert_eq!(d.actions, vec![launch(4, &[0, 1])]);
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

#[test]
fn the_killed_rank_is_blamed_over_a_peer_error_of_the_same_second() {
    let row = Row {
        spec: |s| s.replicas = 4,
        status: running_status(0, 0),
        pods: vec![
            exited(
                0,
                0,
                1,
                "rank 3 closed the connection during all-reduce",
                90,
            ),
            exited(
                0,
                1,
                1,
                "rank 3 closed the connection during all-reduce",
                91,
            ),
            running(0, 2),
            exited(0, 3, 137, "", 90),
        ],
        ..Row::default()
    };
    let d = run(&row);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!((f.node_rank, f.exit_code), (Some(3), Some(137)));
    assert_eq!(f.secondary_failures, 2);
    let r = d.status.condition(condition::RESTARTING).unwrap();
    assert_eq!(
        r.message,
        "rank 3 (pod mt-0-3) exited with code 137: Error (2 other pods failed after it)"
    );
}

#[test]
fn a_rank_on_a_lost_node_is_blamed_for_its_peers_failure_within_the_grace() {
    // The node went NotReady at 85; rank 0 noticed its peer gone at 90, before the 60 s
    // grace made the loss a failure of its own.
    let row = Row {
        status: running_status(0, 0),
        pods: vec![
            exited(0, 0, 1, "rank 1 closed the connection", 90),
            node_lost(running(0, 1), 85),
        ],
        ..Row::default()
    };
    let d = run(&row);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!((f.node_rank, f.reason.as_str()), (Some(1), "NodeLost"));
    assert_eq!(f.secondary_failures, 1);
    assert_eq!(d.status.restarts, 1);
}

#[test]
fn a_pod_that_never_started_is_blamed_for_the_rendezvous_timeout_of_its_peer() {
    let row = Row {
        status: starting_status(0, 0),
        pods: vec![
            exited(0, 0, 1, "rendezvous: rank 1 did not join within 300s", 300),
            stuck(0, 1, "Unschedulable", NO_FIT),
        ],
        now: 310,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Restarting);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!((f.node_rank, f.reason.as_str()), (Some(1), "Unschedulable"));
    assert_eq!(f.secondary_failures, 1);
}

#[test]
fn disruptions_spend_no_restart_and_are_counted_by_cause() {
    let mut s = running_status(1, 1);
    s.restarts_by_cause.insert("ExitCode".into(), 1);
    let row = Row {
        status: s,
        pods: vec![
            exited(1, 0, 143, "terminated", 90),
            disrupted(deleting(running(1, 1), 89), "EvictionByEvictionAPI"),
        ],
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Restarting);
    assert_eq!(d.status.restarts, 1);
    let by_cause: Vec<_> = d.status.restarts_by_cause.iter().collect();
    assert_eq!(
        by_cause,
        [
            (&"Disrupted".to_string(), &1),
            (&"ExitCode".to_string(), &1)
        ]
    );
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!((f.node_rank, f.reason.as_str()), (Some(1), "Disrupted"));
    assert_eq!(f.message, "EvictionByEvictionAPI");
    let restarting = d.events.iter().find(|e| e.reason == "Restarting").unwrap();
    assert!(
        restarting.note.contains("not counted against maxRestarts"),
        "{}",
        restarting.note
    );
    // The initial backoff, not the one doubled by the earlier failure.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(10)));
}

#[test]
fn a_restart_clears_the_old_attempts_rate_and_eta_but_keeps_its_step() {
    let mut s = running_status(0, 0);
    s.progress = Some(TrainingProgress {
        report: report::rounded(&report(100, 2.0)),
        eta: Some("7m".into()),
        estimated_completion_time: Some(Time(t(550))),
        updated_at: Some(Time(t(90))),
    });
    let row = Row {
        status: s,
        pods: vec![running(0, 0), exited(0, 1, 137, "", 95)],
        ..Row::default()
    };
    let d = run(&row);
    let p = d.status.progress.clone().unwrap();
    assert_eq!(p.report.step, 100);
    assert_eq!(p.report.loss, Some(2.0));
    assert_eq!(p.report.steps_per_second, None);
    assert_eq!((p.eta, p.estimated_completion_time), (None, None));
    // The new attempt's first report brings them back.
    let mut s = d.status.clone();
    s.phase = Phase::Running;
    s.attempt = 1;
    let d2 = run(&Row {
        status: s,
        pods: vec![running(1, 0), running(1, 1)],
        progress: ProgressObservation::Report(Box::new(report(100, 2.0))),
        now: 200,
        attempt: 1,
        ..Row::default()
    });
    let p = d2.status.progress.unwrap();
    assert_eq!(p.report.steps_per_second, Some(2.0));
    assert_eq!(p.eta.as_deref(), Some("7m"));
}

fn reporting_status() -> DistributedTrainingStatus {
    let mut s = running_status(0, 0);
    s.progress = Some(TrainingProgress {
        report: report::rounded(&report(100, 2.0)),
        eta: Some("7m".into()),
        estimated_completion_time: Some(Time(t(550))),
        updated_at: Some(Time(t(50))),
    });
    s.conditions
        .push(cond(condition::PROGRESS_AVAILABLE, true, 20));
    s
}

#[test]
fn failed_polls_turn_progress_available_unknown_then_false_after_the_grace() {
    let row = Row {
        status: reporting_status(),
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Unavailable(
            "GET http://10.0.0.7:9090/progress: no answer within 2s".into(),
        ),
        ..Row::default()
    };
    let d = run(&row);
    let c = d.status.condition(condition::PROGRESS_AVAILABLE).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", "PollFailed")
    );
    assert!(d.events.is_empty());
    assert_eq!(
        d.status.progress, row.status.progress,
        "a blip clears nothing"
    );

    let late = run(&Row {
        status: d.status.clone(),
        now: 220,
        ..row
    });
    let c = late
        .status
        .condition(condition::PROGRESS_AVAILABLE)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PollsFailing")
    );
    assert!(c.message.contains("no answer within 2s"), "{}", c.message);
    let reasons: Vec<_> = late.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["ProgressUnavailable"]);
    let p = late.status.progress.clone().unwrap();
    assert_eq!(
        (p.report.step, p.report.steps_per_second, p.eta),
        (100, None, None)
    );

    // It answers again: True, and one event says so.
    let back = run(&Row {
        status: late.status.clone(),
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Report(Box::new(report(150, 1.9))),
        now: 230,
        ..Row::default()
    });
    let c = back
        .status
        .condition(condition::PROGRESS_AVAILABLE)
        .unwrap();
    assert_eq!(c.status, "True");
    let reasons: Vec<_> = back.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["ProgressAvailable"]);
}

#[test]
fn failing_polls_never_restart_a_healthy_gang_as_stalled() {
    let mut status = reporting_status();
    for now in [100, 1000, 5000, 10_000] {
        let d = run(&Row {
            spec: |s| s.stall_timeout_seconds = 60,
            status: status.clone(),
            pods: vec![running(0, 0), running(0, 1)],
            progress: ProgressObservation::Unavailable("connection refused".into()),
            now,
            ..Row::default()
        });
        assert_eq!(d.status.phase, Phase::Running, "at {now}");
        assert!(d.actions.is_empty(), "at {now}: {:?}", d.actions);
        status = d.status;
    }
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
fn conditions_keep_their_transition_time_while_unchanged() {
    let mut conditions = vec![];
    set_condition(
        &mut conditions,
        "Running",
        true,
        "A",
        "x".into(),
        t(1),
        Some(1),
    );
    set_condition(
        &mut conditions,
        "Running",
        true,
        "B",
        "y".into(),
        t(5),
        Some(2),
    );
    assert_eq!(conditions[0].last_transition_time, Time(t(1)));
    assert_eq!(
        (
            conditions[0].reason.as_str(),
            conditions[0].observed_generation
        ),
        ("B", Some(2))
    );
    set_condition(
        &mut conditions,
        "Running",
        false,
        "C",
        String::new(),
        t(9),
        Some(2),
    );
    assert_eq!(conditions[0].last_transition_time, Time(t(9)));
    assert_eq!(conditions.len(), 1);
}

#[test]
fn a_refused_pod_create_is_shown_once_then_fails_the_job_at_the_startup_timeout() {
    let quota = "pods \"mt-0-1\" is forbidden: exceeded quota: compute, requested: cpu=8, used: cpu=60, limited: cpu=64";
    let launching = status(Phase::Pending, 0, 0, vec![]);
    let (s, event) = launch_refused(&launching, quota, t(10), Some(1));
    let event = event.unwrap();
    assert!(event.warning);
    assert_eq!(event.reason, "PodCreateRefused");
    assert_eq!(event.note, format!("attempt 0: {quota}"));
    let c = s.condition(condition::CREATED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PodCreateRefused")
    );
    // The same refusal on the next retry: no second event.
    let (s2, again) = launch_refused(&s, quota, t(40), Some(1));
    assert!(again.is_none());
    assert_eq!(s2, s);

    // Within the start-up timeout the launch is retried.
    let row = Row {
        status: s.clone(),
        pods: vec![pending(0, 0)],
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

fn created_message(d: &Decision) -> String {
    let c = d.status.condition(condition::CREATED).unwrap();
    format!("{} {}: {}", c.status, c.reason, c.message)
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
fn a_finished_job_shows_rank_0s_final_report() {
    let mut s = running_status(0, 0);
    s.progress = Some(TrainingProgress {
        report: report::rounded(&report(997, 0.5)),
        eta: Some("2s".into()),
        estimated_completion_time: Some(Time(t(102))),
        updated_at: Some(Time(t(95))),
    });
    let last = Progress {
        phase: TrainerPhase::Finished,
        eval_loss: Some(0.123456),
        eval_step: Some(1000),
        eta_seconds: Some(0.0),
        last_checkpoint: Some(ferrotrain_api::CheckpointInfo {
            step: 1000,
            size_bytes: 4096,
            time: "2026-11-23T12:00:00Z".into(),
            ..Default::default()
        }),
        ..report(1000, 0.25)
    };
    let mut rank0 = exited(0, 0, 0, "", 99);
    rank0.final_report = Some(Box::new(last));
    let d = run(&Row {
        status: s.clone(),
        pods: vec![rank0, exited(0, 1, 0, "", 99)],
        ..Row::default()
    });
    assert_eq!(d.status.phase, Phase::Succeeded);
    let p = d.status.progress.clone().unwrap();
    assert_eq!(p.report.step, 1000);
    assert_eq!(p.report.phase, TrainerPhase::Finished);
    assert_eq!(p.report.eval_loss, Some(0.1235));
    assert_eq!(p.report.last_checkpoint.map(|c| c.step), Some(1000));
    // A finished job has no rate and no ETA.
    assert_eq!(p.report.steps_per_second, None);
    assert_eq!((p.eta, p.estimated_completion_time), (None, None));
    assert_eq!(p.updated_at, Some(Time(t(100))));
    let c = d.status.condition(condition::SUCCEEDED).unwrap();
    assert!(c.message.ends_with("at step 1000"), "{}", c.message);
    assert!(
        d.events[0].note.ends_with("at step 1000"),
        "{}",
        d.events[0].note
    );

    // Without a final report (an image that writes none) the last poll stays, finished.
    let d = run(&Row {
        status: s,
        pods: vec![exited(0, 0, 0, "", 99), exited(0, 1, 0, "", 99)],
        ..Row::default()
    });
    let p = d.status.progress.unwrap();
    assert_eq!(p.report.step, 997);
    assert_eq!(p.report.phase, TrainerPhase::Finished);
    assert_eq!(p.eta, None);
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
    assert_eq!(launcher_stop_grace_seconds(30), 25);
    assert_eq!(launcher_stop_grace_seconds(70), 65);
}

/// A job's life through one killed rank, decision by decision, each on the status the
/// previous one wrote: the ledger in status.recovery records what each attempt cost.
#[test]
fn the_recovery_ledger_follows_a_killed_rank_through_the_restart() {
    let step = |status: &DistributedTrainingStatus, pods: Vec<PodView>, progress, now| {
        run(&Row {
            status: status.clone(),
            pods,
            progress,
            now,
            ..Row::default()
        })
        .status
    };
    let at = |p: Progress, first: i64, resumed: Option<u64>, ckpt: Option<u64>| {
        ProgressObservation::Report(Box::new(Progress {
            attempt_first_step_time: Some(t(first)),
            resumed_from_step: resumed,
            last_checkpoint: ckpt.map(|step| ferrotrain_api::CheckpointInfo {
                step,
                size_bytes: 1,
                time: String::new(),
                blocking_seconds: None,
                save_seconds: None,
            }),
            ..p
        }))
    };
    let none = ProgressObservation::NotPolled;
    // Attempt 0: created at 0, running at 10, first step at 15, step 100 (checkpoint 80) at 60.
    let s = step(
        &DistributedTrainingStatus::default(),
        vec![],
        none.clone(),
        0,
    );
    let s = step(&s, vec![pending(0, 0), pending(0, 1)], none.clone(), 1);
    let s = step(&s, vec![running(0, 0), running(0, 1)], none.clone(), 10);
    let s = step(
        &s,
        vec![running(0, 0), running(0, 1)],
        at(report(5, 3.0), 15, None, None),
        20,
    );
    let reported = at(report(100, 2.0), 15, None, Some(80));
    let s = step(&s, vec![running(0, 0), running(0, 1)], reported, 60);
    // Rank 1 is killed at 70; the operator sees it at 71.
    let s = step(
        &s,
        vec![running(0, 0), exited(0, 1, 137, "", 70)],
        none.clone(),
        71,
    );
    assert_eq!(s.phase, Phase::Restarting);
    let r = s.recovery.clone().unwrap();
    let end = r.attempts[0].end.clone().unwrap();
    assert_eq!(end.cause, ferrotrain_api::recovery::EndCause::Failure);
    assert_eq!((end.rank, end.exit_code), (Some(1), Some(137)));
    assert_eq!(end.node.as_deref(), Some("node-1"));
    assert_eq!((end.failed_at, end.detected_at), (t(70), t(71)));
    assert_eq!(
        r.attempts[0].lost_steps,
        Some(20),
        "estimated from checkpoint 80"
    );
    assert_eq!(r.attempts[0].running_at, Some(t(10)));
    assert_eq!(
        s.last_failure.as_ref().unwrap().node.as_deref(),
        Some("node-1")
    );
    // Attempt 1 starts after the backoff (pods gone), resumes from 80, first step at 212.
    let s = step(&s, vec![], none.clone(), 200);
    assert_eq!((s.attempt, s.phase), (1, Phase::Pending));
    let s = step(&s, vec![running(1, 0), running(1, 1)], none, 210);
    let s = step(
        &s,
        vec![running(1, 0), running(1, 1)],
        at(report(81, 2.0), 212, Some(80), Some(80)),
        213,
    );
    let r = s.recovery.unwrap();
    assert_eq!(r.attempts.len(), 2);
    assert_eq!(r.attempts[1].started_at, t(200));
    assert_eq!(r.attempts[1].seconds_to_first_step(), Some(12.0));
    assert_eq!(r.lost_steps, 20);
    assert_eq!(r.mean_detect_seconds, Some(1.0));
    assert_eq!(
        r.mean_recovery_seconds,
        Some(142.0),
        "failure at 70, next first step at 212"
    );
    assert_eq!(r.ends_by_cause.get("Failure"), Some(&1));
    // Attempt 0 trained from 15 to its last step seen at 60 and kept 80 of 100 steps; the
    // 10 s from there to the failure trained nothing kept. Attempt 1 trained 1 s.
    assert_eq!(r.productive_seconds, 36.0 + 1.0);
    assert_eq!(r.total_seconds, 213.0);
    let goodput = r.goodput_percent.unwrap();
    assert!((goodput - 100.0 * 37.0 / 213.0).abs() < 0.01, "{goodput}");
}

/// A job of two ranks that launched at 0 and ran from 10 (both pods seen bound), through the
/// decisions an operator makes: the status the next reconcile starts from.
fn ran_with_both_pods_seen() -> DistributedTrainingStatus {
    let step = |status: &DistributedTrainingStatus, pods: Vec<PodView>, now| {
        run(&Row {
            status: status.clone(),
            pods,
            now,
            ..Row::default()
        })
        .status
    };
    let s = step(&DistributedTrainingStatus::default(), vec![], 0);
    let s = step(&s, vec![pending(0, 0), pending(0, 1)], 1);
    step(&s, vec![running(0, 0), running(0, 1)], 10)
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
