//! The launcher's recovery ledger ([`ferrotrain_api::recovery`]): what each round of in-place
//! restarts (or, on several nodes without them, the attempt) cost, logged and kept in files.

use std::path::{Path, PathBuf};

use ferrotrain_api::recovery::{AttemptEnd, EndCause, Timestamp};
use ferrotrain_api::{Progress, Recovery, checksummed, reason};

use crate::files::PROGRESS_FILE;
use crate::group::GroupOutcome;

/// The launcher's recovery ledger ([`ferrotrain_api::recovery`]): fed with the group's starts
/// and exits and rank 0's progress file, logged at every attempt's end and kept in
/// `--recovery-file`.
pub struct Ledger {
    pub recovery: Recovery,
    progress_file: PathBuf,
    /// `--recovery-file`, and for the agent of node 0 the rounds file too.
    outs: Vec<PathBuf>,
    node: Option<String>,
}

impl Ledger {
    pub fn new(logs: &Path, outs: Vec<PathBuf>) -> Self {
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty());
        Ledger {
            recovery: Recovery::default(),
            progress_file: logs.join(PROGRESS_FILE),
            outs,
            node,
        }
    }

    /// Attempt `attempt` (single node), or round `round` of it (in-place restarts), started.
    pub fn started(&mut self, attempt: u64, round: Option<u64>) {
        let _ = std::fs::remove_file(&self.progress_file);
        let now = Timestamp::now();
        match round {
            Some(round) => self.recovery.start_round(attempt as i64, round, now),
            None => self.recovery.start(attempt as i64, now),
        }
        // The launcher's ranks run once spawned: no scheduling, no image pull.
        self.recovery.running(now);
        self.save();
    }

    /// The attempt's last report, read when it ended; rank 0 rewrites it after every step,
    /// so its modification time is when the last step completed. A damaged one (it carries
    /// its CRC-32C) is no report: the record keeps what it had rather than a wrong step.
    fn read_progress(&mut self) {
        let report = std::fs::read(&self.progress_file).ok().and_then(|b| {
            checksummed::open::<Progress>(&b, checksummed::CRC_FIELD)
                .inspect_err(|why| {
                    let path = self.progress_file.display();
                    tracing::warn!("launch: ignoring rank 0's progress file {path}: {why}")
                })
                .ok()
        });
        let written = std::fs::metadata(&self.progress_file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| Timestamp::try_from(t).ok())
            .unwrap_or_else(Timestamp::now);
        if let Some(p) = report {
            self.recovery.report(p.step_report(), written);
        }
    }

    pub fn ended(&mut self, outcome: &GroupOutcome) {
        let now = Timestamp::now();
        let (cause, reason, rank, code, at) = match outcome {
            GroupOutcome::Finished => (EndCause::Succeeded, reason::SUCCEEDED, None, Some(0), now),
            GroupOutcome::Signalled(s) => (
                EndCause::Stopped,
                reason::SIGNALLED,
                None,
                Some(128 + s),
                now,
            ),
            GroupOutcome::Failed(f) => {
                let reason = if f.code >= 128 {
                    reason::KILLED
                } else {
                    reason::EXIT_CODE
                };
                (
                    EndCause::Failure,
                    reason,
                    Some(f.rank as i64),
                    Some(f.code),
                    f.seen_at,
                )
            }
            // The agent records a peer's failure with end_with (it knows the peer's node).
            GroupOutcome::PeerFailed { .. } => {
                (EndCause::Failure, reason::PEER_FAILED, None, None, now)
            }
            GroupOutcome::Frozen { rank, seen_at } => (
                EndCause::Failure,
                reason::FROZEN,
                Some(*rank as i64),
                None,
                *seen_at,
            ),
        };
        self.end_with(AttemptEnd {
            cause,
            reason: reason.into(),
            rank,
            node_rank: None,
            exit_code: code,
            node: self.node.clone(),
            failed_at: at,
            detected_at: at,
        });
    }

    /// Closes the open record with `end` (after reading rank 0's last report).
    pub fn end_with(&mut self, end: AttemptEnd) {
        self.read_progress();
        self.recovery.end(end);
        self.save();
        self.log();
    }

    /// Writes the ledger to every output (JSON, replaced atomically).
    pub fn save(&self) {
        for out in &self.outs {
            let tmp = out.with_extension("tmp");
            let written = serde_json::to_vec_pretty(&self.recovery)
                .map_err(std::io::Error::other)
                .and_then(|json| std::fs::write(&tmp, json))
                .and_then(|()| std::fs::rename(&tmp, out));
            if let Err(e) = written {
                tracing::warn!(path = %out.display(), error = %e, "recovery file not written");
            }
        }
    }

    /// One line per attempt and one for the run.
    fn log(&self) {
        let r = &self.recovery;
        for line in recovery_lines(r) {
            tracing::info!("launch: {line}");
        }
    }
}

/// The ledger in words: each attempt, then the totals.
pub fn recovery_lines(r: &Recovery) -> Vec<String> {
    let mut lines = Vec::new();
    for a in &r.attempts {
        let to_first = a
            .seconds_to_first_step()
            .map_or("no step".to_string(), |s| {
                format!("first step after {s:.1} s")
            });
        let end = a.end.as_ref().map_or("running".to_string(), |e| {
            let who = e.rank.map_or(String::new(), |r| format!(" rank {r}"));
            let code = e.exit_code.map_or(String::new(), |c| format!(" exit {c}"));
            format!("{:?} ({}{who}{code})", e.cause, e.reason)
        });
        let lost = a
            .lost_steps
            .map_or(String::new(), |l| format!(", {l} steps lost"));
        let round = a.round.map_or(String::new(), |r| format!(" round {r}"));
        let skipped = match a.skipped_steps {
            0 => String::new(),
            n => format!(", {n} step(s) skipped on an fp16 overflow"),
        };
        lines.push(format!(
            "attempt {}{round}: resumed from step {}, {to_first}, reached step {}, {end}{lost}{skipped}",
            a.attempt,
            a.resumed_from_step.unwrap_or(0),
            a.last_step.unwrap_or(0),
        ));
    }
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2} s"));
    lines.push(format!(
        "recovery: {} start(s) of the ranks (attempts and rounds), {:.1} s in all, {:.1} s productive, goodput {}, {} steps lost, \
         detect {}, failure to next first step {}",
        r.attempts.len() + r.retired.attempts as usize,
        r.total_seconds,
        r.productive_seconds,
        r.goodput_percent
            .map_or("-".to_string(), |g| format!("{g:.1}%")),
        r.lost_steps,
        opt(r.mean_detect_seconds),
        opt(r.mean_recovery_seconds),
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(step: u64) -> Progress {
        Progress {
            step,
            resumed_from_step: Some(40),
            ..Progress::default()
        }
    }

    /// Issue 44: rank 0's progress file truncated, bit-flipped or zeroed at ten offsets: the
    /// attempt's record holds the report as written or none, never a step it did not reach.
    #[test]
    fn a_damaged_progress_file_is_ignored_never_counted() {
        let dir = tempfile::tempdir().unwrap();
        let good = checksummed::seal(&progress(1234), checksummed::CRC_FIELD).unwrap();
        let (mut ignored, mut read) = (0, 0);
        for copy in ferrotrain_fuzz::damage::copies(&good) {
            let mut ledger = Ledger::new(dir.path(), Vec::new());
            ledger.started(1, None);
            std::fs::write(dir.path().join(PROGRESS_FILE), &copy.bytes).unwrap();
            ledger.ended(&GroupOutcome::Finished);
            let attempt = &ledger.recovery.attempts[0];
            match attempt.last_step {
                None => ignored += 1,
                Some(step) => {
                    assert_eq!(
                        (step, attempt.resumed_from_step),
                        (1234, Some(40)),
                        "{copy}"
                    );
                    read += 1;
                }
            }
        }
        println!("{ignored} damaged progress files ignored, {read} read as written");
        assert!(ignored >= 28, "{ignored} ignored, {read} read");
        let mut ledger = Ledger::new(dir.path(), Vec::new());
        ledger.started(1, None);
        std::fs::write(dir.path().join(PROGRESS_FILE), &good).unwrap();
        ledger.ended(&GroupOutcome::Finished);
        assert_eq!(ledger.recovery.attempts[0].last_step, Some(1234));
    }
}
