//! How a rank's output is kept, between the launcher that keeps it (launch/src/output.rs) and
//! `kubectl ferrotrain logs` that reads it: the label before each line of the pod's log, and
//! the file of each rank's round. Both sides use this one type, written and read here.

use std::fmt;

/// The directory in the temporary directory where a launcher keeps its ranks' files, unless
/// [`crate::env::FERROTRAIN_OUTPUT_DIR`] names another.
pub const DEFAULT_DIR_NAME: &str = "ferrotrain-output";

/// Whose line of the pod's log it is: the label the launcher writes before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputLabel {
    /// Rank `rank`'s line in round `round` (none: a launcher without rounds).
    Rank { round: Option<u64>, rank: usize },
    /// A spare trainer's, for local rank `local_rank`, before it is handed a rank.
    Spare { local_rank: usize },
}

impl OutputLabel {
    /// The label at the start of `line` and the rest of the line (after one space), if the
    /// line starts with one.
    pub fn split(line: &str) -> Option<(OutputLabel, &str)> {
        let rest = line.strip_prefix('[')?;
        let end = rest.find(']')?;
        let (inside, after) = (&rest[..end], &rest[end + 1..]);
        let text = match after.strip_prefix(' ') {
            Some(text) => text,
            None if after.is_empty() => "",
            None => return None,
        };
        let words: Vec<&str> = inside.split(' ').collect();
        let label = match words.as_slice() {
            ["round", round, "rank", rank] => OutputLabel::Rank {
                round: Some(round.parse().ok()?),
                rank: rank.parse().ok()?,
            },
            ["rank", rank] => OutputLabel::Rank {
                round: None,
                rank: rank.parse().ok()?,
            },
            ["spare", "of", "local", "rank", local] => OutputLabel::Spare {
                local_rank: local.parse().ok()?,
            },
            _ => return None,
        };
        Some((label, text))
    }

    /// The path of this rank's file for the round, relative to the output directory
    /// (`round-<r>/rank-<n>.log`; `attempt/rank-<n>.log` without rounds); none for a spare.
    pub fn file(&self) -> Option<String> {
        match *self {
            OutputLabel::Rank {
                round: Some(round),
                rank,
            } => Some(format!("round-{round}/rank-{rank}.log")),
            OutputLabel::Rank { round: None, rank } => Some(format!("attempt/rank-{rank}.log")),
            OutputLabel::Spare { .. } => None,
        }
    }
}

/// `[round 1 rank 3]`, `[rank 3]`, `[spare of local rank 1]`.
impl fmt::Display for OutputLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputLabel::Rank {
                round: Some(round),
                rank,
            } => write!(f, "[round {round} rank {rank}]"),
            OutputLabel::Rank { round: None, rank } => write!(f, "[rank {rank}]"),
            OutputLabel::Spare { local_rank } => write!(f, "[spare of local rank {local_rank}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_reads_back_as_written_with_the_rest_of_its_line() {
        let labels = [
            OutputLabel::Rank {
                round: Some(7),
                rank: 12,
            },
            OutputLabel::Rank {
                round: None,
                rank: 3,
            },
            OutputLabel::Spare { local_rank: 1 },
        ];
        for label in labels {
            let line = format!("{label} 2026-12-01T12:00:00Z INFO [x] step 5");
            assert_eq!(
                OutputLabel::split(&line),
                Some((label, "2026-12-01T12:00:00Z INFO [x] step 5")),
                "{line}"
            );
            assert_eq!(OutputLabel::split(&label.to_string()), Some((label, "")));
        }
    }

    #[test]
    fn a_line_without_the_launchers_label_has_none() {
        for line in [
            "launch: attempt 0 round 1: resumed",
            "[round x rank 1] a",
            "[rank 3]x",
            "[node 0] a",
            "[round 1 rank] a",
            "",
        ] {
            assert_eq!(OutputLabel::split(line), None, "{line}");
        }
    }

    #[test]
    fn a_ranks_file_is_named_after_its_round() {
        let rank = |round| OutputLabel::Rank { round, rank: 5 };
        assert_eq!(rank(Some(2)).file().as_deref(), Some("round-2/rank-5.log"));
        assert_eq!(rank(None).file().as_deref(), Some("attempt/rank-5.log"));
        assert_eq!(OutputLabel::Spare { local_rank: 0 }.file(), None);
    }
}
