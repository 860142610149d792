//! How one rank process is started: the env contract of a group's ranks ([`Spawn`],
//! [`rank_env`]) and its command ([`rank_command`]), shared by the group (launch/group.rs)
//! and its spares (launch/spare.rs). The trainer and a user's command share the contract's
//! core (ranks, files, the round); a command also gets torchrun's (torchrun.rs), the trainer
//! its config and the rendezvous token.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrotrain_api::env;

use crate::args::LaunchArgs;
use crate::files::{PROGRESS_FILE, RankFiles};
use crate::program::RankProgram;
use crate::torchrun::{self, Worker};

/// What every rank of a group is started with.
pub struct Spawn<'a> {
    pub args: &'a LaunchArgs,
    pub program: &'a RankProgram,
    pub attempt: u64,
    /// MASTER_ADDR: node 0. In place, an address: the one this launcher's store connection
    /// reached (node 0's own name resolved once, on node 0): a round's ranks look up no
    /// name, so a DNS outage does not stop a restart.
    pub master_addr: String,
    /// MASTER_PORT: the launcher's store for the trainer; for a command, the port its rank 0
    /// serves its own store on (a port of each round's own).
    pub port: u16,
    pub token: &'a str,
    pub logs: &'a Path,
    pub omp_threads: Option<String>,
    /// In-place restarts (the agent, [`crate::agent`]): the round the ranks belong to; the
    /// agent of node 0 hosts the rendezvous store, so rank 0 must not start one.
    pub round: Option<u64>,
    /// Elastic rounds: this node's position among the round's member nodes and their number
    /// (ranks are renumbered over the members; the gang's full size is the virtual world).
    pub place: Option<(usize, usize)>,
}

/// Local rank `local_rank` of the group `a` starts: its global rank, the files it leaves its
/// launcher, and its environment (the env contract).
pub fn rank_env(
    a: &Spawn<'_>,
    local_rank: usize,
) -> (usize, RankFiles, Vec<(&'static str, String)>) {
    let args = a.args;
    let (position, nodes) = a.place.unwrap_or((args.node_rank, args.nnodes));
    let world = nodes * args.nproc_per_node;
    let rank = position * args.nproc_per_node + local_rank;
    let files = RankFiles::of(a.logs, rank);
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let worker = Worker {
        rank,
        local_rank,
        world_size: world,
        local_world_size: args.nproc_per_node,
        group_rank: position,
        group_world_size: nodes,
        master_addr: a.master_addr.clone(),
        master_port: a.port,
        restart_count: a.attempt + a.round.unwrap_or(0),
        max_restarts: args.max_restarts,
        run_id: std::env::var(env::FERROTRAIN_JOB)
            .ok()
            .filter(|j| !j.is_empty())
            .unwrap_or_else(|| "none".into()),
        error_file: path(&files.error),
    };
    let mut vars = match a.program {
        RankProgram::Command(_) => {
            let nccl = std::env::var(env::TORCH_NCCL_ASYNC_ERROR_HANDLING).ok();
            torchrun::worker_env(&worker, nccl)
        }
        RankProgram::Trainer(t) => vec![
            (env::RANK, rank.to_string()),
            (env::LOCAL_RANK, local_rank.to_string()),
            (env::WORLD_SIZE, world.to_string()),
            (env::LOCAL_WORLD_SIZE, args.nproc_per_node.to_string()),
            (env::MASTER_ADDR, a.master_addr.clone()),
            (env::MASTER_PORT, a.port.to_string()),
            (
                env::TORCHELASTIC_RESTART_COUNT,
                worker.restart_count.to_string(),
            ),
            (env::FERROTRAIN_CONFIG, path(&t.config)),
        ],
    };
    vars.extend([
        (env::NNODES, args.nnodes.to_string()),
        (env::NODE_RANK, args.node_rank.to_string()),
        (env::NPROC_PER_NODE, args.nproc_per_node.to_string()),
        (env::FERROTRAIN_ATTEMPT, a.attempt.to_string()),
        (
            env::FERROTRAIN_TERMINATION_LOG,
            path(&files.termination_log),
        ),
        (env::FERROTRAIN_END_FILE, path(&files.end)),
        (
            env::FERROTRAIN_PROGRESS_FILE,
            path(&a.logs.join(PROGRESS_FILE)),
        ),
        (env::FERROTRAIN_HEAL_DIR, path(&heal_dir(a.logs))),
    ]);
    if a.place.is_some_and(|(_, members)| members < args.nnodes) {
        // The trainers cover the shards of the ranks a smaller round lacks.
        let full = args.nnodes * args.nproc_per_node;
        vars.push((env::FERROTRAIN_VIRTUAL_WORLD, full.to_string()));
    }
    if let RankProgram::Trainer(_) = a.program {
        vars.extend(trainer_rendezvous(a));
    }
    if let Some(round) = a.round {
        vars.push((env::FERROTRAIN_ROUND, round.to_string()));
    }
    if let Some(t) = &a.omp_threads {
        vars.push(("OMP_NUM_THREADS", t.clone()));
    }
    (rank, files, vars)
}

/// How the trainer's ranks meet in the launcher's store: the token (unless the pod holds it
/// in a file: the ranks read the same file, FERROTRAIN_RDZV_TOKEN_FILE, inherited, instead of
/// finding the token in their environment) and, in rounds, that node 0's launcher hosts it.
fn trainer_rendezvous(a: &Spawn<'_>) -> Vec<(&'static str, String)> {
    let mut vars = Vec::new();
    let set = |name| std::env::var(name).is_ok_and(|v: String| !v.trim().is_empty());
    let from_file = !set(env::FERROTRAIN_RDZV_TOKEN) && set(env::FERROTRAIN_RDZV_TOKEN_FILE);
    if !from_file {
        vars.push((env::FERROTRAIN_RDZV_TOKEN, a.token.to_string()));
    }
    if a.round.is_some() {
        vars.push((env::FERROTRAIN_STORE_HOSTED, "1".to_string()));
    }
    vars
}

/// Where the ranks leave their state for the next round (trainer's `heal`):
/// FERROTRAIN_HEAL_DIR when the launcher is given one (a memory-backed volume for large
/// models), else `heal/` in its scratch directory, which goes with it.
pub fn heal_dir(logs: &Path) -> PathBuf {
    std::env::var_os(env::FERROTRAIN_HEAL_DIR)
        .filter(|d| !d.is_empty())
        .map_or_else(|| logs.join("heal"), PathBuf::from)
}

/// The command of a rank with environment `vars` (`<program> run --config <path> [rank
/// args]`, or the user's command: program.rs), dying with its launcher, its output piped to
/// the launcher.
pub fn rank_command(a: &Spawn<'_>, vars: &[(&'static str, String)]) -> Command {
    let mut cmd = a.program.command();
    // The launcher's own variables a rank has no use for; the token is the trainer's alone.
    cmd.env_remove(env::FERROTRAIN_RDZV_TOKEN)
        // The pod's endpoint is its launcher's (report.rs): a rank serves none of its own.
        .env_remove(env::FERROTRAIN_METRICS_PORT)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        // Forwarded line by line, labelled and kept per round (launch/output.rs).
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe. A rank dies with its launcher, even a
        // SIGKILLed one, instead of training on as an orphan. (The thread that spawns it is
        // its parent for this purpose: the launcher's main thread.)
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    cmd
}
