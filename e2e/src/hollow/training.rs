//! What a hollow job's rank 0 reports: a training run whose step advances at a fixed rate while
//! its whole gang runs and stands still otherwise, with in-place rounds as ferrotrain's
//! launchers count them (a pod leaving ends the round; the gang whole again starts the next).
//! Pure: the caller passes the time.

use ferrotrain_api::recovery::{AttemptEnd, EndCause, RoundEnd};
use ferrotrain_api::{Progress, TrainerPhase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How a hollow job trains (from its pods' annotations, else the simulator's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pace {
    pub steps_per_second: f64,
    pub total_steps: u64,
}

/// One job's training, across its attempts and rounds.
#[derive(Clone, Debug)]
pub struct Run {
    pace: Pace,
    /// Steps done before `stepping_since` (fractional: the rate is not a whole number).
    steps: f64,
    /// Set while the whole gang runs: the step advances from here.
    stepping_since: Option<Timestamp>,
    /// The attempt the pods run (a new attempt resumes from the step reached).
    attempt: i32,
    world_size: u32,
    round: u64,
    round_ends: Vec<RoundEnd>,
    resumed_from: Option<u64>,
    attempt_first_step: Option<Timestamp>,
}

impl Run {
    pub fn new(pace: Pace, attempt: i32, world_size: u32) -> Self {
        Run {
            pace,
            steps: 0.0,
            stepping_since: None,
            attempt,
            world_size,
            round: 0,
            round_ends: Vec::new(),
            resumed_from: None,
            attempt_first_step: None,
        }
    }

    /// The optimizer step at `now` (never past the total).
    pub fn step(&self, now: Timestamp) -> u64 {
        let running = self.stepping_since.map_or(0.0, |since| {
            now.duration_since(since).as_secs_f64().max(0.0) * self.pace.steps_per_second
        });
        ((self.steps + running).floor() as u64).min(self.pace.total_steps)
    }

    /// Since when the gang steps (None while it waits for a pod).
    pub fn stepping_since(&self) -> Option<Timestamp> {
        self.stepping_since
    }

    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    pub fn round(&self) -> u64 {
        self.round
    }

    /// Whether the run reached its total steps at `now`.
    pub fn finished(&self, now: Timestamp) -> bool {
        self.step(now) >= self.pace.total_steps
    }

    /// When the run will reach its total steps, if it steps.
    pub fn finishes_at(&self) -> Option<Timestamp> {
        let since = self.stepping_since?;
        let left = (self.pace.total_steps as f64 - self.steps).max(0.0);
        let seconds = left / self.pace.steps_per_second.max(1e-9);
        since
            .checked_add(SignedDuration::from_secs_f64(seconds))
            .ok()
    }

    /// The pods of `attempt` run: a newer attempt resumes from the step reached (as from its
    /// last checkpoint), rounds counting from 0 again.
    pub fn attempt_started(&mut self, attempt: i32, world_size: u32, now: Timestamp) {
        if attempt == self.attempt {
            return;
        }
        self.stop(now);
        let step = self.step(now);
        self.attempt = attempt;
        self.world_size = world_size;
        self.round = 0;
        self.round_ends.clear();
        self.resumed_from = (step > 0).then_some(step);
        self.attempt_first_step = None;
    }

    /// The gang is whole (every pod of the attempt runs): steps from `now`.
    pub fn whole(&mut self, now: Timestamp) {
        if self.stepping_since.is_none() {
            self.stepping_since = Some(now);
            self.attempt_first_step.get_or_insert(now);
        }
    }

    /// A pod of the gang left (deleted, drained, failed) while it stepped: the round ends,
    /// blamed on `node_rank`, and the next starts when the gang is whole again.
    pub fn pod_left(&mut self, node_rank: i32, procs_per_pod: u32, now: Timestamp) {
        if self.stepping_since.is_none() {
            return;
        }
        self.stop(now);
        self.round_ends.push(RoundEnd {
            round: self.round,
            end: AttemptEnd {
                cause: EndCause::Failure,
                reason: "PodLeaving".into(),
                rank: Some(i64::from(node_rank) * i64::from(procs_per_pod.max(1))),
                node_rank: None,
                exit_code: None,
                node: None,
                failed_at: now,
                detected_at: now,
            },
            message: format!("node {node_rank}'s pod went away (hollow kubelet)"),
            // Steps are never trained twice here: the next round starts where this one ended.
            last_step: Some(self.steps as u64),
            // A hollow kubelet runs no ranks: no output to keep.
            last_lines: Vec::new(),
        });
        self.round += 1;
    }

    /// Every pod stopped (the attempt ends): the step stands still.
    pub fn stop(&mut self, now: Timestamp) {
        if self.stepping_since.is_some() {
            self.steps = self.step(now) as f64;
            self.stepping_since = None;
        }
    }

    /// Rank 0's `/progress` at `now`.
    pub fn report(&self, now: Timestamp) -> Progress {
        let step = self.step(now);
        let stepping = self.stepping_since.is_some();
        let finished = step >= self.pace.total_steps;
        let rate = (stepping && !finished).then_some(self.pace.steps_per_second);
        let phase = if finished {
            TrainerPhase::Finished
        } else if stepping {
            TrainerPhase::Training
        } else {
            TrainerPhase::Starting
        };
        let samples_per_step = 64 * u64::from(self.world_size.max(1));
        Progress {
            phase,
            step,
            total_steps: self.pace.total_steps,
            samples: step * samples_per_step,
            world_size: self.world_size,
            steps_per_second: rate,
            samples_per_second: rate.map(|r| r * samples_per_step as f64),
            tokens_per_second: rate.map(|r| r * 20.0 * samples_per_step as f64),
            step_time_seconds: rate.map(|r| 1.0 / r),
            comm_fraction: rate.map(|_| 0.2),
            // A loss that falls with the steps, as a real run's does.
            loss: (step > 0).then(|| 4.0 / (1.0 + step as f64 / 100.0)),
            learning_rate: Some(1e-3),
            eta_seconds: rate.map(|r| (self.pace.total_steps - step) as f64 / r),
            resumed_from_step: self.resumed_from,
            attempt_first_step_time: self.attempt_first_step,
            round: self.round,
            round_ends: self.round_ends.clone(),
            parameters: 1_000_000,
            ..Progress::default()
        }
    }
}

/// `ferrotrain_*` gauges of the report, in the Prometheus text format (rank 0's `/metrics`).
pub fn metrics_text(p: &Progress) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, value: f64| {
        out += &format!("# TYPE ferrotrain_{name} gauge\nferrotrain_{name} {value}\n");
    };
    gauge("step", p.step as f64);
    gauge("samples", p.samples as f64);
    gauge("world_size", f64::from(p.world_size));
    gauge("steps_per_second", p.steps_per_second.unwrap_or(0.0));
    if let Some(loss) = p.loss {
        gauge("loss", loss);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn run() -> Run {
        Run::new(
            Pace {
                steps_per_second: 2.0,
                total_steps: 100,
            },
            0,
            8,
        )
    }

    #[test]
    fn steps_advance_only_while_the_gang_is_whole() {
        let mut r = run();
        assert_eq!(r.step(at(10)), 0);
        assert_eq!(r.report(at(10)).phase, TrainerPhase::Starting);
        r.whole(at(10));
        assert_eq!(r.step(at(15)), 10);
        assert_eq!(r.report(at(15)).steps_per_second, Some(2.0));
        r.pod_left(3, 1, at(15));
        assert_eq!(r.step(at(60)), 10, "no step while a pod is missing");
        let report = r.report(at(60));
        assert_eq!((report.round, report.round_ends.len()), (1, 1));
        assert_eq!(report.round_ends[0].end.rank, Some(3));
        assert_eq!(report.steps_per_second, None);
        r.whole(at(60));
        assert_eq!(r.step(at(61)), 12);
        assert_eq!(r.stepping_since(), Some(at(60)));
    }

    #[test]
    fn a_pod_leaving_a_waiting_gang_ends_no_second_round() {
        let mut r = run();
        r.whole(at(0));
        r.pod_left(1, 1, at(1));
        r.pod_left(2, 1, at(2));
        assert_eq!(r.round(), 1);
    }

    #[test]
    fn a_new_attempt_resumes_from_the_step_reached_with_rounds_from_zero() {
        let mut r = run();
        r.whole(at(0));
        r.pod_left(1, 1, at(5));
        r.attempt_started(1, 8, at(9));
        let report = r.report(at(9));
        assert_eq!(report.resumed_from_step, Some(10));
        assert_eq!((report.round, report.round_ends.len()), (0, 0));
        assert_eq!(r.attempt(), 1);
    }

    #[test]
    fn the_run_finishes_at_its_total_steps() {
        let mut r = run();
        r.whole(at(0));
        assert_eq!(r.finishes_at(), Some(at(50)));
        assert!(!r.finished(at(49)));
        assert!(r.finished(at(50)));
        let report = r.report(at(70));
        assert_eq!((report.step, report.phase), (100, TrainerPhase::Finished));
        assert_eq!(report.eta_seconds, None);
        assert!(metrics_text(&report).contains("ferrotrain_step 100\n"));
    }
}
