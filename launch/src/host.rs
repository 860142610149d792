//! Node 0's agent's own duties: it hosts the rendezvous store for the pod's whole life (its
//! ranks connect to it: `FERROTRAIN_STORE_HOSTED`), so a crash of rank 0's trainer does not
//! take the store down; it announces each round; and when a round ends it gathers every
//! member's report (gather.rs), rules who is to blame (blame.rs), records the round's end in
//! its ledger and in the gang's report it serves (report.rs), and publishes the verdict.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferrotrain_api::recovery::{AttemptEnd, EndCause, RoundEnd, Timestamp};

use crate::auth::Auth;
use crate::blame::{self, NodeReport, Verdict};
use crate::error::AgentError;
use crate::gather::{Gathering, Step};
use crate::keys;
use crate::ledger::Ledger;
use crate::listen::bind_until;
use crate::report::GangReport;
use crate::store::{self, StoreClient, StoreServer};

/// Node 0's part: the store it serves and what it remembers of the rounds.
pub struct Host {
    _server: StoreServer,
    /// The gang's report it serves: how every round so far ended, among the rest.
    report: GangReport,
    /// The nodes the last round ended without (no heartbeat), not waited for again.
    lost: Vec<usize>,
}

impl Host {
    /// Serves the store on `port` (bound within `rendezvous`); the rounds' ends go into
    /// `report`.
    pub fn start(
        port: u16,
        auth: &Auth,
        rendezvous: Duration,
        report: GangReport,
    ) -> store::Result<Self> {
        let deadline = Instant::now() + rendezvous;
        let listener = bind_until(SocketAddr::from(([0, 0, 0, 0], port)), deadline)?;
        let handshake = rendezvous.min(Duration::from_secs(10));
        Ok(Host {
            _server: StoreServer::start(listener, auth.clone(), handshake)?,
            report,
            lost: Vec::new(),
        })
    }

    /// The port its store serves on (the one bound when asked for port 0: a single node).
    pub fn port(&self) -> u16 {
        self._server.port()
    }

    /// The nodes the last round ended without, forgotten: the next round does not wait for
    /// them (their heartbeat timeout was their wait), though it takes them if they come.
    pub fn take_lost(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.lost)
    }

    /// Round `round` starts: agents that join late find it, and the report says it.
    pub fn announce(&self, client: &mut StoreClient, round: u64) -> store::Result<()> {
        self.report.round_started(round);
        client.set(keys::ROUND, round.to_string().as_bytes())
    }

    /// Rules how round `round` ended, from the reports of `gathering`'s members (`permanent`:
    /// the exit codes no restart fixes), records it in `ledger` and publishes the verdict.
    pub fn rule(
        &mut self,
        client: &mut StoreClient,
        round: u64,
        mut gathering: Gathering,
        permanent: &[i32],
        ledger: &mut Ledger,
    ) -> Result<Verdict, AgentError> {
        let resized = client
            .try_get(&keys::resize(round), Duration::ZERO)?
            .is_some();
        let reports = if resized {
            Vec::new()
        } else {
            let nodes: Vec<usize> = gathering.nodes().collect();
            for node in nodes {
                if let Some(seconds) = client.try_get(&keys::lost(round, node), Duration::ZERO)? {
                    let seconds = String::from_utf8_lossy(&seconds).parse().unwrap_or(0.0);
                    gathering.lost(node, seconds);
                    self.lost.push(node);
                }
            }
            reports(client, round, &mut gathering)
        };
        let ruling = blame::ruling(round, resized, &reports, permanent, Timestamp::now());
        self.lost.extend(ruling.gone);
        let mut verdict = ruling.verdict;
        // Recorded first: the ledger, with rank 0's last report, says whether the round saved
        // a checkpoint, and so how long every agent backs off.
        self.record(round, &verdict, ruling.cause, ledger);
        if !resized {
            verdict.in_a_row = ledger.recovery.failures_in_a_row(true).unwrap_or(1);
        }
        publish(client, &verdict)?;
        Ok(verdict)
    }

    /// The round's end in the ledger and the gang's report.
    fn record(&mut self, round: u64, verdict: &Verdict, cause: EndCause, ledger: &mut Ledger) {
        let end = AttemptEnd {
            cause,
            reason: verdict.reason.clone(),
            rank: verdict.rank.map(|r| r as i64),
            node_rank: None,
            exit_code: verdict.code,
            node: verdict.host.clone(),
            failed_at: verdict.detected_at,
            detected_at: verdict.detected_at,
        };
        ledger.end_with(end.clone());
        // Rank 0's own record of the round's last step, read as the round was closed.
        let last_step = ledger.recovery.attempts.last().and_then(|a| a.last_step);
        self.report.round_ended(RoundEnd {
            round,
            end,
            message: verdict.message.clone(),
            last_step,
            last_lines: verdict.last_lines.clone(),
        });
    }
}

/// Every member's report of round `round`, asked for as `gathering` says. A report that does
/// not come (or cannot be read) is a silent one.
fn reports(client: &mut StoreClient, round: u64, gathering: &mut Gathering) -> Vec<NodeReport> {
    let started = Instant::now();
    loop {
        match gathering.next(started.elapsed()) {
            Step::Rule(reports) => return reports,
            Step::Ask { node, within } => {
                match client.try_get(&keys::report(round, node), within) {
                    Ok(Some(bytes)) => match serde_json::from_slice::<NodeReport>(&bytes) {
                        Ok(report) => {
                            let (report, off) = report.read_at(Timestamp::now());
                            if let Some(seconds) = off {
                                tracing::warn!(
                                    "agent: round {round}: node {node}'s clock is {seconds:.0} s \
                                     off this node's: its times are read on this node's clock"
                                );
                            }
                            gathering.heard(node, report);
                        }
                        Err(e) => {
                            tracing::warn!("agent: round {round}: node {node}'s report: {e}");
                            gathering.garbled(node);
                        }
                    },
                    Ok(None) => tracing::warn!("agent: round {round}: no report from node {node}"),
                    Err(e) => {
                        tracing::warn!("agent: round {round}: no report from node {node}: {e}");
                        gathering.garbled(node);
                    }
                }
            }
        }
    }
}

/// Publishes node 0's verdict for every agent.
pub fn publish(client: &mut StoreClient, verdict: &Verdict) -> store::Result<()> {
    let json = serde_json::to_vec(verdict).expect("a verdict serializes");
    client.set(&keys::verdict(verdict.round), &json)
}
