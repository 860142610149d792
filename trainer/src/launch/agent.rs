//! The pod's agent: `ferrotrain launch --restart-in-place` on several nodes. It outlives its
//! ranks: when any rank of the gang fails, every node's agent stops its own ranks and starts
//! them again in a new numbered round, from the latest complete checkpoint, without the pod
//! ending (torchrun's elastic agent does the same with its rendezvous rounds).
//!
//! The agent of node 0 hosts the rendezvous store for the pod's whole life (its ranks connect
//! to it: `FERROTRAIN_STORE_HOSTED`), so a crash of rank 0's trainer does not take the store
//! down. Agents talk only through the store, under `agent/`:
//!
//! ```text
//! agent/round                 the round node 0 started last
//! barrier/agent/<r>/join      every node's agent joins round r before its ranks start
//! agent/<r>/failures          ADD: failed nodes so far; the first one also sets
//! agent/<r>/failed            ...which every agent's watcher thread waits on (one blocking GET):
//!                             a failure anywhere stops every node's ranks within a poll (25 ms)
//! agent/<r>/report/<node>     what each agent saw (blame::NodeReport), once its ranks stopped
//! agent/<r>/verdict           node 0's ruling (blame::Verdict): who is blamed, permanent or not
//! agent/done                  ADD: nodes whose ranks all finished
//! ```
//!
//! The ranks' own keys live under `round/<r>/` (see dist::Rendezvous). A permanent failure
//! (exit 2, 3, 4) ends every agent (the pod fails and the operator fails the job); so does
//! running out of `--max-restarts`, which counts rounds. Losing node 0's agent (its pod
//! deleted, evicted or drained) does not end the others: they wait for its replacement's
//! store and join its first round (see rejoin.rs).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrotrain_api::exit;
use ferrotrain_api::recovery::{AttemptEnd, EndCause, RoundEnd};

use super::args::{Launch, LaunchArgs, LaunchError, forward_final_report};
use super::blame::{self, NodeReport, Verdict};
use super::files::ROUNDS_FILE;
use super::group::{GroupOutcome, PeerEnd, RankFailure, start_group_with};
use super::heartbeat::{self, Heartbeat};
use super::ledger::Ledger;
use super::local::sleep_unless_signalled;
use super::members::{self, Members};
use super::rejoin;
use super::spare::{SpareStart, Spares};
use super::spawn::Spawn;
use super::watch::{Grower, Watcher};
use crate::dist::auth::Auth;
use crate::dist::store::{StoreClient, StoreServer};
use crate::error::write_termination_message;

/// How long node 0 waits for every node's report once a round failed (each agent stops its
/// ranks first, within the stop grace).
const REPORT_SLACK: Duration = Duration::from_secs(5);
/// How long the agents wait for one another at the end (success or a final failure), so that
/// node 0's store outlives the others' last reads.
const FAREWELL: Duration = Duration::from_secs(30);
/// A local rank stopped (SIGSTOP, a debugger) this long ends the round: its peers would only
/// notice at their collective timeout, and would be blamed for waiting.
const FROZEN_AFTER: Duration = Duration::from_secs(2);

/// Runs the rounds until the ranks finish, a failure is permanent, the budget of restarts is
/// spent or the agent is signalled. Returns the exit code of the pod's process.
pub fn run(args: &LaunchArgs, l: &Launch) -> Result<i32, LaunchError> {
    let mut agent = Agent::start(args, l)?;
    let code = agent.rounds();
    agent.farewell(code);
    if agent.collateral {
        // Another node's permanent failure ended the gang: let the blamed pod end first, so
        // the operator reads its termination (the root cause) before this one's.
        let _ = sleep_unless_signalled(COLLATERAL_PAUSE);
    }
    Ok(code)
}

/// How long a survivor tries to reach node 0's store after its ranks stopped before it takes
/// the store for gone with node 0.
const STORE_GONE_AFTER: Duration = Duration::from_secs(2);

/// How long an agent whose gang another node failed for good waits before its pod ends.
const COLLATERAL_PAUSE: Duration = Duration::from_secs(2);

struct Agent<'a> {
    args: &'a LaunchArgs,
    launch: &'a Launch,
    auth: Auth,
    /// Node 0 only.
    _server: Option<StoreServer>,
    host: String,
    client: StoreClient,
    ledger: Ledger,
    hostname: String,
    /// Node 0: how every round so far ended (rank 0 serves them in its progress report).
    ends: Vec<RoundEnd>,
    /// Who this agent is: its pod's UID (POD_UID), else a random token (a stale agent of the
    /// same node, cut off and replaced, is not a member of later rounds).
    id: String,
    /// The members of the round this agent last trained in.
    members: Option<Members>,
    /// The gang ended for another node's permanent failure.
    collateral: bool,
    /// The identity of the store this agent joined (node 0's pod), to tell its replacement's
    /// apart from it.
    store_id: Option<Vec<u8>>,
    /// Trainers started during the last round, waiting to be the next round's ranks.
    spares: Option<Spares>,
    /// Node 0: the nodes the last round ended without (no heartbeat), not waited for again.
    lost: Vec<usize>,
}

impl<'a> Agent<'a> {
    fn start(args: &'a LaunchArgs, l: &'a Launch) -> Result<Self, LaunchError> {
        let auth = Auth::new(&l.token, l.base_attempt);
        let rendezvous = Duration::from_secs_f64(args.rendezvous_timeout_seconds.max(1.0));
        let deadline = Instant::now() + rendezvous;
        let store_err = |e: crate::error::TrainError| LaunchError::Rendezvous(e.to_string());
        let server = if args.node_rank == 0 {
            let listener = crate::dist::bind_until(
                std::net::SocketAddr::from(([0, 0, 0, 0], args.master_port)),
                deadline,
            )
            .map_err(store_err)?;
            let handshake = rendezvous.min(Duration::from_secs(10));
            super::files::keep_refusals_written(l.logs.clone());
            Some(StoreServer::start(listener, auth.clone(), handshake).map_err(store_err)?)
        } else {
            None
        };
        // Node 0 reaches its own store over loopback: it need not wait for its DNS name.
        let host = if args.node_rank == 0 {
            "127.0.0.1".to_string()
        } else {
            args.master_addr.clone()
        };
        let mut client =
            StoreClient::connect(&host, args.master_port, &auth, deadline).map_err(store_err)?;
        let id = std::env::var("POD_UID")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(crate::dist::auth::random_token);
        if args.node_rank == 0 {
            client
                .set(rejoin::STORE_ID, id.as_bytes())
                .map_err(store_err)?;
        } else {
            // A new agent of this node is its newest pod: one it replaced is stale.
            members::claim(&mut client, args.node_rank, &id).map_err(store_err)?;
        }
        let outs: Vec<_> = args.recovery_file.iter().cloned().collect();
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        tracing::info!(
            "agent: node {} of {}, rendezvous {host}:{}{}",
            args.node_rank,
            args.nnodes,
            args.master_port,
            if args.node_rank == 0 {
                " (hosted here)"
            } else {
                ""
            }
        );
        Ok(Agent {
            args,
            launch: l,
            auth,
            _server: server,
            host,
            client,
            ledger: Ledger::new(&l.logs, outs),
            hostname,
            ends: Vec::new(),
            id,
            members: None,
            collateral: false,
            store_id: None,
            spares: None,
            lost: Vec::new(),
        })
    }

    fn node(&self) -> usize {
        self.args.node_rank
    }

    fn rendezvous_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.args.rendezvous_timeout_seconds.max(1.0))
    }

    /// A fresh connection (the store drops one idle for 10 minutes, and a training round is
    /// usually longer), to the store this agent joined: one that node 0's replacement serves
    /// at the same address already is an error, which makes the agent join it anew.
    fn reconnect(&mut self) -> crate::error::Result<()> {
        self.reconnect_within(Duration::from_secs(10))
    }

    fn reconnect_within(&mut self, within: Duration) -> crate::error::Result<()> {
        let deadline = Instant::now() + within;
        let mut client =
            StoreClient::connect(&self.host, self.args.master_port, &self.auth, deadline)?;
        if let Some(joined) = &self.store_id
            && client.try_get(rejoin::STORE_ID, Duration::ZERO)?.as_ref() != Some(joined)
        {
            return Err(crate::error::TrainError::Distributed(
                "node 0's store was replaced (node 0's pod was lost)".into(),
            ));
        }
        self.client = client;
        Ok(())
    }

    fn rounds(&mut self) -> i32 {
        let mut round = match self.joining_round(0) {
            Ok(round) => round,
            Err(e) => return self.give_up(&format!("agent: joining: {e}"), exit::RETRYABLE),
        };
        let mut failed: u64 = 0;
        loop {
            let outcome = match self.one_round(round) {
                Ok(outcome) => outcome,
                // The store may be gone with node 0: wait for its replacement.
                Err(e) if self.node() != 0 && failed < u64::from(self.args.max_restarts) => {
                    failed += 1;
                    match self.rejoin(round, &e.to_string(), false) {
                        Ok(next) => {
                            round = next;
                            continue;
                        }
                        Err(e) => return self.give_up(&format!("agent: {e}"), exit::RETRYABLE),
                    }
                }
                Err(e) => {
                    return self.give_up(&format!("agent: round {round}: {e}"), exit::RETRYABLE);
                }
            };
            let verdict = match outcome {
                Outcome::Finished => {
                    forward_final_report(&self.launch.logs);
                    return exit::SUCCESS;
                }
                Outcome::Signalled(s) => return 128 + s,
                Outcome::Replaced(owner) => {
                    let message = format!(
                        "node {} is held by another pod's launcher now (pod UID {owner}): this \
                         pod was cut off and replaced, so it leaves the gang",
                        self.node()
                    );
                    return self.give_up(&message, exit::RETRYABLE);
                }
                Outcome::NotAdmitted => match self.next_round_after(round) {
                    Ok(next) => {
                        round = next;
                        continue;
                    }
                    Err(e) => {
                        return self
                            .give_up(&format!("agent: waiting to join: {e}"), exit::RETRYABLE);
                    }
                },
                Outcome::Failed(v) => v,
            };
            if verdict.reason == blame::RESIZED {
                tracing::info!("agent: round {round} ended to resize the gang");
                round += 1;
                continue;
            }
            if let Some(code) = self.last_round(round, failed, &verdict) {
                return code;
            }
            if verdict.node == Some(0) && verdict.reason == blame::POD_LEAVING && self.node() != 0 {
                // Node 0's pod goes away, and its store with it.
                failed += 1;
                match self.rejoin(round, &verdict.message, true) {
                    Ok(next) => {
                        round = next;
                        continue;
                    }
                    Err(e) => return self.give_up(&format!("agent: {e}"), exit::RETRYABLE),
                }
            }
            let wait = self.backoff(verdict.in_a_row);
            tracing::warn!(
                "agent: round {round} ended: {}: {}; restarting in place in {:.1} s (failure {} in a row)",
                who(&verdict),
                verdict.message,
                wait.as_secs_f64(),
                verdict.in_a_row
            );
            if let Some(s) = sleep_unless_signalled(wait) {
                return 128 + s;
            }
            failed += 1;
            round += 1;
        }
    }

    /// The wait before the round after a failure that was the `in_a_row`-th in a row: none
    /// for the first (a gang that trained well restarts at once), then the restart backoff,
    /// doubling; a gang that keeps failing before it saves a checkpoint is backed off.
    fn backoff(&self, in_a_row: u32) -> Duration {
        match in_a_row {
            0 | 1 => Duration::ZERO,
            n => self.args.restart_wait(n - 1),
        }
    }

    /// The exit code when round `round` (the `failed`-th failure) was the last: a permanent
    /// failure (every node exits with its code, so that whichever pod the operator sees end
    /// first, no restart follows), or the budget of restarts spent.
    fn last_round(&mut self, round: u64, failed: u64, verdict: &Verdict) -> Option<i32> {
        let own = verdict.node == Some(self.node());
        let own_code = verdict.code.filter(|_| own).unwrap_or(exit::RETRYABLE);
        if verdict.permanent {
            let message = format!(
                "round {round}: {}: {}; permanent, not restarting",
                who(verdict),
                verdict.message
            );
            self.collateral = !own;
            return Some(self.give_up(&message, verdict.code.unwrap_or(own_code)));
        }
        if failed >= u64::from(self.args.max_restarts) {
            let message = format!(
                "round {round}: {}: {}; giving up after {failed} in-place restart(s) (--max-restarts)",
                who(verdict),
                verdict.message
            );
            return Some(self.give_up(&message, own_code));
        }
        None
    }

    /// Not a member of round `round` (late): the next round node 0 starts, which takes it in.
    fn next_round_after(&mut self, round: u64) -> crate::error::Result<u64> {
        tracing::info!("agent: round {round} runs without this node; waiting for the next one");
        loop {
            self.reconnect()?;
            let current = self
                .client
                .try_get("agent/round", Duration::ZERO)?
                .and_then(|b| String::from_utf8_lossy(&b).parse::<u64>().ok())
                .unwrap_or(0);
            if current > round {
                return Ok(current);
            }
            if crate::signals::received() != 0 {
                return Err(crate::error::TrainError::Distributed(
                    "signalled while waiting".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Round `round` ended with node 0's store (`why`): waits for a store at node 0's
    /// address (not the lost one when `lost`, as when node 0 said it leaves) and joins it.
    fn rejoin(&mut self, round: u64, why: &str, lost: bool) -> crate::error::Result<u64> {
        let timeout = self.rendezvous_timeout();
        tracing::warn!(
            "agent: round {round}: {why}; waiting up to {:.0} s for node 0's store at {}:{}",
            timeout.as_secs_f64(),
            self.host,
            self.args.master_port
        );
        let lost = self.store_id.take().filter(|_| lost);
        let deadline = Instant::now() + timeout;
        self.client = rejoin::reach(
            &self.host,
            self.args.master_port,
            &self.auth,
            lost.as_deref(),
            deadline,
        )?;
        self.joining_round(round + 1)
    }

    /// The round to join. Node 0 starts where the others left off (0 for a new gang; see
    /// rejoin.rs). Any other node says where it would go on (`next`), then joins the round
    /// node 0 runs: for a pod that replaces a lost one (or a survivor of node 0's loss), the
    /// one after the last round that failed (waiting for its verdict), else the current one,
    /// whose barrier waits for this node.
    fn joining_round(&mut self, next: u64) -> crate::error::Result<u64> {
        self.reconnect()?;
        if self.node() == 0 {
            let elastic = self.args.min_nodes.is_some_and(|m| m < self.args.nnodes);
            let wait = if elastic {
                Duration::from_secs_f64(self.args.elastic_wait_seconds.max(0.0))
            } else {
                self.rendezvous_timeout()
            };
            return rejoin::first_round(&mut self.client, self.args.nnodes, wait);
        }
        let node = self.node();
        rejoin::post(&mut self.client, node, next)?;
        let current = self.client.get("agent/round", self.rendezvous_timeout())?;
        self.store_id = self.client.try_get(rejoin::STORE_ID, Duration::ZERO)?;
        let round: u64 = String::from_utf8_lossy(&current).parse().unwrap_or(0);
        let failed = format!("agent/{round}/failed");
        if self.client.try_get(&failed, Duration::ZERO)?.is_none() {
            return Ok(round);
        }
        let wait =
            (Duration::from_secs_f64(self.args.stop_grace_seconds.max(0.0)) + REPORT_SLACK) * 2;
        self.client.get(&format!("agent/{round}/verdict"), wait)?;
        tracing::info!("agent: joining a running gang at round {}", round + 1);
        Ok(round + 1)
    }

    /// Logs and writes the termination message, then returns `code`.
    fn give_up(&self, message: &str, code: i32) -> i32 {
        tracing::error!("agent: {message}");
        write_termination_message(message);
        code
    }

    /// Joins round `round`, runs the local ranks in it and, when it failed, agrees on why.
    fn one_round(&mut self, round: u64) -> crate::error::Result<Outcome> {
        self.reconnect()?;
        if self.node() == 0 {
            self.client
                .set("agent/round", round.to_string().as_bytes())?;
        }
        if let Some(owner) = self.replaced_by()? {
            return Ok(Outcome::Replaced(owner));
        }
        let Some((position, size)) = self.assemble(round)? else {
            return Ok(Outcome::NotAdmitted);
        };
        let watcher = Watcher::start(&self.host, self.args.master_port, &self.auth, round)?;
        let heartbeat = self.heartbeat(round, &watcher)?;
        let grower = (self.node() == 0 && size < self.args.nnodes)
            .then(|| Grower::start(&self.host, self.args.master_port, &self.auth, round, size))
            .transpose()?;
        self.ledger.started(self.launch.base_attempt, Some(round));
        let mut group = start_group_with(&self.spawn(round, (position, size)), self.spares.take())?;
        tracing::info!(
            "agent: round {round}: started {} rank(s), {} of them spares",
            self.args.nproc_per_node,
            group.from_spares
        );
        let (fired, lost) = (watcher.fired.clone(), watcher.lost.clone());
        let next = self.spawn(round + 1, (position, size));
        let mut spares = SpareStart::new(self.args.spare_ranks && self.launch.own_binary);
        let outcome = group.supervise_with(
            &|| match (fired.load(Ordering::SeqCst), lost.load(Ordering::SeqCst)) {
                (false, _) => None,
                (true, false) => Some(PeerEnd::Failed),
                (true, true) => Some(PeerEnd::Lost),
            },
            Some(FROZEN_AFTER),
            &mut || spares.when_due(&next),
        );
        drop(group);
        if matches!(
            outcome,
            GroupOutcome::Failed(_) | GroupOutcome::PeerFailed { .. } | GroupOutcome::Frozen { .. }
        ) {
            self.spares = spares.started;
        }
        watcher.stop();
        heartbeat.stop();
        if let Some(g) = grower {
            g.stop();
        }
        let nproc = self.args.nproc_per_node;
        let report = NodeReport {
            node: self.node(),
            host: self.hostname.clone(),
            leaving: false,
            ranks: (position * nproc..(position + 1) * nproc).collect(),
            failure: match &outcome {
                GroupOutcome::Failed(f) => Some(f.clone()),
                _ => None,
            },
            frozen: match &outcome {
                GroupOutcome::PeerFailed { frozen } => frozen.clone(),
                GroupOutcome::Frozen { rank, .. } => vec![*rank],
                _ => Vec::new(),
            },
            silent: false,
            unreachable_seconds: None,
        };
        match outcome {
            GroupOutcome::Finished => {
                self.ledger.ended(&outcome);
                return Ok(Outcome::Finished);
            }
            GroupOutcome::Signalled(s) => {
                self.ledger.ended(&outcome);
                self.leaving(round, report, s);
                return Ok(Outcome::Signalled(s));
            }
            GroupOutcome::Failed(_)
            | GroupOutcome::PeerFailed { .. }
            | GroupOutcome::Frozen { .. } => {}
        }
        let own = report.failure.is_some() || matches!(outcome, GroupOutcome::Frozen { .. });
        // A store that does not answer soon went with node 0 (a connection to its vanished
        // address would hang), and the agent goes to wait for its replacement. Soon is longer
        // when this node's own rank failed: its report carries the blame, and node 0 waits
        // for it (the stop grace and REPORT_SLACK) rather than call this node lost.
        self.reconnect_within(if own { REPORT_SLACK } else { STORE_GONE_AFTER })?;
        if own && self.client.add(&format!("agent/{round}/failures"), 1)? == 1 {
            self.client.set(
                &format!("agent/{round}/failed"),
                self.node().to_string().as_bytes(),
            )?;
        }
        let json = serde_json::to_vec(&report).expect("a report serializes");
        self.client
            .set(&format!("agent/{round}/report/{}", self.node()), &json)?;
        let verdict = self.agree(round)?;
        Ok(Outcome::Failed(verdict))
    }

    /// The round's heartbeat (heartbeat.rs): node 0 watches the other members' beats, every
    /// other node beats; either ends the round through the watcher's flags.
    fn heartbeat(&self, round: u64, watcher: &Watcher) -> crate::error::Result<Heartbeat> {
        let others = self.members.as_ref().map_or_else(Vec::new, |m| {
            m.nodes
                .iter()
                .map(|(n, _)| *n)
                .filter(|&n| n != self.node())
                .collect()
        });
        let r = heartbeat::Round {
            host: &self.host,
            port: self.args.master_port,
            auth: &self.auth,
            round,
            node: self.node(),
            others,
        };
        let timeout = Duration::from_secs_f64(self.args.heartbeat_timeout_seconds.max(1.0));
        Heartbeat::start(r, timeout, watcher.fired.clone(), watcher.lost.clone())
    }

    /// Another agent holds this node (members.rs, `agent/owner/<node>`): the pod that
    /// replaced this one while it was cut off. Claims the node when nobody holds it (a new
    /// node 0's store starts empty).
    fn replaced_by(&mut self) -> crate::error::Result<Option<String>> {
        let node = self.node();
        if node == 0 {
            return Ok(None);
        }
        match members::owner(&mut self.client, node)? {
            Some(owner) if owner != self.id => Ok(Some(owner)),
            Some(_) => Ok(None),
            None => {
                members::claim(&mut self.client, node, &self.id)?;
                Ok(None)
            }
        }
    }

    /// What this node's ranks of round `round` start with, at `place` (position, nodes).
    fn spawn(&self, round: u64, place: (usize, usize)) -> Spawn<'a> {
        Spawn {
            args: self.args,
            program: &self.launch.program,
            attempt: self.launch.base_attempt,
            port: self.args.master_port,
            token: &self.launch.token,
            logs: &self.launch.logs,
            omp_threads: self.launch.omp_threads.clone(),
            round: Some(round),
            place: Some(place),
        }
    }

    /// Arrives at round `round`; node 0 decides who trains in it. This node's place in it
    /// (its position and the number of member nodes), or None when it is not a member.
    fn assemble(&mut self, round: u64) -> crate::error::Result<Option<(usize, usize)>> {
        let (node, nnodes) = (self.node(), self.args.nnodes);
        let timeout = self.rendezvous_timeout();
        members::arrive(&mut self.client, round, node, &self.id)?;
        if node == 0 {
            let wait = members::Wait {
                min_nodes: self.args.min_nodes.unwrap_or(nnodes).clamp(1, nnodes),
                wait: Duration::from_secs_f64(self.args.elastic_wait_seconds.max(0.0)),
                lost: std::mem::take(&mut self.lost),
                timeout,
            };
            members::gather(&mut self.client, round, nnodes, &wait)?;
        }
        let m = members::read(&mut self.client, round, timeout)?;
        let place = m.position(node, &self.id).map(|p| (p, m.len()));
        if place.is_some() && m.len() < nnodes {
            tracing::warn!(
                "agent: round {round} trains on {} of {nnodes} nodes (world size {})",
                m.len(),
                m.len() * self.args.nproc_per_node
            );
        }
        self.members = Some(m);
        Ok(place)
    }

    /// This node's launcher was signalled (its pod is being deleted, evicted or drained): the
    /// other nodes learn of it at once through the store, instead of when their collectives
    /// break, and wait for a replacement in the next round. Best effort: the store may be gone.
    fn leaving(&mut self, round: u64, mut report: NodeReport, signal: i32) {
        let rank = report.ranks.first().copied().unwrap_or(0);
        report.leaving = true;
        report.failure = Some(RankFailure {
            rank,
            code: 128 + signal,
            reason: format!(
                "the launcher of pod {} got {} (the pod is being deleted, evicted or drained)",
                self.hostname,
                crate::signals::name(signal)
            ),
            seen_at: ferrotrain_api::recovery::Timestamp::now(),
        });
        let posted = self.reconnect().and_then(|()| {
            let json = serde_json::to_vec(&report).expect("a report serializes");
            self.client
                .set(&format!("agent/{round}/report/{}", self.node()), &json)?;
            if self.client.add(&format!("agent/{round}/failures"), 1)? == 1 {
                self.client.set(
                    &format!("agent/{round}/failed"),
                    self.node().to_string().as_bytes(),
                )?;
            }
            if self.node() == 0 {
                // Nobody else can rule: the others learn at once that node 0 leaves.
                let verdict =
                    blame::verdict(round, &[report.clone()], &self.args.permanent_exit_codes);
                let json = serde_json::to_vec(&verdict).expect("a verdict serializes");
                self.client.set(&format!("agent/{round}/verdict"), &json)?;
            }
            Ok(())
        });
        if let Err(e) = posted {
            tracing::warn!("agent: could not tell the other nodes that this one leaves: {e}");
        }
    }

    /// Node 0 gathers every node's report and rules; the others read its ruling.
    fn agree(&mut self, round: u64) -> crate::error::Result<Verdict> {
        let wait = Duration::from_secs_f64(self.args.stop_grace_seconds.max(0.0)) + REPORT_SLACK;
        let key = format!("agent/{round}/verdict");
        if self.node() != 0 {
            let bytes = self.client.get(&key, wait * 2)?;
            return serde_json::from_slice(&bytes).map_err(|e| {
                crate::error::TrainError::Distributed(
                    format!("agent: malformed verdict: {e}").into(),
                )
            });
        }
        if self
            .client
            .try_get(&format!("agent/{round}/resize"), Duration::ZERO)?
            .is_some()
        {
            let verdict = blame::resized(round);
            self.client.set(
                &key,
                &serde_json::to_vec(&verdict).expect("a verdict serializes"),
            )?;
            self.record(round, &verdict, EndCause::Stopped);
            return Ok(verdict);
        }
        let nodes: Vec<usize> = self.members.as_ref().map_or_else(
            || (0..self.args.nnodes).collect(),
            |m| m.nodes.iter().map(|(n, _)| *n).collect(),
        );
        let mut reports = Vec::new();
        let nproc = self.args.nproc_per_node;
        for (position, node) in nodes.into_iter().enumerate() {
            let ranks = || (position * nproc..(position + 1) * nproc).collect();
            let lost = self
                .client
                .try_get(&format!("agent/{round}/lost/{node}"), Duration::ZERO)?;
            if let Some(seconds) = lost {
                let seconds = String::from_utf8_lossy(&seconds).parse().unwrap_or(0.0);
                reports.push(NodeReport::unreachable(node, ranks(), seconds));
                self.lost.push(node);
                continue;
            }
            match self
                .client
                .get(&format!("agent/{round}/report/{node}"), wait)
            {
                Ok(bytes) => reports.extend(serde_json::from_slice::<NodeReport>(&bytes).ok()),
                Err(e) => {
                    tracing::warn!("agent: round {round}: no report from node {node}: {e}");
                    reports.push(NodeReport::silent(node, ranks()));
                }
            }
        }
        let mut verdict = blame::verdict(round, &reports, &self.args.permanent_exit_codes);
        // Recorded first: the ledger, with rank 0's last report, says whether the round saved
        // a checkpoint, and so how long every agent backs off.
        self.record(round, &verdict, EndCause::Failure);
        verdict.in_a_row = self.ledger.recovery.failures_in_a_row().unwrap_or(1);
        self.client.set(
            &key,
            &serde_json::to_vec(&verdict).expect("a verdict serializes"),
        )?;
        Ok(verdict)
    }

    /// Node 0: the round's end in the ledger and the rounds file.
    fn record(&mut self, round: u64, verdict: &Verdict, cause: EndCause) {
        let end = AttemptEnd {
            cause,
            reason: verdict.reason.clone(),
            rank: verdict.rank.map(|r| r as i64),
            exit_code: verdict.code,
            node: verdict.host.clone(),
            failed_at: verdict.detected_at,
            detected_at: verdict.detected_at,
        };
        self.ledger.end_with(end.clone());
        self.ends.push(RoundEnd {
            round,
            end,
            message: verdict.message.clone(),
        });
        self.write_round_ends();
    }

    /// Replaces the rounds file (atomically) with every round's end so far.
    fn write_round_ends(&self) {
        let path = self.launch.logs.join(ROUNDS_FILE);
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec(&self.ends).expect("round ends serialize");
        let written = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "rounds file not written");
        }
    }

    /// Node 0 keeps its store up until every other agent is done with it (bounded).
    fn farewell(&mut self, code: i32) {
        if self.reconnect().is_err() {
            return;
        }
        let arrived = self.client.add("agent/done", 1).unwrap_or(0);
        let expected = self.members.as_ref().map_or(self.args.nnodes, Members::len);
        // A signalled node 0 leaves at once: the others go on with its replacement.
        let signalled = code > 128;
        if self.node() == 0 && !signalled && (arrived as usize) < expected {
            let deadline = Instant::now() + FAREWELL;
            while Instant::now() < deadline {
                match self.client.add("agent/done", 0) {
                    Ok(n) if n as usize >= expected => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                    Err(_) => break,
                }
            }
        }
        tracing::info!("agent: done (exit {code})");
    }
}

/// How a round ended for this agent.
enum Outcome {
    Finished,
    Signalled(i32),
    /// Node 0 started the round without this node (it came late).
    NotAdmitted,
    /// Another agent (a replacement pod) holds this node now: this one was cut off.
    Replaced(String),
    Failed(Verdict),
}

/// "rank 1 (Killed)" or the reason alone.
fn who(verdict: &Verdict) -> String {
    match verdict.rank {
        Some(rank) => format!("rank {rank} ({})", verdict.reason),
        None => verdict.reason.clone(),
    }
}
