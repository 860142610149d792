//! Node 0 gathering what every member node saw when a round ended, before it rules: pure.
//! The agent (host.rs) asks the store for each report the [`Gathering`] still lacks, for as
//! long as it says, and tells it what came; once every member is heard from, or the wait is
//! over, it hands back one report per member, writing a silent one for a node that sent none
//! (its agent was killed, or its pod lost) and an unreachable one for a node whose heartbeat
//! stood still ([`crate::heartbeat`]).
//!
//! The wait is shared by all members: each agent stops its ranks (within the stop grace)
//! before it reports, so every report is due by then, plus [`crate::round::REPORT_SLACK`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::blame::NodeReport;

/// The reports of one round's end, as they come.
#[derive(Clone, Debug, PartialEq)]
pub struct Gathering {
    /// The members, in rank order, each with its global ranks.
    members: Vec<(usize, Vec<usize>)>,
    /// What node 0 knows of each member so far.
    heard: BTreeMap<usize, NodeReport>,
    /// How long node 0 waits for the reports, from the round's end.
    wait: Duration,
}

/// What node 0 does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Waits up to `within` for `node`'s report.
    Ask { node: usize, within: Duration },
    /// Rules on these reports, one per member in rank order.
    Rule(Vec<NodeReport>),
}

impl Gathering {
    /// The reports of a round whose members are `nodes` (rank order) with `nproc` ranks each,
    /// waited for up to `wait`.
    pub fn new(nodes: &[usize], nproc: usize, wait: Duration) -> Self {
        let members = nodes
            .iter()
            .enumerate()
            .map(|(position, &node)| (node, (position * nproc..(position + 1) * nproc).collect()))
            .collect();
        Gathering {
            members,
            heard: BTreeMap::new(),
            wait,
        }
    }

    /// The members, in rank order.
    pub fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.members.iter().map(|(n, _)| *n)
    }

    fn ranks(&self, node: usize) -> Vec<usize> {
        self.members
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    /// `node`'s own report came (one for another node, or a second one, is ignored: the first
    /// word stands).
    pub fn heard(&mut self, node: usize, report: NodeReport) {
        if report.node == node && self.members.iter().any(|(n, _)| *n == node) {
            self.heard.entry(node).or_insert(report);
        }
    }

    /// What came from `node` does not parse: it is taken as no report at all.
    pub fn garbled(&mut self, node: usize) {
        let ranks = self.ranks(node);
        self.heard
            .entry(node)
            .or_insert_with(|| NodeReport::silent(node, ranks));
    }

    /// Node 0 ended the round without `node`: its heartbeat stood still for `seconds`. No
    /// report is waited for.
    pub fn lost(&mut self, node: usize, seconds: f64) {
        let ranks = self.ranks(node);
        self.heard
            .insert(node, NodeReport::unreachable(node, ranks, seconds));
    }

    /// What to do `elapsed` after the round's end: ask for the first report still missing,
    /// or rule once all came or the wait is over.
    pub fn next(&self, elapsed: Duration) -> Step {
        let missing = self.nodes().find(|n| !self.heard.contains_key(n));
        match missing {
            Some(node) if elapsed < self.wait => Step::Ask {
                node,
                within: self.wait - elapsed,
            },
            _ => Step::Rule(
                self.members
                    .iter()
                    .map(|(node, ranks)| {
                        self.heard
                            .get(node)
                            .cloned()
                            .unwrap_or_else(|| NodeReport::silent(*node, ranks.clone()))
                    })
                    .collect(),
            ),
        }
    }
}
