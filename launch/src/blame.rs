//! Which rank ended a round of in-place restarts, from what every node's agent saw. Pure: the
//! agent of node 0 gathers one [`NodeReport`] per node and calls [`verdict`].
//!
//! A round ends when any rank fails; its peers then fail too (their collective broke), so most
//! rounds end with several failures. The cause is, in this order:
//! 1. a permanent failure (by default exit 2, 3 or 4: no restart can fix it);
//! 2. a node whose launcher was signalled: its pod is going away (deleted, evicted, drained);
//! 3. a rank killed by a signal (SIGKILL, the OOM killer): killed from outside. Not a rank that
//!    exited 143 or 130 after a graceful stop: the ranks stop together on a SIGTERM any of them
//!    gets (rank 0 saving a checkpoint), so that is how a peer follows, never the cause;
//! 4. a frozen rank (stopped: SIGSTOP, a debugger) that never failed on its own: it made its
//!    peers time out, and blaming the peers that waited would be wrong;
//! 5. a node whose agent sent no report: its launcher was killed (SIGKILL, the OOM killer) or
//!    its pod lost without a signal, and its ranks with it; its peers' ranks only saw their
//!    ring break;
//! 6. a rank its peers name as the one that did not answer in a collective (a hang): each
//!    rank's typed record of its end ([`ferrotrain_api::RankEnd`]) carries the silent peer's
//!    number, and the rank most of them name is blamed;
//! 7. otherwise the earliest failure of a rank that did not only follow a peer (its record
//!    says its own error, not a broken collective), else the earliest failure (ties: the
//!    lower rank).

use ferrotrain_api::reason;
use ferrotrain_api::recovery::{EndCause, Timestamp};
use ferrotrain_api::{EndKind, RankEnd};
use serde::{Deserialize, Serialize};

use crate::group::{GroupOutcome, RankFailure, Tails};
use crate::signals;

/// What one node's agent saw when the round ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node (pod) index.
    pub node: usize,
    /// The pod's host name (the operator maps it to its Kubernetes node).
    pub host: String,
    /// Its local ranks (global numbers).
    pub ranks: Vec<usize>,
    /// Its launcher was signalled: the pod goes away (deleted, evicted, drained).
    #[serde(default)]
    pub leaving: bool,
    /// The first of its local ranks that failed on its own, if one did.
    pub failure: Option<RankFailure>,
    /// Its local ranks that were stopped (not running) when the round ended.
    pub frozen: Vec<usize>,
    /// Node 0 heard nothing from this node's agent (it wrote this report for it).
    #[serde(default)]
    pub silent: bool,
    /// Silent because its heartbeat stood still for this many seconds (heartbeat.rs): it is
    /// cut off (a partition, a frozen node), not known to be dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_seconds: Option<f64>,
    /// Silent because its agent is gone: its connection to node 0's store closed before it
    /// reported (the store applied the agent's will, this report).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// The last lines of output of each of its ranks when the round ended
    /// (launch/output.rs): the blamed rank's go into the verdict.
    #[serde(default, skip_serializing_if = "Tails::is_empty")]
    pub tails: Tails,
    /// When its agent published it, on its node's clock: node 0 reads a node's times on its
    /// own clock when the two differ by more than [`CLOCK_TOLERANCE`] ([`NodeReport::read_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<Timestamp>,
}

/// How far a node's clock may be from node 0's before node 0 reads the node's times on its own
/// clock: well past the skew of clocks kept by NTP (milliseconds) and past the seconds a report
/// may wait in the store before node 0 reads it, so only a clock that jumped or was never set
/// is corrected; its failure would otherwise look earlier (or later) than its peers' and take
/// (or escape) the blame.
pub const CLOCK_TOLERANCE: std::time::Duration = std::time::Duration::from_secs(30);

impl NodeReport {
    /// The report node 0 writes for a node whose agent sent none.
    pub fn silent(node: usize, ranks: Vec<usize>) -> Self {
        NodeReport {
            node,
            host: String::new(),
            ranks,
            leaving: false,
            failure: None,
            frozen: Vec::new(),
            silent: true,
            unreachable_seconds: None,
            gone: false,
            tails: Tails::new(),
            sent_at: None,
        }
    }

    /// The report an agent leaves as its will for the round: if its connection to node 0's
    /// store closes before it reports, node 0 reads this one at once.
    pub fn gone(node: usize, host: &str, ranks: Vec<usize>) -> Self {
        NodeReport {
            host: host.to_string(),
            gone: true,
            ..Self::silent(node, ranks)
        }
    }

    /// The report node 0 writes for a node it ended the round without: no heartbeat from
    /// it for `seconds`.
    pub fn unreachable(node: usize, ranks: Vec<usize>, seconds: f64) -> Self {
        NodeReport {
            unreachable_seconds: Some(seconds),
            ..Self::silent(node, ranks)
        }
    }

    /// What `node`'s agent (on host `host`) saw when its ranks `ranks` stopped with
    /// `outcome`: the failure of its own rank, or the ranks that were frozen.
    pub fn after(node: usize, host: &str, ranks: Vec<usize>, outcome: &GroupOutcome) -> Self {
        NodeReport {
            node,
            host: host.to_string(),
            ranks,
            leaving: false,
            failure: match outcome {
                GroupOutcome::Failed(f) => Some(f.clone()),
                _ => None,
            },
            frozen: match outcome {
                GroupOutcome::PeerFailed { frozen } => frozen.clone(),
                GroupOutcome::Frozen { rank, .. } => vec![*rank],
                _ => Vec::new(),
            },
            silent: false,
            unreachable_seconds: None,
            gone: false,
            tails: Tails::new(),
            sent_at: None,
        }
    }

    /// This report with its ranks' last lines of output.
    pub fn with_tails(self, tails: Tails) -> Self {
        NodeReport { tails, ..self }
    }

    /// This report as its agent publishes it, at `now` on its node's clock.
    pub fn sent(self, now: Timestamp) -> Self {
        NodeReport {
            sent_at: Some(now),
            ..self
        }
    }

    /// This report as node 0 reads it at `now` on its own clock: when the node's clock is
    /// more than [`CLOCK_TOLERANCE`] off (its `sent_at` against `now`), its failure's time is
    /// moved onto node 0's clock. Returns the offset applied, in seconds, if any.
    pub fn read_at(mut self, now: Timestamp) -> (Self, Option<f64>) {
        let Some(sent) = self.sent_at else {
            return (self, None);
        };
        let offset = now.duration_since(sent);
        if offset.unsigned_abs() <= CLOCK_TOLERANCE {
            return (self, None);
        }
        if let Some(f) = self.failure.as_mut() {
            f.seen_at = f.seen_at.checked_add(offset).unwrap_or(f.seen_at);
        }
        self.sent_at = Some(now);
        (self, Some(offset.as_secs_f64()))
    }

    /// This report, of a node whose launcher got `signal` at `now`: its pod is going away
    /// (deleted, evicted, drained), which is what ended the round for it.
    pub fn leaving(self, signal: i32, now: Timestamp) -> Self {
        let rank = self.ranks.first().copied().unwrap_or(0);
        let reason = format!(
            "the launcher of pod {} got {} (the pod is being deleted, evicted or drained)",
            self.host,
            signals::name(signal)
        );
        NodeReport {
            leaving: true,
            failure: Some(RankFailure {
                rank,
                code: 128 + signal,
                end: Some(RankEnd::new(EndKind::Stopped, reason.clone())),
                reason,
                seen_at: now,
            }),
            ..self
        }
    }
}

/// Why a round ended: the rank blamed and how its peers followed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub round: u64,
    /// The rank blamed (none when no rank could be: every node was stopped from outside).
    pub rank: Option<usize>,
    pub node: Option<usize>,
    pub host: Option<String>,
    /// Its exit code (128 + signal when killed); none for a frozen rank.
    pub code: Option<i32>,
    /// One of [`ferrotrain_api::reason`]'s: ExitCode, PodLeaving, Killed, Frozen,
    /// Unresponsive, PermanentExitCode, AgentLost, Stopped or Resized.
    pub reason: String,
    /// For people: what happened to it.
    pub message: String,
    /// A restart cannot help (exit 2, 3 or 4).
    pub permanent: bool,
    /// When the first failure was seen: the agents learnt of the round's end then.
    pub detected_at: Timestamp,
    /// Other ranks that failed after it.
    pub secondary: usize,
    /// Failures in a row, this one included, since the last round that saved a checkpoint
    /// ([`ferrotrain_api::Recovery::failures_in_a_row`], from node 0's ledger): how long
    /// every agent backs off before the next round (0: not counted, no wait).
    #[serde(default)]
    pub in_a_row: u32,
    /// The blamed rank's last lines of output in the round, when its node reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
}

/// Whether the round ended because a pod was taken away (deleted, evicted, drained): a
/// disruption, which spends no restart and waits no backoff.
pub fn is_disruption(verdict: &Verdict) -> bool {
    verdict.reason == reason::POD_LEAVING
}

/// The verdict of a round ended at `now` for a resize: nobody to blame, nothing lost.
pub fn resized_verdict(round: u64, now: Timestamp) -> Verdict {
    Verdict {
        round,
        rank: None,
        node: None,
        host: None,
        code: None,
        reason: reason::RESIZED.into(),
        message: "a node came back: the round ended at a checkpoint so that the gang grows".into(),
        permanent: false,
        detected_at: now,
        secondary: 0,
        in_a_row: 0,
        last_lines: Vec::new(),
    }
}

/// How node 0 rules a round's end, from what it read of it.
#[derive(Debug, PartialEq)]
pub struct Ruling {
    pub verdict: Verdict,
    /// Stopped (a resize), Disruption (a pod taken away) or Failure.
    pub cause: EndCause,
    /// The nodes whose agent is gone or whose pod goes away: the next round does not wait
    /// for them (their pod is replaced; elastic, the gang trains on without it until then).
    pub gone: Vec<usize>,
}

/// The ruling on round `round` at `now`: a resize asked for (`resized`) ends it with nobody
/// to blame; otherwise the [`verdict`] on every node's report, a disruption when a pod was
/// taken away.
pub fn ruling(
    round: u64,
    resized: bool,
    reports: &[NodeReport],
    permanent: &[i32],
    now: Timestamp,
) -> Ruling {
    if resized {
        return Ruling {
            verdict: resized_verdict(round, now),
            cause: EndCause::Stopped,
            gone: Vec::new(),
        };
    }
    let verdict = verdict(round, reports, permanent, now);
    let cause = if is_disruption(&verdict) {
        EndCause::Disruption
    } else {
        EndCause::Failure
    };
    let gone = reports
        .iter()
        .filter(|r| r.gone || r.leaving)
        .map(|r| r.node)
        .collect();
    Ruling {
        verdict,
        cause,
        gone,
    }
}

/// Applies the rule of the module documentation to the reports of every node; `permanent`
/// lists the exit codes no restart can fix. `now` is when it rules: the round's detection
/// time when no failure says when. The verdict carries the blamed rank's last lines.
pub fn verdict(round: u64, reports: &[NodeReport], permanent: &[i32], now: Timestamp) -> Verdict {
    let v = rule(round, reports, permanent, now);
    let last_lines = v
        .rank
        .and_then(|rank| reports.iter().find_map(|r| r.tails.get(&rank)))
        .cloned()
        .unwrap_or_default();
    Verdict { last_lines, ..v }
}

fn rule(round: u64, reports: &[NodeReport], permanent: &[i32], now: Timestamp) -> Verdict {
    let failures: Vec<(&NodeReport, &RankFailure)> = reports
        .iter()
        .filter_map(|r| r.failure.as_ref().map(|f| (r, f)))
        .collect();
    let detected_at = failures.iter().map(|(_, f)| f.seen_at).min().unwrap_or(now);
    let earliest = |pick: &dyn Fn(&RankFailure) -> bool| {
        failures
            .iter()
            .filter(|(_, f)| pick(f))
            .min_by_key(|(_, f)| (f.seen_at, f.rank))
            .copied()
    };
    let base = Verdict {
        round,
        rank: None,
        node: None,
        host: None,
        code: None,
        reason: String::new(),
        message: String::new(),
        permanent: false,
        detected_at,
        secondary: failures.len(),
        in_a_row: 0,
        last_lines: Vec::new(),
    };
    let blame = |(r, f): (&NodeReport, &RankFailure), reason: &str| Verdict {
        rank: Some(f.rank),
        node: Some(r.node),
        host: Some(r.host.clone()),
        code: Some(f.code),
        reason: reason.into(),
        message: f.reason.clone(),
        permanent: permanent.contains(&f.code),
        secondary: failures.len() - 1,
        ..base.clone()
    };
    if let Some(hit) = earliest(&|f| permanent.contains(&f.code)) {
        return blame(hit, reason::PERMANENT_EXIT_CODE);
    }
    let leaving = failures
        .iter()
        .filter(|(r, _)| r.leaving)
        .min_by_key(|(_, f)| (f.seen_at, f.rank))
        .copied();
    if let Some(hit) = leaving {
        return blame(hit, reason::POD_LEAVING);
    }
    if let Some(hit) = earliest(&|f| killed(f.code)) {
        return blame(hit, reason::KILLED);
    }
    if let Some((r, rank)) = reports
        .iter()
        .flat_map(|r| r.frozen.iter().map(move |rank| (r, *rank)))
        .min_by_key(|(_, rank)| *rank)
    {
        return Verdict {
            rank: Some(rank),
            node: Some(r.node),
            host: Some(r.host.clone()),
            reason: reason::FROZEN.into(),
            message: format!(
                "rank {rank} was stopped (SIGSTOP or a debugger) while its peers waited for it \
                 in a collective"
            ),
            ..base
        };
    }
    if let Some(r) = reports.iter().find(|r| r.silent) {
        return agent_lost(r, base);
    }
    if let Some(rank) = named_unresponsive(&failures) {
        let node = reports.iter().find(|r| r.ranks.contains(&rank));
        let said = earliest(&|f| f.silent_peer() == Some(rank)).map(|(_, f)| f);
        return Verdict {
            rank: Some(rank),
            node: node.map(|r| r.node),
            host: node.map(|r| r.host.clone()),
            reason: reason::UNRESPONSIVE.into(),
            message: format!(
                "rank {rank} did not answer its peers in a collective (hung){}",
                said.map(|f| format!(": {}", f.reason)).unwrap_or_default()
            ),
            ..base
        };
    }
    let own = earliest(&|f| !f.kind().is_some_and(EndKind::follows_a_peer));
    match own.or_else(|| earliest(&|_| true)) {
        Some(hit) => blame(hit, reason::EXIT_CODE),
        None => Verdict {
            reason: reason::STOPPED.into(),
            message: "every node's ranks were stopped from outside".into(),
            ..base
        },
    }
}

/// The verdict of a round that node `r` ended by going silent (its agent gone, cut off, or
/// lost without a report).
fn agent_lost(r: &NodeReport, base: Verdict) -> Verdict {
    let message = match r.unreachable_seconds {
        None if r.gone => format!(
            "node {}'s launcher is gone: its connection to node 0's store closed before it \
                 reported (it was killed: SIGKILL, the OOM killer; or its container exited), \
                 and its ranks {:?} with it",
            r.node, r.ranks
        ),
        Some(s) => format!(
            "node {} was cut off: its launcher sent no heartbeat for {s:.1} s (a network \
                 partition, or its node stopped or froze); the round ended without its ranks {:?}",
            r.node, r.ranks
        ),
        None => format!(
            "node {}'s launcher sent no report: it was killed (SIGKILL, the OOM killer) or \
                 its pod was lost, and its ranks {:?} with it",
            r.node, r.ranks
        ),
    };
    Verdict {
        rank: r.ranks.first().copied(),
        node: Some(r.node),
        reason: reason::AGENT_LOST.into(),
        message,
        ..base
    }
}

/// Killed by a signal from outside: 128 + n, but not the graceful stop of SIGTERM or SIGINT
/// (the trainer exits 128 + n itself after saving).
fn killed(code: i32) -> bool {
    code >= 128 && code != 128 + libc::SIGTERM && code != 128 + libc::SIGINT
}

/// The rank most failures say did not answer, when no failure is that rank's own.
fn named_unresponsive(failures: &[(&NodeReport, &RankFailure)]) -> Option<usize> {
    let mut named: Vec<usize> = failures
        .iter()
        .filter_map(|(_, f)| f.silent_peer())
        .filter(|rank| !failures.iter().any(|(_, f)| f.rank == *rank))
        .collect();
    named.sort_unstable();
    let mut best: Option<(usize, usize)> = None;
    for chunk in named.chunk_by(|a, b| a == b) {
        if best.is_none_or(|(_, n)| chunk.len() > n) {
            best = Some((chunk[0], chunk.len()));
        }
    }
    best.map(|(rank, _)| rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERMANENT: [i32; 3] = [2, 3, 4];

    fn verdict(round: u64, reports: &[NodeReport]) -> Verdict {
        super::verdict(round, reports, &PERMANENT, at(99))
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_750_000_000 + s).unwrap()
    }

    fn failed(node: usize, rank: usize, code: i32, reason: &str, seen: i64) -> NodeReport {
        NodeReport {
            node,
            host: format!("job-0-{node}"),
            ranks: vec![rank],
            leaving: false,
            failure: Some(RankFailure {
                rank,
                code,
                reason: reason.into(),
                seen_at: at(seen),
                end: None,
            }),
            frozen: Vec::new(),
            silent: false,
            unreachable_seconds: None,
            gone: false,
            tails: Tails::new(),
            sent_at: None,
        }
    }

    /// `failed`, with the rank's record of its end: `kind`, naming `peer`.
    fn recorded(mut report: NodeReport, kind: EndKind, peer: Option<usize>) -> NodeReport {
        let f = report.failure.as_mut().expect("a failure");
        f.end = Some(RankEnd {
            peer,
            ..RankEnd::new(kind, f.reason.clone())
        });
        report
    }

    /// Rank `rank` of node `node` timed out on `peer` in a collective (the ring's record).
    fn timed_out_on(node: usize, rank: usize, peer: usize, seen: i64) -> NodeReport {
        let words = format!(
            "rank {rank} exited with code 1: rank {peer} (10.0.0.{peer}:41000) did not answer \
             within 30 s during all-reduce"
        );
        recorded(
            failed(node, rank, 1, &words, seen),
            EndKind::PeerSilent,
            Some(peer),
        )
    }

    fn quiet(node: usize, frozen: &[usize]) -> NodeReport {
        NodeReport {
            node,
            host: format!("job-0-{node}"),
            ranks: vec![node],
            leaving: false,
            failure: None,
            frozen: frozen.to_vec(),
            silent: false,
            unreachable_seconds: None,
            gone: false,
            tails: Tails::new(),
            sent_at: None,
        }
    }

    #[test]
    fn a_node_whose_clock_jumped_is_read_on_node_0s_clock_and_blamed_in_order() {
        // Node 1's clock jumped an hour back: its rank's failure, which followed node 0's by a
        // second, looks an hour earlier and would take the blame.
        let first = failed(0, 0, 1, "out of memory", 10).sent(at(12));
        let mut late = failed(1, 1, 1, "a tensor of the wrong shape", 11);
        late.failure.as_mut().unwrap().seen_at = at(11 - 3600);
        let late = late.sent(at(12 - 3600));
        assert_eq!(
            verdict(3, &[first.clone(), late.clone()]).rank,
            Some(1),
            "misread"
        );
        let (read, off) = late.read_at(at(13));
        assert_eq!(off, Some(3601.0));
        assert_eq!(read.failure.as_ref().unwrap().seen_at, at(12));
        assert_eq!(
            verdict(3, &[first.clone(), read]).rank,
            Some(0),
            "the killed rank first"
        );
        // Clocks within the tolerance, or a report with no sending time, are left as they are.
        let (same, off) = first.clone().read_at(at(20));
        assert_eq!((same, off), (first, None));
        let (silent, off) = NodeReport::silent(2, vec![2]).read_at(at(20));
        assert_eq!((silent.sent_at, off), (None, None));
    }

    #[test]
    fn a_ruling_says_the_cause_and_which_nodes_the_next_round_does_not_wait_for() {
        let rule =
            |resized, reports: &[NodeReport]| ruling(4, resized, reports, &PERMANENT, at(50));
        let mut leaving = failed(1, 1, 143, "signalled", 10);
        leaving.leaving = true;
        let mut gone = NodeReport::silent(2, vec![2]);
        gone.gone = true;
        // (resized, reports) -> (reason, cause, nodes not waited for)
        type Row = (bool, Vec<NodeReport>, &'static str, EndCause, Vec<usize>);
        let rows: [Row; 4] = [
            (true, vec![], reason::RESIZED, EndCause::Stopped, vec![]),
            (
                false,
                vec![quiet(0, &[]), failed(1, 1, 137, "killed", 10)],
                reason::KILLED,
                EndCause::Failure,
                vec![],
            ),
            (
                false,
                vec![quiet(0, &[]), leaving.clone()],
                reason::POD_LEAVING,
                EndCause::Disruption,
                vec![1],
            ),
            (
                false,
                vec![quiet(0, &[]), leaving, gone],
                reason::POD_LEAVING,
                EndCause::Disruption,
                vec![1, 2],
            ),
        ];
        for (resized, reports, why, cause, not_waited) in rows {
            let r = rule(resized, &reports);
            assert_eq!(
                (r.verdict.reason.as_str(), r.cause, r.gone),
                (why, cause, not_waited),
                "{reports:?}"
            );
            assert_eq!(
                (r.verdict.round, r.verdict.detected_at.max(at(50))),
                (4, at(50))
            );
        }
    }

    #[test]
    fn a_node_whose_agent_is_gone_is_blamed_not_the_peer_whose_ring_broke() {
        // Node 1's launcher was SIGKILLed: its ranks died with it and its agent never
        // reported; node 0's rank failed first on the broken ring.
        let broke = "rank 0: the ring to rank 1 broke: connection reset by peer";
        let v = verdict(
            2,
            &[
                failed(0, 0, 1, broke, 10),
                NodeReport::silent(1, vec![2, 3]),
            ],
        );
        assert_eq!(v.reason, reason::AGENT_LOST);
        assert_eq!((v.rank, v.node, v.code), (Some(2), Some(1), None));
        assert!(
            v.message.contains("node 1's launcher sent no report"),
            "{}",
            v.message
        );
        assert!(!v.permanent);
        // A permanent failure elsewhere still rules; so does a rank killed on a reporting node.
        let v = verdict(
            2,
            &[
                failed(0, 0, 2, "config", 10),
                NodeReport::silent(1, vec![1]),
            ],
        );
        assert_eq!(v.reason, reason::PERMANENT_EXIT_CODE);
        let v = verdict(
            2,
            &[
                failed(0, 0, 137, "killed", 10),
                NodeReport::silent(1, vec![1]),
            ],
        );
        assert_eq!(v.reason, reason::KILLED);
    }

    #[test]
    fn a_node_cut_off_by_its_heartbeat_is_blamed_as_cut_off_not_as_killed() {
        // Node 1 went silent behind a partition: node 0 stopped its own ranks (no failure of
        // theirs) and wrote node 1's report from the heartbeat.
        let v = verdict(
            4,
            &[quiet(0, &[]), NodeReport::unreachable(1, vec![1], 10.4)],
        );
        assert_eq!(v.reason, reason::AGENT_LOST);
        assert_eq!((v.rank, v.node), (Some(1), Some(1)));
        assert!(
            v.message
                .starts_with("node 1 was cut off: its launcher sent no heartbeat for 10.4 s"),
            "{}",
            v.message
        );
    }

    #[test]
    fn a_killed_rank_is_blamed_over_the_peer_whose_collective_broke_first() {
        let v = verdict(
            0,
            &[
                failed(
                    0,
                    0,
                    1,
                    "rank 0 exited with code 1: ring: connection reset",
                    10,
                ),
                failed(1, 1, 137, "rank 1 was killed by signal 9 (SIGKILL)", 11),
            ],
        );
        assert_eq!((v.rank, v.node, v.code), (Some(1), Some(1), Some(137)));
        assert_eq!(v.reason, reason::KILLED);
        assert_eq!(v.host.as_deref(), Some("job-0-1"));
        assert_eq!((v.secondary, v.permanent), (1, false));
        assert_eq!(
            v.detected_at,
            at(10),
            "the agents learnt of it at the first failure"
        );
    }

    #[test]
    fn a_pod_going_away_is_blamed_over_the_ranks_its_leaving_broke() {
        let mut gone = failed(1, 1, 143, "the launcher of pod job-0-1 got SIGTERM", 12);
        gone.leaving = true;
        let v = verdict(0, &[failed(0, 0, 137, "killed while saving", 11), gone]);
        assert_eq!(
            (v.rank, v.node, v.reason.as_str()),
            (Some(1), Some(1), "PodLeaving")
        );
    }

    #[test]
    fn a_permanent_failure_wins_whatever_came_first() {
        let v = verdict(
            2,
            &[
                failed(0, 0, 137, "killed", 5),
                failed(1, 1, 3, "data.train.source: no such file", 9),
            ],
        );
        assert_eq!(
            (v.rank, v.reason.as_str(), v.permanent),
            (Some(1), "PermanentExitCode", true)
        );
    }

    #[test]
    fn a_peer_that_stopped_gracefully_with_the_frozen_rank_is_not_blamed() {
        // Rank 1 frozen; its launcher stops it (SIGTERM + SIGCONT); the ranks stop together,
        // and rank 0 exits 143 before its launcher heard of the freeze.
        let v = verdict(
            0,
            &[
                failed(
                    0,
                    0,
                    143,
                    "rank 0 exited with code 143: stopped by SIGTERM",
                    10,
                ),
                quiet(1, &[1]),
            ],
        );
        assert_eq!((v.rank, v.reason.as_str()), (Some(1), "Frozen"));
    }

    #[test]
    fn a_frozen_rank_is_blamed_not_the_peer_that_timed_out_waiting_for_it() {
        let v = verdict(0, &[timed_out_on(0, 0, 1, 40), quiet(1, &[1])]);
        assert_eq!((v.rank, v.node, v.code), (Some(1), Some(1), None));
        assert_eq!(v.reason, reason::FROZEN);
        assert!(v.message.contains("stopped"), "{}", v.message);
        assert_eq!(v.secondary, 1);
    }

    #[test]
    fn a_hung_rank_named_by_its_peers_records_is_blamed() {
        let v = verdict(
            0,
            &[
                timed_out_on(0, 0, 2, 40),
                timed_out_on(1, 1, 2, 41),
                quiet(2, &[]),
            ],
        );
        assert_eq!(
            (v.rank, v.node, v.reason.as_str()),
            (Some(2), Some(2), "Unresponsive")
        );
        assert_eq!(v.secondary, 2);
        assert!(v.message.contains("(10.0.0.2:41000)"), "{}", v.message);
    }

    #[test]
    fn the_silent_peer_is_read_from_the_record_never_from_the_words() {
        // Words that name a rank but no record: nobody is blamed as unresponsive.
        let words = "rank 0 exited with code 1: rank 2 did not answer within 30 s";
        let v = verdict(0, &[failed(0, 0, 1, words, 40), quiet(2, &[])]);
        assert_eq!((v.rank, v.reason.as_str()), (Some(0), "ExitCode"));
        // A record that names rank 2 with words that say nothing of it.
        let said = recorded(
            failed(0, 0, 1, "collective timed out", 40),
            EndKind::PeerSilent,
            Some(2),
        );
        let v = verdict(0, &[said, quiet(2, &[])]);
        assert_eq!((v.rank, v.reason.as_str()), (Some(2), "Unresponsive"));
        // In a ring of 3 where rank 1 hangs, rank 2 waits on rank 1 and rank 0 on rank 2:
        // rank 2 failed itself, so it is not the one that did not answer.
        let v = verdict(
            0,
            &[
                timed_out_on(0, 0, 2, 40),
                timed_out_on(2, 2, 1, 40),
                quiet(1, &[]),
            ],
        );
        assert_eq!((v.rank, v.reason.as_str()), (Some(1), "Unresponsive"));
    }

    #[test]
    fn the_verdict_carries_the_blamed_ranks_last_lines_from_its_nodes_report() {
        let tails: Tails = [(1, vec!["step 40".to_string(), "loading shard 9".into()])].into();
        let frozen = quiet(1, &[1]).with_tails(tails);
        let v = verdict(0, &[timed_out_on(0, 0, 1, 40), frozen]);
        assert_eq!((v.rank, v.reason.as_str()), (Some(1), "Frozen"));
        assert_eq!(v.last_lines, ["step 40", "loading shard 9"]);
        let none = verdict(0, &[timed_out_on(0, 0, 1, 40), quiet(1, &[1])]);
        assert!(
            none.last_lines.is_empty(),
            "no report of its lines: none made up"
        );
    }

    #[test]
    fn a_ranks_own_error_is_blamed_over_the_peers_that_only_followed_it() {
        // Rank 3 hit an I/O error; rank 0's ring broke on it and its launcher saw that first.
        let follower = recorded(
            failed(0, 0, 1, "rank 3 closed the connection", 10),
            EndKind::PeerFailed,
            Some(3),
        );
        let cause = recorded(failed(1, 3, 1, "I/O: disk full", 11), EndKind::Error, None);
        let v = verdict(0, &[follower, cause]);
        assert_eq!(
            (v.rank, v.node, v.reason.as_str()),
            (Some(3), Some(1), "ExitCode")
        );
        assert_eq!(v.secondary, 1);
    }

    #[test]
    fn otherwise_the_earliest_failure_then_the_lower_rank() {
        let v = verdict(
            0,
            &[failed(0, 0, 1, "late", 12), failed(1, 3, 1, "first", 11)],
        );
        assert_eq!((v.rank, v.reason.as_str()), (Some(3), "ExitCode"));
        let tie = verdict(0, &[failed(1, 3, 1, "b", 11), failed(0, 1, 1, "a", 11)]);
        assert_eq!(tie.rank, Some(1));
        let none = verdict(0, &[quiet(0, &[]), quiet(1, &[])]);
        assert_eq!((none.rank, none.reason.as_str()), (None, "Stopped"));
    }
}
