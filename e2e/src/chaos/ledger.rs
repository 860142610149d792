//! The job's recovery ledger as the soak keeps it: `status.recovery` holds only the last ten
//! records, so every snapshot read during the run is merged into one history by attempt and
//! round; and when each round's first step came, from rank 0's own reports too (a round too
//! short for the operator to see still counts).

use std::collections::BTreeMap;

use ferrotrain_api::recovery::{AttemptRecord, Recovery, Timestamp};

/// A round of an attempt: (attempt, round).
pub type Key = (i64, u64);

/// The key of a ledger record.
pub fn key_of(record: &AttemptRecord) -> Key {
    (record.attempt, record.round.unwrap_or(0))
}

/// Every record seen, the last snapshot, and every round's first step seen.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    pub records: BTreeMap<Key, AttemptRecord>,
    /// The newest `status.recovery` read (its totals: lost steps, goodput).
    pub last: Option<Recovery>,
    /// When rank 0 completed each round's first step, by its own report.
    pub first_steps: BTreeMap<Key, Timestamp>,
}

impl Ledger {
    /// Merges a snapshot: a newer read of a record replaces the older.
    pub fn merge(&mut self, recovery: &Recovery) {
        for record in &recovery.attempts {
            self.records.insert(key_of(record), record.clone());
        }
        self.last = Some(recovery.clone());
    }

    /// Rank 0 said round `key` took its first step at `at`.
    pub fn first_step_seen(&mut self, key: Key, at: Timestamp) {
        self.first_steps.entry(key).or_insert(at);
    }

    /// The ended records of the rounds from `from` up to (not including) `to`.
    pub fn ends_between(&self, from: Key, to: Key) -> Vec<&AttemptRecord> {
        self.records
            .range(from..to)
            .map(|(_, r)| r)
            .filter(|r| r.end.is_some())
            .collect()
    }

    /// The first step rank 0 completed at or after `since` in a round after `after`, by the
    /// ledger or by rank 0's own report.
    pub fn next_first_step(&self, after: Key, since: Timestamp) -> Option<Timestamp> {
        let from_ledger = self
            .records
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .filter_map(|(_, r)| r.first_step_at);
        let from_rank0 = self
            .first_steps
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .map(|(_, t)| *t);
        from_ledger.chain(from_rank0).filter(|t| *t >= since).min()
    }

    /// The record of the round after `key` that stepped (where the steps `key` lost were
    /// counted from).
    pub fn next_stepping(&self, key: Key) -> Option<&AttemptRecord> {
        self.records
            .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
            .map(|(_, r)| r)
            .find(|r| r.first_step_at.is_some() || r.resumed_from_step.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrotrain_api::recovery::{AttemptEnd, EndCause};

    fn record(round: u64, first_step: Option<&str>, ended: bool) -> AttemptRecord {
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        AttemptRecord {
            attempt: 0,
            round: Some(round),
            started_at: at,
            running_at: None,
            first_step_at: first_step.map(|t| t.parse().unwrap()),
            resumed_from_step: None,
            healed_from: None,
            last_step: None,
            last_step_at: None,
            checkpoint_step: None,
            end: ended.then(|| AttemptEnd {
                cause: EndCause::Failure,
                reason: "Killed".into(),
                rank: None,
                node_rank: None,
                exit_code: None,
                node: None,
                failed_at: at,
                detected_at: at,
            }),
            lost_steps: None,
            skipped_steps: 0,
            productive_seconds: 0.0,
            world_size: None,
        }
    }

    #[test]
    fn snapshots_merge_into_one_history_and_answer_by_round() {
        let mut ledger = Ledger::default();
        let first = Recovery {
            attempts: vec![
                record(0, Some("2026-01-01T00:00:01Z"), true),
                record(1, None, false),
            ],
            ..Recovery::default()
        };
        ledger.merge(&first);
        // The next snapshot has lost round 0 (only the last ten are kept) and knows more of 1.
        let second = Recovery {
            attempts: vec![
                record(1, Some("2026-01-01T00:00:05Z"), true),
                record(2, Some("2026-01-01T00:00:09Z"), false),
            ],
            ..Recovery::default()
        };
        ledger.merge(&second);
        assert_eq!(ledger.records.len(), 3);
        assert_eq!(ledger.ends_between((0, 0), (0, 2)).len(), 2);
        assert_eq!(ledger.ends_between((0, 1), (0, 2)).len(), 1);
        let since: Timestamp = "2026-01-01T00:00:04Z".parse().unwrap();
        assert_eq!(
            ledger.next_first_step((0, 0), since),
            Some("2026-01-01T00:00:05Z".parse().unwrap())
        );
        // Rank 0's own report of a round the operator did not see.
        ledger.first_step_seen((0, 1), "2026-01-01T00:00:04.5Z".parse().unwrap());
        assert_eq!(
            ledger.next_first_step((0, 0), since),
            Some("2026-01-01T00:00:04.5Z".parse().unwrap())
        );
        assert_eq!(ledger.next_stepping((0, 0)).map(key_of), Some((0, 1)));
    }
}
