//! Environment variables: the contract between the operator, `ferrotrain launch` and each
//! rank. The torchrun names are kept so that a PyTorch image started by torchrun also works.

use crate::documented::documented;

documented! {
    /// Every variable of the contract, in this order, with its rustdoc
    /// (docs/reference/environment.md).
    pub const ALL;

    /// Address of the rank-0 pod (hosts the rendezvous store).
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    /// Port of the rendezvous store on MASTER_ADDR.
    pub const MASTER_PORT: &str = "MASTER_PORT";
    /// Total ranks over all nodes.
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    /// Nodes (pods).
    pub const NNODES: &str = "NNODES";
    /// This node's index, 0-based.
    pub const NODE_RANK: &str = "NODE_RANK";
    /// Ranks per node.
    pub const NPROC_PER_NODE: &str = "NPROC_PER_NODE";
    /// Global rank of one process (set by the launcher).
    pub const RANK: &str = "RANK";
    /// Rank within the node (set by the launcher).
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// Ranks on this node (set by the launcher).
    pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
    /// torchelastic's restart count: restarts of any kind so far (the attempt plus the round;
    /// set by the launcher, and by the operator as the attempt).
    pub const TORCHELASTIC_RESTART_COUNT: &str = "TORCHELASTIC_RESTART_COUNT";

    // The rest of torchrun's worker environment, which `ferrotrain-launch` gives a user's
    // command (spec.pytorch) as torchrun 2.11's local elastic agent does (launch/src/torchrun.rs).

    /// torchrun: this node's rank among the round's nodes (set by the launcher).
    pub const GROUP_RANK: &str = "GROUP_RANK";
    /// torchrun: the round's nodes (set by the launcher).
    pub const GROUP_WORLD_SIZE: &str = "GROUP_WORLD_SIZE";
    /// torchrun: the rank among the workers of the same role; one role, so RANK.
    pub const ROLE_RANK: &str = "ROLE_RANK";
    /// torchrun: the workers of the same role; one role, so WORLD_SIZE.
    pub const ROLE_WORLD_SIZE: &str = "ROLE_WORLD_SIZE";
    /// torchrun: the workers' role (`default`, as torchrun's).
    pub const ROLE_NAME: &str = "ROLE_NAME";
    /// torchrun: the restarts the launcher may still make (`--max-restarts`).
    pub const TORCHELASTIC_MAX_RESTARTS: &str = "TORCHELASTIC_MAX_RESTARTS";
    /// torchrun: the run's id: the job's name (FERROTRAIN_JOB), else `none` (torchrun's
    /// default run id).
    pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
    /// torchrun: whether the workers' process group uses the agent's store; `False`: rank 0
    /// serves its own TCPStore on MASTER_PORT, a port of the round's own.
    pub const TORCHELASTIC_USE_AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";
    /// torchrun: where a worker's `@record` writes its error (JSON); the launcher gives each
    /// rank one and puts its message into the rank's failure.
    pub const TORCHELASTIC_ERROR_FILE: &str = "TORCHELASTIC_ERROR_FILE";
    /// torchrun: NCCL's asynchronous error handling, 1 unless the pod sets it.
    pub const TORCH_NCCL_ASYNC_ERROR_HANDLING: &str = "TORCH_NCCL_ASYNC_ERROR_HANDLING";

    /// Name of the DistributedTraining job (checkpoint subdirectory).
    pub const FERROTRAIN_JOB: &str = "FERROTRAIN_JOB";
    /// Attempt number (0-based); part of the rendezvous handshake.
    pub const FERROTRAIN_ATTEMPT: &str = "FERROTRAIN_ATTEMPT";
    /// Path of the trainer config file.
    pub const FERROTRAIN_CONFIG: &str = "FERROTRAIN_CONFIG";
    /// Directory under which `<job>/step-XXXXXXXX/` checkpoints live.
    pub const FERROTRAIN_CHECKPOINT_DIR: &str = "FERROTRAIN_CHECKPOINT_DIR";
    /// Shared secret every rendezvous connection must prove it knows.
    pub const FERROTRAIN_RDZV_TOKEN: &str = "FERROTRAIN_RDZV_TOKEN";
    /// A file holding the rendezvous token, read when FERROTRAIN_RDZV_TOKEN is unset (the
    /// operator mounts the job's Secret there: a token in a file is not in the environment).
    pub const FERROTRAIN_RDZV_TOKEN_FILE: &str = "FERROTRAIN_RDZV_TOKEN_FILE";
    /// The Secret the checkpoint store's credentials come from (spec.checkpoint.
    /// storeSecretName): an error of the bucket names it.
    pub const FERROTRAIN_STORE_SECRET: &str = "FERROTRAIN_STORE_SECRET";
    /// Port of the pod's HTTP endpoint (/metrics, /progress, /healthz): served by `ferrotrain run` for
    /// a rank on its own, by node 0's `ferrotrain launch` for a gang (its ranks serve none).
    pub const FERROTRAIN_METRICS_PORT: &str = "FERROTRAIN_METRICS_PORT";
    /// GPUs the pod was given (the operator sets it to gpusPerReplica when above 0): a rank that
    /// then finds no CUDA device fails with exit 2 instead of training on the CPU.
    pub const FERROTRAIN_EXPECT_GPUS: &str = "FERROTRAIN_EXPECT_GPUS";
    /// Path of libnccl to load (default: `libnccl.so.2` from the library path, then libnccl.so).
    pub const FERROTRAIN_NCCL_LIBRARY: &str = "FERROTRAIN_NCCL_LIBRARY";

    // `ferrotrain launch`'s settings (each also a flag; see docs/launcher.md).

    /// How many rounds the launcher restarts the ranks in after retryable failures (one node, or
    /// several in place); the operator hands its pods what is left of restartPolicy.maxRestarts.
    pub const FERROTRAIN_MAX_RESTARTS: &str = "FERROTRAIN_MAX_RESTARTS";
    /// Seconds before the launcher's first restart (doubling with each restart).
    pub const FERROTRAIN_RESTART_BACKOFF_SECONDS: &str = "FERROTRAIN_RESTART_BACKOFF_SECONDS";
    /// Longest wait between the launcher's restarts.
    pub const FERROTRAIN_RESTART_BACKOFF_MAX_SECONDS: &str =
        "FERROTRAIN_RESTART_BACKOFF_MAX_SECONDS";
    /// Seconds ranks get between the launcher's SIGTERM and SIGKILL.
    pub const FERROTRAIN_STOP_GRACE_SECONDS: &str = "FERROTRAIN_STOP_GRACE_SECONDS";
    /// `ferrotrain launch --restart-in-place`: on several nodes, restart the ranks in a new round
    /// after a retryable failure instead of exiting (the operator sets it for its pods; one node
    /// always does).
    pub const FERROTRAIN_RESTART_IN_PLACE: &str = "FERROTRAIN_RESTART_IN_PLACE";
    /// Exit codes no restart can fix (comma-separated; default 2,3,4): the launcher never
    /// restarts a rank that exits with one (restartPolicy.permanentExitCodes).
    pub const FERROTRAIN_PERMANENT_EXIT_CODES: &str = "FERROTRAIN_PERMANENT_EXIT_CODES";
    /// In-place restarts: how long node 0's launcher waits for another node's heartbeat before
    /// it ends the round without that node (default 10 s), and another node for its own
    /// heartbeat to reach node 0 before it stops its ranks as cut off
    /// (spec.restartPolicy.heartbeatTimeoutSeconds).
    pub const FERROTRAIN_HEARTBEAT_TIMEOUT_SECONDS: &str = "FERROTRAIN_HEARTBEAT_TIMEOUT_SECONDS";
    /// How long the launchers wait for every node to join a round of in-place restarts.
    pub const FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS: &str = "FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS";
    /// Elastic in-place restarts: the fewest nodes a round may start with, once the others have
    /// not come for FERROTRAIN_ELASTIC_WAIT_SECONDS (spec.elastic.minReplicas).
    pub const FERROTRAIN_MIN_NODES: &str = "FERROTRAIN_MIN_NODES";
    /// Elastic in-place restarts: how long a round waits for every node (spec.elastic.waitSeconds).
    pub const FERROTRAIN_ELASTIC_WAIT_SECONDS: &str = "FERROTRAIN_ELASTIC_WAIT_SECONDS";
    /// Set by the launcher in in-place mode: the gang's full world size. A round with fewer ranks
    /// (elastic) has each rank also cover the shards of the missing ones, so the global batch,
    /// and the loss curve, stay those of the full gang.
    pub const FERROTRAIN_VIRTUAL_WORLD: &str = "FERROTRAIN_VIRTUAL_WORLD";
    /// Set by the operator when spec.elastic.maxReplicas exceeds replicas: the ranks each step's
    /// global batch is sized for (replicas x procsPerReplica), while the batch is cut into a
    /// shard per rank of all maxReplicas pods (the launchers' world, or
    /// FERROTRAIN_VIRTUAL_WORLD): more pods make a step faster, not larger.
    pub const FERROTRAIN_BATCH_WORLD: &str = "FERROTRAIN_BATCH_WORLD";
    /// Set by the operator on each pod: the gang's round when the pod was created. A pod that
    /// replaces node 0's (which hosts the store, and with one pod the only one) starts its gang's
    /// rounds there, not at 0: the round numbers go on, as the status counts them.
    pub const FERROTRAIN_FIRST_ROUND: &str = "FERROTRAIN_FIRST_ROUND";
    /// Set by the launcher in in-place mode: the round (0, 1, ...) the rank belongs to; its
    /// rendezvous keys live under `round/<r>/` and its ring connections prove the round.
    pub const FERROTRAIN_ROUND: &str = "FERROTRAIN_ROUND";
    /// Set by the launcher on a spare rank (in-place mode): a trainer started ahead of the next
    /// round, which loads libtorch and its config, then waits on its stdin for the round's
    /// environment (one JSON line) before it trains; EOF ends it quietly (launch/src/spare.rs).
    pub const FERROTRAIN_SPARE: &str = "FERROTRAIN_SPARE";
    /// `false` turns spare ranks off (`ferrotrain launch --spare-ranks`; default true).
    pub const FERROTRAIN_SPARE_RANKS: &str = "FERROTRAIN_SPARE_RANKS";
    /// spec.pytorch.preImport (`ferrotrain-launch --pre-import`): Python modules a spare rank
    /// of a Python command imports while it waits, besides torch (comma-separated).
    pub const FERROTRAIN_PRE_IMPORT: &str = "FERROTRAIN_PRE_IMPORT";
    /// Set by the launcher in in-place mode: node 0's launcher hosts the rendezvous store, so
    /// rank 0 connects to it instead of starting one.
    pub const FERROTRAIN_STORE_HOSTED: &str = "FERROTRAIN_STORE_HOSTED";
    /// The ports a rank's listeners other than the store and progress may use, `first-last`
    /// (the job's NetworkPolicy allows only these): the TCP ring binds inside it.
    pub const FERROTRAIN_PORT_RANGE: &str = "FERROTRAIN_PORT_RANGE";
    /// The program each local rank runs (tests and wrappers; default: ferrotrain itself).
    pub const FERROTRAIN_RANK_PROGRAM: &str = "FERROTRAIN_RANK_PROGRAM";

    /// Overrides TERMINATION_LOG (tests, local runs).
    pub const FERROTRAIN_TERMINATION_LOG: &str = "FERROTRAIN_TERMINATION_LOG";
    /// Set by `ferrotrain launch`, one per rank: where the trainer leaves why it ended (JSON
    /// [`crate::RankEnd`]: the kind, the peer that did not answer, the step), which its launcher
    /// reads to blame the right rank.
    pub const FERROTRAIN_END_FILE: &str = "FERROTRAIN_END_FILE";
    /// `ferrotrain launch`: where it keeps each rank's output per round
    /// (`round-<r>/rank-<n>.log`, the last MiB of each; default `ferrotrain-output` in the
    /// temporary directory, `/tmp/ferrotrain-output` in a pod), which `kubectl ferrotrain logs`
    /// reads while the pod runs.
    pub const FERROTRAIN_OUTPUT_DIR: &str = "FERROTRAIN_OUTPUT_DIR";
    /// Set by `ferrotrain launch`: rank 0 keeps its progress report there (JSON, replaced
    /// atomically about once a second), for the launcher's recovery ledger.
    pub const FERROTRAIN_PROGRESS_FILE: &str = "FERROTRAIN_PROGRESS_FILE";
    /// Set by `ferrotrain launch`: the directory the ranks of one pod (or machine) share for
    /// their state at a round's end, which the next round's ranks start from
    /// (docs/losing-nothing.md). Unset: a rank leaves nothing, and starts from a checkpoint.
    pub const FERROTRAIN_HEAL_DIR: &str = "FERROTRAIN_HEAL_DIR";
    /// `ferrotrain launch --recovery-file`: where the launcher keeps its recovery ledger (JSON).
    pub const FERROTRAIN_RECOVERY_FILE: &str = "FERROTRAIN_RECOVERY_FILE";
}

documented! {
    /// The names that are no variables themselves: what the variables' names are made from,
    /// and what they point at.
    pub const RELATED;

    /// Prefix of the torch elastic twins (`PET_NNODES`, `PET_NODE_RANK`, ...).
    pub const PET_PREFIX: &str = "PET_";
    /// Where a container writes its one-line failure reason (Kubernetes' default path).
    pub const TERMINATION_LOG: &str = "/dev/termination-log";
    /// The checkpoint store's credentials (S3's standard variables), from the keys of the same
    /// names in spec.checkpoint.storeSecretName's Secret: the access key id.
    pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
    /// The checkpoint store's secret access key.
    pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
    /// The checkpoint store's session token (temporary credentials; optional in the Secret).
    pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";
}

/// The keys the store's Secret must have, as the pod's variables of the same names.
pub const STORE_SECRET_KEYS: [&str; 2] = [AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY];
/// The store Secret's optional key (temporary credentials).
pub const STORE_SECRET_SESSION_KEY: &str = AWS_SESSION_TOKEN;

#[cfg(test)]
mod tests {
    /// Each variable's constant is named as the variable, so the code reads as the contract.
    #[test]
    fn every_variable_is_its_constants_name() {
        assert!(super::ALL.len() > 40, "{:?}", super::ALL);
        for var in super::ALL {
            assert_eq!(var.name, var.value);
            assert!(!var.text().is_empty(), "{} has no doc", var.name);
        }
        let values: std::collections::BTreeSet<_> = super::ALL.iter().map(|v| v.value).collect();
        assert_eq!(values.len(), super::ALL.len(), "a variable is listed twice");
    }
}
