//! In-place restarts counted from rank 0's report: restarts, causes, the failed rank's node,
//! a ledger record per round, one event, and nothing twice.

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{AttemptEnd, EndCause, RoundEnd};

use crate::fixtures::{report, running, t};
use crate::gang::Action;
use crate::gang::tests::{Row, ran_with_both_pods_seen, run};
use crate::gang::*;

/// Rank 0's report after round `round` ended with rank 1 killed at `at`.
fn after_kill(step: u64, round: u64, at: i64) -> Progress {
    let end = |r: u64| RoundEnd {
        round: r,
        end: AttemptEnd {
            cause: EndCause::Failure,
            reason: "Killed".into(),
            rank: Some(1),
            node_rank: None,
            exit_code: Some(137),
            node: Some("mt-0-1".into()),
            failed_at: t(at),
            detected_at: t(at),
        },
        message: "rank 1 was killed by signal 9 (SIGKILL)".into(),
        last_step: Some(step - 5),
        last_lines: vec!["step 54/100 loss 1.2".into()],
    };
    Progress {
        round: round + 1,
        round_ends: (0..=round).map(end).collect(),
        resumed_from_step: Some(step - 5),
        attempt_first_step_time: Some(t(at + 1)),
        ..report(step, 2.0)
    }
}

fn polled(
    status: ferrotrain_api::crd::DistributedTrainingStatus,
    p: Progress,
    now: i64,
) -> Decision {
    run(&Row {
        status,
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Report(Box::new(p)),
        now,
        ..Row::default()
    })
}

#[test]
fn a_round_that_ended_is_one_restart_with_its_cause_node_and_ledger_record() {
    let d = polled(ran_with_both_pods_seen(), after_kill(60, 0, 50), 52);
    let s = &d.status;
    assert_eq!((s.phase, s.attempt, s.round), (Phase::Running, 0, 1));
    assert_eq!(s.restarts, 1);
    assert_eq!(s.restarts_by_cause.get("Killed"), Some(&1));
    let f = s.last_failure.as_ref().unwrap();
    assert_eq!(
        (
            f.reason.as_str(),
            f.node_rank,
            f.pod.as_deref(),
            f.exit_code
        ),
        ("Killed", Some(1), Some("mt-0-1"), Some(137))
    );
    assert_eq!(f.node.as_deref(), Some("node-1"), "from status.placement");
    assert_eq!(f.message, "rank 1 was killed by signal 9 (SIGKILL)");
    assert_eq!(
        f.last_lines,
        ["step 54/100 loss 1.2"],
        "the killed rank's last words"
    );
    // The pods are kept: no action touches them.
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    let events: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(events, ["RestartedInPlace"]);
    assert!(
        d.events[0]
            .note
            .contains("round 1 of attempt 0 (restart 1/10"),
        "{}",
        d.events[0].note
    );
    assert!(
        d.events[0]
            .note
            .ends_with("; its last line: step 54/100 loss 1.2"),
        "{}",
        d.events[0].note
    );
    let r = s.recovery.as_ref().unwrap();
    assert_eq!(r.attempts.len(), 2, "{r:#?}");
    let end = r.attempts[0].end.as_ref().unwrap();
    assert_eq!(
        (end.reason.as_str(), end.rank, end.node.as_deref()),
        ("Killed", Some(1), Some("node-1"))
    );
    assert_eq!((r.attempts[1].attempt, r.attempts[1].round), (0, Some(1)));
    assert_eq!(
        r.attempts[1].running_at,
        Some(t(50)),
        "the pods kept running"
    );
    assert_eq!(r.attempts[1].first_step_at, Some(t(51)));
    assert_eq!(
        r.mean_recovery_seconds,
        Some(1.0),
        "kill at 50, next step at 51"
    );
}

/// One pod of two ranks (the shape of one GPU node): rank 1 is the pod's second rank. The
/// round's end blames rank 1 (from the launchers' verdict) on pod 0, and the pod is kept.
#[test]
fn one_pod_of_two_ranks_restarts_in_place_and_blames_the_rank_not_the_pod_index() {
    let one_pod = |s: &mut ferrotrain_api::crd::DistributedTrainingSpec| {
        s.replicas = 1;
        s.procs_per_replica = Some(2);
    };
    let step = |status, pods, progress, now| {
        run(&Row {
            spec: one_pod,
            status,
            pods,
            progress,
            now,
            ..Row::default()
        })
    };
    let s = step(
        Default::default(),
        vec![],
        ProgressObservation::NotPolled,
        0,
    )
    .status;
    let s = step(s, vec![running(0, 0)], ProgressObservation::NotPolled, 10).status;
    let p = ProgressObservation::Report(Box::new(after_kill(60, 0, 50)));
    let d = step(s, vec![running(0, 0)], p, 52);
    let s = &d.status;
    assert_eq!(
        (s.phase, s.attempt, s.round, s.restarts),
        (Phase::Running, 0, 1, 1)
    );
    assert!(d.actions.is_empty(), "the pod is kept: {:?}", d.actions);
    let f = s.last_failure.as_ref().unwrap();
    assert_eq!(
        (f.reason.as_str(), f.rank, f.node_rank, f.pod.as_deref()),
        ("Killed", Some(1), Some(0), Some("mt-0-0"))
    );
    let end = s.recovery.as_ref().unwrap().attempts[0]
        .end
        .clone()
        .unwrap();
    assert_eq!((end.rank, end.node_rank), (Some(1), Some(0)));
    assert!(
        d.events[0].note.starts_with("rank 1 (pod mt-0-0)"),
        "{}",
        d.events[0].note
    );
}

#[test]
fn the_steps_a_round_trains_again_are_counted_from_rank_0s_own_record_not_the_last_poll() {
    // The operator last polled step 20 of round 0; rank 0 had completed 64 when the round
    // ended, and round 1 healed from a peer's state at 63: one step (the one in flight) is
    // trained again, not 0 (from the poll) nor 44.
    let seen = polled(ran_with_both_pods_seen(), report(20, 2.0), 30).status;
    let peers = Some(ferrotrain_api::recovery::HealedFrom::Peers);
    let mut p = after_kill(70, 0, 50);
    p.round_ends[0].last_step = Some(64);
    p.resumed_from_step = Some(63);
    p.healed_from = peers;
    let d = polled(seen, p, 52);
    let r = d.status.recovery.as_ref().unwrap();
    assert_eq!(r.attempts[0].last_step, Some(64), "{r:#?}");
    assert_eq!(r.attempts[0].lost_steps, Some(1), "{r:#?}");
    assert_eq!(r.attempts[1].healed_from, peers);
    assert_eq!(r.lost_steps, 1);
}

#[test]
fn a_round_ended_by_a_pod_taken_away_spends_no_restart() {
    let mut p = after_kill(60, 0, 50);
    let end = &mut p.round_ends[0].end;
    (end.cause, end.reason) = (EndCause::Disruption, "PodLeaving".into());
    let d = polled(ran_with_both_pods_seen(), p, 52);
    let s = &d.status;
    assert_eq!(
        (s.restarts, s.round),
        (0, 1),
        "a disruption, as for gang restarts"
    );
    assert_eq!(s.restarts_by_cause.get("PodLeaving"), Some(&1));
    assert!(
        d.events[0].note.contains("a disruption: no restart spent"),
        "{}",
        d.events[0].note
    );
    let r = s.recovery.as_ref().unwrap();
    assert_eq!(
        r.attempts[0].end.as_ref().unwrap().cause,
        EndCause::Disruption
    );
}

#[test]
fn a_round_is_counted_once_however_often_rank_0_reports_it() {
    let first = polled(ran_with_both_pods_seen(), after_kill(60, 0, 50), 52);
    let again = polled(first.status.clone(), after_kill(70, 0, 50), 57);
    assert_eq!((again.status.restarts, again.status.round), (1, 1));
    assert!(again.events.is_empty(), "{:?}", again.events);
    // Round 1 ended too: one more, and only one.
    let next = polled(again.status.clone(), after_kill(90, 1, 80), 82);
    assert_eq!((next.status.restarts, next.status.round), (2, 2));
    assert_eq!(next.status.restarts_by_cause.get("Killed"), Some(&2));
    assert_eq!(next.status.recovery.as_ref().unwrap().attempts.len(), 3);
}

#[test]
fn rounds_counted_in_one_look_tell_their_events_apart() {
    // Rounds 0 and 1 ended between two polls: each restart's event names its own round, so
    // that Kubernetes does not fold the second into the first's series.
    let d = polled(ran_with_both_pods_seen(), after_kill(90, 1, 80), 82);
    assert_eq!(d.status.round, 2);
    let rounds: Vec<Option<i32>> = d
        .events
        .iter()
        .filter(|e| e.reason == reason::RESTARTED_IN_PLACE)
        .map(|e| e.round)
        .collect();
    assert_eq!(rounds, [Some(1), Some(2)], "{:?}", d.events);
}

#[test]
fn a_new_attempt_starts_at_round_0() {
    let d = polled(ran_with_both_pods_seen(), after_kill(60, 0, 50), 52);
    let mut restarting = crate::fixtures::restarting_status(0, d.status.restarts, 60);
    restarting.round = d.status.round;
    let next = run(&Row {
        status: restarting,
        now: 200,
        ..Row::default()
    });
    assert_eq!((next.status.attempt, next.status.round), (1, 0));
}

/// One look at an in-place job ([`in_place_spec`]) from `status`, its pods `pods`, at `now`.
fn in_place(
    status: &ferrotrain_api::crd::DistributedTrainingStatus,
    pods: Vec<PodView>,
    now: i64,
) -> Decision {
    run(&Row {
        spec: in_place_spec,
        status: status.clone(),
        pods,
        now,
        ..Row::default()
    })
}

/// Creates rank `rank`'s pod of attempt 0 again, alone.
fn relaunch(rank: i32) -> Action {
    Action::Launch {
        attempt: 0,
        node_ranks: vec![rank],
    }
}

fn in_place_spec(s: &mut ferrotrain_api::crd::DistributedTrainingSpec) {
    s.restart_policy.in_place = true;
}

#[test]
fn a_deleted_pod_is_replaced_alone_and_the_others_are_left_running() {
    use crate::fixtures::{deleting, exited, running_status};
    // Rank 1's pod is being deleted: wait for it to go, touch nothing else.
    let going = run(&Row {
        spec: in_place_spec,
        status: running_status(0, 0),
        pods: vec![running(0, 0), deleting(running(0, 1), 95)],
        ..Row::default()
    });
    assert_eq!(
        (
            going.status.phase,
            going.status.restarts,
            going.status.attempt
        ),
        (Phase::Starting, 0, 0)
    );
    assert!(going.actions.is_empty(), "{:?}", going.actions);
    let c = going
        .status
        .condition(ferrotrain_api::crd::condition::RUNNING)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PodReplaced")
    );
    assert_eq!(
        going.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        ["PodReplaced"]
    );
    // Its launcher ended by the deletion's SIGTERM (exit 143), the pod not yet gone: still
    // leaving, not a failure of the gang.
    let ended = run(&Row {
        spec: in_place_spec,
        status: going.status.clone(),
        pods: vec![
            running(0, 0),
            deleting(exited(0, 1, 143, "agent: signalled", 97), 95),
        ],
        now: 98,
        ..Row::default()
    });
    assert_eq!(
        (
            ended.status.phase,
            ended.status.restarts,
            ended.status.attempt
        ),
        (Phase::Starting, 0, 0)
    );
    assert!(ended.actions.is_empty(), "{:?}", ended.actions);
    // One that exited with its own error while being deleted failed all the same.
    let own = in_place(
        &going.status,
        vec![running(0, 0), deleting(exited(0, 1, 1, "boom", 97), 95)],
        98,
    );
    assert_eq!(own.status.restarts, 1, "{:?}", own.status.last_failure);
    // Gone: created again alone, under its name.
    let gone = in_place(&ended.status, vec![running(0, 0)], 101);
    assert_eq!(gone.actions, [relaunch(1)]);
    assert!(gone.events.is_empty(), "said once: {:?}", gone.events);
    // The replacement runs: the gang runs again, same attempt.
    let back = in_place(&gone.status, vec![running(0, 0), running(0, 1)], 110);
    assert_eq!(
        (back.status.phase, back.status.attempt),
        (Phase::Running, 0)
    );
}

#[test]
fn losing_node_0s_pod_replaces_it_alone_a_disruption_that_spends_no_restart() {
    use crate::fixtures::running_status;
    // Node 0's pod is gone: the others' launchers wait for its replacement's store.
    let gone = in_place(&running_status(0, 0), vec![running(0, 1)], 100);
    let s = &gone.status;
    assert_eq!(
        (s.phase, s.attempt, s.restarts, s.round),
        (Phase::Starting, 0, 0, 1)
    );
    assert_eq!(s.restarts_by_cause.get("PodLeaving"), Some(&1));
    assert_eq!(s.last_failure.as_ref().unwrap().node_rank, Some(0));
    assert!(
        gone.events
            .iter()
            .any(|e| e.note.contains("a disruption: no restart spent")),
        "{:?}",
        gone.events
    );
    assert_eq!(gone.actions, [relaunch(0)]);
    // Looked at again before the replacement exists: counted once.
    let again = in_place(&gone.status, vec![running(0, 1)], 101);
    assert_eq!(again.status.round, 1);
    assert_eq!(again.status.restarts_by_cause.get("PodLeaving"), Some(&1));
    assert!(again.events.is_empty(), "said once: {:?}", again.events);
    // The replacement runs: the same attempt runs again.
    let back = in_place(&again.status, vec![running(0, 0), running(0, 1)], 110);
    assert_eq!(
        (back.status.phase, back.status.attempt, back.status.restarts),
        (Phase::Running, 0, 0)
    );
}

#[test]
fn node_0s_killed_launcher_is_a_failure_that_spends_a_restart() {
    use crate::fixtures::{exited, running_status};
    let killed = in_place(
        &running_status(0, 0),
        vec![exited(0, 0, 137, "", 99), running(0, 1)],
        100,
    );
    let s = &killed.status;
    assert_eq!((s.restarts, s.round), (1, 1), "{s:?}");
    assert_eq!(s.restarts_by_cause.get("AgentLost"), Some(&1));
    assert_eq!(s.last_failure.as_ref().unwrap().node_rank, Some(0));
}

#[test]
fn a_pod_whose_launcher_was_killed_is_replaced_alone_while_restarts_are_left() {
    use crate::fixtures::{exited, running_status};
    // Its launcher got SIGKILL (or the OOM killer): the pod failed with 137, nothing deleted it.
    let killed = in_place(
        &running_status(0, 0),
        vec![running(0, 0), exited(0, 1, 137, "", 99)],
        100,
    );
    assert_eq!(
        (killed.status.phase, killed.status.attempt),
        (Phase::Starting, 0)
    );
    assert_eq!(killed.actions, [Action::DeletePod("mt-0-1".into())]);
    // Gone: created again under its name; the others' launchers take it into their next round.
    let gone = in_place(&killed.status, vec![running(0, 0)], 101);
    assert_eq!(gone.actions, [relaunch(1)]);
    // A launcher that exits by itself (restarts spent, exit 1) fails the attempt as before;
    // so does a killed one when no restart is left.
    let gave_up = in_place(
        &running_status(0, 0),
        vec![running(0, 0), exited(0, 1, 1, "giving up", 99)],
        100,
    );
    assert_eq!(gave_up.status.phase, Phase::Restarting);
    let spent = run(&Row {
        spec: |s| {
            in_place_spec(s);
            s.restart_policy.max_restarts = 2;
        },
        status: running_status(0, 2),
        pods: vec![running(0, 0), exited(0, 1, 137, "", 99)],
        now: 100,
        ..Row::default()
    });
    assert_eq!(spent.status.phase, Phase::Failed);
}

/// Rank `rank`'s pod as its kubelet leaves it after an eviction for an ephemeral-storage limit
/// at t(`at`): failed, reason Evicted, its launcher ended by the kubelet's SIGTERM (143), no
/// deletion and no DisruptionTarget condition (pkg/kubelet/eviction).
fn evicted_by_kubelet(rank: i32, at: i64) -> PodView {
    let mut pod = crate::fixtures::disrupted(
        crate::fixtures::exited(0, rank, 143, "agent: signalled", at),
        "Evicted",
    );
    let d = pod.disruption.as_mut().unwrap();
    d.message =
        "Pod ephemeral local storage usage exceeds the total limit of containers 100Mi.".into();
    d.since = Some(t(at));
    pod
}

/// Rank 0's report of round 0's end as its launcher saw rank `rank`'s pod go: `reason`
/// (PodLeaving when it said goodbye, AgentLost when the kubelet's SIGKILL came first).
fn round_0_ended_by(rank: i64, cause: EndCause, reason: &str, at: i64) -> Progress {
    let mut p = after_kill(60, 0, at);
    let end = &mut p.round_ends[0];
    (end.end.cause, end.end.reason) = (cause, reason.into());
    (end.end.rank, end.end.exit_code) = (Some(rank), None);
    p
}

#[test]
fn a_pod_its_kubelet_evicted_is_replaced_alone_a_disruption_told_in_the_kubelets_words() {
    let evicted = in_place(
        &ran_with_both_pods_seen(),
        vec![running(0, 0), evicted_by_kubelet(1, 98)],
        100,
    );
    let s = &evicted.status;
    assert_eq!((s.phase, s.attempt, s.restarts), (Phase::Starting, 0, 0));
    assert_eq!(evicted.actions, [Action::DeletePod("mt-0-1".into())]);
    assert_eq!(s.departures.len(), 1, "{:?}", s.departures);
    // Deleted: created again under its name, the departure kept for its round's end.
    let gone = in_place(s, vec![running(0, 0)], 101);
    assert_eq!(gone.actions, [relaunch(1)]);
    assert_eq!(gone.status.departures, s.departures);
    // Whatever its launcher could say (killed before its goodbye: AgentLost, a failure), the
    // round is told as the eviction: no restart, the kubelet's words.
    for (cause, said) in [
        (EndCause::Failure, reason::AGENT_LOST),
        (EndCause::Disruption, reason::POD_LEAVING),
    ] {
        let back = run(&Row {
            spec: in_place_spec,
            status: gone.status.clone(),
            pods: vec![running(0, 0), running(0, 1)],
            progress: ProgressObservation::Report(Box::new(round_0_ended_by(1, cause, said, 98))),
            now: 110,
            ..Row::default()
        });
        let s = &back.status;
        assert_eq!(
            (s.phase, s.attempt, s.restarts, s.round),
            (Phase::Running, 0, 0, 1)
        );
        assert_eq!(
            s.restarts_by_cause.get(reason::DISRUPTED),
            Some(&1),
            "{said}"
        );
        let f = s.last_failure.as_ref().unwrap();
        assert_eq!(f.node_rank, Some(1));
        assert!(
            f.message
                .contains("Evicted: Pod ephemeral local storage usage exceeds"),
            "{}",
            f.message
        );
        let end = s.recovery.as_ref().unwrap().attempts[0]
            .end
            .clone()
            .unwrap();
        assert_eq!(
            (end.cause, end.reason.as_str()),
            (EndCause::Disruption, reason::DISRUPTED)
        );
        assert!(s.departures.is_empty(), "used: {:?}", s.departures);
    }
    // A launcher that exited with its own error in an evicted pod ended the attempt (a gang
    // restart, of a disruption all the same): it was not the eviction that stopped it.
    let mut own = evicted_by_kubelet(1, 98);
    if let PodState::Failed(t) = &mut own.state {
        t.exit_code = Some(1);
    }
    let failed = in_place(&ran_with_both_pods_seen(), vec![running(0, 0), own], 100);
    assert_eq!(failed.status.phase, Phase::Restarting);
    assert!(failed.actions.contains(&Action::DeletePod("mt-0-0".into())));
}

#[test]
fn node_0s_pod_evicted_by_its_kubelet_is_replaced_alone_and_its_round_told_at_once() {
    let evicted = in_place(
        &ran_with_both_pods_seen(),
        vec![evicted_by_kubelet(0, 98), running(0, 1)],
        100,
    );
    let s = &evicted.status;
    assert_eq!(evicted.actions, [Action::DeletePod("mt-0-0".into())]);
    assert_eq!((s.attempt, s.restarts, s.round), (0, 0, 1));
    assert_eq!(s.restarts_by_cause.get(reason::DISRUPTED), Some(&1));
    assert!(s.departures.is_empty(), "{:?}", s.departures);
    let gone = in_place(s, vec![running(0, 1)], 101);
    assert_eq!(gone.actions, [relaunch(0)]);
    assert_eq!(gone.status.round, 1, "counted once");
}

#[test]
fn a_pod_evicted_by_its_kubelet_without_in_place_restarts_is_a_disruption_of_the_gang() {
    use crate::fixtures::running_status;
    let d = run(&Row {
        status: running_status(0, 0),
        pods: vec![running(0, 0), evicted_by_kubelet(1, 98)],
        ..Row::default()
    });
    assert_eq!((d.status.phase, d.status.restarts), (Phase::Restarting, 0));
    assert_eq!(
        d.status.last_failure.as_ref().unwrap().reason,
        reason::DISRUPTED
    );
}

#[test]
fn node_0_on_a_lost_node_or_restarting_the_gang_by_choice_recreates_the_gang() {
    use crate::fixtures::{node_lost, running_status};
    // Behind a partition node 0 could still host a gang of its own: not replaced alone,
    // even where the others may train without a pod.
    let d = run(&Row {
        spec: elastic_spec,
        status: three_running(),
        pods: vec![node_lost(running(0, 0), 0), running(0, 1), running(0, 2)],
        now: 100,
        ..Row::default()
    });
    assert_eq!((d.status.phase, d.status.restarts), (Phase::Restarting, 1));
    // inPlace false: every lost pod restarts the gang, as before.
    let d = run(&Row {
        spec: |s| s.restart_policy.in_place = false,
        status: running_status(0, 0),
        pods: vec![running(0, 0)],
        ..Row::default()
    });
    assert_eq!((d.status.phase, d.status.restarts), (Phase::Restarting, 1));
}

#[test]
fn a_pod_on_a_lost_node_is_replaced_alone_without_elasticity_too_and_force_deleted_at_once() {
    use crate::fixtures::{deleting, node_lost, running_status};
    // Its launcher is fenced (the others' heartbeat ended their round without it; back, it
    // finds its node held by the replacement): no gang restart, no wait for the force grace.
    let in_place = |s: &mut ferrotrain_api::crd::DistributedTrainingSpec| {
        s.restart_policy.in_place = true;
    };
    let lost = run(&Row {
        spec: in_place,
        status: running_status(0, 0),
        pods: vec![running(0, 0), node_lost(running(0, 1), 0)],
        now: 100,
        ..Row::default()
    });
    assert_eq!(
        (lost.status.restarts, lost.status.attempt),
        (0, 0),
        "no gang restart"
    );
    assert_eq!(
        lost.actions,
        [Action::ForceDeletePod("mt-0-1".into())],
        "force-deleted at once, not deleted and then force-deleted"
    );
    assert!(
        lost.events
            .iter()
            .any(|e| e.reason == ferrotrain_api::reason::FORCE_DELETED),
        "{:?}",
        lost.events
    );
    let stuck = run(&Row {
        spec: in_place,
        status: lost.status.clone(),
        pods: vec![running(0, 0), deleting(node_lost(running(0, 1), 0), 100)],
        now: 100,
        ..Row::default()
    });
    assert!(
        stuck
            .actions
            .contains(&Action::ForceDeletePod("mt-0-1".into())),
        "{:?}",
        stuck.actions
    );
    // Evicted from the lost node (the taint manager's NoExecute) before the node-lost grace:
    // replaced alone all the same, force-deleted at once.
    let evicted = run(&Row {
        spec: in_place,
        status: running_status(0, 0),
        pods: vec![running(0, 0), deleting(node_lost(running(0, 1), 60), 62)],
        now: 62,
        ..Row::default()
    });
    assert_eq!(
        (evicted.status.restarts, evicted.status.attempt),
        (0, 0),
        "no gang restart"
    );
    assert!(
        evicted
            .actions
            .contains(&Action::ForceDeletePod("mt-0-1".into())),
        "{:?}",
        evicted.actions
    );
    // Within the node-lost grace it is only a suspect, as before.
    let within = run(&Row {
        spec: in_place,
        status: running_status(0, 0),
        pods: vec![running(0, 0), node_lost(running(0, 1), 80)],
        now: 100,
        ..Row::default()
    });
    assert!(within.actions.is_empty(), "{:?}", within.actions);
}

fn elastic_spec(s: &mut ferrotrain_api::crd::DistributedTrainingSpec) {
    crate::fixtures::elastic(s, 3, 2, None);
    s.startup_timeout_seconds = 60;
}

fn three_running() -> ferrotrain_api::crd::DistributedTrainingStatus {
    ferrotrain_api::crd::DistributedTrainingStatus {
        replicas: 3,
        running_replicas: 3,
        ..crate::fixtures::running_status(0, 0)
    }
}

#[test]
fn elastic_a_replacement_that_cannot_be_placed_waits_while_the_others_train() {
    use crate::fixtures::stuck;
    let mut waiting = stuck(
        0,
        2,
        "Unschedulable",
        "0/2 nodes are available: 1 node(s) were unschedulable",
    );
    waiting.created = Some(crate::fixtures::t(0));
    let d = run(&Row {
        spec: elastic_spec,
        status: three_running(),
        pods: vec![running(0, 0), running(0, 1), waiting],
        // Far past the start-up timeout.
        now: 3600,
        ..Row::default()
    });
    assert_eq!(
        (d.status.phase, d.status.restarts, d.status.attempt),
        (Phase::Running, 0, 0)
    );
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    let running = d.status.condition(condition::RUNNING).expect("Running");
    assert_eq!(
        (running.status.as_str(), running.message.as_str()),
        (
            "True",
            "2 of 3 pods of attempt 0 run; the gang trains without the others (see Resized)"
        )
    );
}

#[test]
fn elastic_a_pod_on_a_lost_node_is_deleted_and_replaced_while_the_others_train() {
    use crate::fixtures::node_lost;
    let d = run(&Row {
        spec: elastic_spec,
        status: three_running(),
        pods: vec![running(0, 0), running(0, 1), node_lost(running(0, 2), 0)],
        now: 100,
        ..Row::default()
    });
    assert_eq!(
        (d.status.restarts, d.status.attempt),
        (0, 0),
        "no gang restart"
    );
    assert!(
        d.actions.contains(&Action::ForceDeletePod("mt-0-2".into())),
        "{:?}",
        d.actions
    );
    // Gone: created again where it fits.
    let again = run(&Row {
        spec: elastic_spec,
        status: d.status.clone(),
        pods: vec![running(0, 0), running(0, 1)],
        now: 170,
        ..Row::default()
    });
    assert!(
        again.actions.contains(&Action::Launch {
            attempt: 0,
            node_ranks: vec![2]
        }),
        "{:?}",
        again.actions
    );
}

#[test]
fn elastic_the_status_says_how_many_ranks_train_and_why_once_each_way() {
    let polled = |status, world: u32, now| {
        run(&Row {
            spec: elastic_spec,
            status,
            pods: vec![running(0, 0), running(0, 1), running(0, 2)],
            progress: ProgressObservation::Report(Box::new(Progress {
                world_size: world,
                ..report(100 + now as u64, 2.0)
            })),
            now,
            ..Row::default()
        })
    };
    let shrunk = polled(three_running(), 2, 100);
    assert_eq!(shrunk.status.current_world_size, Some(2));
    let c = shrunk
        .status
        .condition(ferrotrain_api::crd::condition::RESIZED)
        .unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Shrunk"));
    assert!(c.message.contains("2 of 3 ranks"), "{}", c.message);
    assert!(
        shrunk
            .events
            .iter()
            .any(|e| e.warning && e.reason == "Shrunk")
    );
    let still = polled(shrunk.status.clone(), 2, 105);
    assert!(
        !still.events.iter().any(|e| e.reason == "Shrunk"),
        "said once"
    );
    let whole = polled(still.status.clone(), 3, 110);
    assert_eq!(whole.status.current_world_size, None);
    let c = whole
        .status
        .condition(ferrotrain_api::crd::condition::RESIZED)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "WholeGang")
    );
    assert!(
        whole
            .events
            .iter()
            .any(|e| !e.warning && e.reason == "WholeGang")
    );
}

/// Rank `rank`'s pod of attempt 0 that no node fits.
fn unplaced(rank: i32) -> PodView {
    crate::fixtures::unplaced(0, rank)
}

#[test]
fn elastic_a_new_gang_trains_on_the_pods_that_fit_with_node_0_among_them() {
    use crate::fixtures::starting_status;
    let fits = run(&Row {
        spec: elastic_spec,
        status: starting_status(0, 0),
        pods: vec![running(0, 0), running(0, 1), unplaced(2)],
        // Past the start-up timeout: a pod the gang can do without ends nothing.
        now: 3600,
        ..Row::default()
    });
    assert_eq!(
        (fits.status.phase, fits.status.attempt),
        (Phase::Running, 0)
    );
    assert!(fits.actions.is_empty(), "{:?}", fits.actions);
    // Node 0 hosts the rendezvous: without it nothing trains, whoever else runs.
    let without_0 = run(&Row {
        spec: elastic_spec,
        status: starting_status(0, 0),
        pods: vec![unplaced(0), running(0, 1), running(0, 2)],
        now: 30,
        ..Row::default()
    });
    assert_eq!(without_0.status.phase, Phase::Starting);
    let late = run(&Row {
        spec: elastic_spec,
        status: starting_status(0, 0),
        pods: vec![unplaced(0), running(0, 1), running(0, 2)],
        now: 3600,
        ..Row::default()
    });
    assert_eq!(
        crate::gang::tests::restart_blaming(&late),
        (1, Some(0), "Unschedulable"),
        "node 0 not placed within startupTimeoutSeconds ends the attempt: {:?}",
        late.status
    );
}

#[test]
fn elastic_training_ends_with_node_0_whatever_pods_never_found_a_place() {
    let node_0_done = || {
        let mut p = crate::fixtures::exited(0, 0, 0, "", 90);
        p.ended_at = Some(t(90));
        p
    };
    let finishing = |pods: Vec<PodView>, now: i64| {
        run(&Row {
            spec: elastic_spec,
            status: three_running(),
            pods,
            now,
            ..Row::default()
        })
    };
    // The members end after node 0: the one placed waits for them, not for the unplaced.
    let members = finishing(
        vec![
            node_0_done(),
            crate::fixtures::exited(0, 1, 0, "", 91),
            unplaced(2),
        ],
        100,
    );
    assert_eq!(members.status.phase, Phase::Succeeded);
    assert!(
        members
            .actions
            .contains(&Action::DeletePod("mt-0-2".into()))
    );
    let ending = finishing(vec![node_0_done(), running(0, 1), unplaced(2)], 100);
    assert_eq!(ending.status.phase, Phase::Running, "rank 1 is ending");
    assert!(ending.actions.is_empty(), "{:?}", ending.actions);
    assert_eq!(
        ending.requeue_after,
        Some(std::time::Duration::from_secs(30)),
        "at 40 s after node 0"
    );
    // One that does not end within 40 s is stopped.
    let d = finishing(vec![node_0_done(), running(0, 1), unplaced(2)], 130);
    assert_eq!(d.status.phase, Phase::Succeeded);
    let done = d.status.condition(condition::SUCCEEDED).expect("Succeeded");
    assert_eq!(
        done.message,
        "1 of 3 pods (node 0's among them; the others stopped) of attempt 0 exited 0"
    );
    for pod in ["mt-0-1", "mt-0-2"] {
        assert!(
            d.actions.contains(&Action::DeletePod(pod.into())),
            "{pod}: {:?}",
            d.actions
        );
    }
    // Not elastic: every pod's own exit counts.
    let whole = run(&Row {
        spec: in_place_spec,
        status: crate::fixtures::running_status(0, 0),
        pods: vec![crate::fixtures::exited(0, 0, 0, "", 90), running(0, 1)],
        now: 100,
        ..Row::default()
    });
    assert_eq!(whole.status.phase, Phase::Running);
}

/// A gang asked at 2 pods that may grow to 4 (min 1).
fn growing_spec(s: &mut ferrotrain_api::crd::DistributedTrainingSpec) {
    crate::fixtures::elastic(s, 2, 1, Some(4));
}

#[test]
fn a_gang_that_may_grow_creates_max_replicas_pods_trains_on_those_placed_and_says_it_grew() {
    let created = run(&Row {
        spec: growing_spec,
        ..Row::default()
    });
    assert_eq!(
        created.actions,
        vec![crate::gang::tests::launch(0, &[0])],
        "node 0's pod first"
    );
    let placed = run(&Row {
        spec: growing_spec,
        status: created.status.clone(),
        pods: vec![crate::fixtures::pending(0, 0)],
        ..Row::default()
    });
    assert_eq!(
        placed.actions,
        vec![crate::gang::tests::launch(0, &[1, 2, 3])]
    );
    let mut grown = crate::fixtures::running_status(0, 0);
    grown.replicas = 4;
    let d = run(&Row {
        spec: growing_spec,
        status: grown,
        pods: vec![running(0, 0), running(0, 1), running(0, 2), unplaced(3)],
        progress: ProgressObservation::Report(Box::new(Progress {
            world_size: 3,
            ..report(200, 2.0)
        })),
        now: 3600,
        ..Row::default()
    });
    assert_eq!((d.status.phase, d.status.attempt), (Phase::Running, 0));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    let running = d.status.condition(condition::RUNNING).unwrap();
    assert_eq!(
        running.message,
        "3 of 4 pods of attempt 0 run; the gang trains without the others (see Resized)"
    );
    let resized = d.status.condition(condition::RESIZED).unwrap();
    assert_eq!(
        (resized.status.as_str(), resized.reason.as_str()),
        ("True", "Grown")
    );
    assert_eq!(d.status.current_world_size, Some(3));
}
