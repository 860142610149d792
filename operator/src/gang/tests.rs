//! The gang state machine, one table row per situation: [`table`] runs every row of every
//! concern (each concern's rows are in its own tests.rs), and
//! [`every_decision_is_idempotent_when_replayed_on_its_own_status`] replays each.

use ferrotrain_api::crd::{DistributedTrainingSpec, DistributedTrainingStatus, Phase};

use super::*;
use crate::fixtures::{NAME, pending, running, running_status, spec, t};

/// One situation and what must come out of it.
pub(super) struct Row {
    pub(super) name: &'static str,
    pub(super) spec: fn(&mut DistributedTrainingSpec),
    pub(super) status: DistributedTrainingStatus,
    pub(super) pods: Vec<PodView>,
    pub(super) progress: ProgressObservation,
    pub(super) problems: Vec<String>,
    pub(super) now: i64,
    pub(super) generation: i64,
    /// Why the controller's last launch stopped, if it did.
    pub(super) launch_stop: Option<LaunchStop>,
    // expectations
    pub(super) phase: Phase,
    pub(super) attempt: i32,
    pub(super) restarts: i32,
    pub(super) actions: Vec<Action>,
    pub(super) events: Vec<&'static str>,
    pub(super) requeue: Option<u64>,
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
            launch_stop: None,
            phase: Phase::Pending,
            attempt: 0,
            restarts: 0,
            actions: Vec::new(),
            events: Vec::new(),
            requeue: None,
        }
    }
}

pub(super) fn run(row: &Row) -> Decision {
    run_with(row, &crate::scheduling::GangMode::Off)
}

/// [`run`] with the pods scheduled as `gang` says.
pub(super) fn run_with(row: &Row, gang: &crate::scheduling::GangMode) -> Decision {
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
        gang,
        launch_stop: row.launch_stop.as_ref(),
    })
}

/// The restarts a decision counted, and the node rank and reason its lastFailure blames.
pub(super) fn restart_blaming(d: &Decision) -> (i32, Option<i32>, &str) {
    let failure = d.status.last_failure.as_ref().expect("lastFailure");
    (
        d.status.restarts,
        failure.node_rank,
        failure.reason.as_str(),
    )
}

pub(super) fn del(attempt: i32, rank: i32) -> Action {
    Action::DeletePod(crate::labels::pod_name(NAME, attempt, rank))
}

pub(super) fn launch(attempt: i32, ranks: &[i32]) -> Action {
    Action::Launch {
        attempt,
        node_ranks: ranks.to_vec(),
    }
}

/// Every row: the decider's own, then each concern's.
fn rows() -> Vec<Row> {
    let own = vec![Row {
        name: "stale status (pods of a newer attempt): wait for the cache",
        status: running_status(0, 0),
        pods: vec![running(1, 0), running(1, 1)],
        phase: Phase::Running,
        requeue: Some(1),
        ..Row::default()
    }];
    [
        own,
        launch::tests::rows(),
        census::tests::rows(),
        failure::tests::rows(),
        lifecycle::tests::rows(),
    ]
    .into_iter()
    .flatten()
    .collect()
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

/// A job of two ranks that launched at 0 and ran from 10 (both pods seen bound), through the
/// decisions an operator makes: the status the next reconcile starts from.
pub(super) fn ran_with_both_pods_seen() -> DistributedTrainingStatus {
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
