//! `ferrotrain launch` with a fake rank program (a shell script): the env contract each rank
//! gets, a single node's restarts in place (rounds), permanent codes, multi-node behaviour
//! without in-place restarts, SIGTERM/SIGKILL of the survivors and signal forwarding. Fast:
//! no libtorch in the ranks.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::ProcessGroup;

type Launcher = ProcessGroup;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// Ranks that record their start as `start-<rank>-<round>` (a single node's launcher runs
    /// rounds).
    fn new(script_body: &str) -> Self {
        Self::keyed("FERROTRAIN_ROUND", script_body)
    }

    /// Ranks that record their start as `start-<rank>-<$key>`.
    fn keyed(key: &str, script_body: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        common::fake_ranks(
            dir.path(),
            "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT \
             $FERROTRAIN_ATTEMPT $OMP_NUM_THREADS $FERROTRAIN_RDZV_TOKEN $*",
            key,
            script_body,
        );
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `ferrotrain launch` with this fixture's script and a clean env.
    fn command(&self) -> Command {
        let mut cmd = common::ferrotrain();
        cmd.arg("launch")
            .arg("--config")
            .arg(self.path("job.yaml"))
            .arg("--rank-program")
            .arg(self.path("rank.sh"))
            .env("FAKE_OUT", self.dir.path())
            .env(
                "FERROTRAIN_TERMINATION_LOG",
                self.path("launcher.termination-log"),
            );
        for var in [
            "OMP_NUM_THREADS",
            "FERROTRAIN_RDZV_TOKEN",
            "FERROTRAIN_ATTEMPT",
            "NNODES",
            "NODE_RANK",
            "NPROC_PER_NODE",
            "FERROTRAIN_MAX_RESTARTS",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// A single-node launch on a free port with short backoff and grace.
    fn launch(&self, extra: &[&str]) -> Launcher {
        let mut cmd = self.command();
        cmd.args(["--master-port", "0", "--restart-backoff-seconds", "0.2"]);
        if !extra.contains(&"--stop-grace-seconds") {
            cmd.args(["--stop-grace-seconds", "5"]);
        }
        cmd.args(extra);
        let log = self.path("launcher.log");
        cmd.stderr(std::fs::File::create(&log).unwrap());
        ProcessGroup::spawn(cmd, Some(log))
    }

    fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }
}

fn alive(pid_file: &Path) -> bool {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn every_rank_gets_the_env_contract() {
    let f = Fixture::new("exit 0");
    let status = f
        .launch(&["--nproc-per-node", "3", "--", "--extra", "arg"])
        .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    let cores = std::thread::available_parallelism().unwrap().get();
    let omp = (cores / 3).max(1);
    let mut token = None;
    let mut port = None;
    for rank in 0..3 {
        let line = f.read(&format!("start-{rank}-0"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            &fields[..4],
            &[&rank.to_string()[..], &rank.to_string()[..], "3", "3"],
            "{line}"
        );
        assert_eq!(fields[4], "127.0.0.1");
        assert!(fields[5].parse::<u16>().unwrap() > 0);
        assert_eq!(fields[6], "0", "attempt: {line}");
        assert_eq!(fields[7], omp.to_string(), "OMP_NUM_THREADS: {line}");
        assert_eq!(fields[8].len(), 32, "a generated token: {line}");
        assert_eq!(
            &fields[9..],
            &[
                "run",
                "--config",
                f.path("job.yaml").to_str().unwrap(),
                "--extra",
                "arg"
            ]
        );
        // All ranks of the group share the port and the token.
        assert_eq!(*token.get_or_insert(fields[8].to_string()), fields[8]);
        assert_eq!(*port.get_or_insert(fields[5].to_string()), fields[5]);
    }
}

#[test]
fn a_failed_rank_stops_the_others_and_they_restart_in_place_as_the_next_round() {
    let f = Fixture::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) sleep 0.3; echo "rank 1 lost its peer" > "$FERROTRAIN_TERMINATION_LOG"; exit 1;;
  *-0) exec sleep 30;;
  *) exit 0;;
esac"#,
    );
    let start = Instant::now();
    let mut launcher = f.launch(&["--nproc-per-node", "3"]);
    let status = launcher.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    // The sleepers of round 0 were stopped (SIGTERM), not waited for.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    for rank in 0..3 {
        assert!(
            f.exists(&format!("start-{rank}-1")),
            "rank {rank} restarted as round 1"
        );
        assert!(!alive(&f.path(&format!("pid-{rank}-0"))));
    }
    assert!(!f.exists("start-0-2"), "one restart only");
    // Why round 0 ended is in the launcher's log; the run then succeeded, so the pod's
    // termination message holds no failure.
    let log = launcher.log();
    assert!(
        log.contains(
            "round 0 ended: rank 1 (ExitCode): rank 1 exited with code 1: rank 1 lost its peer"
        ),
        "{log}"
    );
    assert_eq!(f.read("launcher.termination-log"), "");
    // The next round is the same attempt, and meets at the same store (the launcher's own)
    // with the same token.
    let a0: Vec<String> = f
        .read("start-0-0")
        .split_whitespace()
        .map(String::from)
        .collect();
    let a1: Vec<String> = f
        .read("start-0-1")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!((&a0[5], &a0[6], &a0[8]), (&a1[5], &a1[6], &a1[8]));
    assert_eq!(a1[6], "0", "attempt 0 still");
}

#[test]
fn a_permanent_exit_code_is_never_restarted() {
    let f = Fixture::new(
        r#"case "$RANK" in
  0) echo "config: maxSteps must be >= 1" > "$FERROTRAIN_TERMINATION_LOG"; exit 2;;
  *) exec sleep 30;;
esac"#,
    );
    let status = f
        .launch(&["--nproc-per-node", "2", "--max-restarts", "5"])
        .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2));
    assert!(!f.exists("start-0-1"));
    let msg = f.read("launcher.termination-log");
    assert!(msg.contains("maxSteps must be >= 1"), "{msg}");
}

#[test]
fn restarts_stop_at_max_restarts_with_the_failure_code() {
    let f = Fixture::new("exit 7");
    let status = f
        .launch(&["--nproc-per-node", "1", "--max-restarts", "2"])
        .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(7));
    assert!(f.exists("start-0-2"));
    assert!(!f.exists("start-0-3"));
    let msg = f.read("launcher.termination-log");
    assert!(msg.contains("exited with code 7"), "{msg}");
}

#[test]
fn multi_node_without_in_place_exits_with_the_failure_and_leaves_restarts_to_the_operator() {
    let f = Fixture::keyed(
        "FERROTRAIN_ATTEMPT",
        r#"case "$RANK" in
  3) sleep 0.2; exit 1;;
  *) exec sleep 30;;
esac"#,
    );
    let mut cmd = f.command();
    cmd.args(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2"])
        .args(["--master-addr", "node-0.example", "--master-port", "29999"])
        .env("FERROTRAIN_RDZV_TOKEN", "operator-token")
        .env("FERROTRAIN_ATTEMPT", "4");
    let mut l = ProcessGroup::spawn(cmd, None);
    let status = l.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1));
    let line = f.read("start-2-4");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &fields[..9],
        &[
            "2",
            "0",
            "4",
            "2",
            "node-0.example",
            "29999",
            "4",
            fields[7],
            "operator-token"
        ]
    );
    assert!(f.exists("start-3-4"));
    assert!(!f.exists("start-2-5"), "no local restart on several nodes");
    assert!(!alive(&f.path("pid-2-4")));
}

#[test]
fn multi_node_needs_a_shared_token() {
    let f = Fixture::new("exit 0");
    let mut cmd = f.command();
    cmd.args([
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-port",
        "29999",
    ]);
    let status = ProcessGroup::spawn(cmd, None).wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(2));
    assert!(!f.exists("start-0-0"));
    assert!(
        f.read("launcher.termination-log")
            .contains("FERROTRAIN_RDZV_TOKEN")
    );
}

#[test]
fn a_rank_ignoring_sigterm_is_killed_after_the_grace() {
    let f = Fixture::new(
        r#"case "$RANK" in
  1) sleep 0.2; exit 1;;
  *) trap '' TERM; exec sleep 30;;
esac"#,
    );
    let start = Instant::now();
    let status = f
        .launch(&[
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            "--stop-grace-seconds",
            "1",
        ])
        .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(!alive(&f.path("pid-0-0")));
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank() {
    let f = Fixture::new("exec sleep 30");
    let mut l = f.launch(&["--nproc-per-node", "2"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(f.exists("pid-0-0") && f.exists("pid-1-0")) {
        assert!(Instant::now() < deadline, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    l.signal(libc::SIGTERM);
    let status = l.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(!alive(&f.path("pid-0-0")));
    assert!(!alive(&f.path("pid-1-0")));
    assert!(
        !f.exists("start-0-1"),
        "a stopped launcher does not restart"
    );
}

#[test]
fn a_replacement_of_the_only_pod_goes_on_with_the_gangs_round_numbers() {
    // The operator creates node 0's replacement with the round its status counts: with no
    // other node to say where the gang left off, the launcher starts there, not at 0.
    let f = Fixture::new("exit 0");
    let mut cmd = f.command();
    cmd.args(["--master-port", "0", "--nproc-per-node", "2"])
        .env("FERROTRAIN_FIRST_ROUND", "4");
    let status = ProcessGroup::spawn(cmd, None).wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
    assert!(f.exists("start-0-4") && f.exists("start-1-4"));
    assert!(!f.exists("start-0-0"));
}
