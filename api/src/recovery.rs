//! Recovery accounting: what every attempt of a job did and what its end cost.
//!
//! Both supervisors keep a [`Recovery`] ledger: the operator in `status.recovery` (across
//! pods and nodes), `ferrotrain launch` for the ranks of one machine. They feed it the same
//! facts, and it derives the same numbers:
//!
//! - per attempt: when it started (pods created / ranks spawned), when all its ranks ran,
//!   when its first step completed (the trainer's own clock, [`crate::Progress`]'s
//!   `attemptFirstStepTime`), the step it resumed from, the last step and checkpoint seen,
//!   and how it ended (cause, rank, exit code, node, when it happened, when it was seen);
//! - lost steps: steps an attempt trained that the next one had to train again (its last
//!   step minus the step the next attempt resumed from; until then, minus its last
//!   checkpoint);
//! - productive time: the time spent on steps the job kept, i.e. each attempt's training
//!   time (first step to end) scaled by the share of its steps that were kept; goodput is
//!   productive time over the job's wall time since its first attempt started.
//!
//! The history keeps the last [`MAX_ATTEMPTS`]; the totals keep everything, so the restart
//! budget's use stays visible however long the job runs.

use std::collections::BTreeMap;
use std::time::Duration;

pub use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Attempts kept in the history (the totals count all of them).
pub const MAX_ATTEMPTS: usize = 10;

/// The wait before a restart that follows `in_a_row` failures in a row
/// ([`Recovery::failures_in_a_row`]): `initial`, doubled for each failure in a row after the
/// first, at most `max` (or `initial` when that is larger).
pub fn restart_wait(initial: Duration, max: Duration, in_a_row: u32) -> Duration {
    let doublings = in_a_row.max(1).saturating_sub(1).min(30);
    initial
        .saturating_mul(1u32 << doublings)
        .min(max.max(initial))
}

/// Why an attempt ended, in the three buckets people budget for.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum EndCause {
    /// Every rank finished.
    Succeeded,
    /// A rank failed (exit code, killed, lost node, pod failed or never started).
    Failure,
    /// Eviction, preemption, drain or node shutdown: nothing in the job went wrong.
    Disruption,
    /// Progress stopped for stallTimeoutSeconds.
    Stall,
    /// The job was stopped: suspended, deadline passed, or the launcher was signalled.
    Stopped,
}

impl EndCause {
    /// The key in [`Recovery::restarts`].
    pub fn as_str(self) -> &'static str {
        match self {
            EndCause::Succeeded => "Succeeded",
            EndCause::Failure => "Failure",
            EndCause::Disruption => "Disruption",
            EndCause::Stall => "Stall",
            EndCause::Stopped => "Stopped",
        }
    }
}

/// How and when an attempt ended.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttemptEnd {
    /// Succeeded, Failure, Disruption, Stall or Stopped.
    pub cause: EndCause,
    /// Machine-readable reason (the operator's lastFailure.reason: ExitCode, NodeLost,
    /// Disrupted, Stalled, ...; Succeeded).
    pub reason: String,
    /// The global rank that failed first, when known: the launchers' verdict of an in-place
    /// round; for a gang restart, the pod's rank when it runs one rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<i64>,
    /// The pod (node rank) that failed first, when the operator knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<i64>,
    /// The failed rank's exit code (0 for a success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The node the failed rank ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When it happened (the container's exit, the pod's deletion, the node's loss), when
    /// known; else when it was seen.
    pub failed_at: Timestamp,
    /// When the supervisor saw it.
    pub detected_at: Timestamp,
}

/// How a round of in-place restarts ended (`ferrotrain launch --restart-in-place`): node 0's
/// launcher records one per round, rank 0 serves them in its progress report, and the
/// operator turns each into an in-place restart of its ledger.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RoundEnd {
    /// The round that ended (0 is the attempt's first).
    pub round: u64,
    /// Why, who, when it happened and when the agents saw it. `node` is the blamed pod's
    /// host name.
    #[serde(flatten)]
    pub end: AttemptEnd,
    /// For people: what happened to the blamed rank.
    #[serde(default)]
    pub message: String,
    /// The last step rank 0 completed in the round, by its own record (the operator's polls
    /// may have seen an earlier one): the steps the next round trains again are counted from
    /// here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<u64>,
    /// The blamed rank's last lines of output in the round (at most 10), when its pod's
    /// launcher reported them: why it ended, readable after the round was replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
}

impl AttemptEnd {
    /// Seconds between the failure and its detection.
    pub fn detect_seconds(&self) -> f64 {
        seconds(self.failed_at, self.detected_at)
    }
}

/// One attempt: pods `<job>-<attempt>-*` (operator) or one start of the local ranks (launcher).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// The attempt number (status.attempt while it ran; FERROTRAIN_ATTEMPT of its ranks).
    pub attempt: i64,
    /// The in-place round of the attempt (FERROTRAIN_ROUND of its ranks): once a rank
    /// restarted in place, each round of the attempt has a record of its own (absent before
    /// and without in-place restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u64>,
    /// When its pods were created (its ranks spawned).
    pub started_at: Timestamp,
    /// When all its ranks ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_at: Option<Timestamp>,
    /// When its first training step completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step_at: Option<Timestamp>,
    /// The step it resumed from (0 for a fresh start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from_step: Option<u64>,
    /// Where its state came from: `peers` (a rank of the last round left alive) or
    /// `checkpoint`; absent for a fresh start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healed_from: Option<HealedFrom>,
    /// The last step it reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<u64>,
    /// When that step was first seen: training ends there, not at the failure (a rank that
    /// hangs until the collective timeout trains nothing meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step_at: Option<Timestamp>,
    /// The last complete checkpoint it reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_step: Option<u64>,
    /// How it ended (absent while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<AttemptEnd>,
    /// Steps it trained that were trained again (exact once the next attempt resumed,
    /// else estimated from its last checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_steps: Option<u64>,
    /// `fp16`: steps it skipped because the gradients overflowed (their data is not
    /// trained again; their time is not productive).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
    /// Seconds of its training that produced kept steps.
    #[serde(default)]
    pub productive_seconds: f64,
    /// The ranks that trained in it, as rank 0 reported (elastic: fewer than the gang's
    /// while pods are missing, each covering the missing ranks' shards of the same batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

impl AttemptRecord {
    /// Seconds from the attempt's start to its first step (start-up, rendezvous, restore).
    pub fn seconds_to_first_step(&self) -> Option<f64> {
        self.first_step_at.map(|t| seconds(self.started_at, t))
    }

    /// Whether it saved a checkpoint of its own (past the one it resumed from): it was
    /// training, so a failure after it is one failure, not a job that keeps failing.
    pub fn saved_a_checkpoint(&self) -> bool {
        self.checkpoint_step
            .is_some_and(|c| c > self.resumed_from_step.unwrap_or(0))
    }

    /// Whether what it trained is kept: a checkpoint of its own, or, where the next run
    /// starts from the state the ranks leave (`heals`: a launcher's rounds and restarts, an
    /// in-place round), a step past where it resumed.
    pub fn kept_progress(&self, heals: bool) -> bool {
        let stepped = self.last_step > self.resumed_from_step.or(Some(0));
        self.saved_a_checkpoint() || ((heals || self.round.is_some()) && stepped)
    }

    fn steps_done(&self) -> u64 {
        let from = self.resumed_from_step.unwrap_or(0);
        self.last_step.unwrap_or(from).saturating_sub(from)
    }

    /// Its productive seconds up to `until`: training time scaled by the kept share.
    fn productive_until(&self, until: Timestamp) -> f64 {
        let Some(first) = self.first_step_at else {
            return 0.0;
        };
        let end = self.end.as_ref().map_or(until, |e| e.failed_at);
        let end = self.last_step_at.map_or(end, |t| t.min(end));
        let training = seconds(first, end);
        let done = self.steps_done();
        if done == 0 {
            return 0.0;
        }
        let wasted = (self.lost_steps.unwrap_or(0) + self.skipped_steps).min(done);
        training * (done - wasted) as f64 / done as f64
    }
}

/// The job's recovery ledger.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// The last attempts, oldest first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// When the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// Wall time from the first attempt's start to the last update (or the end).
    #[serde(default)]
    pub total_seconds: f64,
    /// Time spent on training steps that were kept.
    #[serde(default)]
    pub productive_seconds: f64,
    /// productiveSeconds / totalSeconds, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_percent: Option<f64>,
    /// Steps trained twice because an attempt ended after its last checkpoint.
    #[serde(default)]
    pub lost_steps: u64,
    /// `fp16`: steps skipped on a gradient overflow, over every attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
    /// Productive seconds at each world size (key: the ranks training), over every attempt
    /// and round: the capacity an elastic job used at each size (times the GPUs of a rank).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seconds_by_world_size: BTreeMap<String, f64>,
    /// Ended attempts by cause (Failure, Disruption, Stall, Stopped): every restart, counted
    /// or not against maxRestarts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ends_by_cause: BTreeMap<String, u32>,
    /// Mean seconds from a failure to its detection, over all ended attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_detect_seconds: Option<f64>,
    /// Mean seconds from a failure to the next attempt's first step (the whole recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_recovery_seconds: Option<f64>,
    /// Productive seconds, lost steps, detect and recovery times of attempts that left the
    /// history (so the totals stay whole).
    #[serde(default, skip_serializing_if = "Retired::is_empty")]
    pub retired: Retired,
}

/// What attempts that left the history contributed to the totals.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Retired {
    /// Attempts no longer in the history.
    #[serde(default)]
    pub attempts: u32,
    /// Their productive seconds.
    #[serde(default)]
    pub productive_seconds: f64,
    /// Their lost steps.
    #[serde(default)]
    pub lost_steps: u64,
    /// Their skipped steps (`fp16` overflows).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
    /// Sum of their failures' detection times.
    #[serde(default)]
    pub detect_seconds: f64,
    /// Failures in `detectSeconds`.
    #[serde(default)]
    pub detections: u32,
    /// Sum of their failure-to-next-first-step times.
    #[serde(default)]
    pub recovery_seconds: f64,
    /// Recoveries in `recoverySeconds`.
    #[serde(default)]
    pub recoveries: u32,
    /// Their productive seconds at each world size.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seconds_by_world_size: BTreeMap<String, f64>,
}

impl Retired {
    pub fn is_empty(&self) -> bool {
        self.attempts == 0
    }
}

/// What a supervisor saw of the current attempt's progress (`Progress::step_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepReport {
    /// The in-place round the report is of (0 without in-place restarts).
    pub round: u64,
    pub step: u64,
    pub resumed_from_step: Option<u64>,
    pub first_step_at: Option<Timestamp>,
    pub checkpoint_step: Option<u64>,
    /// `fp16`: steps the run skipped on a gradient overflow so far.
    pub skipped_steps: u64,
    /// Where the run's state came from.
    pub healed_from: Option<HealedFrom>,
    /// The ranks training (None when the report does not say).
    pub world_size: Option<u32>,
}

/// Where an attempt's or round's state came from when it resumed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum HealedFrom {
    /// A rank of the last round that was left alive held it (its pod's snapshot of the step
    /// the gang last completed): only the step in flight was trained again.
    Peers,
    /// No rank held a state as new: the newest complete checkpoint (the steps since it were
    /// trained again).
    Checkpoint,
}

impl Recovery {
    /// The attempt being recorded, if it has not ended.
    pub fn current(&self) -> Option<&AttemptRecord> {
        self.attempts.last().filter(|a| a.end.is_none())
    }

    /// The failures in a row that the next restart follows: those of the attempts (or
    /// rounds) at the end of the history whose training was not kept
    /// ([`AttemptRecord::kept_progress`]; `heals`: the supervisor's next run starts from the
    /// state its ranks leave), plus the failure that ended the last one whose training was
    /// (it was training well: the count starts again there); at least 1. None without a
    /// record (nothing known).
    pub fn failures_in_a_row(&self, heals: bool) -> Option<u32> {
        self.attempts.last()?;
        let fruitless = self
            .attempts
            .iter()
            .rev()
            .take_while(|a| !a.kept_progress(heals))
            .count();
        let after_a_good_one = usize::from(fruitless < self.attempts.len());
        Some(((fruitless + after_a_good_one) as u32).max(1))
    }

    fn current_mut(&mut self) -> Option<&mut AttemptRecord> {
        self.attempts.last_mut().filter(|a| a.end.is_none())
    }

    /// Attempt `attempt` started at `at` (idempotent: a known attempt is left as it is).
    pub fn start(&mut self, attempt: i64, at: Timestamp) {
        if self.attempts.iter().any(|a| a.attempt == attempt) {
            return;
        }
        self.open(attempt, None, at);
    }

    /// Round `round` of attempt `attempt` started at `at`: its ranks were restarted in place
    /// (idempotent). The pods kept running, so the round runs from its start.
    pub fn start_round(&mut self, attempt: i64, round: u64, at: Timestamp) {
        let known = self
            .attempts
            .iter()
            .any(|a| a.attempt == attempt && a.round.unwrap_or(0) >= round);
        if known {
            return;
        }
        self.open(attempt, Some(round), at);
        self.running(at);
    }

    fn open(&mut self, attempt: i64, round: Option<u64>, at: Timestamp) {
        self.started_at.get_or_insert(at);
        self.attempts.push(AttemptRecord {
            attempt,
            round,
            started_at: at,
            running_at: None,
            first_step_at: None,
            resumed_from_step: None,
            healed_from: None,
            last_step: None,
            last_step_at: None,
            checkpoint_step: None,
            end: None,
            lost_steps: None,
            skipped_steps: 0,
            productive_seconds: 0.0,
            world_size: None,
        });
        self.retire();
        self.update(at);
    }

    /// All ranks of the current attempt run (the first time counts).
    pub fn running(&mut self, at: Timestamp) {
        if let Some(a) = self.current_mut() {
            a.running_at.get_or_insert(at);
        }
    }

    /// Rank 0 reported `r` at `at` (when its step completed, as near as the supervisor
    /// knows) for the current attempt.
    pub fn report(&mut self, r: StepReport, at: Timestamp) {
        let Some(a) = self.current_mut() else {
            return;
        };
        // Another round's report (a launcher serves the last round's until the new round's
        // rank 0 writes one) says nothing of this round.
        if a.round.unwrap_or(0) != r.round {
            return;
        }
        // Where the round started is known once its rank 0 says so or steps (a fresh start
        // says nothing): until then, a report is no sign that it started from step 0.
        let started = r.resumed_from_step.is_some() || r.first_step_at.is_some() || r.step > 0;
        if a.resumed_from_step.is_none() && started {
            a.resumed_from_step = Some(r.resumed_from_step.unwrap_or(0));
            a.healed_from = r.healed_from;
        }
        let from = a.resumed_from_step.unwrap_or(0);
        if r.step > from && a.first_step_at.is_none() {
            a.first_step_at = Some(r.first_step_at.unwrap_or(at));
        }
        if a.last_step != Some(r.step) {
            a.last_step_at = Some(at);
        }
        a.last_step = Some(r.step);
        a.skipped_steps = r.skipped_steps;
        if r.world_size.is_some() {
            a.world_size = r.world_size;
        }
        if r.checkpoint_step.is_some() {
            a.checkpoint_step = r.checkpoint_step;
        }
        let resumed = a.resumed_from_step;
        self.settle_previous_loss(resumed);
        self.update(at);
    }

    /// The ranks' own record says the current attempt (or round) reached `step`, which a
    /// supervisor that polls may not have seen: the steps trained again are counted from it.
    pub fn reached(&mut self, step: u64) {
        if let Some(a) = self.current_mut()
            && a.last_step.is_none_or(|s| s < step)
        {
            a.last_step = Some(step);
        }
    }

    /// The current attempt ended.
    pub fn end(&mut self, end: AttemptEnd) {
        let at = end.detected_at;
        let Some(a) = self.current_mut() else {
            return;
        };
        if end.cause != EndCause::Succeeded {
            let last = a.last_step.unwrap_or(0);
            let kept = a
                .checkpoint_step
                .unwrap_or(0)
                .max(a.resumed_from_step.unwrap_or(0));
            a.lost_steps = Some(last.saturating_sub(kept));
        }
        *self
            .ends_by_cause
            .entry(end.cause.as_str().to_string())
            .or_default() += 1;
        self.attempts.last_mut().expect("current").end = Some(end);
        self.update(at);
    }

    /// The previous attempt's steps lost are exact once this one says where it resumed.
    fn settle_previous_loss(&mut self, resumed: Option<u64>) {
        let n = self.attempts.len();
        let (Some(resumed), true) = (resumed, n >= 2) else {
            return;
        };
        // Back to the last record that trained a step: those after it (rounds that ended
        // before their first step) kept nothing of their own, so it is the one this record's
        // resume point settles.
        for prev in self.attempts[..n - 1].iter_mut().rev() {
            let failed = prev
                .end
                .as_ref()
                .is_some_and(|e| e.cause != EndCause::Succeeded);
            if failed && let Some(last) = prev.last_step {
                if resumed > last {
                    // The next record resumed from a step this one's last report had not
                    // reached (polled before rank 0 got there): it trained up to that step,
                    // until it ended.
                    prev.last_step = Some(resumed);
                    prev.last_step_at = prev.end.as_ref().map(|e| e.failed_at);
                }
                prev.lost_steps = Some(last.saturating_sub(resumed));
            }
            if prev.first_step_at.is_some() {
                break;
            }
        }
    }

    /// Drops the oldest attempts beyond [`MAX_ATTEMPTS`], keeping what they add to the totals.
    fn retire(&mut self) {
        while self.attempts.len() > MAX_ATTEMPTS {
            let old = self.attempts.remove(0);
            let cost = FailureCost::of(&old, self.attempts.first());
            let r = &mut self.retired;
            r.attempts += 1;
            r.productive_seconds += old.productive_seconds;
            if let Some(size) = old.world_size {
                *r.seconds_by_world_size.entry(size.to_string()).or_default() +=
                    old.productive_seconds;
            }
            r.lost_steps += old.lost_steps.unwrap_or(0);
            r.skipped_steps += old.skipped_steps;
            if let Some(cost) = cost {
                r.detect_seconds += cost.detect_seconds;
                r.detections += 1;
                if let Some(s) = cost.to_next_step {
                    r.recovery_seconds += s;
                    r.recoveries += 1;
                }
            }
        }
    }

    /// Recomputes the totals as of `now` (the end of the last attempt once it ended).
    pub fn update(&mut self, now: Timestamp) {
        for a in &mut self.attempts {
            a.productive_seconds = round3(a.productive_until(now));
        }
        let r = &self.retired;
        let (mut detect, mut detections) = (r.detect_seconds, r.detections);
        let (mut recovery, mut recoveries) = (r.recovery_seconds, r.recoveries);
        for cost in self.failure_costs() {
            detect += cost.detect_seconds;
            detections += 1;
            if let Some(s) = cost.to_next_step {
                recovery += s;
                recoveries += 1;
            }
        }
        self.mean_detect_seconds = (detections > 0).then(|| round3(detect / detections as f64));
        self.mean_recovery_seconds = (recoveries > 0).then(|| round3(recovery / recoveries as f64));
        self.productive_seconds = round3(
            r.productive_seconds
                + self
                    .attempts
                    .iter()
                    .map(|a| a.productive_seconds)
                    .sum::<f64>(),
        );
        let mut by_size = r.seconds_by_world_size.clone();
        for a in &self.attempts {
            if let Some(size) = a.world_size {
                *by_size.entry(size.to_string()).or_default() += a.productive_seconds;
            }
        }
        by_size.values_mut().for_each(|s| *s = round3(*s));
        self.seconds_by_world_size = by_size;
        self.lost_steps = r.lost_steps
            + self
                .attempts
                .iter()
                .filter_map(|a| a.lost_steps)
                .sum::<u64>();
        self.skipped_steps =
            r.skipped_steps + self.attempts.iter().map(|a| a.skipped_steps).sum::<u64>();
        let end = match self.attempts.last().and_then(|a| a.end.as_ref()) {
            Some(e) => e.detected_at,
            None => now,
        };
        self.total_seconds = self.started_at.map_or(0.0, |s| round3(seconds(s, end)));
        self.goodput_percent = (self.total_seconds > 0.0)
            .then(|| round3(100.0 * self.productive_seconds / self.total_seconds).min(100.0));
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// What a failure cost, read off the ledger: the time to detect it, the time from it to the
// next first step (the whole recovery), where the next start's state came from and the steps
// trained twice. The operator's metrics, the ledger's totals and `kubectl ferrotrain` all
// read it here.

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

fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()).max(0) as f64 / 1000.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
