//! Every key of the rendezvous store, spelled once: the agents' (under `agent/`) and the
//! ranks' (under `round/<r>/` in an in-place round, else at the top). Each constructor names
//! the key's writer and readers; docs/rendezvous.md and docs/in-place-restarts.md show the protocol they make.

/// `agent/round`: the round node 0 started last (SET by node 0; read by joining agents).
pub const ROUND: &str = "agent/round";

/// `agent/store`: node 0's identity, its pod's UID (SET by node 0 at start); a survivor
/// waiting for node 0's replacement ignores the store it lost (rejoin.rs).
pub const STORE_ID: &str = "agent/store";

/// `agent/done`: ADD by each agent at the end (node 0 keeps its store up until all came).
pub const DONE: &str = "agent/done";

/// `agent/finished`: SET by node 0 when the gang's ranks finished training; an agent that
/// waits for a round to join (its pod placed after the gang started without it) ends with
/// them instead of waiting for a round that never comes.
pub const FINISHED: &str = "agent/finished";

/// `agent/resume/<node>`: SET by every agent but node 0's before it joins: the round it
/// would start next (rejoin.rs).
pub fn resume(node: usize) -> String {
    format!("agent/resume/{node}")
}

/// `agent/owner/<node>`: SET by the agent that holds `node`: its identity (members.rs).
pub fn owner(node: usize) -> String {
    format!("agent/owner/{node}")
}

/// `agent/<r>/here/<node>`: SET by each agent arriving at round `r`: its identity.
pub fn here(round: u64, node: usize) -> String {
    format!("agent/{round}/here/{node}")
}

/// `agent/<r>/arrived`: ADD by each agent arriving at round `r`.
pub fn arrived(round: u64) -> String {
    format!("agent/{round}/arrived")
}

/// `agent/<r>/knock`: SET by an agent that arrived at round `r` after its members were
/// decided (late), once its spare ranks are ready: node 0's grower wakes on it (watch.rs).
pub fn knock(round: u64) -> String {
    format!("agent/{round}/knock")
}

/// `agent/<r>/members`: SET by node 0: who trains in round `r` (members.rs).
pub fn members(round: u64) -> String {
    format!("agent/{round}/members")
}

/// `agent/<r>/failures`: ADD by each agent whose own rank ended round `r`; the first one
/// also sets [`failed`].
pub fn failures(round: u64) -> String {
    format!("agent/{round}/failures")
}

/// `agent/<r>/failed`: SET once round `r` must end (a node's rank failed, a node was lost,
/// the gang grows); every agent's watcher blocks on it (watch.rs).
pub fn failed(round: u64) -> String {
    format!("agent/{round}/failed")
}

/// `agent/<r>/report/<node>`: SET by each agent once its ranks of round `r` stopped: what it
/// saw (blame::NodeReport).
pub fn report(round: u64, node: usize) -> String {
    format!("agent/{round}/report/{node}")
}

/// `agent/<r>/verdict`: SET by node 0: why round `r` ended (blame::Verdict).
pub fn verdict(round: u64) -> String {
    format!("agent/{round}/verdict")
}

/// `agent/<r>/master_port`: SET by node 0 before round `r` of a user's command starts: the
/// port its rank 0 serves the script's own store on (MASTER_PORT; agent.rs).
pub fn master_port(round: u64) -> String {
    format!("agent/{round}/master_port")
}

/// `agent/<r>/resize`: SET by node 0 when round `r` ends so that the gang grows (watch.rs).
pub fn resize(round: u64) -> String {
    format!("agent/{round}/resize")
}

/// `agent/<r>/beat/<node>`: ADD 1 by `node`'s agent every second of round `r`
/// (heartbeat.rs).
pub fn beat(round: u64, node: usize) -> String {
    format!("agent/{round}/beat/{node}")
}

/// `agent/<r>/lost/<node>`: SET by node 0 for a member of round `r` whose beat stood still
/// for the heartbeat timeout: the seconds it was silent.
pub fn lost(round: u64, node: usize) -> String {
    format!("agent/{round}/lost/{node}")
}

/// The prefix of every key the ranks of in-place round `r` use: `round/<r>/`.
pub fn round_prefix(round: u64) -> String {
    format!("round/{round}/")
}

/// `ring/<rank>`: SET by each rank: the address of its ring listener.
pub fn ring(rank: usize) -> String {
    format!("ring/{rank}")
}

/// `nccl/unique-id`: SET by rank 0: the NCCL communicator's unique id.
pub const NCCL_ID: &str = "nccl/unique-id";

/// `barrier/<name>/count`: ADD by each client entering the barrier `name`.
pub fn barrier_count(name: &str) -> String {
    format!("barrier/{name}/count")
}

/// `barrier/<name>/done`: SET by the last client to enter the barrier `name`.
pub fn barrier_done(name: &str) -> String {
    format!("barrier/{name}/done")
}
