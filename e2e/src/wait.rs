//! Bounded waits that say what they last saw: for anything (polled every second), for a job's
//! status, phase or first checkpoint.

use std::future::Future;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase};
use kube::api::Api;

use crate::jobs::CHECKPOINT_EVERY;
use crate::namespace::TestNamespace;

/// Bound of a wait for the operator (pods created, phases, restarts).
pub const WAIT: Duration = Duration::from_secs(300);
/// Bound of a wait for training (image pull on a cold node, start-up, hundreds of steps).
pub const TRAIN_WAIT: Duration = Duration::from_secs(600);

/// Polls `check` every second until it returns Some, or panics after `limit` naming `what`
/// and the last observation.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = (Option<T>, String)>,
{
    let started = Instant::now();
    loop {
        let (found, seen) = check().await;
        if let Some(v) = found {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until the job's status satisfies `done`; returns that status.
pub async fn wait_status(
    jobs: &Api<DistributedTraining>,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&DistributedTrainingStatus) -> bool,
) -> DistributedTrainingStatus {
    wait_for(&format!("{name}: {what}"), limit, || async {
        match jobs.get_opt(name).await {
            Ok(Some(dt)) => {
                let seen = serde_json::to_string(&dt.status).unwrap_or_default();
                (dt.status.filter(|s| done(s)), seen)
            }
            Ok(None) => (None, "the job does not exist".into()),
            Err(e) => (None, e.to_string()),
        }
    })
    .await
}

/// Waits until the job runs with a first checkpoint in its status (of step
/// `CHECKPOINT_EVERY` or later, on attempt 0); returns that status.
pub async fn wait_first_checkpoint(ns: &TestNamespace, job: &str) -> DistributedTrainingStatus {
    wait_status(&ns.jobs(), job, "a first checkpoint", TRAIN_WAIT, |s| {
        s.phase == Phase::Running
            && s.attempt == 0
            && s.progress
                .as_ref()
                .and_then(|p| p.report.last_checkpoint.as_ref())
                .is_some_and(|c| c.step >= CHECKPOINT_EVERY)
    })
    .await
}

/// Waits until the job is in `phase`.
pub async fn wait_phase(
    jobs: &Api<DistributedTraining>,
    name: &str,
    phase: Phase,
    limit: Duration,
) -> DistributedTrainingStatus {
    wait_status(jobs, name, &format!("phase {phase}"), limit, |s| {
        s.phase == phase
    })
    .await
}
