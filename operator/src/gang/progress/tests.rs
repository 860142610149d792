//! Rank 0's progress in the status, ProgressAvailable, stall detection, and the final report.

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase, TrainingProgress, condition};
use ferrotrain_api::{Progress, TrainerPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::fixtures::{cond, exited, report, running, running_status, t};
use crate::gang::tests::{Row, del, run};
use crate::gang::*;
use crate::report;

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

/// spec.pytorch's script that calls no `ferrotrain.report`: the launcher's report says so and
/// changes with the rounds only, which is no stall; once a step is reported, it can stall.
#[test]
fn a_script_that_reports_no_steps_is_never_taken_for_stalled() {
    let silent = Progress {
        no_step_reports: true,
        ..Progress::default()
    };
    let mut s = running_status(0, 0);
    s.progress = Some(TrainingProgress {
        report: report::rounded(&silent),
        updated_at: Some(Time(t(50))),
        ..TrainingProgress::default()
    });
    s.conditions
        .push(cond(condition::PROGRESS_AVAILABLE, true, 20));
    let row = Row {
        spec: |s| s.stall_timeout_seconds = 60,
        status: s,
        pods: vec![running(0, 0), running(0, 1)],
        progress: ProgressObservation::Report(Box::new(silent)),
        now: 10_000,
        ..Row::default()
    };
    let d = run(&row);
    assert_eq!(d.status.phase, Phase::Running);
    assert!(!d.status.is_true(condition::STALLED));
    let reporting = Row {
        progress: ProgressObservation::Report(Box::new(report(100, 2.0))),
        ..row
    };
    let d = run(&reporting);
    assert_eq!(d.status.phase, Phase::Running, "a first report is progress");
    let stored = d.status.progress.unwrap();
    assert!(!stored.report.no_step_reports);
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
fn refused_connections_warn_each_time_they_pass_a_power_of_ten() {
    let polled = |status: DistributedTrainingStatus, refused: &[(&str, u64)]| {
        let mut r = report(100, 2.0);
        r.rejected_connections = refused.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        run(&Row {
            status,
            pods: vec![running(0, 0), running(0, 1)],
            progress: ProgressObservation::Report(Box::new(r)),
            ..Row::default()
        })
    };
    let warnings = |d: &Decision| -> Vec<String> {
        d.events
            .iter()
            .filter(|e| e.warning && e.reason == ferrotrain_api::reason::REJECTED_CONNECTIONS)
            .map(|e| e.note.clone())
            .collect()
    };
    let few = polled(reporting_status(), &[("bad_token", 9)]);
    assert!(warnings(&few).is_empty());
    // 9 -> 12: past 10, one warning naming the reasons.
    let more = polled(
        few.status.clone(),
        &[("bad_token", 10), ("not_ferrotrain", 2)],
    );
    assert_eq!(
        warnings(&more),
        [
            "12 connections to the gang's rendezvous store or ring were refused (bad_token 10, not_ferrotrain 2): something other than this job's ranks connects to them (docs/security.md)"
        ]
    );
    assert_eq!(
        more.status
            .progress
            .as_ref()
            .unwrap()
            .report
            .rejected_connections["bad_token"],
        10
    );
    // 12 -> 99: the same decade, quiet; 99 -> 100: the next one.
    let quiet = polled(more.status.clone(), &[("bad_token", 99)]);
    assert!(warnings(&quiet).is_empty());
    assert_eq!(
        warnings(&polled(quiet.status.clone(), &[("bad_token", 100)])).len(),
        1
    );
}

#[test]
fn failing_saves_are_a_condition_with_the_disks_words_and_an_event_each_way() {
    use ferrotrain_api::CheckpointError;
    let failing = |saves: u64| {
        Progress {
        checkpoint_error: Some(CheckpointError {
            step: 100 + saves * 50,
            message: "writing /checkpoints/copy/.tmp-step-00000200: No space left on device (os error 28)".into(),
            since: t(90),
            failed_saves: saves,
        }),
        ..report(100 + saves * 50, 2.0)
    }
    };
    let poll = |status: DistributedTrainingStatus, p: Progress, now: i64| {
        run(&Row {
            status,
            pods: vec![running(0, 0), running(0, 1)],
            progress: ProgressObservation::Report(Box::new(p)),
            now,
            ..Row::default()
        })
    };
    let quiet = poll(reporting_status(), report(150, 2.0), 100);
    assert!(
        quiet
            .status
            .condition(condition::CHECKPOINTS_SAVED)
            .is_none(),
        "absent while every save completed"
    );
    let first = poll(reporting_status(), failing(1), 100);
    let c = first
        .status
        .condition(condition::CHECKPOINTS_SAVED)
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "CheckpointSaveFailed")
    );
    assert!(
        c.message.contains("No space left on device"),
        "{}",
        c.message
    );
    assert!(c.message.starts_with("1 save(s) failed"), "{}", c.message);
    let warned: Vec<_> = first
        .events
        .iter()
        .filter(|e| e.warning)
        .map(|e| e.reason)
        .collect();
    assert_eq!(warned, ["CheckpointSaveFailed"]);
    // Failing on: the count moves, said once.
    let second = poll(first.status.clone(), failing(2), 105);
    assert!(second.events.is_empty(), "{:?}", second.events);
    let c = second
        .status
        .condition(condition::CHECKPOINTS_SAVED)
        .unwrap();
    assert!(c.message.starts_with("2 save(s) failed"), "{}", c.message);
    // A save completes: True again, a Normal event.
    let mut saved = report(250, 2.0);
    saved.last_checkpoint = Some(ferrotrain_api::CheckpointInfo {
        step: 250,
        ..Default::default()
    });
    let back = poll(second.status.clone(), saved, 110);
    let c = back.status.condition(condition::CHECKPOINTS_SAVED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "CheckpointSaved")
    );
    assert!(c.message.contains("step 250"), "{}", c.message);
    assert_eq!(
        back.events
            .iter()
            .map(|e| (e.warning, e.reason))
            .collect::<Vec<_>>(),
        [(false, "CheckpointSaved")]
    );
}
