//! The files a launcher and its ranks share in the launcher's scratch directory.

use std::path::{Path, PathBuf};

/// Where one rank leaves its words for people (its termination message) and its typed record
/// of why it ended ([`ferrotrain_api::RankEnd`]), in the launcher's scratch directory `logs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFiles {
    pub termination_log: PathBuf,
    pub end: PathBuf,
}

impl RankFiles {
    pub fn of(logs: &Path, rank: usize) -> Self {
        RankFiles {
            termination_log: logs.join(format!("rank-{rank}.termination-log")),
            end: logs.join(format!("rank-{rank}.end.json")),
        }
    }

    /// Removes what an earlier round's rank of the same number left.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.termination_log);
        let _ = std::fs::remove_file(&self.end);
    }
}

/// Where rank 0 keeps its progress report for its launcher (one way: node 0's launcher serves
/// it with what it knows of the rounds, report.rs).
pub const PROGRESS_FILE: &str = "rank-0.progress.json";
