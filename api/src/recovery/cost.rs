//! What a failure cost, read off the ledger: the time to detect it, the time from it to the
//! next first step (the whole recovery), where the next start's state came from and the steps
//! trained twice. The operator's metrics, the ledger's totals and `kubectl ferrotrain` all
//! read it here.

use super::{AttemptEnd, AttemptRecord, EndCause, HealedFrom, Recovery, Timestamp, seconds};

impl EndCause {
    /// Whether a restart followed this end because something happened to the job (a failure,
    /// a disruption, a stall): not a success, and not a stop someone asked for (a suspend, a
    /// deadline, a resize), whose wait is nobody's recovery.
    pub fn is_recovered_from(self) -> bool {
        matches!(
            self,
            EndCause::Failure | EndCause::Disruption | EndCause::Stall
        )
    }
}

impl AttemptEnd {
    /// Seconds from this end's failure to `next_first_step`: the whole recovery.
    pub fn recovery_seconds(&self, next_first_step: Timestamp) -> f64 {
        seconds(self.failed_at, next_first_step)
    }
}

/// What one failure cost: the record it ended and the one that followed it.
#[derive(Clone, Debug, PartialEq)]
pub struct FailureCost {
    /// The attempt and round it ended.
    pub attempt: i64,
    pub round: u64,
    /// Seconds from the failure to its detection.
    pub detect_seconds: f64,
    /// The next record's attempt and round, once it started.
    pub next_round: Option<(i64, u64)>,
    /// Seconds from the failure to the next record's first step, once it took one.
    pub to_next_step: Option<f64>,
    /// The step the next record resumed from, and from where.
    pub resumed_from: Option<(u64, Option<HealedFrom>)>,
    /// Steps trained twice (the ended record's lostSteps).
    pub lost_steps: Option<u64>,
}

impl FailureCost {
    /// The cost of the end of `failed` (None unless it ended in a failure a recovery
    /// followed), `next` the record after it, if any.
    pub fn of(failed: &AttemptRecord, next: Option<&AttemptRecord>) -> Option<FailureCost> {
        let end = failed
            .end
            .as_ref()
            .filter(|e| e.cause.is_recovered_from())?;
        let stepped = next.filter(|n| n.first_step_at.is_some());
        Some(FailureCost {
            attempt: failed.attempt,
            round: failed.round.unwrap_or(0),
            detect_seconds: end.detect_seconds(),
            next_round: next.map(|n| (n.attempt, n.round.unwrap_or(0))),
            to_next_step: stepped
                .and_then(|n| n.first_step_at)
                .map(|t| end.recovery_seconds(t)),
            resumed_from: stepped.and_then(|n| n.resumed_from_step.map(|s| (s, n.healed_from))),
            lost_steps: failed.lost_steps,
        })
    }
}

impl Recovery {
    /// What each failure in the history cost, oldest first.
    pub fn failure_costs(&self) -> impl Iterator<Item = FailureCost> + '_ {
        self.attempts
            .iter()
            .enumerate()
            .filter_map(|(i, a)| FailureCost::of(a, self.attempts.get(i + 1)))
    }

    /// What the latest failure in the history cost (None without one).
    pub fn last_failure_cost(&self) -> Option<FailureCost> {
        self.failure_costs().last()
    }
}
