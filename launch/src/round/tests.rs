//! The pod agent's decisions, one table row per situation ([`table`]), each replayed
//! ([`every_decision_is_idempotent_when_replayed`]); then the pure pieces around a round's
//! end: a poll of the local ranks, a node's report, node 0's gathering and ruling, and the
//! races found on the cluster, played end to end through them ([`races`]).

use std::time::Duration;

use ferrotrain_api::exit;
use ferrotrain_api::reason;
use ferrotrain_api::recovery::Timestamp;

use super::*;
use crate::blame::{self, NodeReport, Verdict};
use crate::gather::{Gathering, Step};
use crate::group::{PeerEnd, Poll, RankFailure, Seen, poll};

const PERMANENT: [i32; 3] = [2, 3, 4];

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

fn policy(node: usize) -> Policy {
    Policy {
        node,
        max_restarts: 3,
        backoff: (Duration::from_secs(1), Duration::from_secs(30)),
    }
}

fn rounds(round: u64, restarts: u32) -> Rounds {
    Rounds {
        round,
        restarts,
        decided: None,
    }
}

/// Node 0's verdict of round `round`: `reason` blamed on `rank` of `node`.
fn verdict(round: u64, node: usize, reason: &str, code: Option<i32>) -> Verdict {
    Verdict {
        round,
        rank: Some(node),
        node: Some(node),
        host: Some(format!("job-0-{node}")),
        code,
        reason: reason.into(),
        message: "what happened".into(),
        permanent: code.is_some_and(|c| PERMANENT.contains(&c)),
        detected_at: at(10),
        secondary: 1,
        in_a_row: 1,
        last_lines: Vec::new(),
    }
}

fn ruled(round: u64, v: Verdict) -> Event {
    Event::Ended {
        round,
        end: End::Ruled(v),
    }
}

fn exit(code: i32, message: bool, collateral: bool) -> Next {
    Next::Exit(Exit {
        code,
        message: message.then(String::new),
        final_report: code == exit::SUCCESS,
        collateral,
    })
}

/// One situation and what must come of it.
struct Row {
    name: &'static str,
    node: usize,
    before: Rounds,
    event: Event,
    /// The next step (an exit's message is compared by presence, a restart's `why` not).
    next: Next,
    /// Restarts spent after it.
    restarts: u32,
}

/// A `Next` without its words, for comparing with a row.
fn shape(next: &Next) -> Next {
    match next {
        Next::Restart { round, wait, .. } => Next::Restart {
            round: *round,
            wait: *wait,
            why: String::new(),
        },
        Next::Rejoin { after, lost, .. } => Next::Rejoin {
            after: *after,
            why: String::new(),
            lost: *lost,
        },
        Next::Exit(e) => Next::Exit(Exit {
            message: e.message.as_ref().map(|_| String::new()),
            ..e.clone()
        }),
        other => other.clone(),
    }
}

fn restart(round: u64, wait: u64) -> Next {
    Next::Restart {
        round,
        wait: Duration::from_secs(wait),
        why: String::new(),
    }
}

fn rejoin(after: u64, lost: bool) -> Next {
    Next::Rejoin {
        after,
        why: String::new(),
        lost,
    }
}

fn rows() -> Vec<Row> {
    let in_a_row = |n: u32| Verdict {
        in_a_row: n,
        ..verdict(4, 1, reason::KILLED, Some(137))
    };
    vec![
        Row {
            name: "joined at start: run the round node 0 runs",
            node: 1,
            before: Rounds::default(),
            event: Event::Joined(3),
            next: Next::Run(3),
            restarts: 0,
        },
        Row {
            name: "every rank finished: exit 0 with rank 0's final report",
            node: 0,
            before: rounds(2, 1),
            event: Event::Ended {
                round: 2,
                end: End::Finished,
            },
            next: exit(exit::SUCCESS, false, false),
            restarts: 1,
        },
        Row {
            name: "the launcher was signalled: exit 128 + signal, no message",
            node: 1,
            before: rounds(2, 0),
            event: Event::Ended {
                round: 2,
                end: End::Signalled(15),
            },
            next: exit(143, false, false),
            restarts: 0,
        },
        Row {
            name: "signalled during the backoff: exit 128 + signal",
            node: 1,
            before: rounds(3, 1),
            event: Event::Interrupted(2),
            next: exit(130, false, false),
            restarts: 1,
        },
        Row {
            name: "came late: wait for the next round",
            node: 2,
            before: rounds(5, 0),
            event: Event::Ended {
                round: 5,
                end: End::NotAdmitted,
            },
            next: Next::WaitForRound(5),
            restarts: 0,
        },
        Row {
            name: "replaced while cut off: leave the gang, retryable, saying why",
            node: 1,
            before: rounds(5, 1),
            event: Event::Ended {
                round: 5,
                end: End::Replaced {
                    owner: "uid-new".into(),
                },
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 1,
        },
        Row {
            name: "the first failure in a row: restart at once",
            node: 0,
            before: rounds(4, 0),
            event: ruled(4, in_a_row(1)),
            next: restart(5, 0),
            restarts: 1,
        },
        Row {
            name: "the third failure in a row: the backoff doubled once",
            node: 1,
            before: rounds(4, 2),
            event: ruled(4, in_a_row(3)),
            next: restart(5, 2),
            restarts: 3,
        },
        Row {
            name: "the budget spent: give up with the retryable code on a node not blamed",
            node: 0,
            before: rounds(4, 3),
            event: ruled(4, in_a_row(1)),
            next: exit(exit::RETRYABLE, true, false),
            restarts: 3,
        },
        Row {
            name: "the budget spent: the blamed node exits with its rank's code",
            node: 1,
            before: rounds(4, 3),
            event: ruled(4, in_a_row(1)),
            next: exit(137, true, false),
            restarts: 3,
        },
        Row {
            name: "a resize is no failure: the next round at once, nothing spent",
            node: 1,
            before: rounds(6, 2),
            event: ruled(6, blame::resized_verdict(6, at(0))),
            next: Next::Run(7),
            restarts: 2,
        },
        Row {
            name: "node 0's pod leaves: the others follow it to its replacement's store",
            node: 1,
            before: rounds(2, 0),
            event: ruled(2, verdict(2, 0, reason::POD_LEAVING, Some(143))),
            next: rejoin(2, true),
            restarts: 0,
        },
        Row {
            name: "another node's pod leaves: node 0 restarts in place, spending nothing",
            node: 0,
            before: rounds(2, 0),
            event: ruled(2, verdict(2, 1, reason::POD_LEAVING, Some(143))),
            next: restart(3, 0),
            restarts: 0,
        },
        Row {
            name: "a pod leaves when the budget is spent: a disruption, restarted at once",
            node: 0,
            before: rounds(5, 3),
            event: ruled(
                5,
                Verdict {
                    in_a_row: 4,
                    ..verdict(5, 1, reason::POD_LEAVING, Some(143))
                },
            ),
            next: restart(6, 0),
            restarts: 3,
        },
        Row {
            name: "node 1 loses node 0's store mid-round: it waits for node 0's replacement",
            node: 1,
            before: rounds(2, 0),
            event: Event::Broke {
                round: 2,
                stage: Stage::Round,
                error: AgentError::StoreReplaced,
            },
            next: rejoin(2, false),
            restarts: 1,
        },
        Row {
            name: "node 0 cannot use its own store: it gives up, retryable",
            node: 0,
            before: rounds(2, 0),
            event: Event::Broke {
                round: 2,
                stage: Stage::Round,
                error: AgentError::StoreReplaced,
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 0,
        },
        Row {
            name: "node 1 loses node 0's store with no restart left: it gives up",
            node: 1,
            before: rounds(2, 3),
            event: Event::Broke {
                round: 2,
                stage: Stage::Round,
                error: AgentError::StoreReplaced,
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 3,
        },
        Row {
            name: "joining fails: exit, retryable",
            node: 1,
            before: Rounds::default(),
            event: Event::Broke {
                round: 0,
                stage: Stage::Joining,
                error: AgentError::StoreReplaced,
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 0,
        },
        Row {
            name: "node 0's replacement never comes: exit, retryable",
            node: 1,
            before: rounds(2, 1),
            event: Event::Broke {
                round: 2,
                stage: Stage::Rejoining,
                error: AgentError::LostStoreAnswered,
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 1,
        },
        Row {
            name: "signalled while waiting to be admitted: exit, retryable",
            node: 2,
            before: rounds(5, 0),
            event: Event::Broke {
                round: 5,
                stage: Stage::Waiting,
                error: AgentError::Signalled { what: "a round" },
            },
            next: exit(exit::RETRYABLE, true, false),
            restarts: 0,
        },
        // The race of a permanent failure on a node that is not node 0: every node exits with
        // the permanent code (no restart follows whichever pod the operator sees end first),
        // and the ones not blamed end a moment later.
        Row {
            name: "a permanent failure on node 1: node 1 exits with its code",
            node: 1,
            before: rounds(0, 0),
            event: ruled(0, verdict(0, 1, reason::PERMANENT_EXIT_CODE, Some(3))),
            next: exit(3, true, false),
            restarts: 0,
        },
        Row {
            name: "a permanent failure on node 1: node 0 exits with that code, after it",
            node: 0,
            before: rounds(0, 0),
            event: ruled(0, verdict(0, 1, reason::PERMANENT_EXIT_CODE, Some(3))),
            next: exit(3, true, true),
            restarts: 0,
        },
        Row {
            name: "a permanent failure is final even with restarts left and node 0 blamed",
            node: 2,
            before: rounds(7, 3),
            event: ruled(7, verdict(7, 0, reason::PERMANENT_EXIT_CODE, Some(2))),
            next: exit(2, true, true),
            restarts: 3,
        },
    ]
}

#[test]
fn table() {
    let mut failures = Vec::new();
    for row in rows() {
        let (after, next) = decide(&policy(row.node), &row.before, &row.event);
        let got = (shape(&next), after.restarts);
        let want = (shape(&row.next), row.restarts);
        if got != want {
            failures.push(format!("{}:\n   got {got:?}\n  want {want:?}", row.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rows().len() >= 20);
}

#[test]
fn every_decision_is_idempotent_when_replayed() {
    // Deciding again on the same event from the state a decision left (a verdict read twice,
    // an agent that asks again after a reconnect) must spend no second restart and say the
    // same thing.
    for row in rows() {
        let p = policy(row.node);
        let (first, next) = decide(&p, &row.before, &row.event);
        let (second, again) = decide(&p, &first, &row.event);
        assert_eq!(second, first, "{}: state changed on replay", row.name);
        assert_eq!(again, next, "{}: another decision on replay", row.name);
    }
}

#[test]
fn a_restart_says_who_failed_and_how_long_it_waits() {
    let (_, next) = decide(
        &policy(0),
        &rounds(4, 2),
        &ruled(4, verdict(4, 1, "Killed", None)),
    );
    let Next::Restart { why, .. } = next else {
        panic!("{next:?}")
    };
    assert!(
        why.starts_with("round 4 ended: rank 1 (Killed): what happened"),
        "{why}"
    );
    assert!(why.contains("failure 1 in a row"), "{why}");
    let (_, next) = decide(
        &policy(0),
        &rounds(4, 3),
        &ruled(4, verdict(4, 1, "Killed", None)),
    );
    let Next::Exit(Exit {
        message: Some(m), ..
    }) = next
    else {
        panic!("{next:?}")
    };
    assert!(
        m.contains("giving up after 3 in-place restart(s) (--max-restarts)"),
        "{m}"
    );
}

fn failure(rank: usize, code: i32, reason: &str, seen: i64) -> RankFailure {
    RankFailure {
        rank,
        code,
        reason: reason.into(),
        seen_at: at(seen),
        end: None,
    }
}

fn seen() -> Seen {
    Seen {
        signal: 0,
        failure: None,
        peer: None,
        all_done: false,
        frozen: None,
    }
}

#[test]
fn a_poll_decides_in_order_signal_own_failure_peer_success_frozen() {
    let died = failure(1, 137, "rank 1 was killed by signal 9 (SIGKILL)", 10);
    let rows = [
        (seen(), Poll::Running),
        (
            Seen {
                signal: 15,
                failure: Some(died.clone()),
                ..seen()
            },
            Poll::Signalled(15),
        ),
        (
            Seen {
                failure: Some(died.clone()),
                peer: Some(PeerEnd::Failed),
                ..seen()
            },
            Poll::Failed(died.clone()),
        ),
        (
            Seen {
                peer: Some(PeerEnd::Lost),
                all_done: true,
                ..seen()
            },
            Poll::PeerEnded(PeerEnd::Lost),
        ),
        (
            Seen {
                all_done: true,
                frozen: Some(0),
                ..seen()
            },
            Poll::Finished,
        ),
        (
            Seen {
                frozen: Some(3),
                ..seen()
            },
            Poll::Frozen(3),
        ),
    ];
    for (seen, want) in rows {
        assert_eq!(poll(seen.clone()), want, "{seen:?}");
    }
}

#[test]
fn a_nodes_report_carries_its_own_failure_or_its_frozen_ranks() {
    let died = failure(3, 137, "killed", 10);
    let r = NodeReport::after(
        1,
        "job-0-1",
        vec![2, 3],
        &GroupOutcome::Failed(died.clone()),
    );
    assert_eq!(
        (r.failure, r.frozen, r.leaving),
        (Some(died), vec![], false)
    );
    let frozen = GroupOutcome::Frozen {
        rank: 2,
        seen_at: at(5),
    };
    assert_eq!(NodeReport::after(1, "h", vec![2, 3], &frozen).frozen, [2]);
    let peer = GroupOutcome::PeerFailed { frozen: vec![3] };
    let r = NodeReport::after(1, "h", vec![2, 3], &peer);
    assert_eq!((r.failure, r.frozen), (None, vec![3]));
    let gone = NodeReport::after(1, "job-0-1", vec![2, 3], &GroupOutcome::Signalled(15))
        .leaving(15, at(7));
    let f = gone.failure.clone().unwrap();
    assert!(gone.leaving);
    assert_eq!((f.rank, f.code, f.seen_at), (2, 143, at(7)));
    assert!(f.reason.contains("pod job-0-1 got SIGTERM"), "{}", f.reason);
}

#[test]
fn a_node_whose_own_rank_failed_tries_longer_to_report_than_node_0_could_miss() {
    let died = GroupOutcome::Failed(failure(1, 137, "killed", 0));
    let frozen = GroupOutcome::Frozen {
        rank: 1,
        seen_at: at(0),
    };
    let follower = GroupOutcome::PeerFailed { frozen: vec![] };
    assert_eq!(patience(&died), REPORT_SLACK);
    assert_eq!(patience(&frozen), REPORT_SLACK);
    assert_eq!(patience(&follower), STORE_GONE_AFTER);
    assert!(owns_the_failure(&died) && owns_the_failure(&frozen));
    assert!(!owns_the_failure(&follower));
    // Node 0 waits the stop grace and the slack for every report: a blamed node's own
    // patience never runs out before node 0 stops waiting for it.
    let report_wait = Duration::ZERO + REPORT_SLACK;
    assert!(patience(&died) <= report_wait);
}

#[test]
fn node_0_asks_for_missing_reports_until_the_shared_wait_ends() {
    let s = Duration::from_secs;
    let mut g = Gathering::new(&[0, 2], 2, s(30));
    assert_eq!(
        g.next(s(0)),
        Step::Ask {
            node: 0,
            within: s(30)
        }
    );
    let mine = NodeReport::after(
        0,
        "job-0-0",
        vec![0, 1],
        &GroupOutcome::PeerFailed { frozen: vec![] },
    );
    g.heard(0, mine.clone());
    g.heard(0, NodeReport::silent(0, vec![0, 1]));
    assert_eq!(
        g.next(s(12)),
        Step::Ask {
            node: 2,
            within: s(18)
        },
        "node 2 is the second member"
    );
    let Step::Rule(reports) = g.next(s(30)) else {
        panic!("the wait is over")
    };
    assert_eq!(reports[0], mine, "the first word stands");
    assert_eq!(
        reports[1],
        NodeReport::silent(2, vec![2, 3]),
        "node 2 sent none"
    );
    let mut g = Gathering::new(&[0, 1], 1, s(30));
    g.lost(1, 10.4);
    g.garbled(0);
    let Step::Rule(reports) = g.next(s(0)) else {
        panic!("nothing left to wait for")
    };
    assert_eq!(reports[1].unreachable_seconds, Some(10.4));
    assert!(reports[0].silent, "a garbled report is no report");
}

/// The races found on the cluster, played through the pure pieces from the poll to the next
/// round, on both nodes of a 2-node gang.
mod races {
    use super::*;

    /// Node 0 gathers `reports` (in time) of a round whose members are nodes 0 and 1, rules,
    /// and each node decides.
    fn through(reports: Vec<NodeReport>, late: &[usize]) -> (Verdict, Next, Next) {
        let mut g = Gathering::new(&[0, 1], 1, Duration::from_secs(30));
        for r in reports {
            if !late.contains(&r.node) {
                g.heard(r.node, r);
            }
        }
        let Step::Rule(reports) = g.next(Duration::from_secs(30)) else {
            panic!("ruled at the end of the wait")
        };
        let v = blame::verdict(4, &reports, &PERMANENT, at(99));
        let (_, on0) = decide(&policy(0), &rounds(4, 0), &ruled(4, v.clone()));
        let (_, on1) = decide(&policy(1), &rounds(4, 0), &ruled(4, v.clone()));
        (v, on0, on1)
    }

    #[test]
    fn a_ranks_death_and_a_peers_failure_in_the_same_poll_blame_the_dead_rank() {
        // CI: rank 1 was SIGKILLed; its ring broke on rank 0, whose agent marked the round
        // failed; node 1's watcher fired in the very poll that reaped rank 1.
        let killed = failure(1, 137, "rank 1 was killed by signal 9 (SIGKILL)", 11);
        let on1 = poll(Seen {
            failure: Some(killed.clone()),
            peer: Some(PeerEnd::Failed),
            ..seen()
        });
        assert_eq!(
            on1,
            Poll::Failed(killed.clone()),
            "its own rank's end, not the peer's"
        );
        let broke = failure(
            0,
            1,
            "rank 0 exited with code 1: ring: connection reset",
            10,
        );
        let reports = vec![
            NodeReport::after(0, "job-0-0", vec![0], &GroupOutcome::Failed(broke)),
            NodeReport::after(1, "job-0-1", vec![1], &GroupOutcome::Failed(killed)),
        ];
        let (v, on0, on1) = through(reports, &[]);
        assert_eq!((v.reason.as_str(), v.rank), (reason::KILLED, Some(1)));
        assert_eq!(shape(&on0), restart(5, 0));
        assert_eq!(shape(&on1), restart(5, 0));
    }

    #[test]
    fn node_0s_verdict_before_node_1s_report_blames_node_1_and_both_go_on() {
        // Node 1's report did not reach node 0 within its wait: node 0 rules without it, and
        // node 1, reading that verdict, restarts with everyone rather than leave.
        let broke = failure(
            0,
            1,
            "rank 0 exited with code 1: ring: connection reset",
            10,
        );
        let killed = failure(1, 137, "killed", 11);
        let reports = vec![
            NodeReport::after(0, "job-0-0", vec![0], &GroupOutcome::Failed(broke)),
            NodeReport::after(1, "job-0-1", vec![1], &GroupOutcome::Failed(killed)),
        ];
        let (v, on0, on1) = through(reports, &[1]);
        assert_eq!((v.reason.as_str(), v.node), (reason::AGENT_LOST, Some(1)));
        assert_eq!(shape(&on0), restart(5, 0));
        assert_eq!(shape(&on1), restart(5, 0), "node 1 goes on with the gang");
    }

    #[test]
    fn a_permanent_failure_on_node_1_ends_both_with_its_code() {
        let bad = failure(1, 3, "data.train.source: no such file", 9);
        let broke = failure(
            0,
            1,
            "rank 0 exited with code 1: ring: connection reset",
            10,
        );
        let reports = vec![
            NodeReport::after(0, "job-0-0", vec![0], &GroupOutcome::Failed(broke)),
            NodeReport::after(1, "job-0-1", vec![1], &GroupOutcome::Failed(bad)),
        ];
        let (v, on0, on1) = through(reports, &[]);
        assert!(v.permanent);
        assert_eq!(shape(&on0), exit(3, true, true), "node 0 ends after node 1");
        assert_eq!(shape(&on1), exit(3, true, false));
    }
}
