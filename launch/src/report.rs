//! What node 0's launcher reports of its gang: rank 0's last progress report (which the rank
//! keeps in the progress file, one way: rank to launcher), with the round the ranks are in,
//! how every earlier round ended (the launcher's own record, [`RoundEnd`]) and the connections
//! the launcher's rendezvous store refused. The launcher serves it on the pod's endpoint
//! (`/progress`, `/metrics`), so the operator reads a gang's rounds from the one process that
//! rules them, and the report stays up while the ranks restart between rounds.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ferrotrain_api::recovery::RoundEnd;
use ferrotrain_api::{Progress, checksummed};

use crate::files::PROGRESS_FILE;
use crate::refused;

/// The gang's report as node 0's launcher knows it; cheap to clone (one shared state).
#[derive(Clone, Debug)]
pub struct GangReport {
    progress_file: PathBuf,
    shared: Arc<Mutex<Shared>>,
    /// The ranks are a script of the user's, which may never report a step.
    command: bool,
}

#[derive(Debug, Default)]
struct Shared {
    round: u64,
    ends: Vec<RoundEnd>,
    /// Rank 0's last report that could be read: kept across rounds (the file goes when a new
    /// round starts) and over a damaged read.
    last: Option<Progress>,
}

impl GangReport {
    /// The report of the launcher whose scratch directory is `logs`.
    pub fn new(logs: &std::path::Path) -> Self {
        GangReport {
            progress_file: logs.join(PROGRESS_FILE),
            shared: Arc::default(),
            command: false,
        }
    }

    /// The report of a launcher whose ranks run a user's command: until its rank 0 reports a
    /// step (`ferrotrain.report`), it says so (`noStepReports`), and the operator does not
    /// take the unchanging report for a stall.
    pub fn of_command(mut self) -> Self {
        self.command = true;
        self
    }

    /// The round the ranks train in now.
    pub(crate) fn round_started(&self, round: u64) {
        self.lock().round = round;
    }

    /// Round `end.round` ended as `end` says.
    pub(crate) fn round_ended(&self, end: RoundEnd) {
        self.lock().ends.push(end);
    }

    /// The report now: rank 0's newest (its progress file, else the last one read), with the
    /// round, the rounds' ends and the refused connections of this process and of the rank.
    pub fn now(&self) -> Progress {
        let read = std::fs::read(&self.progress_file).ok().and_then(|b| {
            checksummed::open::<Progress>(&b, checksummed::CRC_FIELD)
                .inspect_err(|why| {
                    tracing::debug!("launch: rank 0's progress file not read: {why}");
                })
                .ok()
        });
        let mut shared = self.lock();
        if let Some(report) = read {
            shared.last = Some(report);
        }
        // A report keeps the round its rank 0 wrote it in (an earlier round's until the new
        // round's rank 0 writes one): the operator's ledger takes a report for its own round
        // only. Before any report, the launcher's round.
        let mut p = shared.last.clone().unwrap_or_else(|| Progress {
            round: shared.round,
            ..Progress::default()
        });
        p.no_step_reports = self.command && shared.last.is_none();
        p.round_ends = shared.ends.clone();
        p.rejected_connections = refused::merged(refused::snapshot(), &p.rejected_connections);
        p
    }

    /// `report` (a rank's final one) with what only the launcher knows added: the rounds'
    /// ends and its refused connections.
    pub fn completed(&self, mut report: Progress) -> Progress {
        let shared = self.lock();
        report.round = shared.round;
        report.round_ends = shared.ends.clone();
        report.rejected_connections =
            refused::merged(refused::snapshot(), &report.rejected_connections);
        report
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrotrain_api::recovery::{AttemptEnd, EndCause, Timestamp};

    fn end(round: u64) -> RoundEnd {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        RoundEnd {
            round,
            end: AttemptEnd {
                cause: EndCause::Failure,
                reason: "Killed".into(),
                rank: Some(1),
                node_rank: None,
                exit_code: Some(137),
                node: None,
                failed_at: at,
                detected_at: at,
            },
            message: "rank 1 was killed".into(),
            last_step: Some(40),
            last_lines: Vec::new(),
        }
    }

    fn write(dir: &std::path::Path, step: u64) {
        write_in(dir, 0, step);
    }

    /// Rank 0's report of `step` in round `round`.
    fn write_in(dir: &std::path::Path, round: u64, step: u64) {
        let p = Progress {
            step,
            round,
            ..Progress::default()
        };
        let json = checksummed::seal(&p, checksummed::CRC_FIELD).unwrap();
        std::fs::write(dir.join(PROGRESS_FILE), json).unwrap();
    }

    #[test]
    fn the_report_is_rank_0s_with_the_launchers_rounds_and_survives_a_round_start() {
        let dir = tempfile::tempdir().unwrap();
        let report = GangReport::new(dir.path());
        report.round_started(2);
        let empty = report.now();
        assert_eq!(
            (empty.step, empty.round),
            (0, 2),
            "nothing yet: the launcher's round"
        );
        write_in(dir.path(), 2, 40);
        report.round_ended(end(2));
        report.round_started(3);
        // Round 2's report until round 3's rank 0 writes one: it says it is round 2's.
        let now = report.now();
        assert_eq!((now.step, now.round), (40, 2));
        assert_eq!(now.round_ends, [end(2)]);
        // A new round removes the file until its rank 0 steps: the last report stays.
        std::fs::remove_file(dir.path().join(PROGRESS_FILE)).unwrap();
        assert_eq!(report.clone().now().step, 40);
        // A damaged file is no report.
        std::fs::write(
            dir.path().join(PROGRESS_FILE),
            b"{\"step\": 99, \"crc32c\": \"0\"}",
        )
        .unwrap();
        assert_eq!(report.now().step, 40);
        write_in(dir.path(), 3, 50);
        let now = report.now();
        assert_eq!((now.step, now.round), (50, 3));
    }

    #[test]
    fn a_commands_report_says_no_step_was_reported_until_rank_0_reports_one() {
        let dir = tempfile::tempdir().unwrap();
        let trainer = GangReport::new(dir.path());
        let command = GangReport::new(dir.path()).of_command();
        assert!(!trainer.now().no_step_reports);
        assert!(command.now().no_step_reports);
        write(dir.path(), 3);
        assert!(!command.now().no_step_reports);
        // The report read once stays, and so does what it says.
        std::fs::remove_file(dir.path().join(PROGRESS_FILE)).unwrap();
        assert!(!command.now().no_step_reports);
    }

    #[test]
    fn a_final_report_gets_the_rounds_and_the_refused_connections() {
        let dir = tempfile::tempdir().unwrap();
        let report = GangReport::new(dir.path());
        report.round_ended(end(0));
        report.round_started(1);
        let rank0 = Progress {
            step: 600,
            rejected_connections: [("bad_token".to_string(), 2)].into(),
            ..Progress::default()
        };
        let done = report.completed(rank0);
        assert_eq!((done.step, done.round, done.round_ends.len()), (600, 1, 1));
        assert!(done.rejected_connections["bad_token"] >= 2);
    }
}
