//! Where a round's state comes from, decided alike on every rank from what each offers:
//! pure. The freshest state any rank holds wins (its pod's snapshot of the step the gang
//! last completed), a checkpoint only when no rank holds one as new (the whole gang was lost,
//! a suspend and resume, a new attempt), and a fresh start when there is neither. A rank whose
//! config differs from the gang's is named: it would diverge from the others.

use ferrotrain_api::recovery::HealedFrom;

/// What one rank offers at the start of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The step of the snapshot it holds in its pod, if any.
    pub snapshot: Option<u64>,
    /// Rank 0 (which alone reads checkpoints): the newest complete checkpoint's step.
    pub checkpoint: Option<u64>,
    /// A digest of its whole trainer config.
    pub config: u64,
}

impl Offer {
    /// As three exact integers, for the gang's all-gather.
    pub fn encode(&self) -> [u64; 3] {
        let plus_one = |v: Option<u64>| v.map_or(0, |v| v + 1);
        [
            plus_one(self.snapshot),
            plus_one(self.checkpoint),
            self.config,
        ]
    }

    pub fn decode(v: &[u64]) -> Offer {
        let minus_one = |v: u64| v.checked_sub(1);
        Offer {
            snapshot: minus_one(v[0]),
            checkpoint: minus_one(v[1]),
            config: v[2],
        }
    }
}

/// Where the round's state comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Nothing to resume: a new job.
    Fresh,
    /// Rank 0 reads the checkpoint of this step.
    Checkpoint { step: u64 },
    /// Rank `rank` loads its pod's snapshot of step `step` and sends it to the others.
    Peer { rank: usize, step: u64 },
}

impl Source {
    /// The rank every other rank takes the state from.
    pub fn root(self) -> usize {
        match self {
            Source::Peer { rank, .. } => rank,
            Source::Fresh | Source::Checkpoint { .. } => 0,
        }
    }

    /// The progress report's `healedFrom`; None for a fresh start.
    pub fn healed_from(self) -> Option<HealedFrom> {
        match self {
            Source::Fresh => None,
            Source::Checkpoint { .. } => Some(HealedFrom::Checkpoint),
            Source::Peer { .. } => Some(HealedFrom::Peers),
        }
    }
}

/// Ranks whose config is not the gang's (the one most ranks have; rank 0's on a tie).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMismatch {
    pub ranks: Vec<usize>,
    pub gang: u64,
}

/// The source of the round's state, from every rank's offer (by rank).
pub fn plan(offers: &[Offer]) -> Result<Source, ConfigMismatch> {
    let gang = gang_config(offers);
    let ranks: Vec<usize> = (0..offers.len())
        .filter(|&r| offers[r].config != gang)
        .collect();
    if !ranks.is_empty() {
        return Err(ConfigMismatch { ranks, gang });
    }
    let checkpoint = offers.first().and_then(|o| o.checkpoint);
    let freshest = offers
        .iter()
        .enumerate()
        .filter_map(|(rank, o)| o.snapshot.map(|step| (step, rank)))
        .max_by_key(|&(step, rank)| (step, std::cmp::Reverse(rank)));
    Ok(match (freshest, checkpoint) {
        (Some((step, rank)), Some(c)) if step < c => {
            tracing::debug!(
                rank,
                step,
                checkpoint = c,
                "heal: a snapshot older than the checkpoint"
            );
            Source::Checkpoint { step: c }
        }
        (Some((step, rank)), _) => Source::Peer { rank, step },
        (None, Some(step)) => Source::Checkpoint { step },
        (None, None) => Source::Fresh,
    })
}

/// The config most ranks have; rank 0's when several are as common.
fn gang_config(offers: &[Offer]) -> u64 {
    let count = |c: u64| offers.iter().filter(|o| o.config == c).count();
    let first = offers.first().map_or(0, |o| o.config);
    offers.iter().map(|o| o.config).fold(
        first,
        |best, c| if count(c) > count(best) { c } else { best },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(snapshot: Option<u64>, checkpoint: Option<u64>) -> Offer {
        Offer {
            snapshot,
            checkpoint,
            config: 7,
        }
    }

    #[test]
    fn the_freshest_snapshot_serves_unless_a_checkpoint_is_newer() {
        let rows = [
            // A new job.
            (vec![offer(None, None), offer(None, None)], Source::Fresh),
            // Rank 1's trainer was killed: rank 0's pod holds step 315, the checkpoint is 0.
            (
                vec![offer(Some(315), Some(0)), offer(None, None)],
                Source::Peer { rank: 0, step: 315 },
            ),
            // Rank 0's trainer was killed: rank 1 serves.
            (
                vec![offer(None, Some(300)), offer(Some(322), None)],
                Source::Peer { rank: 1, step: 322 },
            ),
            // One rank got one step further in the broken collective: its state wins.
            (
                vec![
                    offer(Some(40), None),
                    offer(Some(41), None),
                    offer(Some(41), None),
                ],
                Source::Peer { rank: 1, step: 41 },
            ),
            // The same step as the checkpoint: the snapshot (memory, not the volume).
            (
                vec![offer(Some(50), Some(50)), offer(None, None)],
                Source::Peer { rank: 0, step: 50 },
            ),
            // A stale snapshot from an earlier round, older than the checkpoint.
            (
                vec![offer(Some(20), Some(50)), offer(None, None)],
                Source::Checkpoint { step: 50 },
            ),
            // The whole gang was lost: the checkpoint.
            (
                vec![offer(None, Some(50)), offer(None, None)],
                Source::Checkpoint { step: 50 },
            ),
        ];
        for (offers, want) in rows {
            assert_eq!(plan(&offers), Ok(want), "{offers:?}");
        }
    }

    #[test]
    fn a_rank_with_another_config_is_named() {
        let mut offers = vec![offer(Some(5), None), offer(None, None), offer(None, None)];
        offers[2].config = 9;
        assert_eq!(
            plan(&offers),
            Err(ConfigMismatch {
                ranks: vec![2],
                gang: 7
            })
        );
        // Rank 0 is the replacement with the new config: the others' is the gang's.
        offers[2].config = 7;
        offers[0].config = 9;
        assert_eq!(plan(&offers).unwrap_err().ranks, [0]);
    }

    #[test]
    fn an_offer_round_trips() {
        for o in [
            offer(None, None),
            offer(Some(0), Some(0)),
            offer(Some(u64::MAX - 1), None),
        ] {
            assert_eq!(Offer::decode(&o.encode()), o);
        }
    }
}
