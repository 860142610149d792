//! What every pod of a job is known by: its labels, its name and its trainer container. The
//! operator writes them; `kubectl ferrotrain` (and anything else that looks for a job's pods)
//! reads them, so they are spelled here once for both.

/// The DistributedTraining a child belongs to.
pub const JOB: &str = "ferrotrain.dev/job";
/// The attempt a pod belongs to.
pub const ATTEMPT: &str = "ferrotrain.dev/attempt";
/// The pod's node rank within its attempt.
pub const NODE_RANK: &str = "ferrotrain.dev/node-rank";

/// What taking the pod away (preemption, eviction, drain) costs the job, by its node rank:
/// [`COST_RENDEZVOUS`], [`COST_NEEDED`] or [`COST_SURPLUS`]. A label, so that a person
/// (`kubectl get pods -l ferrotrain.dev/preemption-cost=surplus`) or a tool that selects
/// victims by label (the descheduler, a PodDisruptionBudget of one's own) can pick the
/// cheapest.
pub const PREEMPTION_COST: &str = "ferrotrain.dev/preemption-cost";
/// Node 0's pod: it hosts the rendezvous; the others stop and wait for its replacement (they
/// keep their state: no step is lost while one survives).
pub const COST_RENDEZVOUS: &str = "rendezvous";
/// A pod the gang cannot train without (below elastic.minReplicas, or any pod of a job that is
/// not elastic): the others wait for its replacement.
pub const COST_NEEDED: &str = "needed";
/// A pod beyond elastic.minReplicas: the gang trains on without it at the next round, from
/// the step it reached (a step or two slower each, nothing trained again).
pub const COST_SURPLUS: &str = "surplus";

/// What taking node rank `node_rank`'s pod costs a job that trains on at least `min` pods.
pub fn preemption_cost(node_rank: i32, min: i32) -> &'static str {
    match node_rank {
        0 => COST_RENDEZVOUS,
        r if r < min => COST_NEEDED,
        _ => COST_SURPLUS,
    }
}

/// Name of the container running the trainer.
pub const TRAINER_CONTAINER: &str = "trainer";

/// `<job>-<attempt>-<nodeRank>`.
pub fn pod_name(job: &str, attempt: i32, node_rank: i32) -> String {
    format!("{job}-{attempt}-{node_rank}")
}
