//! Who trains in a round (elastic world size). Every node's agent arrives at the round; node
//! 0's agent, which hosts the store, decides the members: every node, or, once
//! `--elastic-wait-seconds` passed, the ones that came if they are at least `--min-nodes`.
//! The members' ranks are renumbered contiguously (node 0 first), so a round of fewer nodes
//! is an ordinary, smaller gang; its trainers cover the missing ranks' shards of the global
//! batch themselves (FERROTRAIN_VIRTUAL_WORLD), so the loss curve does not change. A node
//! that arrives late (a replacement scheduled again) is not a member: it waits for the next
//! round, which node 0 starts at once by stopping the current one (the trainers save a
//! checkpoint on the way: the gang grows back without losing a step).
//!
//! ```text
//! agent/<r>/here/<node>    SET by each arriving agent: its identity (the pod's UID)
//! agent/<r>/arrived        ADD by each arriving agent (node 0 compares it to the members)
//! agent/<r>/members        SET by node 0: Members
//! agent/<r>/knock          SET by a late agent once it arrived (and its spares are ready):
//!                          node 0's grower wakes on it instead of polling
//! agent/owner/<node>       SET by each node's agent as it starts: its identity. An agent
//!                          that finds another's there was replaced while cut off (a pod
//!                          behind a partition) and leaves the gang instead of joining
//! ```

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::AgentError;
use crate::keys;
use crate::store::{self, StoreClient};

/// The nodes of a round, in rank order (node 0 first), each with the identity of the agent
/// that arrived for it: a stale agent of the same node (a pod cut off behind a partition and
/// replaced) is not a member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    pub nodes: Vec<(usize, String)>,
}

impl Members {
    /// This agent's position in the round (its ranks start at position × procs per node).
    pub fn position(&self, node: usize, id: &str) -> Option<usize> {
        self.nodes.iter().position(|(n, i)| *n == node && i == id)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// When node 0 stops waiting: every node came, or enough came and the elastic wait passed
/// or no node worth waiting for is missing (`expected`: the nodes not just lost behind a
/// partition, whose heartbeat timeout was their wait).
pub fn enough(
    arrived: usize,
    (nnodes, expected): (usize, usize),
    min_nodes: usize,
    waited: Duration,
    wait: Duration,
) -> bool {
    arrived >= nnodes || (arrived >= min_nodes.max(1) && (waited >= wait || arrived >= expected))
}

/// Claims `node` for the agent with identity `id` (the newest pod of that node).
pub fn claim(client: &mut StoreClient, node: usize, id: &str) -> store::Result<()> {
    client.set(&keys::owner(node), id.as_bytes())
}

/// The identity of the agent that holds `node`, if one claimed it.
pub fn owner(client: &mut StoreClient, node: usize) -> store::Result<Option<String>> {
    let id = client.try_get(&keys::owner(node), Duration::ZERO)?;
    Ok(id.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Arrives at round `round` as `node` with identity `id`.
pub fn arrive(client: &mut StoreClient, round: u64, node: usize, id: &str) -> store::Result<()> {
    client.set(&keys::here(round, node), id.as_bytes())?;
    client.add(&keys::arrived(round), 1)?;
    Ok(())
}

/// The nodes that did not arrive at round `round` at all (node 0's view once it gathered it).
pub fn absent(client: &mut StoreClient, round: u64, nnodes: usize) -> store::Result<Vec<usize>> {
    let mut absent = Vec::new();
    for node in 0..nnodes {
        if client
            .try_get(&keys::here(round, node), Duration::ZERO)?
            .is_none()
        {
            absent.push(node);
        }
    }
    Ok(absent)
}

/// How long node 0 waits for the nodes of a round.
pub struct Wait {
    /// Elastic: the fewest nodes a round may start with (`nnodes`: not elastic).
    pub min_nodes: usize,
    /// Elastic: how long to wait for every node before starting with fewer.
    pub wait: Duration,
    /// When that wait began: the agent's start for the first round (node 0 already waited
    /// for the others to say where they left off: a new gang starts on the pods that were
    /// placed one wait after node 0's, not two), else the round's gathering.
    pub since: Instant,
    /// Nodes whose agents said they are coming (the first round: they posted where they
    /// left off): waited for up to [`COMING_WITHIN`] even once the elastic wait passed, so
    /// that a node a moment behind node 0 is a member, not a late node that ends the round.
    pub coming: Vec<usize>,
    /// Nodes not waited for, though taken if they come in time: those the last round was
    /// ended without (no heartbeat), and those that did not come to it at all.
    pub lost: Vec<usize>,
    /// The longest wait for at least `min_nodes`.
    pub timeout: Duration,
}

/// Node 0: waits for the nodes of round `round` (all of them, or at least `min_nodes` after
/// the elastic wait, or at once when only lost ones are missing; until the timeout), then
/// publishes the members.
pub fn gather(
    client: &mut StoreClient,
    round: u64,
    nnodes: usize,
    w: &Wait,
) -> Result<Members, AgentError> {
    let (min_nodes, wait, timeout) = (w.min_nodes, w.wait, w.timeout);
    let expected = (0..nnodes).filter(|n| !w.lost.contains(n)).count();
    let started = Instant::now();
    loop {
        let waited = w.since.elapsed();
        let mut nodes = Vec::new();
        for node in 0..nnodes {
            if let Some(id) = client.try_get(&keys::here(round, node), Duration::ZERO)? {
                nodes.push((node, String::from_utf8_lossy(&id).into_owned()));
            }
        }
        let on_the_way = started.elapsed() < COMING_WITHIN
            && w.coming.iter().any(|c| nodes.iter().all(|(m, _)| m != c));
        if !on_the_way && enough(nodes.len(), (nnodes, expected), min_nodes, waited, wait) {
            let members = Members { nodes };
            let json = serde_json::to_vec(&members).expect("members serialize");
            client.set(&keys::members(round), &json)?;
            return Ok(members);
        }
        if started.elapsed() >= timeout {
            return Err(AgentError::TooFewNodes {
                round,
                arrived: nodes.len(),
                nnodes,
                min_nodes,
                seconds: timeout.as_secs(),
            });
        }
        // A blocking GET on a node still missing (the store answers when it arrives): no
        // polling delay on a restart's path; woken at least every GATHER_WAKE to decide again.
        let absent = |n: &usize| nodes.iter().all(|(m, _)| m != n);
        let missing = (w.coming.iter().copied().find(absent).filter(|_| on_the_way))
            .or_else(|| (0..nnodes).find(absent))
            .expect("a node is missing");
        let block = if on_the_way {
            COMING_WITHIN.saturating_sub(started.elapsed())
        } else if waited < wait {
            wait - waited
        } else {
            timeout.saturating_sub(started.elapsed())
        };
        let block = block.clamp(Duration::from_millis(1), GATHER_WAKE);
        client.try_get(&keys::here(round, missing), block)?;
    }
}

/// How long node 0's first round waits for the nodes that said they are coming.
pub const COMING_WITHIN: Duration = Duration::from_secs(2);
/// The longest node 0 waits for a missing node before it looks at every node again.
const GATHER_WAKE: Duration = Duration::from_secs(1);

/// The members of round `round` as node 0 published them.
pub fn read(
    client: &mut StoreClient,
    round: u64,
    timeout: Duration,
) -> Result<Members, AgentError> {
    let bytes = client.get(&keys::members(round), timeout)?;
    serde_json::from_slice(&bytes).map_err(AgentError::malformed("members"))
}

/// Whether node 0 decided round `round`'s members already: an agent arriving now is late.
pub fn decided(client: &mut StoreClient, round: u64) -> store::Result<bool> {
    Ok(client
        .try_get(&keys::members(round), Duration::ZERO)?
        .is_some())
}

/// Nodes that arrived at round `round` beyond its members: late ones waiting to join.
pub fn late(client: &mut StoreClient, round: u64, members: usize) -> store::Result<usize> {
    let arrived = client.add(&keys::arrived(round), 0)?;
    Ok((arrived.max(0) as usize).saturating_sub(members))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Auth;
    use crate::store::StoreServer;
    use std::net::TcpListener;

    #[test]
    fn a_node_that_said_it_is_coming_is_a_member_though_the_elastic_wait_passed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let auth = Auth::new("tok", 1);
        let _srv = StoreServer::start(l, auth.clone(), Duration::from_secs(2)).unwrap();
        let connect = move || {
            let deadline = Instant::now() + Duration::from_secs(5);
            StoreClient::connect("127.0.0.1", port, &auth, deadline).unwrap()
        };
        let mut c = connect();
        arrive(&mut c, 0, 0, "n0").unwrap();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            arrive(&mut connect(), 0, 1, "n1").unwrap();
        });
        // Node 2 never comes; node 1 posted where it left off and arrives 0.3 s after node
        // 0 gathers, the elastic wait long over.
        let w = Wait {
            min_nodes: 1,
            wait: Duration::from_secs(3),
            since: Instant::now() - Duration::from_secs(3),
            coming: vec![1],
            lost: Vec::new(),
            timeout: Duration::from_secs(10),
        };
        let members = gather(&mut c, 0, 3, &w).unwrap();
        late.join().unwrap();
        assert_eq!(
            members.nodes,
            vec![(0, "n0".to_string()), (1, "n1".to_string())]
        );
    }

    #[test]
    fn node_0_waits_for_everyone_or_after_the_elastic_wait_for_enough() {
        let s = Duration::from_secs;
        assert!(enough(3, (3, 3), 2, s(0), s(60)), "all came");
        assert!(!enough(2, (3, 3), 2, s(59), s(60)), "within the wait");
        assert!(
            enough(2, (3, 3), 2, s(60), s(60)),
            "the wait passed with enough"
        );
        assert!(
            !enough(1, (3, 3), 2, s(600), s(60)),
            "never fewer than the minimum"
        );
        assert!(
            !enough(2, (3, 3), 3, s(600), s(60)),
            "not elastic: everyone"
        );
    }

    #[test]
    fn a_node_lost_behind_a_partition_is_not_waited_for_again() {
        let s = Duration::from_secs;
        // Node 2 was cut off in the last round: its heartbeat timeout was its wait.
        assert!(
            enough(2, (3, 2), 2, s(0), s(60)),
            "the others came: at once"
        );
        assert!(
            !enough(1, (3, 2), 1, s(0), s(60)),
            "another one is still due"
        );
        assert!(
            !enough(2, (3, 2), 3, s(0), s(60)),
            "not elastic: everyone, lost or not"
        );
    }

    #[test]
    fn a_stale_agent_of_a_member_node_is_no_member() {
        let m = Members {
            nodes: vec![(0, "uid-a".into()), (2, "uid-c2".into())],
        };
        assert_eq!(m.position(0, "uid-a"), Some(0));
        assert_eq!(
            m.position(2, "uid-c2"),
            Some(1),
            "ranks renumbered: node 2 is second"
        );
        assert_eq!(m.position(2, "uid-c1"), None, "the replaced pod's agent");
        assert_eq!(m.position(1, "uid-b"), None, "node 1 did not come");
    }
}
