//! Rank 0's progress: its report copied into the status when a user-visible value changes,
//! condition ProgressAvailable, and stall detection.

use ferrotrain_api::crd::{TrainingProgress, condition};
use ferrotrain_api::reason;
use ferrotrain_api::{Progress, TrainerPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::decider::{Decider, first_line, signed};
use super::observed::{PodView, ProgressObservation};
use crate::report;

impl<'a, 'o> Decider<'a, 'o> {
    /// Copies rank 0's report into the status when a user-visible value changed, maintains
    /// ProgressAvailable, and restarts a stalled gang.
    pub(super) fn track_progress(&mut self, rank0: Option<&PodView>) {
        match &self.o.progress {
            ProgressObservation::Report(report) => self.progress_report(report),
            ProgressObservation::Unavailable(why) => self.progress_unavailable(why, rank0),
            ProgressObservation::NotPolled => {}
        }
        self.detect_stall();
    }

    /// Writes `report` into status.progress when a value a user sees changed.
    fn store_report(&mut self, report: &Progress) {
        self.count_rounds(report);
        self.world_size(report);
        self.refused_connections(report);
        let now = self.now();
        let rounded = report::rounded(report);
        let changed = self
            .status
            .progress
            .as_ref()
            .is_none_or(|p| report::changed_for_a_user(&p.report, &rounded));
        if changed {
            let eta = report::eta_seconds(&rounded);
            self.status.progress = Some(TrainingProgress {
                eta: eta.map(report::human_duration),
                estimated_completion_time: eta
                    .map(|s| Time(now + SignedDuration::from_secs(s.round() as i64))),
                updated_at: Some(Time(now)),
                report: rounded,
            });
            // With the status written anyway: the ledger's clock moves with the progress.
            if let Some(r) = self.status.recovery.as_mut() {
                r.report(report.step_report(), now);
            }
            if self.status.is_true(condition::STALLED) {
                self.set_condition(
                    condition::STALLED,
                    false,
                    reason::PROGRESS_RESUMED,
                    String::new(),
                );
            }
        }
    }

    /// A Warning event each time the connections the gang refused pass 10, 100, 1000, ...:
    /// something that is not this job's ranks is connecting to them (docs/security.md).
    fn refused_connections(&mut self, report: &Progress) {
        let total = |p: &Progress| p.rejected_connections.values().sum::<u64>();
        let before = self
            .status
            .progress
            .as_ref()
            .map_or(0, |p| total(&p.report));
        let now = total(report);
        let threshold = |n: u64| if n < 10 { 0 } else { n.ilog10() };
        if threshold(now) <= threshold(before) {
            return;
        }
        let by_reason: Vec<String> = report
            .rejected_connections
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        self.event(
            true,
            reason::REJECTED_CONNECTIONS,
            format!(
                "{now} connections to the gang's rendezvous store or ring were refused ({}): \
                 something other than this job's ranks connects to them (docs/security.md)",
                by_reason.join(", ")
            ),
        );
    }

    /// Rank 0 answered: its report stored, ProgressAvailable True (an event only after False).
    fn progress_report(&mut self, report: &Progress) {
        self.store_report(report);
        let was = self
            .status
            .condition(condition::PROGRESS_AVAILABLE)
            .map(|c| c.status.clone());
        if was.as_deref() != Some("True") {
            // After a blip (Unknown) nothing is news; after False it is.
            if was.as_deref() == Some("False") {
                self.event(
                    false,
                    reason::PROGRESS_AVAILABLE,
                    "rank 0 serves /progress".into(),
                );
            }
            self.set_condition(
                condition::PROGRESS_AVAILABLE,
                true,
                reason::REPORTED,
                "rank 0 serves /progress".into(),
            );
        }
    }

    /// A poll failed. Never answered: False once rank 0 ran for the grace (an image without
    /// the endpoint). Answered before: Unknown at the first failed poll, False when polls
    /// kept failing for the grace, and the rates and ETA go (they are no longer current).
    /// Stall detection only runs while it is True, so failing polls never restart a gang.
    fn progress_unavailable(&mut self, why: &str, rank0: Option<&PodView>) {
        let now = self.now();
        let grace = self.o.timing.progress_grace;
        let Some(c) = self.status.condition(condition::PROGRESS_AVAILABLE) else {
            let running_since = rank0.and_then(|p| p.running_since).unwrap_or(now);
            let at = running_since + signed(grace);
            if now < at {
                self.requeue_at(at);
                return;
            }
            let message = format!(
                "rank 0 does not serve /progress ({why}); status.progress stays empty and stall detection is off"
            );
            self.event(false, reason::PROGRESS_UNAVAILABLE, message.clone());
            let c = condition::PROGRESS_AVAILABLE;
            self.set_condition(c, false, reason::NO_PROGRESS_ENDPOINT, message);
            return;
        };
        match c.status.as_str() {
            "True" => {
                let message = format!("polling rank 0's /progress failed: {}", first_line(why));
                self.set_condition_to(
                    condition::PROGRESS_AVAILABLE,
                    "Unknown",
                    reason::POLL_FAILED,
                    message,
                );
                self.requeue_in(grace);
            }
            "Unknown" => {
                let at = c.last_transition_time.0 + signed(grace);
                if now < at {
                    self.requeue_at(at);
                    return;
                }
                let message = format!(
                    "rank 0's /progress has not answered for {}s ({}); rates and ETA are cleared and stall detection is paused until it answers",
                    grace.as_secs(),
                    first_line(why)
                );
                self.event(true, reason::PROGRESS_UNAVAILABLE, message.clone());
                let c = condition::PROGRESS_AVAILABLE;
                self.set_condition(c, false, reason::POLLS_FAILING, message);
                self.end_attempt_progress();
            }
            _ => {}
        }
    }

    /// No change of the report for stallTimeoutSeconds while ProgressAvailable is True: Stalled
    /// and a gang restart.
    fn detect_stall(&mut self) {
        let timeout = self.o.spec.stall_timeout_seconds;
        if timeout <= 0 || !self.status.is_true(condition::PROGRESS_AVAILABLE) {
            return;
        }
        let running_since = self
            .status
            .condition(condition::RUNNING)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0);
        let updated = self
            .status
            .progress
            .as_ref()
            .and_then(|p| p.updated_at.as_ref())
            .map(|t| t.0);
        let Some(since) = running_since.into_iter().chain(updated).max() else {
            return;
        };
        let at = since + SignedDuration::from_secs(timeout);
        if self.now() < at {
            self.requeue_at(at);
            return;
        }
        let step = self.status.progress.as_ref().map_or(0, |p| p.report.step);
        let message = format!("no progress for {timeout}s (step {step})");
        self.set_condition(
            condition::STALLED,
            true,
            reason::NO_PROGRESS,
            message.clone(),
        );
        self.event(true, reason::STALLED, message.clone());
        let failure = self.job_failure(reason::STALLED, message);
        self.restart_or_fail(failure);
    }

    /// The last poll is up to an interval old when training ends: rank 0's final report
    /// (its termination message) has the final step, eval and checkpoint. Without one (an
    /// image that writes none) the last polled numbers stay. Either way the phase is
    /// Finished, and rates and ETA, which describe a running attempt, go.
    pub(super) fn final_progress(&mut self, rank0: Option<&PodView>) {
        if let Some(report) = rank0.and_then(|p| p.final_report.as_deref()) {
            self.store_report(report);
        }
        if let Some(p) = self.status.progress.as_mut() {
            p.report.phase = TrainerPhase::Finished;
        }
        self.end_attempt_progress();
    }

    /// Rates and ETA describe the attempt that reported them; once it ended they are no
    /// longer current (step, losses and the last checkpoint stay true).
    pub(super) fn end_attempt_progress(&mut self) {
        if let Some(p) = self.status.progress.as_mut() {
            let r = &mut p.report;
            r.steps_per_second = None;
            r.samples_per_second = None;
            r.tokens_per_second = None;
            r.step_time_seconds = None;
            r.comm_fraction = None;
            r.eta_seconds = None;
            p.eta = None;
            p.estimated_completion_time = None;
        }
    }
}

#[cfg(test)]
mod tests;
