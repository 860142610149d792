//! torchrun's worker environment, for a user's command (spec.pytorch): what torch 2.11's
//! local elastic agent gives each worker (torch/distributed/elastic/agent/server/
//! local_elastic_agent.py, `_start_workers`, and torch/distributed/elastic/multiprocessing/
//! api.py for TORCHELASTIC_ERROR_FILE), so that a script written for torchrun runs unchanged.
//! The values follow ferrotrain's gang: one role, a node's rank among the round's members, a
//! restart count over attempts and rounds, a MASTER_PORT of the round's own on which the
//! script's rank 0 serves its TCPStore (torchrun's `use_agent_store` False).

use ferrotrain_api::env;

/// Where one worker stands in the round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    /// This node's position among the round's member nodes, and their number.
    pub group_rank: usize,
    pub group_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Restarts so far, of any kind (the attempt plus the round).
    pub restart_count: u64,
    pub max_restarts: u32,
    /// The job's name; `none` (torchrun's default --rdzv-id) when there is none.
    pub run_id: String,
    /// Where the worker's `@record` writes its error.
    pub error_file: String,
}

/// torchrun's role name when none is given.
pub const ROLE: &str = "default";

/// The worker's torchrun variables, by name. TORCH_NCCL_ASYNC_ERROR_HANDLING is the pod's
/// when it sets one, else 1 (torchrun's default).
pub fn worker_env(w: &Worker, nccl_async: Option<String>) -> Vec<(&'static str, String)> {
    vec![
        (env::RANK, w.rank.to_string()),
        (env::LOCAL_RANK, w.local_rank.to_string()),
        (env::GROUP_RANK, w.group_rank.to_string()),
        (env::ROLE_RANK, w.rank.to_string()),
        (env::ROLE_NAME, ROLE.to_string()),
        (env::LOCAL_WORLD_SIZE, w.local_world_size.to_string()),
        (env::WORLD_SIZE, w.world_size.to_string()),
        (env::GROUP_WORLD_SIZE, w.group_world_size.to_string()),
        (env::ROLE_WORLD_SIZE, w.world_size.to_string()),
        (env::MASTER_ADDR, w.master_addr.clone()),
        (env::MASTER_PORT, w.master_port.to_string()),
        (env::TORCHELASTIC_RESTART_COUNT, w.restart_count.to_string()),
        (env::TORCHELASTIC_MAX_RESTARTS, w.max_restarts.to_string()),
        (env::TORCHELASTIC_RUN_ID, w.run_id.clone()),
        (env::TORCHELASTIC_USE_AGENT_STORE, "False".to_string()),
        (
            env::TORCH_NCCL_ASYNC_ERROR_HANDLING,
            nccl_async.unwrap_or_else(|| "1".to_string()),
        ),
        (env::TORCHELASTIC_ERROR_FILE, w.error_file.clone()),
    ]
}

/// The variables [`worker_env`] sets, in its order.
pub fn worker_env_names() -> &'static [&'static str] {
    &NAMES
}

const NAMES: [&str; 17] = [
    env::RANK,
    env::LOCAL_RANK,
    env::GROUP_RANK,
    env::ROLE_RANK,
    env::ROLE_NAME,
    env::LOCAL_WORLD_SIZE,
    env::WORLD_SIZE,
    env::GROUP_WORLD_SIZE,
    env::ROLE_WORLD_SIZE,
    env::MASTER_ADDR,
    env::MASTER_PORT,
    env::TORCHELASTIC_RESTART_COUNT,
    env::TORCHELASTIC_MAX_RESTARTS,
    env::TORCHELASTIC_RUN_ID,
    env::TORCHELASTIC_USE_AGENT_STORE,
    env::TORCH_NCCL_ASYNC_ERROR_HANDLING,
    env::TORCHELASTIC_ERROR_FILE,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// torch 2.11.0's `worker_env` keys, in its order (local_elastic_agent.py, lines
    /// 308-325), then multiprocessing/api.py's TORCHELASTIC_ERROR_FILE. The cross-process
    /// test (launch/tests/python.rs) compares a real torchrun's environment with ours.
    const TORCHRUN: [&str; 17] = [
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCHELASTIC_ERROR_FILE",
    ];

    /// Node 1 of 2 with 2 ranks each, after 3 restarts: what torchrun's agent gives its
    /// second worker, rank by rank.
    #[test]
    fn a_worker_gets_torchruns_variables_with_torchruns_values() {
        let w = Worker {
            rank: 3,
            local_rank: 1,
            world_size: 4,
            local_world_size: 2,
            group_rank: 1,
            group_world_size: 2,
            master_addr: "job-0-0.job.ns.svc".into(),
            master_port: 41007,
            restart_count: 3,
            max_restarts: 5,
            run_id: "job".into(),
            error_file: "/tmp/x/rank-3.error.json".into(),
        };
        let vars = worker_env(&w, None);
        let names: Vec<&str> = vars.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, TORCHRUN);
        assert_eq!(worker_env_names(), TORCHRUN);
        let value = |k: &str| vars.iter().find(|(n, _)| *n == k).unwrap().1.as_str();
        // One role: the role's rank and size are the global ones, as torchrun's with --role
        // unset.
        assert_eq!(value("ROLE_RANK"), value("RANK"));
        assert_eq!(value("ROLE_WORLD_SIZE"), value("WORLD_SIZE"));
        assert_eq!(value("ROLE_NAME"), "default");
        assert_eq!((value("GROUP_RANK"), value("GROUP_WORLD_SIZE")), ("1", "2"));
        assert_eq!(value("TORCHELASTIC_USE_AGENT_STORE"), "False");
        assert_eq!(value("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
        let pod = worker_env(&w, Some("3".into()));
        assert!(pod.contains(&("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3".into())));
    }
}
