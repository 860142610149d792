//! What every pod of a job is known by: its labels, its name and its trainer container. The
//! operator writes them; `kubectl ferrotrain` (and anything else that looks for a job's pods)
//! reads them, so they are spelled here once for both.

/// The DistributedTraining a child belongs to.
pub const JOB: &str = "ferrotrain.dev/job";
/// The attempt a pod belongs to.
pub const ATTEMPT: &str = "ferrotrain.dev/attempt";
/// The pod's node rank within its attempt.
pub const NODE_RANK: &str = "ferrotrain.dev/node-rank";

/// Name of the container running the trainer.
pub const TRAINER_CONTAINER: &str = "trainer";

/// `<job>-<attempt>-<nodeRank>`.
pub fn pod_name(job: &str, attempt: i32, node_rank: i32) -> String {
    format!("{job}-{attempt}-{node_rank}")
}
