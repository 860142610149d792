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
    /// The launchers read the token from a file, as in a pod (FERROTRAIN_RDZV_TOKEN_FILE).
    token_file: bool,
    /// --stop-grace-seconds.
    stop_grace: &'static str,
}

impl Gang {
    /// Every rank runs `body` (sh) with $RANK and $FERROTRAIN_ROUND set; each start leaves a
    /// file `start-<rank>-<round>` holding the rank's store settings.
    fn new(body: &str) -> Gang {
        let dir = tempfile::tempdir().unwrap();
        // Each start also leaves `world-<node>-<round>`: the rank, world and virtual world.
        let body = format!(
            "echo \"$RANK $WORLD_SIZE $FERROTRAIN_VIRTUAL_WORLD\" \
             > \"$FAKE_OUT/world-$NODE_RANK-$FERROTRAIN_ROUND\"\n{body}"
        );
        common::fake_ranks(
            dir.path(),
            "$FERROTRAIN_STORE_HOSTED $MASTER_PORT $FERROTRAIN_ATTEMPT",
            "FERROTRAIN_ROUND",
            &body,
        );
        let port = common::free_port();
        Gang {
            dir,
            port,
            token_file: false,
            stop_grace: "2",
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// The launcher of node `node` of 2, in place, with `max_restarts`.
    fn node(&self, node: usize, max_restarts: u32) -> ProcessGroup {
        self.node_of(node, 2, max_restarts, &[])
    }

    /// The launcher of node `node` of `nnodes`, in place, with `max_restarts` and `extra` flags.
    fn node_of(
        &self,
        node: usize,
        nnodes: usize,
        max_restarts: u32,
        extra: &[&str],
    ) -> ProcessGroup {
        self.launcher(node, nnodes, max_restarts, extra, &node.to_string())
    }

    /// [`Self::node_of`], its files (log, ledger, termination message) named after `files`:
    /// a second launcher of the same node (a replacement pod) keeps its own.
    fn launcher(
        &self,
        node: usize,
        nnodes: usize,
        max_restarts: u32,
        extra: &[&str],
        files: &str,
    ) -> ProcessGroup {
        let log = self.path(&format!("launcher-{files}.log"));
        let mut cmd = common::ferrotrain();
        cmd.arg("launch")
            .arg("--config")
            .arg(self.path("job.yaml"))
            .arg("--rank-program")
            .arg(self.path("rank.sh"))
            .args([
                "--nnodes",
                &nnodes.to_string(),
                "--node-rank",
                &node.to_string(),
            ])
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
                self.stop_grace,
                "--restart-backoff-seconds",
                "0.2",
            ])
            .args(["--rendezvous-timeout-seconds", "20"])
            .arg("--recovery-file")
            .arg(self.path(&format!("recovery-{files}.json")))
            .env("FAKE_OUT", self.dir.path())
            .env("FERROTRAIN_RDZV_TOKEN", "gang-token")
            .env("FERROTRAIN_ATTEMPT", "3")
            .env(
                "FERROTRAIN_TERMINATION_LOG",
                self.path(&format!("launcher-{files}.termination-log")),
            )
            .args(extra)
            .env_remove("OMP_NUM_THREADS")
            .stderr(std::fs::File::create(&log).unwrap());
        if self.token_file {
            let file = self.path("token");
            std::fs::write(&file, "gang-token\n").unwrap();
            cmd.env_remove("FERROTRAIN_RDZV_TOKEN")
                .env("FERROTRAIN_RDZV_TOKEN_FILE", file);
        }
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

    fn termination(&self, files: impl std::fmt::Display) -> String {
        std::fs::read_to_string(self.path(&format!("launcher-{files}.termination-log")))
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
fn a_token_in_a_file_stays_out_of_the_ranks_environment() {
    let mut g = Gang::new(
        r#"echo "${FERROTRAIN_RDZV_TOKEN:-none} ${FERROTRAIN_RDZV_TOKEN_FILE:-none}" \
  > "$FAKE_OUT/token-$RANK"
exit 0"#,
    );
    g.token_file = true;
    assert_eq!(g.run(1), (Some(0), Some(0)));
    let file = g.path("token").display().to_string();
    for rank in 0..2 {
        assert_eq!(read(&g, &format!("token-{rank}")), format!("none {file}"));
    }
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
  0-0) sleep 1; echo '{"kind": "peerSilent", "peer": 1, "message": "timed out"}' > "$FERROTRAIN_END_FILE"; exit 1;;
  *) exit 0;;
esac"#,
    );
    assert_eq!(g.run(3), (Some(0), Some(0)));
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("Frozen", Some(1)));
}

/// Rank 1 hangs (deaf to SIGTERM, not stopped): rank 0's typed record names it as the peer
/// that did not answer, and node 0 blames it `Unresponsive`. Its node stops it within the
/// short grace of a stuck round, not the stop grace a saving rank gets.
#[test]
fn a_rank_its_peer_records_as_silent_is_blamed_unresponsive_and_stopped_at_once() {
    let mut g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) trap '' TERM; exec sleep 60;;
  0-0) sleep 1; echo '{"kind": "peerSilent", "peer": 1, "message": "the words say nothing"}' > "$FERROTRAIN_END_FILE"; exit 1;;
  *) exit 0;;
esac"#,
    );
    g.stop_grace = "10";
    let start = std::time::Instant::now();
    assert_eq!(g.run(3), (Some(0), Some(0)));
    let took = start.elapsed();
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("Unresponsive", Some(1)));
    // Rank 1 ignores SIGTERM: it was killed after the 2 s of a stuck round, not a grace of 10.
    assert!(took < std::time::Duration::from_secs(8), "{took:?}");
}

#[test]
fn a_permanent_failure_ends_every_launcher_at_once() {
    let g = Gang::new(
        r#"case "$RANK" in
  1) echo "data.train.source: no such file" > "$FERROTRAIN_TERMINATION_LOG"; exit 3;;
  *) exec sleep 30;;
esac"#,
    );
    // Both pods end with the permanent code (the operator may see either first: neither
    // may look retryable); node 0's says whose failure it was.
    assert_eq!(g.run(3), (Some(3), Some(3)));
    assert!(!g.exists("start-0-1"), "no second round");
    assert!(
        g.termination(1).contains("permanent"),
        "{}",
        g.termination(1)
    );
    assert!(
        g.termination(0).contains("rank 1") && g.termination(0).contains("data.train.source"),
        "{}",
        g.termination(0)
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

#[test]
fn the_backoff_doubles_only_while_rounds_keep_failing_before_they_save_a_checkpoint() {
    // Rank 0's report of round 2, which saved step 50 past its start at 0 (a report says its
    // round: the ledger takes a round's own report only).
    let saved = ferrotrain_api::Progress {
        round: 2,
        step: 60,
        resumed_from_step: Some(0),
        last_checkpoint: Some(ferrotrain_api::progress::CheckpointInfo {
            step: 50,
            size_bytes: 1,
            time: "2026-11-27T08:00:00Z".into(),
            blocking_seconds: None,
            save_seconds: None,
        }),
        ..Default::default()
    };
    // Rank 1 fails in rounds 0 to 3; only round 2 saves a checkpoint; round 4 succeeds.
    let g = Gang::new(
        r#"[ "$FERROTRAIN_ROUND" -ge 4 ] && exit 0
case "$RANK" in
  1) sleep 0.3; exit 1;;
  *) [ "$FERROTRAIN_ROUND" = 2 ] && cp "$FAKE_OUT/saved.json" "$FERROTRAIN_PROGRESS_FILE"
     exec sleep 30;;
esac"#,
    );
    std::fs::write(g.path("saved.json"), serde_json::to_vec(&saved).unwrap()).unwrap();
    let (mut n0, mut n1) = (g.node(0, 5), g.node(1, 5));
    both_succeed(&mut n0, &mut n1);
    let waits: Vec<String> = read(&g, "launcher-1.log")
        .lines()
        .filter_map(|l| l.split("restarting in place in ").nth(1))
        .map(|w| w.to_string())
        .collect();
    assert_eq!(
        waits,
        [
            "0.0 s (failure 1 in a row)",
            "0.2 s (failure 2 in a row)",
            // Round 2 saved a checkpoint: it was training, the count starts again.
            "0.0 s (failure 1 in a row)",
            "0.2 s (failure 2 in a row)",
        ]
    );
}

#[test]
fn a_replacement_pod_joins_the_next_round_of_the_gang_it_left() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0) exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    let mut n0 = g.node(0, 3);
    let mut n1 = g.node(1, 3);
    let started = std::time::Instant::now();
    while !g.exists("start-1-0") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "round 0 never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The pod of node 1 is deleted: its launcher gets SIGTERM and tells the others at once.
    assert_eq!(deleted(&mut n1), Some(143));
    // Its replacement (a new pod of the same name) joins the round node 0 waits in.
    let mut replacement = g.node(1, 3);
    both_succeed(&mut n0, &mut replacement);
    assert!(g.exists("start-0-1") && g.exists("start-1-1"));
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("PodLeaving", Some(1)));
}

#[test]
fn a_killed_launcher_is_known_gone_at_once_not_after_the_stop_grace() {
    // Rank 0 fails as soon as rank 1 is gone (its ring would break); rank 1 dies with its
    // launcher (PR_SET_PDEATHSIG).
    let mut g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) echo $$ > "$FAKE_OUT/pid-1"; exec sleep 60;;
  0-0) until [ -s "$FAKE_OUT/pid-1" ]; do sleep 0.05; done
       while kill -0 "$(cat "$FAKE_OUT/pid-1")" 2>/dev/null; do sleep 0.05; done; exit 1;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    // A grace the old wait for a report would have spent: 20 s + 5 s.
    g.stop_grace = "20";
    let mut n0 = g.node(0, 3);
    let mut n1 = g.node(1, 3);
    wait_line(&g, "pid-1");
    let killed = std::time::Instant::now();
    // SAFETY: killing a launcher the test started, as the OOM killer would.
    unsafe {
        libc::kill(n1.pid(), libc::SIGKILL);
    }
    let _ = n1.wait(Duration::from_secs(10));
    let ruled = loop {
        let ended = std::fs::read_to_string(g.path("recovery-0.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Recovery>(&t).ok())
            .and_then(|r| r.attempts.first().and_then(|a| a.end.clone()));
        if let Some(end) = ended {
            break end;
        }
        assert!(killed.elapsed() < Duration::from_secs(20), "{}", n0.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    eprintln!("launcher of node 1 killed -> node 0 ruled {took:?} later");
    assert!(
        took < Duration::from_secs(5),
        "{took:?}: node 0 waited for a report"
    );
    assert_eq!((ruled.reason.as_str(), ruled.rank), ("AgentLost", Some(1)));
    // Its replacement (a new pod) joins the next round.
    let mut replacement = g.launcher(1, 2, 3, &[], "1b");
    both_succeed(&mut n0, &mut replacement);
    let log = n0.log();
    assert!(
        log.contains("is gone: its connection to node 0's store closed"),
        "{log}"
    );
}

#[test]
fn losing_node_0s_pod_the_survivor_waits_for_its_replacement_and_joins_its_store() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0) exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    let mut n0 = g.node(0, 3);
    let mut n1 = g.node(1, 3);
    wait_line(&g, "start-1-0");
    // Node 0's pod is deleted: its launcher, which hosts the store, leaves at once.
    assert_eq!(deleted(&mut n0), Some(143));
    // Its replacement serves a new store at the same address; node 1 never exited.
    std::thread::sleep(Duration::from_millis(500));
    let mut replacement = g.node(0, 3);
    both_succeed(&mut replacement, &mut n1);
    // The round numbers go on: both trained in round 1, in the new store.
    assert!(g.exists("start-0-1") && g.exists("start-1-1"));
    assert!(n1.log().contains("waiting up to"), "{}", n1.log());
}

#[test]
fn a_rank_stopped_for_a_second_ends_the_round_before_any_collective_timeout() {
    // Rank 0 would wait for ever; rank 1 stops itself. Its own launcher notices.
    let g = Gang::new(
        r#"case "$RANK-$FERROTRAIN_ROUND" in
  1-0) kill -STOP $$;;
  0-0) exec sleep 60;;
  *) exit 0;;
esac"#,
    );
    let started = std::time::Instant::now();
    assert_eq!(g.run(3), (Some(0), Some(0)));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("Frozen", Some(1)));
}

/// The launcher's pod is deleted: SIGTERM; its exit code.
fn deleted(launcher: &mut ProcessGroup) -> Option<i32> {
    // SAFETY: signalling a launcher the test started.
    unsafe {
        libc::kill(launcher.pid(), libc::SIGTERM);
    }
    launcher.wait(Duration::from_secs(20)).code()
}

/// Both launchers end with 0 (their logs otherwise).
fn both_succeed(a: &mut ProcessGroup, b: &mut ProcessGroup) {
    let within = Duration::from_secs(60);
    assert_eq!(
        (a.wait(within).code(), b.wait(within).code()),
        (Some(0), Some(0)),
        "first:\n{}\nsecond:\n{}",
        a.log(),
        b.log()
    );
}

fn read(g: &Gang, name: &str) -> String {
    std::fs::read_to_string(g.path(name))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until a rank has written its line to `name` (the shell creates the file before
/// `echo` writes to it, so a file that exists may still be empty) and returns it.
fn wait_line(g: &Gang, name: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(g.path(name)).unwrap_or_default();
        if text.ends_with('\n') {
            return text.trim().to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{name} never got its line (so far: {text:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const ELASTIC: [&str; 4] = ["--min-nodes", "2", "--elastic-wait-seconds", "2"];

#[test]
fn elastic_a_lost_node_leaves_a_smaller_gang_that_covers_its_shards() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0) exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    let mut n0 = g.node_of(0, 3, 3, &ELASTIC);
    let mut n1 = g.node_of(1, 3, 3, &ELASTIC);
    let mut n2 = g.node_of(2, 3, 3, &ELASTIC);
    assert_eq!(
        wait_line(&g, "world-2-0"),
        "2 3",
        "round 0: every node (no virtual world: the round is whole)"
    );
    // Node 2's pod goes and does not come back within the elastic wait.
    // SAFETY: signalling the launcher this test started.
    unsafe {
        libc::kill(n2.pid(), libc::SIGTERM);
    }
    assert_eq!(n2.wait(Duration::from_secs(20)).code(), Some(143));
    let within = Duration::from_secs(60);
    assert_eq!(
        (n0.wait(within).code(), n1.wait(within).code()),
        (Some(0), Some(0))
    );
    assert_eq!(
        read(&g, "world-0-1"),
        "0 2 3",
        "round 1: 2 ranks covering a gang of 3"
    );
    assert_eq!(read(&g, "world-1-1"), "1 2 3");
    assert!(!g.exists("world-2-1"));
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("PodLeaving", Some(2)));
}

#[test]
fn elastic_a_late_node_joins_at_the_next_round_and_the_gang_grows() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0) exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    let mut n0 = g.node_of(0, 3, 3, &ELASTIC);
    let mut n1 = g.node_of(1, 3, 3, &ELASTIC);
    // Node 2 comes after the elastic wait: round 0 starts without it.
    assert_eq!(wait_line(&g, "world-1-0"), "1 2 3");
    let mut n2 = g.node_of(2, 3, 3, &ELASTIC);
    let within = Duration::from_secs(60);
    let codes = (
        n0.wait(within).code(),
        n1.wait(within).code(),
        n2.wait(within).code(),
    );
    assert_eq!(codes, (Some(0), Some(0), Some(0)), "{}", n0.log());
    assert_eq!(
        read(&g, "world-2-1"),
        "2 3",
        "round 1: the gang grew back (whole: no virtual world)"
    );
    let r = g.ledger();
    let end = r.attempts[0].end.clone().unwrap();
    assert_eq!(
        (end.reason.as_str(), end.cause),
        ("Resized", ferrotrain_api::recovery::EndCause::Stopped),
        "a resize is no failure"
    );
}

#[test]
fn elastic_a_new_gang_starts_on_the_nodes_placed_one_wait_after_node_0_not_two() {
    let g = Gang::new("sleep 0.3; exit 0");
    // Node 2's pod is never placed (no capacity): node 0 waits once for it, both for where
    // it left off and for round 0's members, then starts on the two nodes that run.
    let wait = 3.0;
    let flags = ["--min-nodes", "2", "--elastic-wait-seconds", "3"];
    let started = std::time::Instant::now();
    let mut n0 = g.node_of(0, 3, 3, &flags);
    let mut n1 = g.node_of(1, 3, 3, &flags);
    assert_eq!(wait_line(&g, "world-1-0"), "1 2 3", "round 0: 2 ranks of 3");
    let took = started.elapsed().as_secs_f64();
    let within = Duration::from_secs(60);
    assert_eq!(
        (n0.wait(within).code(), n1.wait(within).code()),
        (Some(0), Some(0))
    );
    assert!(
        (wait..wait + 1.5).contains(&took),
        "round 0 started {took:.1} s after node 0 (elastic wait {wait} s): {}",
        n0.log()
    );
}

#[test]
fn elastic_a_node_that_never_came_is_not_waited_for_again_at_the_next_round() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0) sleep 0.5; [ "$RANK" = 1 ] && exit 1; exec sleep 30;;
  *) sleep 0.3; exit 0;;
esac"#,
    );
    // Node 2's pod is never placed: round 0 waits for it once (3 s); round 1, after rank 1's
    // failure, starts at once without it.
    let flags = ["--min-nodes", "1", "--elastic-wait-seconds", "3"];
    let mut n0 = g.node_of(0, 3, 3, &flags);
    let mut n1 = g.node_of(1, 3, 3, &flags);
    let within = Duration::from_secs(60);
    assert_eq!(
        (n0.wait(within).code(), n1.wait(within).code()),
        (Some(0), Some(0)),
        "{}",
        n0.log()
    );
    let started = |round: u64| {
        std::fs::metadata(g.path(&format!("world-0-{round}")))
            .and_then(|m| m.modified())
            .unwrap()
    };
    let gap = started(1).duration_since(started(0)).unwrap().as_secs_f64();
    assert_eq!(read(&g, "world-1-1"), "1 2 3", "round 1: the same 2 of 3");
    assert!(
        gap < 2.5,
        "round 1 started {gap:.1} s after round 0 (round 0 failed after 0.5 s; elastic wait 3 s): {}",
        n0.log()
    );
}

#[test]
fn elastic_a_frozen_node_is_left_out_at_its_heartbeat_timeout_and_leaves_once_replaced() {
    let g = Gang::new(
        r#"case "$FERROTRAIN_ROUND" in
  0|1) exec sleep 30;;
  *) sleep 3; exit 0;;
esac"#,
    );
    let flags = [&ELASTIC[..], &["--heartbeat-timeout-seconds", "2"]].concat();
    let mut n0 = g.node_of(0, 3, 3, &flags);
    let mut n1 = g.node_of(1, 3, 3, &flags);
    let old = g.launcher(2, 3, 3, &flags, "2-old");
    assert_eq!(
        wait_line(&g, "world-2-0"),
        "2 3",
        "round 0: every node (no virtual world: the round is whole)"
    );
    // Node 2's pod stops answering, launcher and ranks (a frozen node; to its peers the
    // same as a partition): nothing breaks, so only its heartbeat can tell.
    // SAFETY: the process group this test started.
    unsafe {
        libc::kill(-old.pid(), libc::SIGSTOP);
    }
    let frozen_at = std::time::Instant::now();
    assert_eq!(
        wait_line(&g, "world-0-1"),
        "0 2 3",
        "round 1: 2 ranks covering a gang of 3"
    );
    let took = frozen_at.elapsed().as_secs_f64();
    // The heartbeat timeout (2 s) + the ranks stopped (at most 2 s); no elastic wait for a
    // node the last round was ended without.
    assert!(took < 5.5, "round 1 started {took:.1} s after the freeze");
    let end = g.ledger().attempts[0].end.clone().unwrap();
    assert_eq!((end.reason.as_str(), end.rank), ("AgentLost", Some(2)));
    // Its replacement comes (a new pod: another identity) and the gang grows back.
    let mut new = g.launcher(2, 3, 3, &flags, "2-new");
    wait_line(&g, "world-2-2");
    // The old pod comes back: it finds node 2 held by the replacement and leaves.
    // SAFETY: as above.
    unsafe {
        libc::kill(-old.pid(), libc::SIGCONT);
    }
    let mut old = old;
    assert_eq!(old.wait(Duration::from_secs(20)).code(), Some(1));
    assert!(
        g.termination("2-old")
            .contains("node 2 is held by another pod's launcher now"),
        "{}",
        old.log()
    );
    let within = Duration::from_secs(60);
    let codes = (
        n0.wait(within).code(),
        n1.wait(within).code(),
        new.wait(within).code(),
    );
    assert_eq!(codes, (Some(0), Some(0), Some(0)), "{}", n0.log());
    assert_eq!(
        read(&g, "world-2-2"),
        "2 3",
        "round 2: the whole gang (no virtual world)"
    );
}
