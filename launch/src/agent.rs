//! The pod's agent: `ferrotrain launch` on one node, and `--restart-in-place` on several. It
//! outlives its ranks: when any rank of the gang fails, every node's agent stops its own ranks
//! and starts them again in a new numbered round, without the pod ending (torchrun's elastic
//! agent does the same with its rendezvous rounds). One node is the same gang with node 0
//! alone: its agent hosts the store, rules on its own report and decides through the same
//! table (round.rs).
//!
//! This file carries out what round.rs decides. A failure's path reads one way: the local
//! ranks' supervision sees it (group.rs: a rank's own end, or a peer's end through the
//! watcher, watch.rs, or a lost node through the heartbeat, heartbeat.rs); the agent reports
//! what its node saw (blame.rs's `NodeReport::after`); node 0 gathers the reports and rules
//! (host.rs, gather.rs, blame.rs); every agent hands the verdict to [`round::decide`], which
//! says what comes next. Agents talk only through node 0's store (keys.rs):
//!
//! ```text
//! agent/round                 the round node 0 started last
//! agent/<r>/failures          ADD: failed nodes so far; the first one also sets
//! agent/<r>/failed            ...which every agent's watcher thread waits on (one blocking GET):
//!                             a failure anywhere stops every node's ranks within a poll (25 ms)
//! agent/<r>/report/<node>     what each agent saw (blame::NodeReport), once its ranks stopped
//! agent/<r>/verdict           node 0's ruling (blame::Verdict): who is blamed, permanent or not
//! agent/<r>/master_port       a user's command: the port its rank 0 serves its own store on
//! agent/done                  ADD: nodes whose ranks all finished
//! agent/finished              SET by node 0 when they did: an agent waiting to join ends too
//! ```
//!
//! The ranks' own keys live under `round/<r>/` (see the trainer's dist::Rendezvous). A
//! permanent failure (exit 2, 3, 4) ends every agent (the pod fails and the operator fails the
//! job); so does running out of `--max-restarts`, which counts rounds. Losing node 0's agent
//! (its pod deleted, evicted or drained) does not end the others: they wait for its
//! replacement's store and join its first round (see rejoin.rs).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrotrain_api::recovery::Timestamp;

use crate::args::{Launch, LaunchArgs, forward_final_report};
use crate::auth::Auth;
use crate::blame::{self, NodeReport, Verdict};
use crate::error::{AgentError, LaunchError};
use crate::gather::Gathering;
use crate::group::{GroupOutcome, PeerEnd, Tails, start_group_with};
use crate::heartbeat::{self, Heartbeat};
use crate::host::{self, Host};
use crate::keys;
use crate::ledger::Ledger;
use crate::link::Link;
use crate::members::{self, Members};
use crate::ports::{self, Listened};
use crate::rejoin;
use crate::round::{self, End, Event, Exit, Next, Policy, REPORT_SLACK, Rounds, Stage};
use crate::run_once::sleep_unless_signalled;
use crate::spare::{SpareStart, Spares};
use crate::spawn::Spawn;
use crate::store::StoreClient;
use crate::termination::write_termination_message;
use crate::watch::{self, Grower, Watcher};

/// How long the agents wait for one another at the end (success or a final failure), so that
/// node 0's store outlives the others' last reads.
const FAREWELL: Duration = Duration::from_secs(30);
/// A local rank stopped (SIGSTOP) this long ends the round: its peers would only notice at
/// their collective timeout, and would be blamed for waiting. Only a stop signal puts a
/// process in state T (a tracer's stop is `t`, a frozen cgroup's `D`), and nothing trains
/// while it lasts, so a second is enough to be sure.
const FROZEN_AFTER: Duration = Duration::from_secs(1);
/// How long a late node waits for its spare ranks to load before it arrives anyway.
const SPARES_READY_WITHIN: Duration = Duration::from_secs(20);
/// How often a late node looks for the round that takes it in.
const JOIN_POLL: Duration = Duration::from_millis(50);
/// How long an agent whose gang another node failed for good waits before its pod ends.
const COLLATERAL_PAUSE: Duration = Duration::from_secs(2);

/// Runs the rounds until the ranks finish, a failure is permanent, the budget of restarts is
/// spent or the agent is signalled. Returns the exit code of the pod's process.
pub fn run(args: &LaunchArgs, l: &Launch) -> Result<i32, LaunchError> {
    let mut agent = Agent::start(args, l)?;
    let mut rounds = Rounds::default();
    let mut event = agent.join();
    let exit = loop {
        let (now, next) = round::decide(&agent.policy, &rounds, &event);
        rounds = now;
        event = match next {
            Next::Run(round) => agent.round(round),
            Next::Restart { round, wait, why } => {
                tracing::warn!("agent: {why}");
                match sleep_unless_signalled(wait) {
                    Some(signal) => Event::Interrupted(signal),
                    None => agent.round(round),
                }
            }
            Next::WaitForRound(round) => agent.wait_for_round_after(round),
            Next::Rejoin { after, why, lost } => agent.rejoin(after, &why, lost),
            Next::Exit(exit) => break exit,
        };
    };
    Ok(agent.leave(exit))
}

struct Agent<'a> {
    args: &'a LaunchArgs,
    launch: &'a Launch,
    policy: Policy,
    /// The rendezvous store's port: node 0's own (bound when --master-port is 0, one node
    /// only), else --master-port.
    port: u16,
    link: Link,
    /// Node 0's duties; None on every other node.
    host: Option<Host>,
    ledger: Ledger,
    hostname: String,
    /// Who this agent is: its pod's UID (POD_UID), else a random token (a stale agent of the
    /// same node, cut off and replaced, is not a member of later rounds).
    id: String,
    /// The members of the round this agent last trained in.
    members: Option<Members>,
    /// Node 0, elastic: when its wait for the first round's nodes began (members::Wait).
    waiting_since: Option<Instant>,
    /// Node 0: the last round it gathered (whose arrivals say which nodes exist at all).
    gathered: Option<u64>,
    /// Node 0, its first round: the nodes that said where they left off (members::Wait).
    coming: Vec<usize>,
    /// Node 0: its own address (its name, --master-addr, resolved once: a pod keeps its IP),
    /// what its ranks get as MASTER_ADDR so that a round looks up no name.
    own_ip: Option<std::net::IpAddr>,
    /// Trainers started during the last round, waiting to be the next round's ranks.
    spares: Option<Spares>,
    /// Every node but 0: a connection to node 0's store whose will is this node's report of
    /// the current round as gone ([`NodeReport::gone`]): if this agent dies, node 0 knows at
    /// once instead of waiting for its report.
    will: Option<StoreClient>,
}

impl<'a> Agent<'a> {
    fn start(args: &'a LaunchArgs, l: &'a Launch) -> Result<Self, LaunchError> {
        let auth = Auth::new(&l.token, l.base_attempt);
        let rendezvous = Duration::from_secs_f64(args.rendezvous_timeout_seconds.max(1.0));
        let node = args.node_rank;
        let host = match node {
            0 => Some(Host::start(
                args.master_port,
                &auth,
                rendezvous,
                l.report.clone(),
            )?),
            _ => None,
        };
        // Node 0 reaches its own store over loopback: it need not wait for its DNS name.
        let address = if node == 0 {
            "127.0.0.1"
        } else {
            &args.master_addr
        };
        let port = host.as_ref().map_or(args.master_port, Host::port);
        let deadline = Instant::now() + rendezvous;
        let mut link = Link::connect(address, port, &auth, deadline)?;
        let id = std::env::var("POD_UID")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(crate::auth::random_token);
        if node == 0 {
            link.client.set(keys::STORE_ID, id.as_bytes())?;
        } else {
            // A new agent of this node is its newest pod: one it replaced is stale.
            members::claim(&mut link.client, node, &id)?;
        }
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let hosted = if node == 0 { " (hosted here)" } else { "" };
        tracing::info!(
            "agent: node {node} of {}, rendezvous {address}:{port}{hosted}",
            args.nnodes,
        );
        Ok(Agent {
            args,
            launch: l,
            policy: Policy {
                node,
                max_restarts: args.max_restarts,
                backoff: (
                    Duration::from_secs_f64(args.restart_backoff_seconds.max(0.0)),
                    Duration::from_secs_f64(args.restart_backoff_max_seconds.max(0.0)),
                ),
            },
            port,
            link,
            host,
            ledger: Ledger::new(&l.logs, args.recovery_file.iter().cloned().collect()),
            hostname,
            id,
            members: None,
            waiting_since: None,
            gathered: None,
            spares: None,
            coming: Vec::new(),
            own_ip: None,
            will: None,
        })
    }

    fn node(&self) -> usize {
        self.args.node_rank
    }

    fn rendezvous_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.args.rendezvous_timeout_seconds.max(1.0))
    }

    /// How long a node's ranks may take to stop, and then report.
    fn report_wait(&self) -> Duration {
        Duration::from_secs_f64(self.args.stop_grace_seconds.max(0.0)) + REPORT_SLACK
    }

    /// Joins the gang at start.
    fn join(&mut self) -> Event {
        match self.joining_round(0) {
            Ok(round) => Event::Joined(round),
            Err(error) => Event::Broke {
                round: 0,
                stage: Stage::Joining,
                error,
            },
        }
    }

    /// Runs round `round`.
    fn round(&mut self, round: u64) -> Event {
        match self.one_round(round) {
            Ok(end) => Event::Ended { round, end },
            Err(error) => Event::Broke {
                round,
                stage: Stage::Round,
                error,
            },
        }
    }

    /// Leaves the gang as `exit` says; returns the pod's exit code.
    fn leave(&mut self, exit: Exit) -> i32 {
        if let Some(message) = &exit.message {
            tracing::error!("agent: {message}");
            write_termination_message(message);
        }
        if exit.final_report {
            forward_final_report(self.launch);
        }
        self.farewell(exit.code);
        if exit.collateral {
            // Another node's permanent failure ended the gang: let the blamed pod end first, so
            // the operator reads its termination (the root cause) before this one's.
            let _ = sleep_unless_signalled(COLLATERAL_PAUSE);
        }
        exit.code
    }

    /// The round to join. Node 0 starts where the others left off (0 for a new gang; see
    /// rejoin.rs), at least at --first-round (the round the operator knows: a replacement of
    /// the only pod has nobody to tell it). Any other node says where it would go on (`next`), then joins the round
    /// node 0 runs: for a pod that replaces a lost one (or a survivor of node 0's loss), the
    /// one after the last round that failed (waiting for its verdict), else the current one,
    /// whose barrier waits for this node.
    fn joining_round(&mut self, next: u64) -> Result<u64, AgentError> {
        self.link.fresh()?;
        if self.host.is_some() {
            let elastic = self.args.min_nodes.is_some_and(|m| m < self.args.nnodes);
            self.waiting_since = Some(Instant::now());
            let wait = if elastic {
                Duration::from_secs_f64(self.args.elastic_wait_seconds.max(0.0))
            } else {
                self.rendezvous_timeout()
            };
            let first = rejoin::first_round(&mut self.link.client, self.args.nnodes, wait)?;
            self.coming = first.coming;
            return Ok(first.round.max(self.args.first_round));
        }
        let timeout = self.rendezvous_timeout();
        let client = &mut self.link.client;
        rejoin::post(client, self.args.node_rank, next)?;
        let current = client.get(keys::ROUND, timeout)?;
        let round: u64 = String::from_utf8_lossy(&current).parse().unwrap_or(0);
        let failed = client.try_get(&keys::failed(round), Duration::ZERO)?;
        self.link.joined_this_store()?;
        if failed.is_none() {
            return Ok(round);
        }
        let wait = self.report_wait() * 2;
        self.link.client.get(&keys::verdict(round), wait)?;
        tracing::info!("agent: joining a running gang at round {}", round + 1);
        Ok(round + 1)
    }

    /// Not a member of round `round` (late): joins the next round node 0 starts, which takes
    /// it in.
    fn wait_for_round_after(&mut self, round: u64) -> Event {
        tracing::info!("agent: round {round} runs without this node; waiting for the next one");
        let waited = loop {
            if let Err(e) = self.link.fresh() {
                break Err(e);
            }
            match self.link.client.try_get(keys::FINISHED, Duration::ZERO) {
                Ok(Some(_)) => {
                    tracing::info!("agent: the gang finished training without this node");
                    return Event::Ended {
                        round,
                        end: End::Finished,
                    };
                }
                Ok(None) => {}
                Err(e) => break Err(e.into()),
            }
            let current = self.link.client.try_get(keys::ROUND, Duration::ZERO);
            match current.map(|b| b.and_then(|b| String::from_utf8_lossy(&b).parse::<u64>().ok())) {
                Ok(Some(current)) if current > round => break Ok(current),
                Ok(_) => {}
                Err(e) => break Err(e.into()),
            }
            if crate::signals::received() != 0 {
                break Err(AgentError::Signalled {
                    what: "a round to join",
                });
            }
            std::thread::sleep(JOIN_POLL);
        };
        match waited {
            Ok(next) => Event::Joined(next),
            Err(error) => Event::Broke {
                round,
                stage: Stage::Waiting,
                error,
            },
        }
    }

    /// Round `after` ended with node 0's store (`why`): waits for a store at node 0's address
    /// (not the lost one when `lost`, as when node 0 said it leaves) and joins it.
    fn rejoin(&mut self, after: u64, why: &str, lost: bool) -> Event {
        let timeout = self.rendezvous_timeout();
        tracing::warn!(
            "agent: round {after}: {why}; waiting up to {:.0} s for node 0's store at {}:{}",
            timeout.as_secs_f64(),
            self.link.host,
            self.link.port
        );
        let joined = self
            .link
            .reach_replacement(lost, Instant::now() + timeout)
            .and_then(|()| self.joining_round(after + 1));
        match joined {
            Ok(round) => Event::Joined(round),
            Err(error) => Event::Broke {
                round: after,
                stage: Stage::Rejoining,
                error,
            },
        }
    }

    /// Joins round `round`, runs the local ranks in it and, when it failed, agrees on why.
    fn one_round(&mut self, round: u64) -> Result<End, AgentError> {
        self.link.fresh()?;
        if let Some(host) = &self.host {
            host.announce(&mut self.link.client, round)?;
            if self.own_ip.is_none() {
                self.own_ip = resolve(&self.args.master_addr, self.port);
            }
        }
        if let Some(owner) = self.replaced_by()? {
            return Ok(End::Replaced { owner });
        }
        self.warm_up_if_late(round)?;
        let Some(place) = self.assemble(round)? else {
            return Ok(End::NotAdmitted);
        };
        let nproc = self.args.nproc_per_node;
        let ranks: Vec<usize> = (place.0 * nproc..(place.0 + 1) * nproc).collect();
        if self.host.is_none() {
            self.will = Some(self.leave_will(round, ranks.clone())?);
        }
        let port = self.master_port(round)?;
        let (outcome, tails) = self.train(round, place, port)?;
        let report =
            NodeReport::after(self.node(), &self.hostname, ranks, &outcome).with_tails(tails);
        match outcome {
            GroupOutcome::Finished => {
                self.ledger.ended(&outcome);
                return Ok(End::Finished);
            }
            GroupOutcome::Signalled(signal) => {
                self.ledger.ended(&outcome);
                self.leaving(round, report, signal);
                return Ok(End::Signalled(signal));
            }
            GroupOutcome::Failed(_)
            | GroupOutcome::PeerFailed { .. }
            | GroupOutcome::Frozen { .. } => {}
        }
        self.link.fresh_within(round::patience(&outcome))?;
        if round::owns_the_failure(&outcome) {
            self.mark_failed(round, watch::end_mark(self.node(), &outcome))?;
        }
        let json = serde_json::to_vec(&report.sent(Timestamp::now())).expect("a report serializes");
        let key = keys::report(round, self.node());
        self.link.client.set(&key, &json)?;
        Ok(End::Ruled(self.agree(round)?))
    }

    /// A connection of its own to node 0's store whose will is this node's report of round
    /// `round` (ranks `ranks`) as gone: should this agent die (SIGKILL, the OOM killer), its
    /// connection closes and node 0 reads that report at once. Its real report, set first,
    /// stands.
    fn leave_will(&self, round: u64, ranks: Vec<usize>) -> Result<StoreClient, AgentError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let link = &self.link;
        let mut client = StoreClient::connect(&link.host, link.port, &link.auth, deadline)?;
        let gone = NodeReport::gone(self.node(), &self.hostname, ranks);
        let json = serde_json::to_vec(&gone).expect("a report serializes");
        client.will(&keys::report(round, self.node()), &json)?;
        Ok(client)
    }

    /// Round `round` must end, as `mark` says (watch::end_mark): the first node to say so
    /// wakes every agent's watcher.
    fn mark_failed(&mut self, round: u64, mark: Vec<u8>) -> Result<(), AgentError> {
        let client = &mut self.link.client;
        if client.add(&keys::failures(round), 1)? == 1 {
            client.set(&keys::failed(round), &mark)?;
        }
        Ok(())
    }

    /// The ranks' MASTER_PORT in round `round`: the launcher's store for the trainer; for a
    /// user's command, a port of the round's own in the job's range (the NetworkPolicy lets
    /// peers reach only those), free on node 0 when it picks it, where the script's rank 0
    /// serves its TCPStore: a new round never meets the old round's store, nor waits for its
    /// port. Node 0 picks it and sets it in the store; the others read it.
    fn master_port(&mut self, round: u64) -> Result<u16, AgentError> {
        if !self.launch.program.is_command() {
            return Ok(self.port);
        }
        let key = keys::master_port(round);
        if self.host.is_none() {
            let bytes = self.link.client.get(&key, self.rendezvous_timeout())?;
            let text = String::from_utf8_lossy(&bytes);
            return text.trim().parse().map_err(|_| {
                AgentError::Spawn(std::io::Error::other(format!(
                    "node 0 set MASTER_PORT {text:?} for round {round}"
                )))
            });
        }
        let range =
            ports::range_from_env().map_err(|e| AgentError::Spawn(std::io::Error::other(e)))?;
        // Another start each round: the last round's port may still be held.
        let start = (round as u32)
            .wrapping_mul(7919)
            .wrapping_add(std::process::id());
        let port = loop {
            let listened = ports::listen(range, start).map_err(AgentError::Spawn)?;
            let Listened::Bound(listener) = listened else {
                let full = ports::full_message(range.unwrap_or_default());
                return Err(AgentError::Spawn(std::io::Error::other(full)));
            };
            let port = listener.local_addr().map_err(AgentError::Spawn)?.port();
            if port != self.port {
                break port;
            }
        };
        self.link.client.set(&key, port.to_string().as_bytes())?;
        Ok(port)
    }

    /// Trains in round `round` at `place` (position, member nodes), the ranks' MASTER_PORT
    /// `master_port`, until the local ranks end or the round ends elsewhere; returns how, and each
    /// local rank's last lines of output.
    fn train(
        &mut self,
        round: u64,
        place: (usize, usize),
        master_port: u16,
    ) -> Result<(GroupOutcome, Tails), AgentError> {
        let (host, port, auth) = (&self.link.host, self.link.port, &self.link.auth);
        let watcher = Watcher::start(host, port, auth, round)?;
        let heartbeat = self.heartbeat(round, &watcher)?;
        let grower = (self.host.is_some() && place.1 < self.args.nnodes)
            .then(|| Grower::start(host, port, auth, round, place.1))
            .transpose()?;
        self.ledger.started(self.launch.base_attempt, Some(round));
        let spawn = self.spawn(round, place, master_port);
        let mut group = start_group_with(&spawn, self.spares.take()).map_err(AgentError::Spawn)?;
        tracing::info!(
            "agent: round {round}: started {} rank(s), {} of them spares",
            self.args.nproc_per_node,
            group.from_spares
        );
        let (fired, lost) = (watcher.fired.clone(), watcher.lost.clone());
        // The next round's port is not known yet: a spare is handed its real one.
        let next = self.spawn(round + 1, place, master_port);
        let wanted = self.args.spare_ranks && self.launch.program.can_have_spares();
        let mut spares = SpareStart::new(wanted);
        let outcome = group.supervise_with(
            &|| match (fired.load(Ordering::SeqCst), lost.load(Ordering::SeqCst)) {
                (false, _) => None,
                (true, false) => Some(PeerEnd::Failed),
                (true, true) => Some(PeerEnd::Lost),
            },
            Some(FROZEN_AFTER),
            &mut || spares.when_due(&next),
        );
        let tails = group.tails();
        drop(group);
        if !matches!(outcome, GroupOutcome::Finished | GroupOutcome::Signalled(_)) {
            self.spares = spares.started;
        }
        watcher.stop();
        heartbeat.stop();
        if let Some(g) = grower {
            g.stop();
        }
        Ok((outcome, tails))
    }

    /// The round's heartbeat (heartbeat.rs): node 0 watches the other members' beats, every
    /// other node beats; either ends the round through the watcher's flags.
    fn heartbeat(&self, round: u64, watcher: &Watcher) -> Result<Heartbeat, AgentError> {
        let others = self.members.as_ref().map_or_else(Vec::new, |m| {
            m.nodes
                .iter()
                .map(|(n, _)| *n)
                .filter(|&n| n != self.node())
                .collect()
        });
        let r = heartbeat::Round {
            host: &self.link.host,
            port: self.link.port,
            auth: &self.link.auth,
            round,
            node: self.node(),
            others,
        };
        let timeout = Duration::from_secs_f64(self.args.heartbeat_timeout_seconds.max(1.0));
        Ok(Heartbeat::start(
            r,
            timeout,
            watcher.fired.clone(),
            watcher.lost.clone(),
        )?)
    }

    /// Another agent holds this node (members.rs, `agent/owner/<node>`): the pod that
    /// replaced this one while it was cut off. Claims the node when nobody holds it (a new
    /// node 0's store starts empty).
    fn replaced_by(&mut self) -> Result<Option<String>, AgentError> {
        let node = self.node();
        if node == 0 {
            return Ok(None);
        }
        match members::owner(&mut self.link.client, node)? {
            Some(owner) if owner != self.id => Ok(Some(owner)),
            Some(_) => Ok(None),
            None => {
                members::claim(&mut self.link.client, node, &self.id)?;
                Ok(None)
            }
        }
    }

    /// What this node's ranks of round `round` start with, at `place` (position, nodes),
    /// with MASTER_PORT `port`.
    fn spawn(&self, round: u64, place: (usize, usize), port: u16) -> Spawn<'a> {
        // Node 0 as an address, not a name: where this agent's link reached it; on node 0
        // (whose link is its loopback), its own name resolved once.
        let reached = match self.host {
            Some(_) => self.own_ip,
            None => self.link.client.peer_ip().ok(),
        };
        let master_addr =
            reached.map_or_else(|| self.args.master_addr.clone(), |ip| ip.to_string());
        Spawn {
            master_addr,
            args: self.args,
            program: &self.launch.program,
            attempt: self.launch.base_attempt,
            port,
            token: &self.launch.token,
            logs: &self.launch.logs,
            omp_threads: self.launch.omp_threads.clone(),
            round: Some(round),
            place: Some(place),
        }
    }

    /// Arrives at round `round`; node 0 decides who trains in it. This node's place in it
    /// (its position and the number of member nodes), or None when it is not a member.
    fn assemble(&mut self, round: u64) -> Result<Option<(usize, usize)>, AgentError> {
        let (node, nnodes) = (self.node(), self.args.nnodes);
        let timeout = self.rendezvous_timeout();
        members::arrive(&mut self.link.client, round, node, &self.id)?;
        if let Some(host) = self.host.as_mut() {
            // Not waited for either: nodes that did not come to the last round at all (pods
            // not placed, up to elastic.maxReplicas); one that comes in time is taken.
            let mut lost = host.take_lost();
            if let Some(last) = self.gathered.replace(round) {
                lost.extend(members::absent(&mut self.link.client, last, nnodes)?);
            }
            let wait = members::Wait {
                min_nodes: self.args.min_nodes.unwrap_or(nnodes).clamp(1, nnodes),
                wait: Duration::from_secs_f64(self.args.elastic_wait_seconds.max(0.0)),
                lost,
                since: self.waiting_since.take().unwrap_or_else(Instant::now),
                coming: std::mem::take(&mut self.coming),
                timeout,
            };
            members::gather(&mut self.link.client, round, nnodes, &wait)?;
        }
        let m = members::read(&mut self.link.client, round, timeout)?;
        let place = m.position(node, &self.id).map(|p| (p, m.len()));
        if place.is_some() && m.len() < nnodes {
            tracing::warn!(
                "agent: round {round} trains on {} of {nnodes} nodes (world size {})",
                m.len(),
                m.len() * self.args.nproc_per_node
            );
        }
        if place.is_none() && self.host.is_none() {
            // Late: node 0's grower wakes on this and ends the round so that the gang grows.
            self.link
                .client
                .set(&keys::knock(round), self.id.as_bytes())?;
        }
        self.members = Some(m);
        Ok(place)
    }

    /// A node arriving at round `round` after node 0 decided its members (a pod placed once
    /// capacity freed up, a replacement) joins the next round, which starts as soon as it
    /// arrives: it starts its spare ranks first and arrives once they are ready (libtorch
    /// loaded), so that the gang's pause for it is a round switch, not a trainer's start.
    fn warm_up_if_late(&mut self, round: u64) -> Result<(), AgentError> {
        let wanted = self.args.spare_ranks && self.launch.program.can_have_spares();
        if self.host.is_some() || self.spares.is_some() || !wanted {
            return Ok(());
        }
        if !members::decided(&mut self.link.client, round)? {
            return Ok(());
        }
        let next = self.spawn(round + 1, (self.node(), self.args.nnodes), self.port);
        let started = Instant::now();
        match Spares::start(&next) {
            Ok(mut spares) => {
                // A script's spare names itself before its imports: it is not waited for.
                let ready = !self.launch.program.is_command()
                    && spares.wait_ready(started + SPARES_READY_WITHIN);
                tracing::info!(
                    "agent: round {round} runs without this node; its spare ranks {} after {:.2} s",
                    if ready { "are ready" } else { "load" },
                    started.elapsed().as_secs_f64()
                );
                self.spares = Some(spares);
            }
            Err(e) => tracing::warn!("launch: no spare ranks to join with: {e}"),
        }
        Ok(())
    }

    /// This node's launcher was signalled (its pod is being deleted, evicted or drained): the
    /// other nodes learn of it at once through the store, instead of when their collectives
    /// break, and wait for a replacement in the next round. Best effort: the store may be gone.
    fn leaving(&mut self, round: u64, report: NodeReport, signal: i32) {
        let now = Timestamp::now();
        let report = report.leaving(signal, now).sent(now);
        let args = self.args;
        let posted = self.link.fresh().and_then(|()| {
            let json = serde_json::to_vec(&report).expect("a report serializes");
            let key = keys::report(round, self.node());
            self.link.client.set(&key, &json)?;
            self.mark_failed(round, self.node().to_string().into_bytes())?;
            if self.host.is_some() {
                // Nobody else can rule: the others learn at once that node 0 leaves.
                let permanent = &args.permanent_exit_codes;
                let verdict = blame::verdict(round, &[report], permanent, Timestamp::now());
                host::publish(&mut self.link.client, &verdict)?;
            }
            Ok(())
        });
        if let Err(e) = posted {
            tracing::warn!("agent: could not tell the other nodes that this one leaves: {e}");
        }
    }

    /// Node 0 gathers every node's report and rules; the others read its ruling.
    fn agree(&mut self, round: u64) -> Result<Verdict, AgentError> {
        let wait = self.report_wait();
        let client = &mut self.link.client;
        let Some(host) = self.host.as_mut() else {
            let bytes = client.get(&keys::verdict(round), wait * 2)?;
            return serde_json::from_slice(&bytes).map_err(AgentError::malformed("verdict"));
        };
        let nodes: Vec<usize> = self.members.as_ref().map_or_else(
            || (0..self.args.nnodes).collect(),
            |m| m.nodes.iter().map(|(n, _)| *n).collect(),
        );
        let gathering = Gathering::new(&nodes, self.args.nproc_per_node, wait);
        let permanent = &self.args.permanent_exit_codes;
        host.rule(client, round, gathering, permanent, &mut self.ledger)
    }

    /// Node 0 keeps its store up until every other agent is done with it (bounded).
    fn farewell(&mut self, code: i32) {
        if self.link.fresh().is_err() {
            return;
        }
        let client = &mut self.link.client;
        if self.host.is_some() && code == 0 {
            // Agents waiting for a round to join (placed after the gang started without
            // them) end with the gang.
            let _ = client.set(keys::FINISHED, b"1");
        }
        let arrived = client.add(keys::DONE, 1).unwrap_or(0);
        let expected = self.members.as_ref().map_or(self.args.nnodes, Members::len);
        // A signalled node 0 leaves at once: the others go on with its replacement.
        let signalled = code > 128;
        if self.host.is_some() && !signalled && (arrived as usize) < expected {
            let deadline = Instant::now() + FAREWELL;
            while Instant::now() < deadline {
                match client.add(keys::DONE, 0) {
                    Ok(n) if n as usize >= expected => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                    Err(_) => break,
                }
            }
        }
        tracing::info!("agent: done (exit {code})");
    }
}

/// Node 0's own `name` resolved to an address of this pod's, if it resolves so now (a
/// replacement's name may still give the pod it replaced: an address not its own is not
/// kept).
fn resolve(name: &str, port: u16) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let ip = (name, port).to_socket_addrs().ok()?.next()?.ip();
    std::net::UdpSocket::bind((ip, 0)).ok().map(|_| ip)
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_0_keeps_only_an_address_of_its_own_for_its_name() {
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        assert_eq!(super::resolve("127.0.0.1", 29500), Some(loopback));
        // A documentation address (RFC 5737) is no address of this machine's: what a stale
        // record of the replaced pod gives.
        assert_eq!(super::resolve("192.0.2.7", 29500), None);
    }
}
