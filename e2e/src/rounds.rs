//! Rounds of an attempt as the recovery tests see them: when rank 0 first stepped in a round
//! (its own report, fresher than the status), where the round's state came from, and how many
//! steps the round before it had trained that were trained again (the ledger in the status).

use ferrotrain_api::crd::DistributedTrainingStatus;
use ferrotrain_api::recovery::{AttemptRecord, HealedFrom, Timestamp};

use crate::namespace::TestNamespace;
use crate::rank0::wait_rank0;
use crate::wait::{WAIT, wait_status};

/// Rank 0's first step in a round.
#[derive(Debug, Clone, Copy)]
pub struct RoundStart {
    /// The round.
    pub round: u64,
    /// When rank 0 completed the round's first step.
    pub first_step: Timestamp,
    /// The world size the round trains at.
    pub world_size: u32,
    /// The step its state was at (the last the gang completed, healed from peers).
    pub resumed_from: Option<u64>,
    pub healed_from: Option<HealedFrom>,
}

impl RoundStart {
    /// Seconds from `since` (the failure) to this first step.
    pub fn seconds_after(&self, since: Timestamp) -> f64 {
        self.first_step.duration_since(since).as_secs_f64()
    }
}

/// Waits (through pod `pod`'s own report) until rank 0 has stepped in round `round` or a
/// later one (a round can end before its first step, e.g. a shrunk round that a quick
/// replacement grows again at once).
pub async fn round_started(ns: &TestNamespace, pod: &str, round: u64) -> RoundStart {
    let what = format!("rank 0 ({pod}) stepping in round {round} or later");
    wait_rank0(ns, pod, &what, |p| {
        let first_step = p.attempt_first_step_time.filter(|_| p.round >= round)?;
        Some(RoundStart {
            round: p.round,
            first_step,
            world_size: p.world_size,
            resumed_from: p.resumed_from_step,
            healed_from: p.healed_from,
        })
    })
    .await
}

/// The ledger's record of round `round` of attempt 0, once the round after it has resumed
/// (its `lostSteps` then exact), with the status it was read from.
pub async fn ended_round(
    ns: &TestNamespace,
    job: &str,
    round: u64,
) -> (AttemptRecord, DistributedTrainingStatus) {
    let record = |s: &DistributedTrainingStatus, r: u64| {
        let ledger = s.recovery.as_ref()?;
        ledger
            .attempts
            .iter()
            .find(|a| a.attempt == 0 && a.round.unwrap_or(0) == r)
            .cloned()
    };
    let what = format!("round {round}'s record, a later round resumed");
    // Its count is exact once a later round of the attempt says where it resumed (rounds
    // between that ended before their first step say nothing); a round that ended before its
    // first step trained nothing: no count of its own.
    let resumed_later = |s: &DistributedTrainingStatus| {
        s.recovery.as_ref().is_some_and(|l| {
            l.attempts.iter().any(|a| {
                a.attempt == 0 && a.round.unwrap_or(0) > round && a.resumed_from_step.is_some()
            })
        })
    };
    let status = wait_status(&ns.jobs(), job, &what, WAIT, |s| {
        record(s, round).is_some_and(|r| {
            r.end.is_some()
                && (r.last_step.is_none() || (r.lost_steps.is_some() && resumed_later(s)))
        })
    })
    .await;
    (record(&status, round).expect("checked"), status)
}

/// The steps trained twice by the rounds from `from` up to the one before `next` (rounds that
/// ended before their first step count nothing), each checked to lose at most the step in
/// flight and `next` to start from its peers; returns the total.
pub async fn lost_before(ns: &TestNamespace, job: &str, from: u64, next: &RoundStart) -> u64 {
    let mut total = 0;
    for round in from..next.round {
        let (record, _) = ended_round(ns, job, round).await;
        total += lost_at_most_the_step_in_flight(&record, next);
    }
    total
}

/// Asserts that the round after `ended` started from its peers' state and that `ended` lost
/// at most the step in flight (steps it trained that were trained again); returns that count.
pub fn lost_at_most_the_step_in_flight(ended: &AttemptRecord, next: &RoundStart) -> u64 {
    assert_eq!(
        next.healed_from,
        Some(HealedFrom::Peers),
        "round {:?} ended and the next started from {:?} at step {:?}, not from its peers",
        ended.round,
        next.healed_from,
        next.resumed_from
    );
    let lost = ended.lost_steps.unwrap_or(0);
    assert!(
        lost <= 1,
        "round {:?} (last step {:?}) lost {lost} steps; the next resumed from {:?}",
        ended.round,
        ended.last_step,
        next.resumed_from
    );
    lost
}
