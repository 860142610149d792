//! Rank 0's step log (`train-log.jsonl`), appended to across restarts. Never read back by
//! the trainer: a damaged log costs its damaged lines, not the run; so does a disk that
//! refuses a line (full, read-only: the lines are lost until it takes them again).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use super::job::TRAIN_LOG;
use crate::error::{Result, refused};

/// The log file, and whether its last line may be cut short.
pub(super) struct StepLog {
    file: File,
    /// The last write failed or an earlier run's last line was cut (a rank 0 killed
    /// mid-write): the next line starts on a line of its own.
    cut: bool,
    /// The disk refuses lines (said once until it takes one again).
    refusing: bool,
}

impl StepLog {
    /// Rank 0's log in `job_dir` (none on the others).
    pub(super) fn open(leader: bool, job_dir: &Path) -> Result<Option<StepLog>> {
        if !leader {
            return Ok(None);
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(job_dir.join(TRAIN_LOG))?;
        let cut = ends_mid_line(&file)?;
        Ok(Some(StepLog {
            file,
            cut,
            refusing: false,
        }))
    }

    /// Appends `line` in one write (a line formatted straight into the file takes a write per
    /// token, and a kill between them leaves half a line). A disk that refuses it costs the
    /// line, with a warning the first time.
    pub(super) fn append(&mut self, line: &serde_json::Value) -> Result<()> {
        let start = if self.cut { "\n" } else { "" };
        match self.file.write_all(format!("{start}{line}\n").as_bytes()) {
            Ok(()) => {
                if self.refusing {
                    tracing::info!("{TRAIN_LOG}: the disk takes lines again");
                }
                (self.cut, self.refusing) = (false, false);
                Ok(())
            }
            Err(e) if refused(&e) => {
                if !self.refusing {
                    tracing::warn!(error = %e, "{TRAIN_LOG}: the disk refuses lines; they are lost until it takes them again (training goes on)");
                }
                (self.cut, self.refusing) = (true, true);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn ends_mid_line(file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last != *b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: whatever damage the log took (truncated, a bit flipped, zeroed at ten
    /// offsets), the trainer opens it and its next line is a line of its own that parses.
    #[test]
    fn a_damaged_train_log_is_appended_to_with_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TRAIN_LOG);
        let mut good = Vec::new();
        for step in 1..=4 {
            let line = serde_json::json!({"step": step, "loss": 3.5, "samples": step * 64});
            good.extend(format!("{line}\n").bytes());
        }
        let next = serde_json::json!({"step": 5, "loss": 3.25});
        for copy in ferrotrain_fuzz::damage::copies(&good) {
            std::fs::write(&path, &copy.bytes).unwrap();
            let mut log = StepLog::open(true, dir.path()).unwrap().unwrap();
            log.append(&next).unwrap();
            let text = std::fs::read(&path).unwrap();
            let last = text[..text.len() - 1]
                .split(|&b| b == b'\n')
                .next_back()
                .unwrap();
            let parsed: serde_json::Value = serde_json::from_slice(last)
                .unwrap_or_else(|e| panic!("{copy}: {e}: {}", String::from_utf8_lossy(last)));
            assert_eq!(parsed, next, "{copy}");
            assert!(
                text.starts_with(&copy.bytes),
                "{copy}: the old lines are kept"
            );
        }
    }

    /// A full disk costs lines, not the run; the first line it takes again is whole. /dev/full
    /// answers every write with ENOSPC, as a full volume does.
    #[test]
    fn a_full_disk_costs_lines_and_the_next_line_it_takes_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = StepLog::open(true, dir.path()).unwrap().unwrap();
        log.append(&serde_json::json!({"step": 1})).unwrap();
        let file = std::mem::replace(
            &mut log.file,
            OpenOptions::new().write(true).open("/dev/full").unwrap(),
        );
        for step in 2..=3 {
            log.append(&serde_json::json!({"step": step})).unwrap();
        }
        assert!(log.refusing && log.cut);
        log.file = file;
        // What a write cut by a full disk leaves.
        log.file.write_all(b"{\"step\":").unwrap();
        log.append(&serde_json::json!({"step": 4})).unwrap();
        assert!(!log.refusing);
        let text = std::fs::read_to_string(dir.path().join(TRAIN_LOG)).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"step\":\n{\"step\":4}\n");
        // Another error is the run's.
        log.file = File::open(dir.path().join(TRAIN_LOG)).unwrap();
        assert!(log.append(&serde_json::json!({"step": 5})).is_err());
    }
}
