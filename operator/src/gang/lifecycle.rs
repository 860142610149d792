//! The phases of a job: Pending after a suspend or a fixed spec, Suspended, Restarting with
//! its backoff, and the end (Succeeded, Failed, the deadline, ttlSecondsAfterFinished).

use std::time::Duration;

use ferrotrain_api::Recovery;
use ferrotrain_api::crd::{DistributedTrainingSpec, Phase, condition};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{AttemptEnd, EndCause, restart_wait};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::decider::{Decider, signed};
use super::decision::Action;
use super::failure::{Failure, ended_by};
use super::observed::PodView;

/// Restart backoff after `in_a_row` failures in a row: backoff * 2^(in_a_row-1), capped.
pub fn backoff(spec: &DistributedTrainingSpec, in_a_row: i32) -> Duration {
    let p = &spec.restart_policy;
    let s = |secs: i64| Duration::from_secs(secs.max(0) as u64);
    restart_wait(
        s(p.backoff_seconds),
        s(p.max_backoff_seconds),
        in_a_row.max(1) as u32,
    )
}

impl<'a, 'o> Decider<'a, 'o> {
    /// Succeeded or Failed: the attempt's pods that still run are deleted (terminated ones
    /// stay for their logs), and past ttlSecondsAfterFinished the job itself.
    pub(super) fn finished(&mut self) {
        self.stop_current_pods();
        if let (Some(ttl), Some(done)) = (
            self.o.spec.ttl_seconds_after_finished,
            self.status.completion_time.as_ref(),
        ) {
            let at = done.0 + SignedDuration::from_secs(ttl.max(0));
            if self.now() >= at {
                self.actions.push(Action::DeleteJob);
            } else {
                self.requeue_at(at);
            }
        }
    }

    /// Failed for an invalid spec, and the spec changed since: a job that never got to run
    /// deserves its fixed spec a try (any other failure is final, as a Job's is).
    pub(super) fn invalid_spec_changed(&self) -> bool {
        self.o.status.condition(condition::FAILED).is_some_and(|c| {
            c.status == "True"
                && c.reason == reason::INVALID_SPEC
                && c.observed_generation != self.o.generation
        })
    }

    /// Back to Pending after an invalid spec was changed; a new attempt if pods of the
    /// failed one still exist (they were made from the old spec).
    pub(super) fn reopen(&mut self) {
        if self.current_pods().next().is_some() {
            self.status.attempt += 1;
        }
        self.status.phase = Phase::Pending;
        self.status.completion_time = None;
        let generation = self.o.generation.unwrap_or_default();
        self.set_condition(
            condition::FAILED,
            false,
            reason::SPEC_CHANGED,
            format!("generation {generation} of the spec is tried"),
        );
    }

    /// spec.suspend: the attempt ends (in the ledger, not as a failure), phase Suspended, and
    /// its pods are deleted; once, then quietly.
    pub(super) fn suspend(&mut self) {
        self.end_attempt_progress();
        if self.status.phase != Phase::Suspended {
            let from = self.status.phase;
            let failure = self.job_failure(reason::SUSPENDED, String::new());
            self.record_end(EndCause::Stopped, &failure);
            self.status.phase = Phase::Suspended;
            self.set_condition(
                condition::SUSPENDED,
                true,
                reason::SUSPENDED,
                "spec.suspend is true".into(),
            );
            self.clear_running(reason::SUSPENDED);
            self.set_condition(
                condition::RESTARTING,
                false,
                reason::SUSPENDED,
                String::new(),
            );
            self.event(
                false,
                reason::SUSPENDED,
                format!(
                    "suspended in phase {from}: pods of attempt {} are deleted",
                    self.status.attempt
                ),
            );
        }
        self.stop_current_pods();
    }

    /// spec.suspend is false again: Pending, a new attempt if one was launched before, and the
    /// deadline's clock restarts.
    pub(super) fn resume(&mut self) {
        let launched_before = self.status.condition(condition::CREATED).is_some();
        if launched_before {
            self.status.attempt += 1;
        }
        self.status.phase = Phase::Pending;
        self.status.start_time = Some(Time(self.now()));
        self.set_condition(
            condition::SUSPENDED,
            false,
            reason::RESUMED,
            "spec.suspend is false".into(),
        );
        self.event(
            false,
            reason::RESUMED,
            format!(
                "resumed: attempt {} starts from the latest checkpoint",
                self.status.attempt
            ),
        );
    }

    /// activeDeadlineSeconds since startTime: true (and the job Failed) once it passed, else
    /// a requeue at it.
    pub(super) fn deadline_passed(&mut self) -> bool {
        let (Some(deadline), Some(start)) = (
            self.o.spec.active_deadline_seconds,
            self.status.start_time.as_ref(),
        ) else {
            return false;
        };
        let at = start.0 + SignedDuration::from_secs(deadline.max(0));
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        let message = format!("activeDeadlineSeconds {deadline} passed");
        let failure = self.job_failure(reason::DEADLINE_EXCEEDED, message);
        self.fail(failure, reason::DEADLINE_EXCEEDED, reason::FAILED);
        true
    }

    /// In Restarting: true (and the phase moved to Pending of the next attempt) when the
    /// backoff is over.
    pub(super) fn backoff_over(&mut self) -> bool {
        let since = self
            .status
            .condition(condition::RESTARTING)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0)
            .unwrap_or(self.now());
        let at = since + signed(self.restart_backoff());
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        self.stop_current_pods();
        self.status.attempt += 1;
        self.status.phase = Phase::Pending;
        self.set_condition(
            condition::RESTARTING,
            false,
            reason::RELAUNCHED,
            format!("attempt {} launched", self.status.attempt),
        );
        true
    }

    /// The wait before the next attempt: the backoff doubled for each failure in a row (since
    /// the last attempt or round that saved a checkpoint: a job that trained well before it
    /// failed waits only the initial backoff; without a ledger, every restart counts), the
    /// initial one after a disruption (nothing went wrong that waiting longer would help).
    fn restart_backoff(&self) -> Duration {
        let disrupted = self
            .status
            .last_failure
            .as_ref()
            .is_some_and(|f| f.attempt == self.status.attempt && f.reason == reason::DISRUPTED);
        let in_a_row = self
            .status
            .recovery
            .as_ref()
            // A gang restart's new pods start from a checkpoint: only what a checkpoint kept
            // counts (an in-place round's record counts its steps: the next round kept them).
            .and_then(|r| r.failures_in_a_row(false))
            .map_or(self.status.restarts, |n| n as i32);
        backoff(self.o.spec, if disrupted { 1 } else { in_a_row })
    }

    /// The attempt is over: a permanent failure fails the job, anything else restarts it.
    pub(super) fn end_attempt(&mut self, failure: Failure) {
        if failure.permanent {
            self.event(true, reason::RANK_FAILED, failure.describe());
            let reason = match failure.info.reason.as_str() {
                reason::PERMANENT_EXIT_CODE => reason::PERMANENT_FAILURE.to_string(),
                other => other.to_string(),
            };
            self.fail(failure, &reason, reason::FAILED);
        } else {
            self.restart_or_fail(failure);
        }
    }

    /// Every rank exited 0: phase Succeeded, rank 0's final report in the status, the ledger's
    /// last attempt closed.
    /// Training finished: `succeeded` pods exited 0 (elastic: node 0's and the others that
    /// had already ended; any still waiting for a place are stopped).
    pub(super) fn succeed(&mut self, rank0: Option<&PodView>, succeeded: i32) {
        let (replicas, attempt) = (self.o.spec.pod_count(), self.status.attempt);
        let pods = if succeeded >= replicas {
            format!("all {replicas} pods")
        } else {
            format!("{succeeded} of {replicas} pods (node 0's among them; the others stopped)")
        };
        self.final_progress(rank0);
        let now = self.now();
        if let Some(r) = self.status.recovery.as_mut() {
            r.end(AttemptEnd {
                cause: EndCause::Succeeded,
                reason: reason::SUCCEEDED.into(),
                rank: None,
                node_rank: None,
                exit_code: Some(0),
                node: None,
                failed_at: now,
                detected_at: now,
            });
        }
        self.status.phase = Phase::Succeeded;
        self.status.completion_time = Some(Time(self.now()));
        self.clear_running(reason::SUCCEEDED);
        let step = self
            .status
            .progress
            .as_ref()
            .map(|p| format!(" at step {}", p.report.step))
            .unwrap_or_default();
        self.set_condition(
            condition::SUCCEEDED,
            true,
            reason::ALL_RANKS_SUCCEEDED,
            format!("{pods} of attempt {attempt} exited 0{step}"),
        );
        self.event(
            false,
            reason::SUCCEEDED,
            format!("training finished: {pods} exited 0{step}"),
        );
        self.finished();
    }

    /// A gang restart, counted against maxRestarts unless a disruption caused it.
    pub(super) fn restart_or_fail(&mut self, failure: Failure) {
        let max = self.budget().max;
        let describe = failure.describe();
        self.event(
            true,
            if failure.disruption {
                reason::DISRUPTED
            } else {
                reason::RANK_FAILED
            },
            describe.clone(),
        );
        if !failure.disruption && !self.budget().allows_another() {
            let mut failure = failure;
            failure.info.message = format!("maxRestarts {max} reached; last failure: {describe}");
            self.fail(failure, reason::MAX_RESTARTS_REACHED, reason::FAILED);
            return;
        }
        if !failure.disruption {
            self.status.restarts += 1;
        }
        let cause = failure.info.reason.clone();
        *self
            .status
            .restarts_by_cause
            .entry(cause.clone())
            .or_default() += 1;
        let ended = if failure.disruption {
            EndCause::Disruption
        } else {
            ended_by(&cause)
        };
        self.record_end(ended, &failure);
        self.status.phase = Phase::Restarting;
        self.set_condition(condition::RESTARTING, true, &cause, describe);
        self.clear_running(&cause);
        self.end_attempt_progress();
        self.status.last_failure = Some(failure.info);
        self.stop_current_pods();
        let wait = self.restart_backoff();
        let next = self.status.attempt + 1;
        let note = if failure.disruption {
            format!(
                "gang restart after a disruption (not counted against maxRestarts {max}): attempt {next} starts in {}s from the latest checkpoint",
                wait.as_secs()
            )
        } else {
            format!(
                "gang restart {}/{max}: attempt {next} starts in {}s from the latest checkpoint",
                self.status.restarts,
                wait.as_secs()
            )
        };
        self.event(true, reason::RESTARTING, note);
        self.requeue_in(wait);
    }

    /// Phase Failed with `reason` (the Failed condition's) and a Warning event `event`.
    pub(super) fn fail(&mut self, failure: Failure, reason: &str, event: &'static str) {
        // Whatever the attempt was waiting for, nothing is now (finished() sets the ttl's).
        self.requeue = None;
        let message = failure.describe();
        self.record_end(ended_by(&failure.info.reason), &failure);
        self.status.phase = Phase::Failed;
        self.status.completion_time = Some(Time(self.now()));
        self.clear_running(reason);
        if self.status.is_true(condition::RESTARTING) {
            self.set_condition(condition::RESTARTING, false, reason, String::new());
        }
        self.set_condition(condition::FAILED, true, reason, message.clone());
        self.end_attempt_progress();
        self.status.last_failure = Some(failure.info);
        self.event(true, event, message);
        self.finished();
    }

    /// Closes the current attempt's record (if one is open) with `failure`.
    fn record_end(&mut self, cause: EndCause, failure: &Failure) {
        let now = self.now();
        let Some(r) = self.status.recovery.as_mut() else {
            return;
        };
        let i = &failure.info;
        r.end(AttemptEnd {
            cause,
            reason: i.reason.clone(),
            rank: i.rank.map(i64::from),
            node_rank: i.node_rank.map(i64::from),
            exit_code: i.exit_code,
            node: i.node.clone(),
            // A pod that vanished went at the latest when it was missed.
            failed_at: failure.at.filter(|at| *at <= now).unwrap_or(now),
            detected_at: now,
        });
    }

    /// The recovery ledger in the status, started on first use.
    pub(super) fn recovery(&mut self) -> &mut Recovery {
        self.status.recovery.get_or_insert_with(Recovery::default)
    }
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
