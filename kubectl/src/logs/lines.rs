//! The lines `logs` prints, from the two places a rank's output is kept (launch/src/output.rs):
//! the pod's container log, where the launcher writes every rank's line after a label
//! (`[round 1 rank 3] `, `[rank 3] ` without rounds, `[spare of local rank 1] ` for a spare)
//! and its own lines without one; and a round's file of one rank, `round-<r>/rank-<n>.log`,
//! whose lines are the rank's own. Lines are merged by time (the kubelet's timestamp of a
//! container log's line, else the trainer's own RFC 3339 timestamp at the line's start; a line
//! without one, a panic's for instance, keeps the time of the line before it) and printed
//! after a `[round.rank]` label.

use std::collections::HashMap;

use ferrotrain_api::output::OutputLabel;
use jiff::Timestamp;

/// Whose line it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// A rank's, in a round (absent: a launcher without rounds).
    Rank { round: Option<u64>, rank: usize },
    /// A spare trainer's, before it was handed a rank: node `node`'s spare of local rank
    /// `local`.
    Spare { node: i32, local: usize },
    /// Node `node`'s launcher's own.
    Launcher { node: i32 },
}

/// One line of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub time: Option<Timestamp>,
    pub origin: Origin,
    pub text: String,
}

impl Line {
    /// `[1.3] text`, `[3] text` without rounds, `[node 0] text` for a launcher's, `[node 0
    /// spare 1] text` for a spare's.
    pub fn render(&self) -> String {
        let label = match self.origin {
            Origin::Rank {
                round: Some(round),
                rank,
            } => format!("{round}.{rank}"),
            Origin::Rank { round: None, rank } => rank.to_string(),
            Origin::Spare { node, local } => format!("node {node} spare {local}"),
            Origin::Launcher { node } => format!("node {node}"),
        };
        format!("[{label}] {}", self.text)
    }
}

/// Which lines to keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub round: Option<u64>,
    pub rank: Option<usize>,
}

impl Filter {
    /// Whether `line` is one of them: with a round or a rank, only ranks' lines that match;
    /// without either, every line.
    pub fn keeps(&self, line: &Line) -> bool {
        match line.origin {
            Origin::Rank { round, rank } => {
                self.rank.is_none_or(|r| r == rank)
                    && self.round.is_none_or(|want| round.unwrap_or(0) == want)
            }
            Origin::Spare { .. } | Origin::Launcher { .. } => {
                self.round.is_none() && self.rank.is_none()
            }
        }
    }
}

/// The label the launcher writes before a line (`ferrotrain_api::output::OutputLabel`, the
/// launcher's own type), as an origin of node 0's pod, and the rest of the line.
fn label(line: &str) -> Option<(Origin, &str)> {
    let (label, text) = OutputLabel::split(line)?;
    let origin = match label {
        OutputLabel::Rank { round, rank } => Origin::Rank { round, rank },
        OutputLabel::Spare { local_rank } => Origin::Spare {
            node: 0,
            local: local_rank,
        },
    };
    Some((origin, text))
}

/// The RFC 3339 timestamp a line starts with (tracing's format: `2026-12-01T12:00:00.123456Z
/// INFO ...`; colours, should there be any, are skipped).
fn leading_time(text: &str) -> Option<Timestamp> {
    let plain = skip_colour(text);
    let first = plain.split(' ').next().unwrap_or(plain);
    skip_colour_end(first).parse().ok()
}

/// `\x1b[2m` and the like at the start.
fn skip_colour(s: &str) -> &str {
    let mut s = s;
    while let Some(rest) = s.strip_prefix("\x1b[") {
        match rest.find('m') {
            Some(end) => s = &rest[end + 1..],
            None => return s,
        }
    }
    s
}

/// A word without a colour code at its end (`...Z\x1b[0m`).
fn skip_colour_end(word: &str) -> &str {
    word.find('\x1b').map_or(word, |at| &word[..at])
}

/// The lines of node `node`'s container log, as read with the kubelet's timestamps
/// (`timestamps=true`: `2026-12-01T12:00:00.123456789Z [round 0 rank 1] ...`).
pub fn container_log(node: i32, text: &str) -> Vec<Line> {
    let mut last: HashMap<Origin, Timestamp> = HashMap::new();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|raw| {
            let (kubelet, line) = match raw.split_once(' ') {
                Some((t, rest)) => match t.parse::<Timestamp>() {
                    Ok(t) => (Some(t), rest),
                    Err(_) => (None, raw),
                },
                None => (None, raw),
            };
            let (origin, text) = match label(line) {
                Some((Origin::Spare { local, .. }, text)) => (Origin::Spare { node, local }, text),
                Some(found) => found,
                None => (Origin::Launcher { node }, line),
            };
            let time = kubelet
                .or_else(|| leading_time(text))
                .or_else(|| last.get(&origin).copied());
            if let Some(t) = time {
                last.insert(origin, t);
            }
            Line {
                time,
                origin,
                text: text.to_string(),
            }
        })
        .collect()
}

/// The lines of rank `rank`'s file of round `round` (the rank's own, without labels).
pub fn round_file(round: u64, rank: usize, text: &str) -> Vec<Line> {
    let origin = Origin::Rank {
        round: Some(round),
        rank,
    };
    let mut last = None;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let time = leading_time(l).or(last);
            last = time;
            Line {
                time,
                origin,
                text: l.to_string(),
            }
        })
        .collect()
}

/// Every source's lines in one sequence, by time; a source's own order is kept among lines of
/// the same time, and lines that have no time yet come first.
pub fn merge(sources: Vec<Vec<Line>>) -> Vec<Line> {
    let mut all: Vec<Line> = sources.into_iter().flatten().collect();
    all.sort_by_key(|l| l.time);
    all
}

/// The last `n` of `lines` (all of them without `n`).
pub fn tail(mut lines: Vec<Line>, n: Option<usize>) -> Vec<Line> {
    if let Some(n) = n {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    lines
}

#[cfg(test)]
mod tests;
