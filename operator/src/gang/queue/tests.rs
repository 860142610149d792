//! Condition GangScheduling, phase Queued, the admission and the queue timeout.

use ferrotrain_api::crd::{Phase, condition};

use crate::fixtures::{exited, pending, starting_status, status};
use crate::gang::tests::{Row, run_with};
use crate::gang::*;
use crate::scheduling::{GangMode, NativeApi};

fn kueue() -> GangMode {
    GangMode::Kueue {
        queue: "team-a".into(),
    }
}

/// A pod of attempt 0 held by Kueue's admission gate.
fn gated(rank: i32) -> PodView {
    let mut p = pending(0, rank);
    p.node = None;
    p.waiting = Some(Waiting {
        cause: WaitCause::Queued,
        reason: "SchedulingGated".into(),
        message: "held by scheduling gates kueue.x-k8s.io/admission".into(),
    });
    p
}

fn queued_row(now: i64) -> Row {
    Row {
        spec: |s| s.startup_timeout_seconds = 60,
        status: starting_status(0, 0),
        pods: vec![gated(0), gated(1)],
        now,
        ..Row::default()
    }
}

#[test]
fn gated_pods_make_the_job_queued_with_the_gate_and_queue_once() {
    let d = run_with(&queued_row(10), &kueue());
    assert_eq!(d.status.phase, Phase::Queued);
    let running = d.status.condition(condition::RUNNING).unwrap();
    assert_eq!(
        (running.status.as_str(), running.reason.as_str()),
        ("False", "Queued")
    );
    assert_eq!(
        running.message,
        "attempt 0: 2 of 2 pods wait to be admitted (LocalQueue team-a): held by scheduling gates kueue.x-k8s.io/admission"
    );
    assert!(d.status.is_true(condition::QUEUED));
    let events: Vec<(bool, &str)> = d.events.iter().map(|e| (e.warning, e.reason)).collect();
    assert!(events.contains(&(false, "Queued")), "{events:?}");
    // Polled again: nothing new to say.
    let again = run_with(
        &Row {
            status: d.status.clone(),
            ..queued_row(20)
        },
        &kueue(),
    );
    assert!(
        !again.events.iter().any(|e| e.reason == "Queued"),
        "{:?}",
        again.events
    );
}

#[test]
fn the_startup_timeout_does_not_run_while_queued_and_counts_from_the_admission() {
    // Queued for an hour, far past the 60 s start-up timeout: no restart, no failure.
    let d = run_with(&queued_row(3600), &kueue());
    assert_eq!((d.status.phase, d.status.restarts), (Phase::Queued, 0));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    // Admitted at 3600: the pods now wait for the scheduler; the clock starts there.
    let mut unschedulable = pending(0, 0);
    unschedulable.waiting = Some(Waiting {
        cause: WaitCause::Unschedulable,
        reason: "Unschedulable".into(),
        message: "0/2 nodes are available".into(),
    });
    let admitted = run_with(
        &Row {
            status: d.status.clone(),
            pods: vec![unschedulable.clone(), pending(0, 1)],
            now: 3601,
            ..queued_row(3601)
        },
        &kueue(),
    );
    let q = admitted.status.condition(condition::QUEUED).unwrap();
    assert_eq!(
        (q.status.as_str(), q.reason.as_str()),
        ("False", "Admitted")
    );
    assert_eq!(admitted.status.phase, Phase::Starting);
    let within = run_with(
        &Row {
            status: admitted.status.clone(),
            pods: vec![unschedulable.clone(), pending(0, 1)],
            now: 3650,
            ..queued_row(3650)
        },
        &kueue(),
    );
    assert_eq!(within.status.restarts, 0, "50 s after its admission");
    let past = run_with(
        &Row {
            status: admitted.status.clone(),
            pods: vec![unschedulable, pending(0, 1)],
            now: 3662,
            ..queued_row(3662)
        },
        &kueue(),
    );
    assert_eq!(past.status.restarts, 1, "61 s after its admission");
}

#[test]
fn a_job_that_finishes_between_two_looks_says_it_was_admitted() {
    // Seen Queued, then next seen with every pod done: Succeeded, and Queued False (Admitted).
    let queued = run_with(&queued_row(10), &kueue());
    assert!(queued.status.is_true(condition::QUEUED));
    let done = run_with(
        &Row {
            status: queued.status.clone(),
            pods: vec![exited(0, 0, 0, "", 40), exited(0, 1, 0, "", 40)],
            ..queued_row(45)
        },
        &kueue(),
    );
    assert_eq!(done.status.phase, Phase::Succeeded);
    let c = done.status.condition(condition::QUEUED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "Admitted")
    );
}

#[test]
fn a_queue_timeout_fails_the_job_with_its_reason() {
    let row = Row {
        spec: |s| s.scheduling.queue_timeout_seconds = Some(300),
        ..queued_row(299)
    };
    let before = run_with(&row, &kueue());
    assert_eq!(before.status.phase, Phase::Queued);
    let d = run_with(
        &Row {
            now: 300,
            status: before.status.clone(),
            ..row
        },
        &kueue(),
    );
    assert_eq!(d.status.phase, Phase::Failed);
    let f = d.status.last_failure.clone().unwrap();
    assert_eq!(f.reason, "QueueTimeout");
    assert!(f.message.contains("queueTimeoutSeconds"), "{}", f.message);
    assert_eq!(
        d.status.condition(condition::FAILED).unwrap().reason,
        "QueueTimeout"
    );
    // Never admitted: Queued stays True, also once its gated pods are gone.
    assert!(d.status.is_true(condition::QUEUED));
    let gone = run_with(
        &Row {
            spec: |s| s.scheduling.queue_timeout_seconds = Some(300),
            status: d.status.clone(),
            pods: vec![],
            ..queued_row(310)
        },
        &kueue(),
    );
    assert_eq!(gone.status.phase, Phase::Failed);
    assert!(gone.status.is_true(condition::QUEUED));
}

#[test]
fn gang_scheduling_says_once_how_the_pods_are_placed_or_why_not() {
    let fresh = Row {
        status: status(Phase::Pending, 0, 0, vec![]),
        ..Row::default()
    };
    let native = run_with(&fresh, &GangMode::Native(NativeApi::V1alpha2));
    let c = native.status.condition(condition::GANG_SCHEDULING).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NativePodGroup")
    );
    assert!(!native.events.iter().any(|e| e.reason == "NativePodGroup"));

    let fallback = run_with(&fresh, &GangMode::NotServed { asked: false });
    let c = fallback
        .status
        .condition(condition::GANG_SCHEDULING)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NativeApiNotServed")
    );
    let said: Vec<(bool, &str)> = fallback
        .events
        .iter()
        .map(|e| (e.warning, e.reason))
        .filter(|(_, r)| *r == "NativeApiNotServed")
        .collect();
    assert_eq!(
        said,
        [(false, "NativeApiNotServed")],
        "a Normal event: the default fell back"
    );
    let asked = run_with(&fresh, &GangMode::NotServed { asked: true });
    assert!(
        asked
            .events
            .iter()
            .any(|e| e.warning && e.reason == "NativeApiNotServed")
    );
    // Said once: the next decision from that status says nothing again.
    let again = run_with(
        &Row {
            status: fallback.status.clone(),
            ..Row::default()
        },
        &GangMode::NotServed { asked: false },
    );
    assert!(
        !again
            .events
            .iter()
            .any(|e| e.reason == "NativeApiNotServed")
    );
    // Off by choice: no condition at all.
    let off = run_with(&fresh, &GangMode::Off);
    assert!(off.status.condition(condition::GANG_SCHEDULING).is_none());
}
