//! `ferrotrain launch --restart-in-place` on two "nodes" of this machine (two launchers, one
//! store on node 0's launcher), with a fake rank program (a shell script) that behaves by
//! round: the launchers restart every rank in a new round after a failure without exiting,
//! blame the right rank (killed, frozen, named by its peers), stop at once on a permanent
//! failure and give up after --max-restarts. Fast: no libtorch in the ranks.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::ProcessGroup;
use ferrotrain_api::Recovery;

struct Gang {
    dir: tempfile::TempDir,
    port: u16,
}

impl Gang {
    /// Every rank runs `body` (sh) with $RANK and $FERROTRAIN_ROUND set; each start leaves a
    /// file `start-<rank>-<round>` holding the rank's store settings.
    fn new(body: &str) -> Gang {
        let dir = tempfile::tempdir().unwrap();
        common::fake_ranks(
            dir.path(),
            "$FERROTRAIN_STORE_HOSTED $MASTER_PORT $FERROTRAIN_ATTEMPT",
            "FERROTRAIN_ROUND",
            body,
        );
        let port = common::free_port();
        Gang { dir, port }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// The launcher of node `node` of 2, in place, with `max_restarts`.
    fn node(&self, node: usize, max_restarts: u32) -> ProcessGroup {
        let log = self.path(&format!("launcher-{node}.log"));
        let mut cmd = common::ferrotrain();
        cmd.arg("launch")
            .arg("--config")
            .arg(self.path("job.yaml"))
            .arg("--rank-program")
            .arg(self.path("rank.sh"))
            .args(["--nnodes", "2", "--node-rank", &node.to_string()])
            .args([
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &self.port.to_string(),
            ])
            .args([
                "--restart-in-place",
                "--max-restarts",
                &max_restarts.to_string(),
            ])
            .args([
                "--stop-grace-seconds",
                "2",
                "--restart-backoff-seconds",
                "0.2",
            ])
            .args(["--rendezvous-timeout-seconds", "20"])
            .arg("--recovery-file")
            .arg(self.path(&format!("recovery-{node}.json")))
            .env("FAKE_OUT", self.dir.path())
            .env("FERROTRAIN_RDZV_TOKEN", "gang-token")
            .env("FERROTRAIN_ATTEMPT", "3")
            .env(
                "FERROTRAIN_TERMINATION_LOG",
                self.path(&format!("launcher-{node}.termination-log")),
            )
            .env_remove("OMP_NUM_THREADS")
            .stderr(std::fs::File::create(&log).unwrap());
        ProcessGroup::spawn(cmd, Some(log))
    }

    /// Both launchers, run to their end: their exit codes.
    fn run(&self, max_restarts: u32) -> (Option<i32>, Option<i32>) {
        let mut n0 = self.node(0, max_restarts);
        let mut n1 = self.node(1, max_restarts);
        let within = Duration::from_secs(60);
        (n0.wait(within).code(), n1.wait(within).code())
    }

    fn ledger(&self) -> Recovery {
        let text = std::fs::read_to_string(self.path("recovery-0.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn termination(&self, node: usize) -> String {
        std::fs::read_to_string(self.path(&format!("launcher-{node}.termination-log")))
            .unwrap_or_default()
    }
}

#[test]
fn a_failed_rank_restarts_every_rank_in_a_new_round_without_the_launchers_exiting() {
    let g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) sleep 0.3; echo "boom" > "$FERROTRAIN_TERMINATION_LOG"; exit 1;;
  *-0) exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    assert_eq!(g.run(3), (Some(0), Some(0)));
    for rank in 0..2 {
        for round in 0..2 {
            assert!(
                g.exists(&format!("start-{rank}-{round}")),
                "rank {rank} round {round}"
            );
        }
        assert!(!g.exists(&format!("start-{rank}-2")));
    }
    // Node 0's launcher hosts the store; every rank uses it, in every round.
    let settings = std::fs::read_to_string(g.path("start-0-1")).unwrap();
    assert_eq!(settings.trim(), format!("1 {} 3", g.port));
    let ledger = g.ledger();
    assert_eq!(ledger.attempts.len(), 2, "{ledger:?}");
    let end = ledger.attempts[0].end.clone().unwrap();
    assert_eq!(
        (end.reason.as_str(), end.rank, end.exit_code),
        ("ExitCode", Some(1), Some(1))
    );
    assert_eq!(
        (ledger.attempts[1].attempt, ledger.attempts[1].round),
        (3, Some(1)),
        "round 1 of attempt 3"
    );
}

#[test]
fn a_killed_rank_is_blamed_and_restarted_in_place() {
    let g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) sleep 0.3; kill -9 $$;;
  0-0) sleep 0.5; echo "ring: connection reset by rank 1" > "$FERROTRAIN_TERMINATION_LOG"; exit 1;;
  *) exit 0;;
esac"#,
    );
    assert_eq!(g.run(3), (Some(0), Some(0)));
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!(
        (end.reason.as_str(), end.rank, end.exit_code),
        ("Killed", Some(1), Some(137))
    );
}

#[test]
fn a_frozen_rank_is_blamed_not_the_peer_that_timed_out_waiting() {
    let g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) kill -STOP $$;;
  0-0) sleep 1; echo "rank 1 did not answer within 1 s during all-reduce" > "$FERROTRAIN_TERMINATION_LOG"; exit 1;;
  *) exit 0;;
esac"#,
    );
    assert_eq!(g.run(3), (Some(0), Some(0)));
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("Frozen", Some(1)));
}

#[test]
fn a_permanent_failure_ends_every_launcher_at_once() {
    let g = Gang::new(
        r#"case "$RANK" in
  1) echo "data.train.source: no such file" > "$FERROTRAIN_TERMINATION_LOG"; exit 3;;
  *) exec sleep 30;;
esac"#,
    );
    assert_eq!(g.run(3), (Some(1), Some(3)));
    assert!(!g.exists("start-0-1"), "no second round");
    assert!(
        g.termination(1).contains("permanent"),
        "{}",
        g.termination(1)
    );
}

#[test]
fn the_launchers_give_up_after_max_restarts_rounds() {
    let g = Gang::new(
        r#"case "$RANK" in
  1) sleep 0.2; exit 1;;
  *) exec sleep 30;;
esac"#,
    );
    assert_eq!(g.run(2), (Some(1), Some(1)));
    assert!(g.exists("start-1-2"), "rounds 0, 1 and 2 ran");
    assert!(!g.exists("start-1-3"));
    let message = g.termination(1);
    assert!(
        message.contains("giving up after 2 in-place restart(s)"),
        "{message}"
    );
}
