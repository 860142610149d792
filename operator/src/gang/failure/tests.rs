//! Which failure ends an attempt, whether it is permanent, a disruption, and which rank is
//! blamed when several fail.

use std::time::Duration;

use ferrotrain_api::crd::{Phase, condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::fixtures::{
    NO_FIT, deleting, disrupted, exited, node_lost, pod_view, running, running_status,
    starting_status, stuck, t,
};
use crate::gang::tests::{Row, del, run};
use crate::gang::*;

/// Rows of the table of every decision ([`crate::gang::tests`]).
pub(in crate::gang) fn rows() -> Vec<Row> {
    vec![
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

/// Attempts 0..=2 each failed; `saved` says which of them saved a checkpoint of its own.
fn ledger(saved: [bool; 3]) -> ferrotrain_api::Recovery {
    use ferrotrain_api::recovery::{AttemptEnd, EndCause, StepReport};
    let mut r = ferrotrain_api::Recovery::default();
    for (attempt, saved) in saved.into_iter().enumerate() {
        let from = 100 * attempt as u64;
        r.start(attempt as i64, t(attempt as i64 * 10));
        let report = StepReport {
            round: 0,
            step: from + 60,
            resumed_from_step: Some(from),
            first_step_at: None,
            checkpoint_step: Some(if saved { from + 50 } else { from }),
            skipped_steps: 0,
            healed_from: None,
            world_size: None,
        };
        r.report(report, t(attempt as i64 * 10 + 5));
        if attempt < 2 {
            r.end(AttemptEnd {
                cause: EndCause::Failure,
                reason: "ExitCode".into(),
                rank: Some(1),
                node_rank: None,
                exit_code: Some(1),
                node: None,
                failed_at: t(attempt as i64 * 10 + 8),
                detected_at: t(attempt as i64 * 10 + 8),
            });
        }
    }
    r
}

#[test]
fn the_backoff_doubles_only_for_failures_in_a_row_that_saved_no_checkpoint() {
    // The third restart (attempt 2 fails; backoff 10 s doubling, at most 300 s).
    let cases = [
        // Attempt 2 saved a checkpoint before it failed: it was training, wait 10 s.
        ([false, false, true], 10),
        // Attempt 1 saved one, attempt 2 did not: the second failure in a row.
        ([false, true, false], 20),
        // None saved anything: the third in a row.
        ([false, false, false], 40),
    ];
    for (saved, wait) in cases {
        let mut status = running_status(2, 2);
        status.recovery = Some(ledger(saved));
        let row = Row {
            status,
            pods: vec![running(2, 0), exited(2, 1, 1, "CUDA error", 90)],
            ..Row::default()
        };
        let d = run(&row);
        assert_eq!(d.status.phase, Phase::Restarting, "{saved:?}");
        assert_eq!(
            d.requeue_after,
            Some(Duration::from_secs(wait)),
            "attempts that saved a checkpoint: {saved:?}"
        );
    }
}
