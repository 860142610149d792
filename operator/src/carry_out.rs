//! The choices carrying out a decision makes, as plain functions of what it has seen (the
//! controller's calls only do what these say): whether the status is written now, what a
//! launch's result means, and what the events and the next look are once a launch stopped.

use std::time::Duration;

use ferrotrain_api::crd::DistributedTrainingStatus;
use ferrotrain_api::reason;
use k8s_openapi::jiff::Timestamp;

use crate::apply::Applied;
use crate::error::Error;
use crate::gang::{EventNote, LaunchStop};

/// Whether a decision's status `after` is written now: when it differs from `before`, at once
/// unless only what every poll moves changed (progress, the ledger's running numbers), which
/// waits for `progress_write_due` (`--progress-write-interval-seconds`).
pub fn write_status(
    before: &DistributedTrainingStatus,
    after: &DistributedTrainingStatus,
    progress_write_due: bool,
) -> bool {
    after != before && (!only_progress_changed(before, after) || progress_write_due)
}

/// Whether `after` differs from `before` only in what every poll of a training job moves:
/// `progress` (a new step, loss, rate) and the recovery ledger's running numbers (last step,
/// productive seconds, goodput). A new ledger record comes with a new attempt or round, which
/// changes more and is written at once.
fn only_progress_changed(
    before: &DistributedTrainingStatus,
    after: &DistributedTrainingStatus,
) -> bool {
    let strip = |s: &DistributedTrainingStatus| DistributedTrainingStatus {
        progress: None,
        recovery: None,
        ..s.clone()
    };
    strip(before) == strip(after)
}

/// What one launch's creates came to.
#[derive(Debug)]
pub enum Created {
    /// Go on with the next launch, with an event to add, if any.
    Next(Option<EventNote>),
    /// Stop the launches here: the next decision says why.
    Stop(LaunchStop),
    /// An error of the reconcile (retried with backoff).
    Error(Error),
}

/// What the result of creating a launch's objects of `attempt` means, at `now`: done, the gang
/// not enforced (an event), a name taken or a pod the API refused (a stop), or an error.
pub fn created(result: crate::error::Result<Applied>, attempt: i32, now: Timestamp) -> Created {
    let stop = |reason, message: String| {
        Created::Stop(LaunchStop {
            attempt,
            reason,
            message,
            at: now,
        })
    };
    match result {
        Ok(Applied::Done) => Created::Next(None),
        Ok(Applied::GangIgnored(message)) => Created::Next(Some(EventNote {
            warning: true,
            reason: reason::SCHEDULING_GROUP_DROPPED,
            note: message,
            round: None,
        })),
        Ok(Applied::NameConflict(message)) => stop(reason::NAME_CONFLICT, message),
        Err(error) if error.is_refused_create() && !error.is_namespace_terminating() => {
            stop(reason::POD_CREATE_REFUSED, error.to_string())
        }
        Err(error) => Created::Error(error),
    }
}

/// The stop of a launch of `attempt` that waits for the checkpoint store's Secret (`message`
/// says which, or which key): nothing was created.
pub fn waits_for_secret(attempt: i32, message: String, now: Timestamp) -> LaunchStop {
    LaunchStop {
        attempt,
        reason: reason::STORE_SECRET_MISSING,
        message,
        at: now,
    }
}

/// A launch that stopped: when nothing was created (a name taken, the Secret missing) the
/// decision's "creating N pods" event would not be true and goes; the next decision shows why
/// at once. Returns when to look again (`requeue`, unchanged without a stop).
pub fn after_launch(
    events: &mut Vec<EventNote>,
    stop: Option<&LaunchStop>,
    requeue: Option<Duration>,
) -> Option<Duration> {
    let Some(stop) = stop else {
        return requeue;
    };
    if matches!(
        stop.reason,
        reason::NAME_CONFLICT | reason::STORE_SECRET_MISSING
    ) {
        events.retain(|e| e.reason != reason::CREATED);
    }
    Some(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{report, running_status, t};
    use ferrotrain_api::crd::TrainingProgress;

    fn note(reason: &'static str) -> EventNote {
        EventNote {
            warning: false,
            reason,
            note: String::new(),
            round: None,
        }
    }

    #[test]
    fn a_status_is_written_at_once_unless_only_progress_moved() {
        let before = running_status(0, 0);
        let progressed = DistributedTrainingStatus {
            progress: Some(TrainingProgress {
                report: report(10, 1.0),
                eta: None,
                estimated_completion_time: None,
                updated_at: None,
            }),
            ..before.clone()
        };
        let restarted = DistributedTrainingStatus {
            restarts: 1,
            ..progressed.clone()
        };
        // (after, progress write due) -> written
        let rows = [
            (&before, true, false),
            (&progressed, false, false),
            (&progressed, true, true),
            (&restarted, false, true),
        ];
        for (after, due, want) in rows {
            assert_eq!(write_status(&before, after, due), want, "due {due}");
        }
    }

    #[test]
    fn a_launchs_result_goes_on_stops_or_fails_the_reconcile() {
        let at = t(5);
        assert!(matches!(
            created(Ok(Applied::Done), 2, at),
            Created::Next(None)
        ));
        let Created::Next(Some(n)) = created(Ok(Applied::GangIgnored("dropped".into())), 2, at)
        else {
            panic!("an event")
        };
        assert_eq!(
            (n.reason, n.warning),
            (reason::SCHEDULING_GROUP_DROPPED, true)
        );
        let Created::Stop(stop) = created(Ok(Applied::NameConflict("taken".into())), 2, at) else {
            panic!("a stop")
        };
        assert_eq!(
            (stop.attempt, stop.reason, stop.message.as_str(), stop.at),
            (2, reason::NAME_CONFLICT, "taken", at)
        );
        let answer = |code: u16, message: &str| {
            let status: kube::core::Status = serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": message
            }))
            .unwrap();
            crate::error::api_err("create", "Pod", "mt-2-0")(kube::Error::Api(Box::new(
                status.with_code(code),
            )))
        };
        let Created::Stop(quota) = created(Err(answer(403, "exceeded quota: gpus")), 2, at) else {
            panic!("a refused pod stops the launch")
        };
        assert_eq!(quota.reason, reason::POD_CREATE_REFUSED);
        assert!(
            quota.message.contains("exceeded quota"),
            "{}",
            quota.message
        );
        let busy = created(Err(answer(500, "etcd timeout")), 2, at);
        assert!(matches!(busy, Created::Error(_)), "retried: {busy:?}");
    }

    #[test]
    fn a_launch_that_created_nothing_takes_back_its_created_event_and_looks_again_at_once() {
        let thirty = Some(Duration::from_secs(30));
        let mut events = vec![note(reason::CREATED), note(reason::RUNNING)];
        assert_eq!(after_launch(&mut events, None, thirty), thirty);
        assert_eq!(events.len(), 2, "no stop: nothing changes");
        for (reason, kept) in [
            (reason::NAME_CONFLICT, 1),
            (reason::STORE_SECRET_MISSING, 1),
            (reason::POD_CREATE_REFUSED, 2),
        ] {
            let mut events = vec![note(reason::CREATED), note(reason::RUNNING)];
            let stop = LaunchStop {
                attempt: 0,
                reason,
                message: String::new(),
                at: t(1),
            };
            let next = after_launch(&mut events, Some(&stop), thirty);
            assert_eq!(next, Some(Duration::from_secs(1)), "{reason}");
            assert_eq!(events.len(), kept, "{reason}");
        }
        let stop = waits_for_secret(3, "no Secret".into(), t(2));
        assert_eq!(
            (stop.attempt, stop.reason),
            (3, reason::STORE_SECRET_MISSING)
        );
    }
}
