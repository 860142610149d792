//! `ferrotrain launch` with the real trainer on 127.0.0.1: a rank killed with SIGKILL, stopped
//! with SIGSTOP or hung inside a step mid-run makes the launcher restart the ranks in place (a
//! new round) from the state the surviving rank left, losing at most the step in flight (also
//! when the rank serving that state dies while it sends it); a hung rank is blamed from its
//! peers' typed records; a permanent failure is not restarted.
//! On two "nodes" (two launchers) with `--restart-in-place`, a killed rank restarts every
//! rank in a new round without either launcher exiting.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::ProcessGroup;

const CHECKPOINT_EVERY: u64 = 20;
const MAX_STEPS: u64 = 240;
/// Long enough that the job still trains when the next round's spares start, 3 s into round
/// 0 (240 steps take about 3 s on an idle machine).
const IN_PLACE_STEPS: u64 = 1200;
const COLLECTIVE_TIMEOUT: u64 = 5;

fn config(max_steps: u64) -> String {
    common::GangCopyJob {
        seed: 5,
        max_steps,
        train_samples: 4000,
        valid_samples: 32,
        max_tokens: 512,
        global_tokens: None,
        checkpoint_every: CHECKPOINT_EVERY,
        keep_latest: 2,
        collective_timeout_seconds: COLLECTIVE_TIMEOUT,
        log_every: 40,
    }
    .yaml()
}

type Launcher = ProcessGroup;

struct Job {
    dir: tempfile::TempDir,
}

impl Job {
    fn new(config_text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("job.yaml"), config_text).unwrap();
        Job { dir }
    }

    fn launch(&self, nproc: usize) -> Launcher {
        self.launch_with(nproc, &[])
    }

    /// [`Job::launch`] with more environment for the launcher and its ranks.
    fn launch_with(&self, nproc: usize, env: &[(&str, &std::ffi::OsStr)]) -> Launcher {
        let stderr = self.dir.path().join("launch.log");
        let mut cmd = common::ferrotrain();
        cmd.arg("launch")
            .arg("--config")
            .arg(self.dir.path().join("job.yaml"))
            .args(["--nproc-per-node", &nproc.to_string(), "--master-port", "0"])
            .args(["--max-restarts", "2", "--restart-backoff-seconds", "0.2"])
            .args(["--stop-grace-seconds", "3"])
            .arg("--recovery-file")
            .arg(self.recovery_file())
            .env("FERROTRAIN_CHECKPOINT_DIR", self.dir.path().join("runs"))
            .env(
                "FERROTRAIN_TERMINATION_LOG",
                self.dir.path().join("termination-log"),
            )
            .env("OMP_NUM_THREADS", "1")
            .env_remove("FERROTRAIN_RDZV_TOKEN")
            .env_remove("FERROTRAIN_ATTEMPT")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (name, value) in env {
            cmd.env(name, value);
        }
        ProcessGroup::spawn(cmd, Some(stderr))
    }

    fn recovery_file(&self) -> PathBuf {
        self.dir.path().join("recovery.json")
    }

    fn recovery(&self) -> ferrotrain_api::Recovery {
        let text = std::fs::read_to_string(self.recovery_file()).expect("the recovery file");
        serde_json::from_str(&text).expect("a recovery ledger")
    }

    fn job_dir(&self) -> PathBuf {
        self.dir.path().join("runs").join("job")
    }

    /// Steps logged by rank 0, in order (a restart logs steps again from its resume point).
    fn logged_steps(&self) -> Vec<u64> {
        steps_logged_in(&self.job_dir())
    }

    fn termination_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("termination-log")).unwrap_or_default()
    }
}

/// The pid of the launcher's child with RANK=`rank` in round `round`, if running (or, for a
/// later round, the spare waiting to become it: its environment names that round).
fn rank_pid(launcher: i32, rank: usize, round: u64) -> Option<i32> {
    child_with(
        launcher,
        &[format!("RANK={rank}"), format!("FERROTRAIN_ROUND={round}")],
    )
}

/// The pid of the launcher's child whose environment holds every one of `vars`.
/// The process name of `pid` (/proc/PID/comm), empty once it is gone.
fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

fn child_with(launcher: i32, vars: &[String]) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ..."; comm may contain spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid != Some(launcher) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let env: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        if vars.iter().all(|v| env.contains(&v.as_bytes())) {
            return Some(pid);
        }
    }
    None
}

fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The steps rank 0 logged in `job_dir`'s train log, in order (a restart logs steps again
/// from its resume point).
fn steps_logged_in(job_dir: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(job_dir.join("train-log.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("loss").is_some())
        .filter_map(|v| v.get("step").and_then(|s| s.as_u64()))
        .collect()
}

/// Steps trained twice because of a restart that resumed from step `resumed_from`: (the last
/// step logged before it, how many of them were logged again). None are when it resumed from
/// the last step trained: a rank killed while rank 0 writes checkpoint S waits in step S+1's
/// all-reduce, so rank 0 finishes the checkpoint and fails only at S+1; the log then runs on
/// from S without a step logged twice.
fn steps_lost(steps: &[u64], resumed_from: u64) -> (u64, u64) {
    if let Some(restart) = steps.windows(2).position(|w| w[1] <= w[0]) {
        let before = steps[restart];
        return (before, before - (steps[restart + 1] - 1));
    }
    let at = steps.iter().position(|&s| s == resumed_from);
    assert!(
        at.is_some_and(|i| steps.get(i + 1) == Some(&(resumed_from + 1))),
        "no step logged twice, so the restart resumed from the last step trained, \
         {resumed_from}, and the log goes on with the next: {steps:?}"
    );
    (resumed_from, 0)
}

/// The step the last "resuming from ..." line (a peer's state or a checkpoint) of a
/// launcher's log names.
fn resumed_from_in_log(log: &str) -> u64 {
    log.lines()
        .rev()
        .filter(|l| l.contains("resuming from "))
        .find_map(|l| {
            let digits = l.split(" step=").nth(1)?;
            let end = digits.find(|c: char| !c.is_ascii_digit())?;
            digits[..end].parse().ok()
        })
        .unwrap_or_else(|| panic!("no resume in the log:\n{log}"))
}

/// Once training is past the first checkpoints (step 50), well before the end, sends
/// `signal` to rank 1 of round 0; returns when.
fn signal_rank_1_past_step_50(job: &Job, launcher: &Launcher, signal: i32) -> Instant {
    wait_for("training to pass step 50", Duration::from_secs(60), || {
        job.logged_steps()
            .last()
            .is_some_and(|&s| s >= 50)
            .then_some(())
    });
    let victim = rank_pid(launcher.pid(), 1, 0).expect("rank 1 of round 0 runs");
    let hit = Instant::now();
    // SAFETY: signalling a rank process the launcher started for this test.
    unsafe {
        libc::kill(victim, signal);
    }
    hit
}

fn interrupt_and_recover(signal: i32) {
    let job = Job::new(&config(MAX_STEPS));
    let mut launcher = job.launch(2);
    let hit = signal_rank_1_past_step_50(&job, &launcher, signal);
    // The ranks come back in place as round 1 of the same attempt.
    wait_for("the restart", Duration::from_secs(30), || {
        launcher
            .log()
            .contains("agent: round 1: started 2 rank(s)")
            .then_some(())
    });
    let restarted_after = hit.elapsed();
    let status = launcher.wait(Duration::from_secs(90));
    let log = launcher.log();
    assert_eq!(status.code(), Some(0), "launch failed:\n{log}");

    let steps = job.logged_steps();
    assert_eq!(*steps.last().unwrap(), MAX_STEPS, "{log}");
    let (before, lost) = steps_lost(&steps, resumed_from_in_log(&log));
    assert!(before >= 50, "{steps:?}");
    // Rank 0 survived and left its state: only the step in flight is trained again, not the
    // steps since the last checkpoint.
    assert!(
        lost <= 1,
        "lost {lost} steps (the step in flight at most)\n{log}"
    );
    assert!(log.contains("restarting in place"), "{log}");
    assert!(log.contains("resuming from a peer's state"), "{log}");
    assert!(!log.contains("resuming from checkpoint"), "{log}");
    eprintln!(
        "signal {signal}: restarted after {restarted_after:?}, {lost} steps redone (killed at \
         step {before})"
    );
    // The restart's reason is in the launcher's log; its termination message, once the run
    // finished, is rank 0's final report.
    let report = ferrotrain_api::Progress::from_termination_message(&job.termination_log());
    assert_eq!(
        report.as_ref().map(|r| r.step),
        Some(MAX_STEPS),
        "{}",
        job.termination_log()
    );
    // Both ranks' resources reached rank 0 with the step's all-reduce (every logEverySteps).
    let gang = report
        .and_then(|r| r.gang_resources)
        .expect("gang resources");
    assert_eq!(gang.ranks, 2, "{gang:?}");
    let rss = gang.rss_bytes.expect("resident memory");
    assert!(rss.min > 10e6 && rss.max < 4e9, "{rss:?}");
    let cpu = gang.cpu_utilization.expect("CPU utilisation");
    assert!(cpu.max > 0.0 && cpu.max < 64.0, "{cpu:?}");
    assert!(gang.gpu_utilization.is_none(), "no GPU here");
    check_the_ledger(&job.recovery(), signal, before, lost);
    let reason = log;
    if signal == libc::SIGSTOP {
        // Nobody died: the launcher saw rank 1 stopped for 1 s, before any collective timeout.
        assert!(
            restarted_after >= Duration::from_secs(1)
                && restarted_after < Duration::from_secs(COLLECTIVE_TIMEOUT),
            "{restarted_after:?}"
        );
        assert!(reason.contains("rank 1 (Frozen)"), "{reason}");
    } else {
        assert!(restarted_after < Duration::from_secs(COLLECTIVE_TIMEOUT + 10));
        assert!(
            reason.contains("rank 1") && reason.contains("signal 9"),
            "{reason}"
        );
    }
}

/// The launcher's ledger agrees with rank 0's own log: the round that failed, the step the
/// next resumed from, the steps lost (the ledger sees rank 0's progress file, up to a second
/// old, so it may count fewer), and it adds the times and the goodput.
fn check_the_ledger(r: &ferrotrain_api::Recovery, signal: i32, before: u64, lost: u64) {
    for line in ferrotrain_launch::recovery_lines(r) {
        eprintln!("ledger: {line}");
    }
    use ferrotrain_api::recovery::EndCause;
    assert_eq!(r.attempts.len(), 2, "{r:#?}");
    let (a0, a1) = (&r.attempts[0], &r.attempts[1]);
    assert_eq!(
        (a0.attempt, a0.round, a1.attempt, a1.round),
        (0, Some(0), 0, Some(1)),
        "one attempt, two rounds: {r:#?}"
    );
    let end = a0.end.as_ref().expect("round 0 ended");
    assert_eq!(end.cause, EndCause::Failure, "{r:#?}");
    if signal == libc::SIGKILL {
        assert_eq!(
            (end.rank, end.exit_code),
            (Some(1), Some(128 + 9)),
            "{r:#?}"
        );
    }
    assert_eq!(a1.resumed_from_step, Some(before - lost), "{r:#?}");
    let seen = a0.last_step.expect("round 0's steps were seen");
    assert!(seen <= before && seen >= 50, "{r:#?}");
    assert_eq!(a0.lost_steps, Some(seen - (before - lost)), "{r:#?}");
    assert_eq!(a1.end.as_ref().map(|e| e.cause), Some(EndCause::Succeeded));
    assert_eq!(a1.last_step, Some(MAX_STEPS));
    let first = a1.seconds_to_first_step().expect("round 1 stepped");
    assert!(first < 30.0, "{first}");
    assert!(r.mean_detect_seconds.unwrap() < 1.0, "{r:#?}");
    let recovery = r.mean_recovery_seconds.expect("a recovery time");
    assert!(recovery >= first, "{r:#?}");
    let goodput = r.goodput_percent.expect("goodput");
    assert!(goodput > 0.0 && goodput < 100.0, "{r:#?}");
    assert!(r.productive_seconds < r.total_seconds, "{r:#?}");
}

#[test]
fn a_killed_rank_restarts_the_group_from_the_survivors_state() {
    interrupt_and_recover(libc::SIGKILL);
}

#[test]
fn a_stopped_rank_is_detected_by_the_collective_timeout_and_the_group_recovers() {
    interrupt_and_recover(libc::SIGSTOP);
}

/// Rank 1 hangs inside a step (a fault armed in the debug build: it sleeps before its
/// exchange, deaf to signals and not stopped, so its launcher cannot see it frozen). Rank 0
/// times out in the all-reduce and records the silent peer as a number; the launcher blames
/// rank 1 `Unresponsive` from that record within the collective timeout and 2 s, stops the
/// hung rank without waiting out the stop grace, and the next round heals from rank 0.
#[test]
fn a_hung_rank_is_blamed_unresponsive_from_its_peers_record_within_the_collective_timeout() {
    let job = Job::new(&config(MAX_STEPS));
    let marker = job.dir.path().join("hang-began");
    let mut launcher = job.launch_with(
        2,
        &[
            ("FERROTRAIN_FAULT_RANK_HANGS", marker.as_os_str()),
            ("FERROTRAIN_FAULT_AFTER_STEP", "50".as_ref()),
        ],
    );
    let status = launcher.wait(Duration::from_secs(120));
    let log = launcher.log();
    assert_eq!(status.code(), Some(0), "launch failed:\n{log}");
    let hung_at = std::fs::metadata(&marker)
        .and_then(|m| m.modified())
        .expect("the fault fired");
    let hung_at = ferrotrain_api::recovery::Timestamp::try_from(hung_at).unwrap();
    assert!(
        log.contains("round 0 ended: rank 1 (Unresponsive)"),
        "{log}"
    );
    let r = job.recovery();
    let end = r.attempts[0].end.clone().expect("round 0 ended");
    assert_eq!(
        (end.reason.as_str(), end.rank),
        ("Unresponsive", Some(1)),
        "{r:#?}"
    );
    let detected = end.detected_at.duration_since(hung_at).as_secs_f64();
    let next_step = r.attempts[1].first_step_at.expect("round 1 stepped");
    let to_step = next_step.duration_since(hung_at).as_secs_f64();
    eprintln!(
        "hang of rank 1: blamed Unresponsive {detected:.2} s after it began (collective \
         timeout {COLLECTIVE_TIMEOUT} s), round 1's first step {to_step:.2} s after it"
    );
    let limit = COLLECTIVE_TIMEOUT as f64 + 2.0;
    assert!(
        detected >= COLLECTIVE_TIMEOUT as f64 - 0.5 && detected <= limit,
        "blamed {detected:.2} s after the hang began (limit {limit} s): {r:#?}"
    );
    // The hung rank was stopped within the short grace, not the 3 s stop grace plus.
    assert!(
        to_step < limit + 3.0,
        "round 1 stepped {to_step:.2} s after the hang: {r:#?}"
    );
    assert_eq!(
        r.attempts[1].healed_from,
        Some(ferrotrain_api::recovery::HealedFrom::Peers),
        "{r:#?}"
    );
    let steps = job.logged_steps();
    let (_, lost) = steps_lost(&steps, resumed_from_in_log(&log));
    assert!(lost <= 1, "lost {lost} steps\n{log}");
}

/// The rank that serves the next round its state dies after the header, before the state
/// (a fault armed in the debug build): the ranks that got half a transfer fail before they
/// train (nothing of theirs is left or trained), and the round after heals from the same
/// snapshot. Nothing is trained twice beyond the step in flight of the first failure.
#[test]
fn a_source_that_dies_mid_transfer_leaves_no_half_state_and_the_next_round_heals() {
    let job = Job::new(&config(MAX_STEPS));
    let marker = job.dir.path().join("fault-fired");
    let mut launcher = job.launch_with(
        2,
        &[("FERROTRAIN_FAULT_HEAL_SOURCE_DIES", marker.as_os_str())],
    );
    signal_rank_1_past_step_50(&job, &launcher, libc::SIGKILL);
    let status = launcher.wait(Duration::from_secs(120));
    let log = launcher.log();
    assert_eq!(status.code(), Some(0), "launch failed:\n{log}");
    assert!(marker.exists(), "the fault fired:\n{log}");
    assert!(
        log.contains("fault injected: the heal source dies"),
        "{log}"
    );
    // Round 1 died healing, before any rank of it took the state up (each logs it once it
    // holds it, checked); round 2's two ranks healed from the snapshot round 1 was sent.
    let lines: Vec<&str> = log.lines().collect();
    let fault = lines
        .iter()
        .position(|l| l.contains("fault injected"))
        .unwrap();
    let healed: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("resuming from a peer's state"))
        .collect();
    assert_eq!(healed.len(), 2, "round 2's two ranks:\n{log}");
    assert!(
        healed.iter().all(|&i| i > fault),
        "no heal before the fault:\n{log}"
    );
    assert!(!log.contains("resuming from checkpoint"), "{log}");
    let steps = job.logged_steps();
    assert_eq!(*steps.last().unwrap(), MAX_STEPS, "{log}");
    let (before, lost) = steps_lost(&steps, resumed_from_in_log(&log));
    assert!(
        lost <= 1,
        "lost {lost} steps (killed at step {before})\n{log}"
    );
    let r = job.recovery();
    assert_eq!(r.attempts.len(), 3, "{r:#?}");
    assert_eq!(
        r.attempts[1].first_step_at, None,
        "round 1 never trained: {r:#?}"
    );
}

#[test]
fn an_invalid_config_is_not_restarted() {
    let job = Job::new(&config(MAX_STEPS).replace("heads: 2", "heads: 3"));
    let mut launcher = job.launch(2);
    let status = launcher.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{}", launcher.log());
    assert!(!launcher.log().contains("restarting in place"));
    assert!(!job.termination_log().is_empty());
}

/// Two launchers (nodes 0 and 1 of one rank each) with --restart-in-place on 127.0.0.1.
fn launch_node(job: &Job, node: usize, port: u16) -> Launcher {
    launch_node_with(job, node, port, &[])
}

/// [`launch_node`] with `extra` flags.
fn launch_node_with(job: &Job, node: usize, port: u16, extra: &[&str]) -> Launcher {
    let stderr = job.dir.path().join(format!("node-{node}.log"));
    let mut cmd = common::ferrotrain();
    cmd.arg("launch")
        .arg("--config")
        .arg(job.dir.path().join("job.yaml"))
        .args(["--nnodes", "2", "--node-rank", &node.to_string()])
        .args([
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port.to_string(),
        ])
        .args(["--restart-in-place", "--max-restarts", "2"])
        .args([
            "--stop-grace-seconds",
            "3",
            "--rendezvous-timeout-seconds",
            "30",
        ])
        .args(extra)
        .arg("--recovery-file")
        .arg(job.dir.path().join(format!("recovery-{node}.json")))
        .env(
            "FERROTRAIN_CHECKPOINT_DIR",
            job.dir.path().join(format!("runs-{node}")),
        )
        .env(
            "FERROTRAIN_TERMINATION_LOG",
            job.dir.path().join(format!("termination-{node}")),
        )
        .env("FERROTRAIN_RDZV_TOKEN", "in-place-test")
        .env("OMP_NUM_THREADS", "1")
        .env_remove("FERROTRAIN_ATTEMPT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap());
    ProcessGroup::spawn(cmd, Some(stderr))
}

#[test]
fn in_place_a_killed_rank_restarts_every_rank_in_a_new_round_and_resumes() {
    let job = Job::new(&config(IN_PLACE_STEPS));
    let port = common::free_port();
    let mut node0 = launch_node(&job, 0, port);
    let mut node1 = launch_node(&job, 1, port);
    let steps = || steps_logged_in(&job.dir.path().join("runs-0/job"));
    wait_for("training to pass step 50", Duration::from_secs(90), || {
        steps().last().is_some_and(|&s| s >= 50).then_some(())
    });
    let round = |r: u64| vec!["RANK=1".to_string(), format!("FERROTRAIN_ROUND={r}")];
    let victim = child_with(node1.pid(), &round(0)).expect("rank 1 of round 0 runs");
    // Seconds into round 0, node 1's agent starts a spare for round 1: a loaded trainer that
    // waits, under its own name, to become rank 1 of the next round.
    let spare = wait_for(
        "rank 1's spare for round 1",
        Duration::from_secs(30),
        || child_with(node1.pid(), &round(1)).filter(|&pid| comm(pid) == "ft-spare"),
    );
    let node0_pid = node0.pid();
    let killed_at = ferrotrain_api::recovery::Timestamp::now();
    // SAFETY: signalling a rank process the launcher started for this test.
    unsafe {
        libc::kill(victim, libc::SIGKILL);
    }
    wait_for("rank 1 of round 1", Duration::from_secs(30), || {
        (comm(spare) == "ferrotrain").then_some(())
    });
    let (s0, s1) = (
        node0.wait(Duration::from_secs(120)),
        node1.wait(Duration::from_secs(30)),
    );
    let logs = format!("node 0:\n{}\nnode 1:\n{}", node0.log(), node1.log());
    assert_eq!((s0.code(), s1.code()), (Some(0), Some(0)), "{logs}");
    assert_eq!(node0.pid(), node0_pid, "the launchers never exited mid-run");
    for log in [node0.log(), node1.log()] {
        assert!(
            log.contains("round 1: started 1 rank(s), 1 of them spares"),
            "every node's round 1 ran on its spare: {logs}"
        );
    }
    let steps = steps();
    assert_eq!(*steps.last().unwrap(), IN_PLACE_STEPS, "{logs}");
    // Node 0's ledger has one record per round.
    let text = std::fs::read_to_string(job.dir.path().join("recovery-0.json")).unwrap();
    let r: ferrotrain_api::Recovery = serde_json::from_str(&text).unwrap();
    let resumed_from = r.attempts.get(1).and_then(|a| a.resumed_from_step);
    let (before, lost) = steps_lost(&steps, resumed_from.expect("round 1 resumed"));
    assert!(
        lost <= 1,
        "lost {lost} steps at {before}: more than the step in flight\n{logs}"
    );
    assert!(
        node0.log().contains("resuming from a peer's state"),
        "{logs}"
    );
    assert_eq!(r.attempts.len(), 2, "{r:#?}");
    let end = r.attempts[0].end.clone().expect("round 0 ended");
    assert_eq!(
        (end.reason.as_str(), end.rank, end.exit_code),
        ("Killed", Some(1), Some(137)),
        "{r:#?}"
    );
    let first = r.attempts[1].first_step_at.expect("round 1 stepped");
    let to_step = first.duration_since(killed_at).as_secs_f64();
    eprintln!(
        "in place: kill -9 of rank 1 at step {before}; round 1's first step {to_step:.2} s later; {lost} steps redone"
    );
    assert!(to_step > 0.0 && to_step < 20.0, "{to_step}");
    assert_eq!(
        r.attempts[1].resumed_from_step,
        Some(before - lost),
        "{r:#?}"
    );
}

/// Stops (or continues) a launcher and every process it started.
fn signal_tree(launcher: i32, signal: i32) {
    let children = std::process::Command::new("pgrep")
        .args(["-P", &launcher.to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let pids =
        std::iter::once(launcher).chain(children.lines().filter_map(|l| l.trim().parse().ok()));
    for pid in pids {
        // SAFETY: signalling processes this test started.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

#[test]
fn in_place_a_lost_node_ends_the_round_and_the_survivor_goes_on_from_its_own_state() {
    // Elastic, with a short heartbeat timeout: node 1 freezes whole (its launcher and its
    // rank), as a partition looks from node 0. Rank 0 waits in a collective that cannot
    // complete; told to abandon it, it leaves its state, and the next round (node 0 alone)
    // starts from it instead of the last checkpoint.
    let job = Job::new(&config(IN_PLACE_STEPS));
    let port = common::free_port();
    let flags = [
        "--min-nodes",
        "1",
        "--elastic-wait-seconds",
        "1",
        "--heartbeat-timeout-seconds",
        "3",
    ];
    let mut node0 = launch_node_with(&job, 0, port, &flags);
    let mut node1 = launch_node_with(&job, 1, port, &flags);
    let steps = || steps_logged_in(&job.dir.path().join("runs-0/job"));
    wait_for("training to pass step 50", Duration::from_secs(90), || {
        steps().last().is_some_and(|&s| s >= 50).then_some(())
    });
    signal_tree(node1.pid(), libc::SIGSTOP);
    let resumed = wait_for("node 0 alone in round 1", Duration::from_secs(60), || {
        let log = node0.log();
        log.contains("resuming from a peer's state").then_some(log)
    });
    assert!(
        resumed.contains("heal: left the state of step"),
        "{resumed}"
    );
    signal_tree(node1.pid(), libc::SIGCONT);
    let (s0, s1) = (
        node0.wait(Duration::from_secs(120)),
        node1.wait(Duration::from_secs(60)),
    );
    let logs = format!("node 0:\n{}\nnode 1:\n{}", node0.log(), node1.log());
    assert_eq!(s0.code(), Some(0), "{logs}");
    assert!(matches!(s1.code(), Some(0 | 1)), "{logs}");
    let text = std::fs::read_to_string(job.dir.path().join("recovery-0.json")).unwrap();
    let r: ferrotrain_api::Recovery = serde_json::from_str(&text).unwrap();
    let end = r.attempts[0].end.clone().expect("round 0 ended");
    assert_eq!(
        (end.reason.as_str(), end.rank),
        ("AgentLost", Some(1)),
        "{r:#?}"
    );
    assert_eq!(
        r.attempts[1].healed_from,
        Some(ferrotrain_api::recovery::HealedFrom::Peers),
        "{r:#?}"
    );
    assert!(r.attempts[0].lost_steps.unwrap_or(99) <= 1, "{r:#?}");
    assert_eq!(*steps().last().unwrap(), IN_PLACE_STEPS, "{logs}");
}
