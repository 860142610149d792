//! The recovery ledger (`status.recovery`, api/src/recovery.rs) for people: a row per attempt
//! and round (its world size, what ended it, the rank blamed, the time to detect it and to the next step, the
//! steps trained twice, where the next one's state came from), the job's totals, and what the
//! last failure cost, which `watch` shows too.

use ferrotrain_api::Recovery;
use ferrotrain_api::crd::labels::pod_name;
use ferrotrain_api::recovery::{AttemptRecord, EndCause, HealedFrom};

use crate::format::{clock, short_seconds};
use crate::table::table;

/// The round of a record (absent: the attempt's first).
fn round_of(r: &AttemptRecord) -> u64 {
    r.round.unwrap_or(0)
}

/// `peers`, `checkpoint`, or `-` for a fresh start.
pub fn healed(from: Option<HealedFrom>) -> &'static str {
    match from {
        Some(HealedFrom::Peers) => "peers",
        Some(HealedFrom::Checkpoint) => "checkpoint",
        None => "-",
    }
}

const HEADER: [&str; 14] = [
    "ATTEMPT",
    "ROUND",
    "WORLD",
    "STARTED",
    "FIRST STEP",
    "RESUMED",
    "STATE FROM",
    "LAST STEP",
    "ENDED BY",
    "RANK",
    "POD",
    "DETECT",
    "NEXT STEP",
    "LOST",
];

/// The ledger of job `job` as a table and its totals.
pub fn ledger_table(job: &str, recovery: &Recovery) -> String {
    let rows: Vec<Vec<String>> = recovery
        .attempts
        .iter()
        .enumerate()
        .map(|(i, r)| row(job, r, recovery.attempts.get(i + 1)))
        .collect();
    let mut out = table(&HEADER, &rows);
    out.push('\n');
    out.push_str(&totals(recovery));
    out
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn row(job: &str, r: &AttemptRecord, next: Option<&AttemptRecord>) -> Vec<String> {
    let end = r.end.as_ref();
    let ended_by = end.map_or_else(
        || "(running)".to_string(),
        |e| {
            if e.cause == EndCause::Succeeded || e.reason == e.cause.as_str() {
                e.cause.as_str().to_string()
            } else {
                format!("{} {}", e.cause.as_str(), e.reason)
            }
        },
    );
    let pod = end
        .and_then(|e| e.node_rank)
        .map(|n| pod_name(job, r.attempt as i32, n as i32));
    let next_step = end.filter(|e| e.cause.is_recovered_from()).and_then(|e| {
        next.and_then(|n| n.first_step_at)
            .map(|t| short_seconds(e.recovery_seconds(t)))
    });
    vec![
        r.attempt.to_string(),
        round_of(r).to_string(),
        or_dash(r.world_size),
        clock(r.started_at),
        or_dash(r.seconds_to_first_step().map(short_seconds)),
        r.resumed_from_step.unwrap_or(0).to_string(),
        healed(r.healed_from).to_string(),
        or_dash(r.last_step),
        ended_by,
        or_dash(end.and_then(|e| e.rank)),
        or_dash(pod),
        or_dash(
            end.filter(|e| e.cause.is_recovered_from())
                .map(|e| short_seconds(e.detect_seconds())),
        ),
        or_dash(next_step),
        or_dash(r.lost_steps),
    ]
}

/// The job's totals under the table.
fn totals(recovery: &Recovery) -> String {
    let mut parts = Vec::new();
    if let Some(g) = recovery.goodput_percent {
        parts.push(format!(
            "goodput {g:.1}%: {} productive of {}",
            short_seconds(recovery.productive_seconds),
            short_seconds(recovery.total_seconds)
        ));
    }
    parts.push(format!("{} steps trained twice", recovery.lost_steps));
    // An elastic job's capacity: how long it trained at each size.
    if recovery.seconds_by_world_size.len() > 1 {
        let sizes: Vec<String> = recovery
            .seconds_by_world_size
            .iter()
            .map(|(size, s)| format!("{} at {size}", short_seconds(*s)))
            .collect();
        parts.push(format!("ranks: {}", sizes.join(", ")));
    }
    if !recovery.ends_by_cause.is_empty() {
        let ends: Vec<String> = recovery
            .ends_by_cause
            .iter()
            .map(|(cause, n)| format!("{cause} {n}"))
            .collect();
        parts.push(format!("ends: {}", ends.join(", ")));
    }
    if let Some(d) = recovery.mean_detect_seconds {
        parts.push(format!("mean detect {}", short_seconds(d)));
    }
    if let Some(r) = recovery.mean_recovery_seconds {
        parts.push(format!("mean failure to next step {}", short_seconds(r)));
    }
    let mut out = parts.join("; ") + "\n";
    if recovery.retired.attempts > 0 {
        out += &format!(
            "{} older attempts are counted in the totals but no longer listed\n",
            recovery.retired.attempts
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_table_has_a_row_per_round_and_the_totals() {
        let text = ledger_table("copy", &fixtures::recovered_ledger());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("ATTEMPT   ROUND   WORLD   STARTED"),
            "{text}"
        );
        assert!(lines[0].ends_with("NEXT STEP   LOST"), "{text}");
        let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            words(lines[1]),
            [
                "0", "0", "2", "12:00:00", "2.00", "s", "0", "-", "303", "Failure", "Killed", "1",
                "copy-0-1", "0.05", "s", "0.50", "s", "0"
            ],
            "{text}"
        );
        assert_eq!(
            words(lines[2]),
            [
                "0",
                "1",
                "2",
                "12:00:30",
                "0.45",
                "s",
                "303",
                "peers",
                "600",
                "Succeeded",
                "-",
                "-",
                "-",
                "-",
                "-"
            ],
            "{text}"
        );
        assert!(
            text.contains("goodput 97.1%: 40.0 s productive of 41.2 s; 0 steps trained twice; ends: Failure 1, Succeeded 1"),
            "{text}"
        );
    }

    #[test]
    fn an_elastic_jobs_totals_say_how_long_it_trained_at_each_size() {
        let mut ledger = fixtures::recovered_ledger();
        ledger.seconds_by_world_size = [("1".to_string(), 10.0), ("2".to_string(), 30.0)].into();
        let text = ledger_table("copy", &ledger);
        assert!(
            text.contains("0 steps trained twice; ranks: 10.0 s at 1, 30.0 s at 2; ends:"),
            "{text}"
        );
    }
}
