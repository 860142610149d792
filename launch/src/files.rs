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

/// Where rank 0 keeps its progress report for the launcher.
pub const PROGRESS_FILE: &str = "rank-0.progress.json";
/// Where the agent of node 0 keeps the rounds' ends for rank 0, which serves them in its
/// progress report (`Progress.roundEnds`): how the operator learns of in-place restarts.
pub const ROUNDS_FILE: &str = "rounds.json";
/// Where the agent of node 0 counts the connections its rendezvous store refused, for rank 0's
/// progress report and /metrics.
pub const REFUSED_FILE: &str = "refused.json";

/// Node 0's agent: rewrites [`REFUSED_FILE`] in `dir` every two seconds while the count of
/// refused connections changes, for the life of the process.
pub fn keep_refusals_written(dir: std::path::PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("agent-refused".into())
        .spawn(move || {
            let mut last = std::collections::BTreeMap::new();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(2));
                let now = crate::refused::snapshot();
                if now == last {
                    continue;
                }
                let path = dir.join(REFUSED_FILE);
                let tmp = path.with_extension("tmp");
                let json = serde_json::to_vec(&now).expect("counts serialize");
                if std::fs::write(&tmp, json)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .is_ok()
                {
                    last = now;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("agent: refused connections will not be counted: {e}");
    }
}
