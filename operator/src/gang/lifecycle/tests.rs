//! The phases of a job: suspend and resume, a fixed spec, the restart backoff, maxRestarts,
//! the deadline, success, ttlSecondsAfterFinished, and the ledger of what each attempt cost.

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase, RestartPolicy, condition};
use ferrotrain_api::{Progress, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::fixtures::{
    cond, deleting, exited, pending, report, running, running_status, spec, status, t,
};
use crate::gang::tests::{Row, del, launch, run};
use crate::gang::*;

/// Rows of the table of every decision ([`crate::gang::tests`]).
pub(in crate::gang) fn rows() -> Vec<Row> {
    vec![
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
