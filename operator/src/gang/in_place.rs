//! In-place restarts (`restartPolicy.inPlace`): the pods' launchers restart every rank in a new
//! round of the same attempt without any pod ending (docs/in-place-restarts.md). Rank 0's report
//! says how each earlier round ended (`roundEnds`); each one not yet counted becomes a restart
//! here: `restarts` (against maxRestarts), `restartsByCause`, `lastFailure`, a record of its
//! own in the recovery ledger, and a Warning event. The pods are not touched.

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{FailureInfo, Phase, condition};
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{EndCause, RoundEnd};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::decision::Action;
use super::departure;
use super::draft::{Draft, first_line};

/// Counts the rounds of the current attempt that `report` says ended and the status has
/// not counted yet (idempotent: `status.round` is the next round to count).
pub(super) fn count_rounds(d: &mut Draft<'_, '_>, report: &Progress) {
    let mut ends: Vec<&RoundEnd> = report
        .round_ends
        .iter()
        .filter(|e| e.round >= d.status.round.max(0) as u64)
        .collect();
    ends.sort_by_key(|e| e.round);
    for end in ends {
        restarted_in_place(d, end);
    }
}

fn restarted_in_place(d: &mut Draft<'_, '_>, e: &RoundEnd) {
    if e.end.cause == EndCause::Stopped {
        // A resize (the gang grew back): a record of its own, no restart.
        next_round_record(d, e, None);
        return;
    }
    let attempt = d.status.attempt;
    let procs = d.o.spec.procs_per_replica().max(1) as i64;
    let node_rank = e.end.rank.map(|r| (r / procs) as i32);
    // A pod the operator saw taken away tells the round's end better than its launcher
    // could (killed by the kubelet before it said goodbye, it went silent).
    let told = departure::explain(e, node_rank, attempt, &mut d.status.departures);
    let e = &told;
    let node = node_rank.and_then(|r| d.node_of(r));
    let info = FailureInfo {
        attempt,
        node_rank,
        rank: e.end.rank.map(|r| r as i32),
        pod: node_rank.map(|r| crate::labels::pod_name(d.o.job, attempt, r)),
        exit_code: e.end.exit_code,
        node: node.clone(),
        reason: e.end.reason.clone(),
        message: first_line(&e.message),
        last_lines: e.last_lines.clone(),
        time: Time(d.now()),
        secondary_failures: 0,
    };
    // A pod taken away (deleted, evicted, drained) spends no restart, as for gang
    // restarts; the launchers count the same.
    let disruption = e.end.cause == EndCause::Disruption;
    if !disruption {
        d.status.restarts += 1;
    }
    *d.status
        .restarts_by_cause
        .entry(info.reason.clone())
        .or_default() += 1;
    let next = e.round + 1;
    next_round_record(d, e, Some((node_rank, node)));
    let who = match (&info.pod, e.end.rank) {
        (Some(pod), Some(rank)) => format!("rank {rank} (pod {pod})"),
        _ => "a rank".to_string(),
    };
    let max = d.budget().max;
    let kept = if disruption {
        "its pod is replaced alone, the others are kept"
    } else {
        "the pods and their nodes are kept"
    };
    d.event(
        true,
        reason::RESTARTED_IN_PLACE,
        format!(
            "{who}: {}: every rank restarted in place as round {next} of attempt {attempt} \
             ({}; {kept})",
            info.message,
            if disruption {
                "a disruption: no restart spent".to_string()
            } else {
                format!("restart {}/{max}", d.status.restarts)
            }
        ) + &last_words(&info.last_lines),
    );
    d.status.last_failure = Some(info);
}

/// Closes the current record with round `e.round`'s end (the blamed rank's pod and node
/// as the operator knows them, when given; the rank stays the launchers') and opens the
/// next round's; status.round follows.
fn next_round_record(
    d: &mut Draft<'_, '_>,
    e: &RoundEnd,
    who: Option<(Option<i32>, Option<String>)>,
) {
    let attempt = d.status.attempt;
    let next = e.round + 1;
    if let Some(r) = d.status.recovery.as_mut() {
        let mut end = e.end.clone();
        if let Some((node_rank, node)) = who {
            (end.node_rank, end.node) = (node_rank.map(i64::from), node);
        }
        if let Some(step) = e.last_step {
            r.reached(step);
        }
        r.end(end);
        r.start_round(i64::from(attempt), next, e.end.detected_at);
    }
    d.status.round = next as i32;
}

/// Elastic: the ranks training now (rank 0's report) against the gang asked for
/// (`replicas`). Resized True with a Warning event when fewer train (Shrunk), True with a
/// Normal event when more do (Grown, elastic.maxReplicas), False with a Normal event when
/// the size asked for trains again (WholeGang); once each way.
pub(super) fn world_size(d: &mut Draft<'_, '_>, report: &Progress) {
    let (desired, current) = (d.o.spec.world_size(), report.world_size as i32);
    if current == 0 || !d.o.spec.is_elastic() {
        return;
    }
    let (why, message) = match current.cmp(&desired) {
        std::cmp::Ordering::Less => (
            reason::SHRUNK,
            format!(
                "training on {current} of {desired} ranks: pods lost or not placed, and not running within elastic.waitSeconds, are left out until they come (the global batch is unchanged)"
            ),
        ),
        std::cmp::Ordering::Greater => (
            reason::GROWN,
            format!(
                "training on {current} ranks, {} more than the {desired} asked for: pods up to elastic.maxReplicas found a place (the global batch is unchanged, each step faster)",
                current - desired
            ),
        ),
        std::cmp::Ordering::Equal => (
            reason::WHOLE_GANG,
            format!("the whole gang of {desired} ranks trains"),
        ),
    };
    let resized = why != reason::WHOLE_GANG;
    d.status.current_world_size = resized.then_some(current);
    let known = d.status.condition(condition::RESIZED);
    if known.is_some_and(|c| c.reason == why) || (known.is_none() && !resized) {
        return;
    }
    d.event(why == reason::SHRUNK, why, message.clone());
    d.set_condition(condition::RESIZED, resized, why, message);
}

/// "; its last line: <the rank's last line of output>" for an event (the status keeps the
/// last lines).
fn last_words(lines: &[String]) -> String {
    lines
        .last()
        .map(|l| format!("; its last line: {l}"))
        .unwrap_or_default()
}

/// Node 0's pod went away: its launcher, which rules on every round, cannot say how
/// the round ended, so the operator counts it (once per loss: the Running condition
/// names the pods being replaced). Taken away (deleted, evicted, drained) it is a
/// disruption and spends no restart, as for the other pods; its launcher killed
/// (`failed`), a failure.
fn node0_left(d: &mut Draft<'_, '_>, pod: &str, failed: bool) {
    let listed = d.status.condition(condition::RUNNING).is_some_and(|c| {
        c.reason == reason::POD_REPLACED && c.message.split([' ', ',']).any(|word| word == pod)
    });
    if listed {
        return;
    }
    let now = d.now();
    let (cause, why, message) = if failed {
        (
            EndCause::Failure,
            reason::AGENT_LOST,
            "node 0's launcher was killed; the other launchers wait for its replacement's rendezvous store",
        )
    } else {
        (
            EndCause::Disruption,
            reason::POD_LEAVING,
            "node 0's pod went away (deleted, evicted or drained); the other launchers wait for its replacement's rendezvous store",
        )
    };
    let end = RoundEnd {
        round: d.status.round.max(0) as u64,
        end: ferrotrain_api::recovery::AttemptEnd {
            cause,
            reason: why.to_string(),
            rank: Some(0),
            node_rank: Some(0),
            exit_code: None,
            node: None,
            failed_at: now,
            detected_at: now,
        },
        message: message.into(),
        last_step: None,
        last_lines: Vec::new(),
    };
    restarted_in_place(d, &end);
}

/// Pods of `replacing` went away: those already `gone` are created again under their
/// names, alone; the other pods' launchers wait for them in their next round, so nothing
/// else is touched. The round that ended is counted when rank 0 reports it (roundEnds).
pub(super) fn replace_pods(
    d: &mut Draft<'_, '_>,
    replacing: &[i32],
    gone: Vec<i32>,
    node0_failed: bool,
) {
    d.status.phase = Phase::Starting;
    let attempt = d.status.attempt;
    let pods: Vec<String> = replacing
        .iter()
        .map(|r| crate::labels::pod_name(d.o.job, attempt, *r))
        .collect();
    let message = format!(
        "attempt {attempt}: pod {} went away and is replaced alone; the other pods keep running and their launchers wait for it",
        pods.join(", ")
    );
    if replacing.contains(&0) {
        node0_left(
            d,
            &crate::labels::pod_name(d.o.job, attempt, 0),
            node0_failed,
        );
    }
    let known = d
        .status
        .condition(condition::RUNNING)
        .is_some_and(|c| c.status == "False" && c.reason == reason::POD_REPLACED);
    if !known {
        d.event(false, reason::POD_REPLACED, message.clone());
    }
    d.set_condition(condition::RUNNING, false, reason::POD_REPLACED, message);
    if !gone.is_empty() {
        d.actions.push(Action::Launch {
            attempt,
            node_ranks: gone,
        });
    }
    // Their deletion and creation wake the controller; this is the fallback.
    d.requeue_in(std::time::Duration::from_secs(5));
}

#[cfg(test)]
mod tests;
