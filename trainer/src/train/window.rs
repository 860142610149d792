//! A sliding window of recent steps: the rates and the loss the progress report shows.

use std::collections::VecDeque;

/// A sliding window of recent steps for rates and the reported loss.
#[derive(Default)]
pub(super) struct Window {
    steps: VecDeque<(f64, f64, i64, u64)>, // (seconds, comm seconds, tokens, samples)
    losses: VecDeque<f64>,
}

/// Rates over the window's steps.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rates {
    pub(super) steps_per_second: f64,
    pub(super) samples_per_second: f64,
    pub(super) tokens_per_second: f64,
    pub(super) step_time_seconds: f64,
    /// Seconds in collectives per second of step (not clamped).
    pub(super) comm_fraction: f64,
}

impl Window {
    const LEN: usize = 20;
    pub(super) fn push(&mut self, seconds: f64, comm: f64, tokens: i64, samples: u64) {
        if self.steps.len() == Self::LEN {
            self.steps.pop_front();
        }
        self.steps.push_back((seconds, comm, tokens, samples));
    }
    pub(super) fn push_loss(&mut self, loss: f64) {
        if self.losses.len() == Self::LEN {
            self.losses.pop_front();
        }
        self.losses.push_back(loss);
    }
    /// The mean loss of the recent steps (the progress report's loss).
    pub(super) fn mean_loss(&self) -> f64 {
        self.losses.iter().sum::<f64>() / self.losses.len() as f64
    }
    pub(super) fn rates(&self) -> Option<Rates> {
        let secs: f64 = self.steps.iter().map(|s| s.0).sum();
        if secs <= 0.0 {
            return None;
        }
        let n = self.steps.len() as f64;
        let comm: f64 = self.steps.iter().map(|s| s.1).sum();
        let tokens: i64 = self.steps.iter().map(|s| s.2).sum();
        let samples: u64 = self.steps.iter().map(|s| s.3).sum();
        Some(Rates {
            steps_per_second: n / secs,
            samples_per_second: samples as f64 / secs,
            tokens_per_second: tokens as f64 / secs,
            step_time_seconds: secs / n,
            comm_fraction: comm / secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_rates() {
        let mut w = Window::default();
        assert!(w.rates().is_none());
        w.push(0.5, 0.1, 1000, 10);
        w.push(0.5, 0.1, 1000, 10);
        let r = w.rates().unwrap();
        assert!((r.steps_per_second - 2.0).abs() < 1e-9);
        assert!((r.samples_per_second - 20.0).abs() < 1e-9);
        assert!((r.tokens_per_second - 2000.0).abs() < 1e-9);
        assert!((r.step_time_seconds - 0.5).abs() < 1e-9);
        assert!((r.comm_fraction - 0.2).abs() < 1e-9);
        for loss in 0..=Window::LEN {
            w.push_loss(loss as f64);
        }
        // The first loss left the window: the mean of 1..=20.
        assert!((w.mean_loss() - 10.5).abs() < 1e-9);
    }
}
