//! The files a launcher and its ranks share in the launcher's scratch directory.

use std::path::{Path, PathBuf};

/// Where one rank leaves its words for people (its termination message) and its typed record
/// of why it ended ([`ferrotrain_api::RankEnd`]), in the launcher's scratch directory `logs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankFiles {
    pub termination_log: PathBuf,
    pub end: PathBuf,
    /// A user's command: where torchrun's `@record` writes the error that ended the rank
    /// (TORCHELASTIC_ERROR_FILE).
    pub error: PathBuf,
}

impl RankFiles {
    pub fn of(logs: &Path, rank: usize) -> Self {
        RankFiles {
            termination_log: logs.join(format!("rank-{rank}.termination-log")),
            end: logs.join(format!("rank-{rank}.end.json")),
            error: logs.join(format!("rank-{rank}.error.json")),
        }
    }

    /// Removes what an earlier round's rank of the same number left.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.termination_log);
        let _ = std::fs::remove_file(&self.end);
        let _ = std::fs::remove_file(&self.error);
    }

    /// The rank's words on why it ended: its termination message, else the error torchrun's
    /// `@record` left (`{"message": {"message": "...", ...}}`); empty when neither says.
    pub fn message(&self) -> String {
        let log = std::fs::read_to_string(&self.termination_log).unwrap_or_default();
        if !log.trim().is_empty() {
            return log.trim().to_string();
        }
        let recorded = std::fs::read(&self.error).ok().and_then(|bytes| {
            let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
            let m = &v["message"];
            m["message"].as_str().or(m.as_str()).map(str::to_string)
        });
        let text = recorded.unwrap_or_default();
        // The last line says what it was (the error's type and words); the traceback is in
        // the rank's output.
        text.trim().lines().last().unwrap_or("").to_string()
    }
}

/// Where rank 0 keeps its progress report for its launcher (one way: node 0's launcher serves
/// it with what it knows of the rounds, report.rs).
pub const PROGRESS_FILE: &str = "rank-0.progress.json";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ranks_words_are_its_termination_message_else_torchruns_error_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = RankFiles::of(dir.path(), 3);
        assert_eq!(files.message(), "");
        // What torch.distributed.elastic's @record writes (ErrorHandler.record_exception).
        let error = r#"{"message": {"message": "RuntimeError: boom\nmore: CUDA out of memory", "extraInfo": {"py_callstack": "...", "timestamp": "1"}}}"#;
        std::fs::write(&files.error, error).unwrap();
        assert_eq!(files.message(), "more: CUDA out of memory");
        std::fs::write(&files.termination_log, "rank says why\n").unwrap();
        assert_eq!(files.message(), "rank says why");
        files.clear();
        assert!(!files.error.exists() && !files.termination_log.exists());
    }
}
