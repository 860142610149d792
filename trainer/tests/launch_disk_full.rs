//! A disk that refuses writes, for real: a small tmpfs under the checkpoints, or under a
//! pod's heal directory (a memory-backed /dev/shm-like volume), filled by a ballast file as
//! another writer would fill it. Mounting one needs root (CI runs as root); each test skips,
//! saying so loudly, only when it does not run as root.
//!
//! - The checkpoint volume full mid-run: saves fail, training goes on, the progress report and
//!   /metrics say so, nothing a failed save wrote is left, and once space is freed the next save
//!   completes and the report clears.
//! - The volume full for the last save: the round ends with a retryable error instead of
//!   finishing without the checkpoint of its last step; the next round resumes from the
//!   rank's own state of that step and saves it once there is room: no step trained twice.
//! - The heal directory full: the surviving rank leaves nothing (not half a state), and the
//!   next round starts from another rank's state, or from the checkpoint when no rank has one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::tmpfs::Tmpfs;
use common::{Guard, ProcessGroup, http_get, progress, wait_until};
use serde_json::Value;

/// A checkpoint of the small copy model takes about 276 KB: the ballast leaves less.
const LESS_THAN_A_CHECKPOINT: u64 = 200 << 10;

/// GET `path` from 127.0.0.1:`port`: the body of a 200.
/// The value of the series `name` in an OpenMetrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The `.tmp-step-*` directories in `dir`, by step.
fn temp_steps(dir: &Path) -> Vec<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix(".tmp-step-")?.get(..8)?.parse().ok()
        })
        .collect()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling the child this test started (and has not reaped).
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

#[test]
fn a_full_checkpoint_volume_costs_saves_not_the_run_and_the_first_save_after_space_is_freed_clears_it()
 {
    let Some(volume) = Tmpfs::mount(
        4 << 20,
        "a_full_checkpoint_volume_costs_saves_not_the_run_and_the_first_save_after_space_is_freed_clears_it",
    ) else {
        return;
    };
    const STEPS: u64 = 1500;
    let tmp = tempfile::tempdir().unwrap();
    let config = common::write(
        tmp.path(),
        "copy.yaml",
        &common::copy_config(STEPS, 10, "tensorboard: {enabled: false}\n"),
    );
    let ballast = volume.fill("ballast", LESS_THAN_A_CHECKPOINT);
    let log = tmp.path().join("stderr.log");
    let progress_file = tmp.path().join("progress.json");
    let mut cmd = common::run_command(&config, volume.path());
    cmd.args(["--metrics-port", "0"])
        .env("FERROTRAIN_PROGRESS_FILE", &progress_file)
        .stderr(std::fs::File::create(&log).unwrap());
    let mut trainer = Guard::spawn(cmd);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut port = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            port = read_log()
                .split("addr=0.0.0.0:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
            port.is_some()
        }),
        "no metrics address:\n{}",
        read_log()
    );
    let port: u16 = port.unwrap();

    // Three saves refused in a row, and the run trains on.
    let mut report = Value::Null;
    let mut ended = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            report = progress(port).unwrap_or_default();
            ended = trainer.0.as_mut().unwrap().try_wait().unwrap();
            ended.is_some() || report["checkpointError"]["failedSaves"].as_u64() >= Some(3)
        }) && ended.is_none(),
        "no checkpointError with 3 failed saves (ended: {ended:?}, last report {report}):\n{}",
        read_log()
    );
    let failures = http_get(port, "/metrics").expect("a scrape");
    signal(trainer.id(), libc::SIGSTOP);
    let error = &report["checkpointError"];
    let failed_step = error["step"].as_u64().unwrap();
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{error}"
    );
    assert!(report["step"].as_u64() >= Some(failed_step), "{report}");
    assert!(report.get("lastCheckpoint").is_none(), "{report}");
    assert!(
        metric(&failures, "ferrotrain_checkpoint_save_failures_total") >= Some(3.0),
        "{failures}"
    );
    assert!(
        metric(
            &failures,
            "ferrotrain_checkpoint_error_since_timestamp_seconds"
        )
        .is_some(),
        "{failures}"
    );
    // What the failed saves wrote is given back: only a save begun since may be there.
    let job = volume.path().join("copy");
    let temps = temp_steps(&job);
    assert!(
        temps.iter().all(|&s| s > failed_step),
        "a failed save's temporary directory is left: {temps:?} (failed at {failed_step})"
    );

    std::fs::remove_file(ballast).unwrap();
    signal(trainer.id(), libc::SIGCONT);
    let status = trainer
        .wait_timeout(Duration::from_secs(120))
        .expect("the run ends");
    assert_eq!(status.code(), Some(0), "{}", read_log());

    let text = std::fs::read_to_string(&progress_file).unwrap();
    let last: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(last["phase"], "finished", "{last}");
    assert_eq!(
        last["lastCheckpoint"]["step"].as_u64(),
        Some(STEPS),
        "{last}"
    );
    assert!(last.get("checkpointError").is_none(), "cleared: {last}");
    assert!(last["checkpointSaveFailures"].as_u64() >= Some(3), "{last}");
    let log = read_log();
    assert!(
        log.contains(&format!("checkpoint of step {failed_step} not saved")),
        "{log}"
    );
    assert!(temp_steps(&job).is_empty(), "{:?}", temp_steps(&job));
    let steps: Vec<u64> = common::losses(&job).iter().map(|l| l.0).collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "every step trained");
}

/// `--nnodes` launchers of one rank each, restarting in place, checkpoints under `ckpt`,
/// node `n`'s heal directory `heal[n]`; with `dies`, that rank dies after step `DIES_AFTER`
/// (a fault armed in the debug build).
struct Gang<'a> {
    dir: &'a Path,
    ckpt: &'a Path,
    heal: Vec<PathBuf>,
    dies: Option<usize>,
}

const DIES_AFTER: u64 = 40;

impl Gang<'_> {
    fn config(max_steps: u64, checkpoint_every: u64) -> String {
        common::GangCopyJob {
            seed: 5,
            max_steps,
            train_samples: 2000,
            valid_samples: 16,
            max_tokens: 256,
            global_tokens: None,
            checkpoint_every,
            keep_latest: 2,
            collective_timeout_seconds: 10,
            log_every: 10,
        }
        .yaml()
    }

    fn start(&self, config: &str) -> Vec<ProcessGroup> {
        std::fs::write(self.dir.join("job.yaml"), config).unwrap();
        let port = common::free_port().to_string();
        let nodes = self.heal.len();
        (0..nodes)
            .map(|node| {
                let log = self.dir.join(format!("node-{node}.log"));
                let mut cmd = common::ferrotrain();
                cmd.arg("launch")
                    .arg("--config")
                    .arg(self.dir.join("job.yaml"))
                    .args(["--nnodes", &nodes.to_string()])
                    .args(["--node-rank", &node.to_string(), "--nproc-per-node", "1"])
                    .args(["--master-addr", "127.0.0.1", "--master-port", &port])
                    .args(["--restart-in-place", "--max-restarts", "3"])
                    .args(["--spare-ranks", "false", "--stop-grace-seconds", "5"])
                    .args(["--restart-backoff-seconds", "0.5"])
                    .env("FERROTRAIN_CHECKPOINT_DIR", self.ckpt)
                    .env("FERROTRAIN_HEAL_DIR", &self.heal[node])
                    .env("FERROTRAIN_RDZV_TOKEN", "disk-full")
                    .env(
                        "FERROTRAIN_TERMINATION_LOG",
                        self.dir.join(format!("term-{node}")),
                    )
                    .env("OMP_NUM_THREADS", "1")
                    .env_remove("FERROTRAIN_ATTEMPT")
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap());
                if let Some(rank) = self.dies {
                    cmd.env("FERROTRAIN_FAULT_RANK_DIES", self.dir.join("fault-fired"))
                        .env("FERROTRAIN_FAULT_RANK", rank.to_string())
                        .env("FERROTRAIN_FAULT_AFTER_STEP", DIES_AFTER.to_string());
                }
                ProcessGroup::spawn(cmd, Some(log))
            })
            .collect()
    }

    /// Waits for every launcher to succeed; their logs.
    fn finish(launchers: &mut [ProcessGroup]) -> String {
        let mut logs = String::new();
        let mut codes = Vec::new();
        for (node, l) in launchers.iter_mut().enumerate() {
            codes.push(l.wait(Duration::from_secs(120)).code());
            logs.push_str(&format!("node {node}:\n{}\n", l.log()));
        }
        assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}: {logs}");
        logs
    }
}

#[test]
fn the_last_checkpoint_refused_by_a_full_volume_is_saved_by_the_next_round_from_the_ranks_own_state()
 {
    let Some(volume) = Tmpfs::mount(
        2 << 20,
        "the_last_checkpoint_refused_by_a_full_volume_is_saved_by_the_next_round_from_the_ranks_own_state",
    ) else {
        return;
    };
    const STEPS: u64 = 150;
    let tmp = tempfile::tempdir().unwrap();
    let gang = Gang {
        dir: tmp.path(),
        ckpt: volume.path(),
        heal: vec![tmp.path().join("heal")],
        dies: None,
    };
    let ballast = volume.fill("ballast", LESS_THAN_A_CHECKPOINT);
    // No periodic save: the last step's is the run's only one.
    let mut launchers = gang.start(&Gang::config(STEPS, 0));
    assert!(
        wait_until(Duration::from_secs(60), || launchers[0]
            .log()
            .contains("No space left on device")),
        "{}",
        launchers[0].log()
    );
    std::fs::remove_file(ballast).unwrap();
    let logs = Gang::finish(&mut launchers);
    let job = volume.path().join("job");
    let lines = common::loss_lines(&job);
    assert_eq!(
        lines.iter().map(|l| l.0).collect::<Vec<_>>(),
        (1..=STEPS).collect::<Vec<_>>(),
        "each step trained once: {logs}"
    );
    assert!(
        logs.contains(&format!("resuming from a peer's state step={STEPS}")),
        "the next round resumed from the state of step {STEPS}: {logs}"
    );
    let refused = format!("the checkpoint of the last step ({STEPS}) was not saved");
    assert!(logs.contains(&refused), "{logs}");
    assert!(job.join(format!("step-{STEPS:08}/trainer.json")).exists());
    assert!(temp_steps(&job).is_empty(), "{:?}", temp_steps(&job));
}

/// The surviving ranks leave their state when rank `dies` dies; node 0's heal directory is
/// too small for it. Returns the logs and node 0's heal directory's entries.
fn heal_dir_full(nodes: usize, test: &str) -> Option<(String, Vec<String>)> {
    // The state of the copy model is about 270 KB: the write starts, then runs out of room.
    let full = Tmpfs::mount(128 << 10, test)?;
    let tmp = tempfile::tempdir().unwrap();
    let mut heal = vec![full.path().to_path_buf()];
    heal.extend((1..nodes).map(|n| tmp.path().join(format!("heal-{n}"))));
    let gang = Gang {
        dir: tmp.path(),
        ckpt: &tmp.path().join("runs"),
        heal,
        dies: Some(nodes - 1),
    };
    let mut launchers = gang.start(&Gang::config(80, 30));
    let logs = Gang::finish(&mut launchers);
    assert!(tmp.path().join("fault-fired").exists(), "{logs}");
    assert!(logs.contains("heal: no state left"), "{logs}");
    let left = std::fs::read_dir(full.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let lines = common::loss_lines(&tmp.path().join("runs/job"));
    assert_eq!(lines.last().map(|l| l.0), Some(80), "{logs}");
    Some((logs, left))
}

#[test]
fn a_full_heal_directory_leaves_no_state_and_the_next_round_starts_from_another_ranks() {
    let Some((logs, left)) = heal_dir_full(
        3,
        "a_full_heal_directory_leaves_no_state_and_the_next_round_starts_from_another_ranks",
    ) else {
        return;
    };
    assert_eq!(left, Vec::<String>::new(), "nothing half written");
    assert!(
        logs.contains(&format!(
            "resuming from a peer's state step={DIES_AFTER} rank=1"
        )),
        "rank 1 (whose directory had room) is the source: {logs}"
    );
}

#[test]
fn a_full_heal_directory_leaves_no_state_and_the_next_round_starts_from_the_checkpoint() {
    let Some((logs, left)) = heal_dir_full(
        2,
        "a_full_heal_directory_leaves_no_state_and_the_next_round_starts_from_the_checkpoint",
    ) else {
        return;
    };
    assert_eq!(left, Vec::<String>::new(), "nothing half written");
    assert!(
        logs.contains("resuming from checkpoint step=30"),
        "no rank left a state: {logs}"
    );
    assert!(!logs.contains("resuming from a peer's state"), "{logs}");
}
