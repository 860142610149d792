//! Where the job stands: the optimizer steps taken and the examples consumed, of the job
//! (not only this run), and the step it resumed from. Only a completed step moves it.

use super::resume::Start;

/// The job's position, which checkpoints, heal snapshots and the progress report carry.
pub(super) struct Position {
    step: u64,
    samples: u64,
    resumed_from_step: Option<u64>,
}

impl Position {
    /// Where the resume put the job.
    pub(super) fn at(start: &Start) -> Self {
        Position {
            step: start.step,
            samples: start.samples,
            resumed_from_step: start.resumed_from_step,
        }
    }

    /// Optimizer steps taken.
    pub(super) fn step(&self) -> u64 {
        self.step
    }

    /// The step being taken (the first is 1): dropout seeds, the schedule and the test hooks
    /// count it.
    pub(super) fn next_step(&self) -> u64 {
        self.step + 1
    }

    /// Examples consumed.
    pub(super) fn samples(&self) -> u64 {
        self.samples
    }

    pub(super) fn resumed_from_step(&self) -> Option<u64> {
        self.resumed_from_step
    }

    /// A step completed on a global batch of `samples` examples (skipped by fp16 or not: the
    /// batch was consumed).
    pub(super) fn advance(&mut self, samples: u64) {
        self.step += 1;
        self.samples += samples;
    }
}
