//! When the run stops before `maxSteps`: the time budget spent, or a signal some rank
//! received. Every rank decides it from the step's all-reduce, so all stop at the same step.

/// The run's stop state, as the last step left it.
#[derive(Default)]
pub(super) struct Stop {
    /// The last step was the run's last (time budget or signal).
    stop: bool,
    /// The signal that stopped the gang; once seen, it stays.
    interrupted_by: Option<i32>,
}

impl Stop {
    /// After a step's exchange: `over_budget` at rank 0's clock, `signal` when some rank was
    /// signalled.
    pub(super) fn after_step(&mut self, over_budget: bool, signal: Option<i32>) {
        if signal.is_some() {
            self.interrupted_by = signal;
        }
        self.stop = over_budget || self.interrupted_by.is_some();
    }

    /// The last step was the run's last.
    pub(super) fn stopped(&self) -> bool {
        self.stop
    }

    /// The signal that stopped the gang, if one did.
    pub(super) fn interrupted_by(&self) -> Option<i32> {
        self.interrupted_by
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_or_a_signal_stops_the_run_and_the_signal_is_kept() {
        let mut stop = Stop::default();
        stop.after_step(false, None);
        assert!(!stop.stopped());
        assert_eq!(stop.interrupted_by(), None);
        stop.after_step(true, None);
        assert!(stop.stopped());
        assert_eq!(stop.interrupted_by(), None);
        let mut stop = Stop::default();
        stop.after_step(false, Some(libc::SIGTERM));
        // A later step without one (the run stops first; the state must not forget it).
        stop.after_step(false, None);
        assert!(stop.stopped());
        assert_eq!(stop.interrupted_by(), Some(libc::SIGTERM));
    }
}
