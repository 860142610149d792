//! Pods taken away by a disruption (the kubelet's eviction or node shutdown, the Eviction
//! API, a preemption, a drain) while their launchers restart in place: the operator sees why
//! (the pod's DisruptionTarget condition or its failed phase's reason, in Kubernetes' own
//! words); the launchers see only that a pod's launcher left, or went silent when the kubelet
//! killed it before it could say so. A [`Departure`] keeps what the operator saw until node 0's
//! launcher reports the end of the round the pod ended; that end is then told with the
//! disruption's cause ([`explain`]): reason `Disrupted`, no restart spent.
//!
//! Pure functions of what they are given.

use ferrotrain_api::crd::Departure;
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{EndCause, RoundEnd};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::draft::first_line;
use super::observed::PodView;

/// How much earlier than a disruption's recorded start its round's end may have been seen:
/// the kubelet kills an evicted pod after 1 s of grace and dates the end of a pod it failed
/// without a DisruptionTarget condition by its container's end; nodes' clocks differ a little.
const EARLIER_BY: SignedDuration = SignedDuration::from_secs(5);

/// The departure of `pod`, seen `now`, if a disruption takes it away.
pub(super) fn of(pod: &PodView, now: Timestamp) -> Option<Departure> {
    let d = pod.disruption.as_ref()?;
    Some(Departure {
        attempt: pod.attempt,
        node_rank: pod.node_rank,
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
        reason: d.reason.clone(),
        message: d.message.clone(),
        seen_at: Time(d.since.unwrap_or(now)),
    })
}

/// Adds `new` unless a departure of the same pod is known (idempotent across reconciles), or
/// the round it ended was counted already (`counted_until`: when the last round end counted
/// in its attempt was seen): an eviction the operator saw only after rank 0 reported it.
pub(super) fn record(known: &mut Vec<Departure>, new: Departure, counted_until: Option<Timestamp>) {
    let same = |d: &Departure| {
        d.attempt == new.attempt && d.node_rank == new.node_rank && d.uid == new.uid
    };
    let counted = counted_until.is_some_and(|at| new.seen_at.0 <= at + EARLIER_BY);
    if !counted && !known.iter().any(same) {
        known.push(new);
    }
}

/// What `end` (round `end.round` of `attempt`, its blamed rank on node rank `node_rank`)
/// says once the departures are read: told as the disruption of the blamed pod when that pod
/// departed in this round, else unchanged. Every departure of `attempt` that happened by the
/// time the round's end was seen belongs to that round and is dropped from `known`.
pub(super) fn explain(
    end: &RoundEnd,
    node_rank: Option<i32>,
    attempt: i32,
    known: &mut Vec<Departure>,
) -> RoundEnd {
    let seen = end.end.detected_at.max(end.end.failed_at);
    let this_round = |d: &Departure| d.attempt == attempt && d.seen_at.0 <= seen + EARLIER_BY;
    let blamed = known
        .iter()
        .find(|d| this_round(d) && Some(d.node_rank) == node_rank)
        .cloned();
    known.retain(|d| d.attempt == attempt && !this_round(d));
    let Some(d) = blamed else {
        return end.clone();
    };
    let mut told = end.clone();
    told.end.cause = EndCause::Disruption;
    told.end.reason = reason::DISRUPTED.to_string();
    told.message = words(&d);
    told
}

/// `pod <pod>: <reason>: <message>`, the message's first line.
pub(super) fn words(d: &Departure) -> String {
    match first_line(&d.message).as_str() {
        "" => format!("pod {}: {}", d.pod, d.reason),
        m => format!("pod {}: {}: {m}", d.pod, d.reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{disrupted, running, t};
    use ferrotrain_api::recovery::AttemptEnd;

    fn end(round: u64, reason: &str, at: i64) -> RoundEnd {
        RoundEnd {
            round,
            end: AttemptEnd {
                cause: EndCause::Failure,
                reason: reason.into(),
                rank: Some(1),
                node_rank: None,
                exit_code: None,
                node: None,
                failed_at: t(at),
                detected_at: t(at),
            },
            message: "node 1's launcher is gone".into(),
            last_step: Some(40),
            last_lines: Vec::new(),
        }
    }

    fn evicted(rank: i32, at: i64) -> Departure {
        let mut pod = disrupted(running(0, rank), "Evicted");
        let d = pod.disruption.as_mut().unwrap();
        d.message = "The node was low on resource: memory.\nmore".into();
        d.since = Some(t(at));
        of(&pod, t(at + 3)).unwrap()
    }

    #[test]
    fn a_departure_is_dated_by_the_disruption_and_recorded_once() {
        let d = evicted(1, 50);
        assert_eq!(d.seen_at, Time(t(50)));
        let mut known = Vec::new();
        record(&mut known, d.clone(), None);
        record(&mut known, d.clone(), Some(t(20)));
        assert_eq!(known.len(), 1);
        let mut late = Vec::new();
        record(&mut late, d, Some(t(50)));
        assert!(
            late.is_empty(),
            "its round was counted before the operator saw it"
        );
        assert_eq!(
            of(&running(0, 1), t(1)),
            None,
            "no disruption, no departure"
        );
    }

    #[test]
    fn the_blamed_pods_departure_tells_the_rounds_end_whatever_the_launchers_saw() {
        // The kubelet killed the launcher before it said goodbye: its peers saw it go silent.
        let mut known = vec![evicted(1, 50)];
        let told = explain(&end(0, reason::AGENT_LOST, 50), Some(1), 0, &mut known);
        assert_eq!(told.end.cause, EndCause::Disruption);
        assert_eq!(told.end.reason, reason::DISRUPTED);
        assert_eq!(
            told.message,
            "pod mt-0-1: Evicted: The node was low on resource: memory."
        );
        assert_eq!(told.last_step, Some(40), "the rest is the launchers'");
        assert!(known.is_empty(), "used once");
    }

    #[test]
    fn a_round_that_ended_before_the_departure_is_left_alone_and_keeps_it() {
        // Counted late: round 0 ended by a killed trainer 20 s before rank 1's pod was evicted.
        let mut known = vec![evicted(1, 50)];
        let told = explain(&end(0, reason::KILLED, 30), Some(1), 0, &mut known);
        assert_eq!(told, end(0, reason::KILLED, 30));
        assert_eq!(known.len(), 1, "kept for the round it ended");
        let next = explain(&end(1, reason::POD_LEAVING, 50), Some(1), 0, &mut known);
        assert_eq!(next.end.reason, reason::DISRUPTED);
    }

    #[test]
    fn departures_of_a_round_that_blamed_another_pod_go_with_it() {
        // Two pods evicted at once: the round blames one; the other's departure was part of
        // the same round and must not tell a later failure of its replacement.
        let mut known = vec![evicted(1, 50), evicted(2, 50)];
        let told = explain(&end(0, reason::POD_LEAVING, 50), Some(1), 0, &mut known);
        assert_eq!(told.end.reason, reason::DISRUPTED);
        assert!(known.is_empty(), "{known:?}");
        let later = explain(&end(1, reason::KILLED, 400), Some(2), 0, &mut known);
        assert_eq!(later.end.reason, reason::KILLED);
    }

    #[test]
    fn another_attempts_departures_tell_nothing_and_are_dropped() {
        let mut known = vec![evicted(1, 50)];
        let told = explain(&end(0, reason::POD_LEAVING, 60), Some(1), 1, &mut known);
        assert_eq!(told.end.reason, reason::POD_LEAVING);
        assert!(known.is_empty());
    }
}
