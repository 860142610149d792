//! Training time, which `maxSeconds` and a time-horizon schedule count: the job's earlier
//! runs plus this run's loop, not its start-up (data, vocabulary, rendezvous), which differs
//! between machines and restarts.

use std::time::Instant;

/// The run's training clock.
pub(super) struct Clock {
    loop_started: Instant,
    earlier_seconds: f64,
    /// Rank 0's training seconds at the last step (the step's all-reduce gives every rank
    /// rank 0's count): what the next round goes on from.
    synced_seconds: f64,
    /// `maxSeconds`.
    budget: Option<f64>,
}

impl Clock {
    /// Starts now, after the job's `earlier_seconds` of training.
    pub(super) fn start(earlier_seconds: f64, budget: Option<f64>) -> Self {
        Clock {
            loop_started: Instant::now(),
            earlier_seconds,
            synced_seconds: earlier_seconds,
            budget,
        }
    }

    /// This rank's count; the step's all-reduce gives every rank rank 0's.
    pub(super) fn train_seconds(&self) -> f64 {
        self.earlier_seconds + self.loop_started.elapsed().as_secs_f64()
    }

    /// A step ended at rank 0's `train_seconds`.
    pub(super) fn sync(&mut self, train_seconds: f64) {
        self.synced_seconds = train_seconds;
    }

    /// Rank 0's training seconds at the last step.
    pub(super) fn synced_seconds(&self) -> f64 {
        self.synced_seconds
    }

    /// `maxSeconds`.
    pub(super) fn budget(&self) -> Option<f64> {
        self.budget
    }

    pub(super) fn over_budget(&self, train_seconds: f64) -> bool {
        self.budget.is_some_and(|b| train_seconds >= b)
    }

    /// The share of the budget spent (0 without one), for a time-horizon schedule.
    pub(super) fn time_used(&self, train_seconds: f64) -> f64 {
        self.budget.map_or(0.0, |b| train_seconds / b)
    }
}
