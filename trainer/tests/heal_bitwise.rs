//! A run healed from a peer ends bit for bit where the run that was never interrupted ends:
//! the same model and optimizer bytes in the final checkpoint, the same loss at every step.
//! Rank 1 dies (a fault armed in the debug build, SIGKILL before its exchange) after step 40
//! of 120; the launcher restarts both ranks in place from rank 0's state of that step. Two
//! shapes: one launcher of two ranks (a pod of two GPUs) and two launchers of one rank each
//! (two pods). It cannot hold where the world size changes (an elastic round trains at a
//! smaller size: the same global batch, summed in another order); docs/job-shapes.md ("Bit for bit") says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::ProcessGroup;

const STEPS: u64 = 120;
const DIES_AFTER: u64 = 40;

fn config() -> String {
    common::GangCopyJob {
        seed: 11,
        max_steps: STEPS,
        train_samples: 2000,
        valid_samples: 16,
        max_tokens: 256,
        global_tokens: None,
        checkpoint_every: 100,
        keep_latest: 2,
        collective_timeout_seconds: 10,
        log_every: 1,
    }
    .yaml()
}

/// How the gang is laid out over launchers.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// One launcher of two ranks.
    OnePodOfTwo,
    /// Two launchers of one rank each, restarting in place.
    TwoPodsOfOne,
}

/// One run of the job in `dir` (its checkpoints under `dir/runs`); with `fault`, rank 1 dies
/// after step [`DIES_AFTER`]. Returns the launcher logs.
fn run(dir: &Path, shape: Shape, fault: bool) -> String {
    std::fs::write(dir.join("job.yaml"), config()).unwrap();
    let port = common::free_port().to_string();
    let (nodes, nproc) = match shape {
        Shape::OnePodOfTwo => (1, 2),
        Shape::TwoPodsOfOne => (2, 1),
    };
    let mut launchers: Vec<ProcessGroup> = (0..nodes)
        .map(|node| {
            let log = dir.join(format!("node-{node}.log"));
            let mut cmd = common::ferrotrain();
            cmd.arg("launch")
                .arg("--config")
                .arg(dir.join("job.yaml"))
                .args([
                    "--nnodes",
                    &nodes.to_string(),
                    "--node-rank",
                    &node.to_string(),
                ])
                .args(["--nproc-per-node", &nproc.to_string()])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port])
                .args(["--restart-in-place", "--max-restarts", "2"])
                .args(["--spare-ranks", "false", "--stop-grace-seconds", "5"])
                .env("FERROTRAIN_CHECKPOINT_DIR", dir.join("runs"))
                .env("FERROTRAIN_RDZV_TOKEN", "bitwise")
                .env(
                    "FERROTRAIN_TERMINATION_LOG",
                    dir.join(format!("term-{node}")),
                )
                .env("OMP_NUM_THREADS", "1")
                .env_remove("FERROTRAIN_ATTEMPT")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap());
            if fault {
                cmd.env("FERROTRAIN_FAULT_RANK_DIES", dir.join("fault-fired"))
                    .env("FERROTRAIN_FAULT_RANK", "1")
                    .env("FERROTRAIN_FAULT_AFTER_STEP", DIES_AFTER.to_string());
            }
            ProcessGroup::spawn(cmd, Some(log))
        })
        .collect();
    let mut logs = String::new();
    for (node, l) in launchers.iter_mut().enumerate() {
        let status = l.wait(Duration::from_secs(180));
        logs.push_str(&format!("node {node}:\n{}\n", l.log()));
        assert_eq!(status.code(), Some(0), "{shape:?}: {logs}");
    }
    logs
}

fn final_checkpoint(dir: &Path) -> PathBuf {
    dir.join("runs/job").join(format!("step-{STEPS:08}"))
}

fn healed_equals_untouched(shape: Shape) {
    let untouched = tempfile::tempdir().unwrap();
    let healed = tempfile::tempdir().unwrap();
    run(untouched.path(), shape, false);
    let logs = run(healed.path(), shape, true);
    assert!(healed.path().join("fault-fired").exists(), "{logs}");
    assert!(
        logs.contains(&format!("resuming from a peer's state step={DIES_AFTER}")),
        "round 1 healed from rank 0's state of step {DIES_AFTER}: {logs}"
    );
    assert!(logs.contains("round 0 ended: rank 1 (Killed)"), "{logs}");
    for file in ["model.safetensors", "optimizer.safetensors"] {
        let a = std::fs::read(final_checkpoint(untouched.path()).join(file)).unwrap();
        let b = std::fs::read(final_checkpoint(healed.path()).join(file)).unwrap();
        assert!(
            a == b,
            "{shape:?}: {file} of step {STEPS} differs between the untouched and the healed run"
        );
    }
    // Per step, the last loss logged (the healed run logs the step in flight twice).
    let losses = |dir: &Path| common::losses(&dir.join("runs/job"));
    let (a, b) = (losses(untouched.path()), losses(healed.path()));
    assert_eq!(a.len() as u64, STEPS, "{a:?}");
    assert_eq!(a, b, "{shape:?}: the loss at every step");
    eprintln!(
        "{shape:?}: healed at step {DIES_AFTER}; step {STEPS}'s model and optimizer bytes equal"
    );
}

#[test]
fn a_pod_of_two_ranks_healed_from_a_peer_ends_bit_for_bit_as_the_untouched_run() {
    healed_equals_untouched(Shape::OnePodOfTwo);
}

#[test]
fn two_pods_of_one_rank_healed_from_a_peer_end_bit_for_bit_as_the_untouched_run() {
    healed_equals_untouched(Shape::TwoPodsOfOne);
}
