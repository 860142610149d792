//! What `watch` shows of a job, from its status alone: a pure function of the object and the
//! time, so every line is tested here. On a terminal the lines are redrawn in place
//! (src/terminal.rs); elsewhere each line is printed when it changes (src/watch.rs).

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase, condition};
use jiff::Timestamp;

use crate::format::{age, loss, percent, rate, seconds, short_seconds, steps};
use crate::ledger::healed;
use ferrotrain_api::recovery::FailureCost;

/// Width of the progress bar between its brackets.
const BAR: usize = 30;
/// Lines of the blamed rank's last output shown under its failure.
const LAST_LINES: usize = 3;

/// The view of a job, line by line; each part is absent when the status has nothing for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct View {
    /// Name, phase, attempt and round, world size, restarts.
    pub header: String,
    /// Since the job started (or last resumed), to its end once it ended.
    pub age: Option<String>,
    /// Why the job is in its phase, when the status says (a condition's message).
    pub note: Option<String>,
    /// The bar, for a terminal.
    pub bar: Option<String>,
    /// Step of total, percent, ETA, rates.
    pub progress: String,
    /// Loss, evaluation, the network's share of a step.
    pub metrics: Option<String>,
    /// The last failure and its recovery.
    pub failure: Vec<String>,
    /// Goodput and how fresh the report is.
    pub footer: Option<String>,
}

impl View {
    /// The lines a terminal shows.
    pub fn lines(&self) -> Vec<String> {
        let header = match &self.age {
            Some(age) => format!("{}  age {age}", self.header),
            None => self.header.clone(),
        };
        let mut out = vec![header];
        out.extend(self.note.clone());
        out.push(match &self.bar {
            Some(bar) => format!("{bar} {}", self.progress),
            None => self.progress.clone(),
        });
        out.extend(self.metrics.clone());
        out.extend(self.failure.iter().cloned());
        out.extend(self.footer.clone());
        out
    }

    /// The parts whose change is a line of its own where the output is no terminal: all but
    /// the age, the bar and the footer, which change with every report.
    pub fn parts(&self) -> Vec<String> {
        let mut out = vec![self.header.clone()];
        out.extend(self.note.clone());
        out.push(self.progress.clone());
        out.extend(self.metrics.clone());
        out.extend(self.failure.iter().cloned());
        out
    }
}

/// The view of `dt` at `now`.
pub fn view(dt: &DistributedTraining, now: Timestamp) -> View {
    let empty = DistributedTrainingStatus::default();
    let status = dt.status.as_ref().unwrap_or(&empty);
    let progress = status.progress.as_ref();
    View {
        header: header(dt, status),
        age: age_of(dt, status, now),
        note: note(status),
        bar: progress
            .filter(|p| p.report.total_steps > 0)
            .map(|p| bar(p.report.step, p.report.total_steps)),
        progress: progress_line(status),
        metrics: metrics(status),
        failure: failure(status),
        footer: footer(status, now),
    }
}

fn header(dt: &DistributedTraining, status: &DistributedTrainingStatus) -> String {
    let name = dt.metadata.name.as_deref().unwrap_or_default();
    let desired = dt.spec.world_size();
    let world = status
        .progress
        .as_ref()
        .map(|p| p.report.world_size as i32)
        .filter(|w| *w > 0)
        .or(status.current_world_size)
        .unwrap_or(desired);
    let mut out = format!(
        "{name}  {}  attempt {}, round {}  world size {world}",
        status.phase, status.attempt, status.round
    );
    if world < desired {
        out += &format!(" of {desired}");
    } else if world > desired {
        // Grown into pods beyond replicas (elastic.maxReplicas).
        out += &format!(" ({desired} asked for)");
    }
    out + &format!(
        "  restarts {}/{}",
        status.restarts, dt.spec.restart_policy.max_restarts
    )
}

fn age_of(
    dt: &DistributedTraining,
    status: &DistributedTrainingStatus,
    now: Timestamp,
) -> Option<String> {
    let start = status
        .start_time
        .as_ref()
        .or(dt.metadata.creation_timestamp.as_ref())?;
    let end = status.completion_time.as_ref().map_or(now, |t| t.0);
    Some(age(seconds(start.0, end)))
}

/// The message of the condition that explains the phase, when there is one.
fn note(status: &DistributedTrainingStatus) -> Option<String> {
    let type_ = match status.phase {
        Phase::Failed => condition::FAILED,
        Phase::Queued => condition::QUEUED,
        Phase::Restarting => condition::RESTARTING,
        Phase::Suspended => condition::SUSPENDED,
        Phase::Pending | Phase::Starting => condition::RUNNING,
        Phase::Running if status.is_true(condition::STALLED) => condition::STALLED,
        Phase::Running | Phase::Succeeded => return None,
    };
    let c = status.condition(type_)?;
    (!c.message.is_empty()).then(|| format!("{}: {}", c.reason, c.message))
}

/// `[=========>                    ]`.
pub fn bar(step: u64, total: u64) -> String {
    let done = ((step.min(total) as f64 / total.max(1) as f64) * BAR as f64).floor() as usize;
    let mut out = String::from("[");
    out.extend(std::iter::repeat_n('=', done));
    if done < BAR {
        out.push('>');
        out.extend(std::iter::repeat_n(' ', BAR - done - 1));
    }
    out.push(']');
    out
}

fn progress_line(status: &DistributedTrainingStatus) -> String {
    let Some(p) = status.progress.as_ref() else {
        return if status.phase.is_finished() {
            "no progress was reported".into()
        } else {
            "waiting for rank 0's first report".into()
        };
    };
    let r = &p.report;
    let mut parts = vec![format!("step {}", steps(r.step, r.total_steps))];
    if let Some(eta) = p.eta.clone().or_else(|| r.eta_seconds.map(age)) {
        parts.push(format!("ETA {eta}"));
    }
    if let Some(s) = r.steps_per_second {
        parts.push(format!("{} steps/s", rate(s)));
    }
    if let Some(t) = r.tokens_per_second {
        parts.push(format!("{} tokens/s", rate(t)));
    }
    parts.join("  ")
}

fn metrics(status: &DistributedTrainingStatus) -> Option<String> {
    let r = &status.progress.as_ref()?.report;
    let mut parts = Vec::new();
    if let Some(l) = r.loss {
        parts.push(format!("loss {}", loss(l)));
    }
    if let Some(l) = r.eval_loss {
        parts.push(format!("eval loss {}", loss(l)));
    }
    if let Some(b) = r.eval_bleu {
        parts.push(format!("BLEU {b:.1}"));
    }
    if let (Some(step), true) = (r.eval_step, r.eval_loss.is_some() || r.eval_bleu.is_some()) {
        parts.push(format!("(eval at step {step})"));
    }
    if let Some(c) = r.comm_fraction {
        parts.push(format!("network {} of each step", percent(c)));
    }
    (!parts.is_empty()).then(|| parts.join("  "))
}

/// The last failure, what its recovery cost, and the blamed rank's last lines.
fn failure(status: &DistributedTrainingStatus) -> Vec<String> {
    let Some(f) = status.last_failure.as_ref() else {
        return Vec::new();
    };
    let who = match (f.rank, f.pod.as_deref()) {
        (Some(rank), Some(pod)) => format!("rank {rank} (pod {pod})"),
        (None, Some(pod)) => format!("pod {pod}"),
        (Some(rank), None) => format!("rank {rank}"),
        (None, None) => "the gang".to_string(),
    };
    let cost = status.recovery.as_ref().and_then(|r| r.last_failure_cost());
    let when = cost.as_ref().map_or_else(
        || format!("attempt {}", f.attempt),
        |c| format!("round {} of attempt {}", c.round, c.attempt),
    );
    let mut head = format!("last failure: {who} {}, {when}", f.reason);
    if !f.message.is_empty() {
        head += &format!(": {}", f.message);
    }
    let mut out = vec![head];
    if let Some(cost) = cost {
        out.push(format!("  recovery: {}", recovery_line(&cost)));
    }
    let skip = f.last_lines.len().saturating_sub(LAST_LINES);
    out.extend(f.last_lines[skip..].iter().map(|l| format!("  | {l}")));
    out
}

/// `round 1 resumed from step 303 (peers) 0.50 s after the failure (detected in 0.05 s), 0
/// steps trained twice`.
pub fn recovery_line(cost: &FailureCost) -> String {
    let detected = format!("detected in {}", short_seconds(cost.detect_seconds));
    let Some((attempt, round)) = cost.next_round else {
        return format!("{detected}; no new round yet");
    };
    let next = if attempt == cost.attempt {
        format!("round {round}")
    } else {
        format!("attempt {attempt}")
    };
    match (cost.to_next_step, cost.resumed_from) {
        (Some(t), Some((step, from))) => format!(
            "{next} resumed from step {step} (state from {}) {} after the failure ({detected}), {} steps trained twice",
            healed(from),
            short_seconds(t),
            cost.lost_steps
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        ),
        _ => format!("{next} started, waiting for its first step ({detected})"),
    }
}

fn footer(status: &DistributedTrainingStatus, now: Timestamp) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(g) = status.recovery.as_ref().and_then(|r| r.goodput_percent) {
        parts.push(format!("goodput {g:.1}%"));
    }
    if let Some(t) = status.progress.as_ref().and_then(|p| p.updated_at.as_ref())
        && !status.phase.is_finished()
    {
        parts.push(format!("report changed {} ago", age(seconds(t.0, now))));
    }
    (!parts.is_empty()).then(|| parts.join("  "))
}

/// The line `watch` ends with: how the job ended.
pub fn closing_line(dt: &DistributedTraining) -> String {
    let name = dt.metadata.name.as_deref().unwrap_or_default();
    let Some(status) = dt.status.as_ref() else {
        return format!("{name} has no status");
    };
    let mut out = format!("{name} {}", status.phase);
    if let (Some(start), Some(end)) = (&status.start_time, &status.completion_time) {
        out += &format!(" after {}", age(seconds(start.0, end.0)));
    }
    if let Some(p) = &status.progress {
        out += &format!(": step {}", p.report.step);
        if p.report.total_steps > 0 {
            out += &format!("/{}", p.report.total_steps);
        }
    }
    out += &match status.restarts {
        1 => ", 1 restart".to_string(),
        n => format!(", {n} restarts"),
    };
    if let Some(r) = &status.recovery {
        if let Some(g) = r.goodput_percent {
            out += &format!(", goodput {g:.1}%");
        }
        out += &format!(", {} steps trained twice", r.lost_steps);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    #[test]
    fn a_training_job_after_a_recovery() {
        let v = view(&fixtures::training_job(), at("2026-12-01T12:01:02Z"));
        assert_eq!(
            v.lines(),
            [
                "copy  Running  attempt 0, round 1  world size 2  restarts 1/5  age 1m02s",
                "[==============>               ] step 1450/3000 48%  ETA 43s  35.9 steps/s  41.2k tokens/s",
                "loss 0.01180  eval loss 0.003100  BLEU 98.2  (eval at step 1000)  network 12% of each step",
                "last failure: rank 1 (pod copy-0-1) Killed, round 0 of attempt 0: rank 1 was killed by signal 9 (SIGKILL)",
                "  recovery: round 1 resumed from step 303 (state from peers) 0.50 s after the failure (detected in 0.05 s), 0 steps trained twice",
                "  | 2026-12-01T12:00:29.100000Z  INFO ferrotrain::train: step 300 loss 0.0213",
                "  | 2026-12-01T12:00:29.500000Z  INFO ferrotrain::checkpoint: saved step 300",
                "goodput 97.1%  report changed 2s ago",
            ]
        );
    }

    #[test]
    fn a_round_that_has_not_stepped_yet_says_so() {
        let mut dt = fixtures::training_job();
        let status = dt.status.as_mut().unwrap();
        status.recovery.as_mut().unwrap().attempts[1].first_step_at = None;
        let v = view(&dt, at("2026-12-01T12:01:02Z"));
        assert_eq!(
            v.failure[1],
            "  recovery: round 1 started, waiting for its first step (detected in 0.05 s)"
        );
    }

    #[test]
    fn before_the_first_report_and_with_fewer_ranks() {
        let mut dt = fixtures::training_job();
        let status = dt.status.as_mut().unwrap();
        status.progress = None;
        status.last_failure = None;
        status.current_world_size = Some(1);
        let v = view(&dt, at("2026-12-01T12:00:05Z"));
        assert_eq!(
            v.header,
            "copy  Running  attempt 0, round 1  world size 1 of 2  restarts 1/5"
        );
        assert_eq!(v.age.as_deref(), Some("5s"));
        assert_eq!(v.progress, "waiting for rank 0's first report");
        assert_eq!((v.bar, v.metrics), (None, None));
        assert!(v.failure.is_empty());
        // Grown beyond replicas (elastic.maxReplicas).
        let status = dt.status.as_mut().unwrap();
        status.current_world_size = Some(3);
        let v = view(&dt, at("2026-12-01T12:00:05Z"));
        assert_eq!(
            v.header,
            "copy  Running  attempt 0, round 1  world size 3 (2 asked for)  restarts 1/5"
        );
    }

    #[test]
    fn the_bar_fills_with_the_steps() {
        assert_eq!(bar(0, 10), format!("[>{}]", " ".repeat(29)));
        assert_eq!(
            bar(5, 10),
            format!("[{}>{}]", "=".repeat(15), " ".repeat(14))
        );
        assert_eq!(bar(10, 10), format!("[{}]", "=".repeat(30)));
        assert_eq!(bar(12, 10), bar(10, 10));
    }

    #[test]
    fn a_finished_job_closes_with_its_account() {
        let dt = fixtures::succeeded_job();
        assert_eq!(
            closing_line(&dt),
            "copy Succeeded after 1m37s: step 3000/3000, 1 restart, goodput 97.1%, 0 steps trained twice"
        );
        let v = view(&dt, at("2026-12-01T12:05:00Z"));
        assert_eq!(v.progress, "step 3000/3000 100%");
        assert_eq!(v.footer.as_deref(), Some("goodput 97.1%"));
        assert_eq!(v.age.as_deref(), Some("1m37s"), "to the end, not to now");
    }

    #[test]
    fn the_parts_printed_per_change_leave_out_what_changes_with_every_report() {
        let v = view(&fixtures::training_job(), at("2026-12-01T12:01:02Z"));
        let parts = v.parts();
        assert!(
            parts
                .iter()
                .all(|p| !p.contains("[===") && !p.contains("ago") && !p.contains("age ")),
            "{parts:?}"
        );
        assert_eq!(
            parts[1],
            "step 1450/3000 48%  ETA 43s  35.9 steps/s  41.2k tokens/s"
        );
    }
}
