use super::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn report(step: u64, resumed: u64, first: i64, ckpt: Option<u64>) -> StepReport {
    StepReport {
        round: 0,
        step,
        resumed_from_step: Some(resumed),
        first_step_at: Some(t(first)),
        checkpoint_step: ckpt,
        skipped_steps: 0,
        healed_from: None,
        world_size: None,
    }
}

/// `rep` as a report of round `round`.
fn in_round(round: u64, rep: StepReport) -> StepReport {
    StepReport { round, ..rep }
}

fn failure(at: i64, seen: i64) -> AttemptEnd {
    AttemptEnd {
        cause: EndCause::Failure,
        reason: "ExitCode".into(),
        rank: Some(1),
        node_rank: None,
        exit_code: Some(137),
        node: Some("node-a".into()),
        failed_at: t(at),
        detected_at: t(seen),
    }
}

/// Attempt 0 trains 100 s from step 0 to 100 (checkpoint at 80) and dies; attempt 1
/// starts 10 s later, resumes from 80, takes its first step 5 s after its start and
/// trains to 200 in 120 s.
fn two_attempts() -> Recovery {
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.running(t(2));
    r.report(report(100, 0, 10, Some(80)), t(110));
    r.end(failure(110, 111));
    r.start(1, t(120));
    r.running(t(121));
    r.report(report(81, 80, 125, Some(80)), t(126));
    r.report(report(200, 80, 125, Some(200)), t(245));
    r
}

#[test]
fn failures_in_a_row_start_again_after_an_attempt_that_saved_a_checkpoint() {
    let mut r = Recovery::default();
    assert_eq!(r.failures_in_a_row(false), None, "nothing known");
    r.start(0, t(0));
    r.report(report(5, 0, 1, None), t(2));
    r.end(failure(3, 4));
    assert_eq!(
        r.failures_in_a_row(false),
        Some(1),
        "a first attempt that saved nothing"
    );
    let mut r = Recovery::default();
    // Attempt 0 saved step 80, then died: one failure.
    r.start(0, t(0));
    r.report(report(100, 0, 10, Some(80)), t(110));
    r.end(failure(110, 111));
    assert_eq!(r.failures_in_a_row(false), Some(1));
    // Attempts 1 and 2 die before saving anything past 80: two, then three in a row.
    for (attempt, at) in [(1, 120), (2, 140)] {
        r.start(attempt, t(at));
        r.report(report(85, 80, at + 5, Some(80)), t(at + 6));
        r.end(failure(at + 7, at + 8));
    }
    assert_eq!(r.failures_in_a_row(false), Some(3));
    // Attempt 3 saves step 120 before it dies: the count starts again.
    r.start(3, t(200));
    r.report(report(130, 80, 205, Some(120)), t(260));
    r.end(failure(261, 262));
    assert_eq!(r.failures_in_a_row(false), Some(1));
}

#[test]
fn where_the_ranks_leave_their_state_a_round_that_stepped_kept_its_training() {
    // Checkpoints every 1000 steps; each round resumes from the last one's state.
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(300, 0, 10, None), t(100));
    r.end(failure(100, 100));
    r.start(1, t(101));
    r.report(report(600, 300, 102, None), t(200));
    r.end(failure(200, 200));
    assert_eq!(
        r.failures_in_a_row(true),
        Some(1),
        "both trained, and it was kept"
    );
    assert_eq!(
        r.failures_in_a_row(false),
        Some(2),
        "without healing nothing was kept"
    );
    // A round that fails before its first step keeps nothing: then the backoff grows.
    for (attempt, at) in [(2, 201), (3, 210)] {
        r.start(attempt, t(at));
        r.report(report(600, 600, at + 1, None), t(at + 2));
        r.end(failure(at + 3, at + 3));
    }
    assert_eq!(r.failures_in_a_row(true), Some(3));
}

#[test]
fn the_steps_trained_again_are_counted_from_the_ranks_own_record_not_the_last_poll() {
    // The supervisor last polled step 344; rank 0 had completed 364 when the round
    // ended (its own record), and the next round healed from a peer at 363.
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(344, 0, 10, Some(300)), t(60));
    r.reached(364);
    r.reached(350);
    r.end(failure(62, 62));
    assert_eq!(r.attempts[0].last_step, Some(364), "the later step stands");
    r.start_round(0, 1, t(62));
    let healed = StepReport {
        healed_from: Some(HealedFrom::Peers),
        ..in_round(1, report(365, 363, 63, Some(300)))
    };
    r.report(healed, t(63));
    assert_eq!(r.attempts[0].lost_steps, Some(1), "only the step in flight");
    assert_eq!(r.attempts[1].healed_from, Some(HealedFrom::Peers));
    assert_eq!(r.lost_steps, 1);
}

#[test]
fn the_restart_wait_doubles_with_failures_in_a_row_up_to_the_cap() {
    let s = Duration::from_secs;
    let waits: Vec<u64> = (0..=6)
        .map(|n| restart_wait(s(10), s(60), n).as_secs())
        .collect();
    assert_eq!(waits, [10, 10, 20, 40, 60, 60, 60]);
    assert_eq!(restart_wait(s(10), s(0), 4), s(10), "a cap below the start");
    assert_eq!(restart_wait(s(0), s(60), 9), s(0));
    assert_eq!(restart_wait(s(1), s(86400), u32::MAX), s(86400));
}

#[test]
fn skipped_fp16_steps_are_counted_and_not_productive() {
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(50, 0, 10, None), t(60));
    r.report(
        StepReport {
            skipped_steps: 4,
            ..report(100, 0, 10, Some(100))
        },
        t(110),
    );
    // 100 s of training, 4 of 100 steps skipped.
    assert_eq!(r.attempts[0].skipped_steps, 4);
    assert_eq!(r.attempts[0].productive_seconds, 96.0);
    assert_eq!(r.skipped_steps, 4);
    r.end(failure(110, 111));
    r.start(1, t(120));
    r.report(
        StepReport {
            skipped_steps: 1,
            ..report(150, 100, 125, Some(150))
        },
        t(175),
    );
    assert_eq!(r.skipped_steps, 5, "every attempt's own count, summed");
}

#[test]
fn a_killed_attempt_costs_its_steps_since_the_checkpoint_and_the_restart_time() {
    let r = two_attempts();
    let a0 = &r.attempts[0];
    assert_eq!(a0.lost_steps, Some(20));
    // 100 s of training, 80 of 100 steps kept.
    assert_eq!(a0.productive_seconds, 80.0);
    assert_eq!(a0.end.as_ref().unwrap().detect_seconds(), 1.0);
    let a1 = &r.attempts[1];
    assert_eq!(a1.seconds_to_first_step(), Some(5.0));
    assert_eq!(a1.productive_seconds, 120.0);
    assert_eq!(r.total_seconds, 245.0);
    assert_eq!(r.productive_seconds, 200.0);
    assert_eq!(r.goodput_percent, Some(round3(100.0 * 200.0 / 245.0)));
    assert_eq!(r.lost_steps, 20);
    assert_eq!(r.mean_detect_seconds, Some(1.0));
    // Failure at 110, first step of the next attempt at 125.
    assert_eq!(r.mean_recovery_seconds, Some(15.0));
    assert_eq!(r.ends_by_cause.get("Failure"), Some(&1));
}

#[test]
fn the_next_attempts_resume_point_makes_the_loss_exact() {
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(100, 0, 10, Some(80)), t(110));
    r.end(failure(110, 111));
    assert_eq!(
        r.attempts[0].lost_steps,
        Some(20),
        "estimated from the checkpoint"
    );
    // The newest checkpoint was unreadable: the next attempt resumed from 60.
    r.start(1, t(120));
    r.report(report(61, 60, 125, Some(60)), t(126));
    assert_eq!(r.attempts[0].lost_steps, Some(40));
    assert_eq!(r.lost_steps, 40);
}

#[test]
fn a_success_loses_nothing_and_the_clock_stops_at_the_end() {
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(50, 0, 4, None), t(54));
    r.end(AttemptEnd {
        cause: EndCause::Succeeded,
        reason: "Succeeded".into(),
        rank: None,
        node_rank: None,
        exit_code: None,
        node: None,
        failed_at: t(54),
        detected_at: t(55),
    });
    r.update(t(999));
    assert_eq!(r.lost_steps, 0);
    assert_eq!(r.total_seconds, 55.0);
    assert_eq!(r.productive_seconds, 50.0);
    assert_eq!(
        r.mean_detect_seconds, None,
        "a success is no failure to detect"
    );
}

#[test]
fn the_history_is_bounded_but_the_totals_keep_every_attempt() {
    let mut r = Recovery::default();
    for i in 0..15 {
        let base = i * 100;
        r.start(i, t(base));
        let resumed = 5 * i as u64;
        r.report(
            report(resumed + 10, resumed, base + 5, Some(resumed + 5)),
            t(base + 15),
        );
        r.end(failure(base + 15, base + 16));
    }
    assert_eq!(r.attempts.len(), MAX_ATTEMPTS);
    assert_eq!(r.attempts[0].attempt, 5);
    assert_eq!(r.retired.attempts, 5);
    assert_eq!(r.ends_by_cause.get("Failure"), Some(&15));
    // Every attempt lost 5 steps: the next resumed from its checkpoint, 5 before its end.
    assert_eq!(r.lost_steps, 15 * 5);
    assert_eq!(r.mean_detect_seconds, Some(1.0));
    let json = serde_json::to_string(&r).unwrap();
    let back: Recovery = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
}

#[test]
fn a_restart_of_a_known_attempt_is_not_a_new_one() {
    let mut r = two_attempts();
    let before = r.clone();
    r.start(1, t(300));
    r.update(t(245));
    assert_eq!(r, before);
}

#[test]
fn a_round_that_ended_before_its_first_step_leaves_the_loss_to_the_next_that_resumed() {
    // Round 0 trains to step 84 (checkpoint 61) and fails; round 1 ends before its first
    // step; round 2 resumes from 84, the state round 0's ranks left: nothing was lost.
    let mut r = Recovery::default();
    r.start_round(0, 0, t(0));
    r.report(report(84, 61, 5, Some(61)), t(20));
    r.end(failure(21, 21));
    assert_eq!(
        r.attempts[0].lost_steps,
        Some(23),
        "estimated from the checkpoint"
    );
    r.start_round(0, 1, t(21));
    r.end(failure(22, 22));
    r.start_round(0, 2, t(23));
    r.report(in_round(2, report(85, 84, 24, Some(61))), t(24));
    assert_eq!(
        r.attempts[0].lost_steps,
        Some(0),
        "settled by round 2's resume"
    );
    assert_eq!(r.lost_steps, 0);
}

#[test]
fn each_rounds_world_size_and_the_seconds_trained_at_each_size_are_kept() {
    let mut r = Recovery::default();
    let at = |world: u32, rep: StepReport| StepReport {
        world_size: Some(world),
        ..rep
    };
    // Round 0 trains 10 s on 1 rank (the other pod not placed), round 1 20 s on 2.
    r.start(0, t(0));
    r.report(at(1, report(100, 0, 0, None)), t(10));
    r.end(AttemptEnd {
        cause: EndCause::Stopped,
        reason: "Resized".into(),
        ..failure(10, 10)
    });
    r.start_round(0, 1, t(10));
    r.report(at(2, in_round(1, report(300, 100, 11, None))), t(31));
    assert_eq!(
        (r.attempts[0].world_size, r.attempts[1].world_size),
        (Some(1), Some(2))
    );
    assert_eq!(r.attempts[0].lost_steps, Some(0), "a resize loses nothing");
    let sizes: Vec<(&str, f64)> = r
        .seconds_by_world_size
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(sizes, [("1", 10.0), ("2", 20.0)]);
    // A report that does not say keeps what the round said.
    r.report(in_round(1, report(301, 100, 11, None)), t(32));
    assert_eq!(r.attempts[1].world_size, Some(2));
    // Attempts that leave the history keep their seconds in the totals.
    for i in 1..=MAX_ATTEMPTS as i64 {
        r.start(i, t(100 * i));
        r.report(at(4, report(400, 300, 100 * i, None)), t(100 * i + 1));
    }
    assert_eq!(r.seconds_by_world_size["1"], 10.0);
}

#[test]
fn a_failure_costs_its_detection_the_time_to_the_next_first_step_and_its_steps() {
    let r = two_attempts();
    let cost = r.last_failure_cost().expect("attempt 0 failed");
    assert_eq!(
        cost,
        FailureCost {
            attempt: 0,
            round: 0,
            detect_seconds: 1.0,
            next_round: Some((1, 0)),
            to_next_step: Some(15.0),
            resumed_from: Some((80, None)),
            lost_steps: Some(20),
        }
    );
    // Before the next attempt stepped: detected, not yet recovered.
    let mut waiting = two_attempts();
    waiting.attempts[1].first_step_at = None;
    let cost = waiting.last_failure_cost().unwrap();
    assert_eq!(cost.next_round, Some((1, 0)));
    assert_eq!((cost.to_next_step, cost.resumed_from), (None, None));
    assert_eq!(Recovery::default().last_failure_cost(), None);
}

#[test]
fn a_stop_someone_asked_for_costs_no_recovery_time() {
    // A suspend at 110, resumed an hour later: not a failure the job recovered from.
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(100, 0, 10, Some(100)), t(110));
    r.end(AttemptEnd {
        cause: EndCause::Stopped,
        reason: "Suspended".into(),
        ..failure(110, 110)
    });
    r.start(1, t(3600));
    r.report(report(101, 100, 3610, Some(100)), t(3611));
    r.update(t(3611));
    assert_eq!(r.last_failure_cost(), None);
    assert_eq!(
        (r.mean_detect_seconds, r.mean_recovery_seconds),
        (None, None)
    );
    for cause in [EndCause::Failure, EndCause::Disruption, EndCause::Stall] {
        assert!(cause.is_recovered_from(), "{cause:?}");
    }
    for cause in [EndCause::Succeeded, EndCause::Stopped] {
        assert!(!cause.is_recovered_from(), "{cause:?}");
    }
}

#[test]
fn a_report_of_another_round_or_that_says_nothing_yet_leaves_the_round_alone() {
    // Round 0 trains to step 40 and is killed; round 1 starts. The launcher still serves
    // round 0's last report (round 1's rank 0 has not written one): it is not round 1's.
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(40, 0, 5, None), t(20));
    r.end(failure(21, 21));
    r.start_round(0, 1, t(21));
    r.report(report(40, 0, 5, None), t(22));
    assert_eq!(r.attempts[1].resumed_from_step, None, "round 0's report");
    assert_eq!(r.attempts[0].lost_steps, Some(40), "not settled yet");
    // Round 1's rank 0 before it restored: nothing said of where it starts.
    let empty = StepReport {
        round: 1,
        ..StepReport::default()
    };
    r.report(empty, t(22));
    assert_eq!(r.attempts[1].resumed_from_step, None, "no sign yet");
    r.report(in_round(1, report(41, 40, 23, None)), t(23));
    assert_eq!(r.attempts[1].resumed_from_step, Some(40));
    assert_eq!(
        r.attempts[0].lost_steps,
        Some(0),
        "only its own round's report settles it"
    );
}

#[test]
fn a_round_polled_behind_its_ranks_is_counted_to_the_step_the_next_resumed_from() {
    // Round 0 was last polled at step 421 (t=20); rank 0's pod then went away (t=28) and the
    // next round resumed from its peers at 697: round 0 trained to 697, until it ended.
    let mut r = Recovery::default();
    r.start(0, t(0));
    r.report(report(421, 0, 2, None), t(20));
    r.end(failure(28, 28));
    r.start_round(0, 1, t(28));
    let healed = StepReport {
        healed_from: Some(HealedFrom::Peers),
        ..in_round(1, report(698, 697, 31, None))
    };
    r.report(healed, t(31));
    let round0 = &r.attempts[0];
    assert_eq!(round0.last_step, Some(697));
    assert_eq!(round0.last_step_at, Some(t(28)));
    assert_eq!(round0.lost_steps, Some(0));
    assert_eq!(
        round0.productive_seconds, 26.0,
        "from its first step (2) to its end (28)"
    );
}
