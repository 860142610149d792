//! The gang state machine, one table row per situation.

use super::*;
use ferrotrain_api::crd::RestartPolicy;

const JOB: &str = "mt";

/// T0 + `s` seconds.
fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn spec() -> DistributedTrainingSpec {
    serde_json::from_value(serde_json::json!({
        "replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 1000},
    }))
    .unwrap()
}

fn pod(attempt: i32, rank: i32, state: PodState) -> PodView {
    PodView {
        name: crate::labels::pod_name(JOB, attempt, rank),
        attempt,
        node_rank: rank,
        running_since: matches!(state, PodState::Running).then(|| t(0)),
        state,
        deleting_since: None,
        node_lost_since: None,
    }
}

fn running(attempt: i32, rank: i32) -> PodView {
    pod(attempt, rank, PodState::Running)
}

fn pending(attempt: i32, rank: i32) -> PodView {
    pod(attempt, rank, PodState::Pending)
}

fn exited(attempt: i32, rank: i32, code: i32, message: &str, at: i64) -> PodView {
    pod(
        attempt,
        rank,
        if code == 0 {
            PodState::Succeeded
        } else {
            PodState::Failed(Termination {
                exit_code: Some(code),
                reason: "Error".into(),
                message: message.into(),
                finished_at: Some(t(at)),
            })
        },
    )
}

fn deleting(mut p: PodView, since: i64) -> PodView {
    p.deleting_since = Some(t(since));
    p
}

fn node_lost(mut p: PodView, since: i64) -> PodView {
    p.node_lost_since = Some(t(since));
    p
}

fn cond(type_: &str, status: bool, since: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: "Test".into(),
        message: String::new(),
        last_transition_time: Time(t(since)),
        observed_generation: Some(1),
    }
}

fn status(
    phase: Phase,
    attempt: i32,
    restarts: i32,
    conditions: Vec<Condition>,
) -> DistributedTrainingStatus {
    DistributedTrainingStatus {
        phase,
        attempt,
        restarts,
        start_time: (phase != Phase::Pending || attempt > 0).then(|| Time(t(0))),
        conditions,
        observed_generation: Some(1),
        ..DistributedTrainingStatus::default()
    }
}

fn running_status(attempt: i32, restarts: i32) -> DistributedTrainingStatus {
    status(
        Phase::Running,
        attempt,
        restarts,
        vec![
            cond(condition::CREATED, true, 0),
            cond(condition::RUNNING, true, 10),
        ],
    )
}

fn report(step: u64, loss: f64) -> Progress {
    Progress {
        step,
        total_steps: 1000,
        steps_per_second: Some(2.0),
        loss: Some(loss),
        ..Progress::default()
    }
}

/// One situation and what must come out of it.
struct Row {
    name: &'static str,
    spec: fn(&mut DistributedTrainingSpec),
    status: DistributedTrainingStatus,
    pods: Vec<PodView>,
    progress: ProgressObservation,
    problems: Vec<String>,
    now: i64,
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
        job: JOB,
        generation: Some(1),
        spec: &s,
        status: &row.status,
        pods: &row.pods,
        progress: row.progress.clone(),
        spec_problems: &row.problems,
        timing: &timing,
    })
}

fn del(attempt: i32, rank: i32) -> Action {
    Action::DeletePod(crate::labels::pod_name(JOB, attempt, rank))
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
            actions: vec![Action::ForceDeletePod(crate::labels::pod_name(JOB, 0, 1))],
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
            name: "backoff over: next attempt without waiting for old pods' names",
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
            actions: vec![launch(1, &[0, 1])],
            events: vec!["Created"],
            requeue: Some(30),
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
            name: "old attempts: running pods and pods two attempts back are deleted",
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
            actions: vec![del(1, 0), del(0, 0)],
            requeue: Some(5),
            ..Row::default()
        },
        Row {
            name: "invalid trainer config: no pods, warning",
            problems: vec!["spec.trainer.data.train: is required for task translation".into()],
            events: vec!["InvalidSpec"],
            ..Row::default()
        },
    ]
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
        report: progress::rounded(&report(100, 2.0)),
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
fn invalid_spec_warns_once_and_waits() {
    let row = Row {
        problems: vec!["spec.trainer.model.dModel: 250 is not divisible by model.heads 4".into()],
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.actions, vec![]);
    assert_eq!(d.requeue_after, None);
    let c = d.status.condition(condition::CREATED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InvalidSpec")
    );
    let again = Row {
        status: d.status.clone(),
        ..row
    };
    assert!(run(&again).events.is_empty());
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
