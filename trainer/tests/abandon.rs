//! A rank whose round is abandoned (ABANDON, SIGUSR1: its agent ended the round because a peer
//! failed, froze or was lost) while it still meets its gang exits at once, with the record of
//! an abandoned collective, instead of waiting out the rendezvous timeout in a store request
//! until its launcher's stop grace kills it (trainer/src/ending.rs).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferrotrain_api::{EndKind, RankEnd};

/// The rank's process, killed if the test ends (passes or fails) while it runs.
struct Rank(std::process::Child);

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_rank_still_meeting_its_gang_leaves_at_once_when_its_round_is_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 1 of 2; rank 0 never comes, so rank 1 waits for its store for up to 120 s.
    let config = common::write(
        dir.path(),
        "job.yaml",
        &common::copy_config(
            100,
            50,
            "distributed: {rendezvousTimeoutSeconds: 120, collectiveTimeoutSeconds: 120}\n",
        ),
    );
    let end_file = dir.path().join("rank-1.end.json");
    let mut rank = Rank(
        common::run_command(&config, &dir.path().join("runs"))
            .env("RANK", "1")
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", common::free_port().to_string())
            .env("FERROTRAIN_RDZV_TOKEN", "abandon-test")
            .env("FERROTRAIN_END_FILE", &end_file)
            .env("FERROTRAIN_TERMINATION_LOG", dir.path().join("termination"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let rank = &mut rank.0;
    // Its signal handlers are installed before it says it starts; a second later it waits
    // for its peers.
    let stderr = BufReader::new(rank.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = Instant::now();
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("starting rank=1")) {
        assert!(started.elapsed() < Duration::from_secs(60), "{seen:?}");
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            seen.push(line);
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        rank.try_wait().unwrap().is_none(),
        "still meeting: {seen:?}"
    );
    let abandoned_at = Instant::now();
    // SAFETY: our own child.
    unsafe {
        libc::kill(rank.id() as i32, libc::SIGUSR1);
    }
    let status = loop {
        if let Some(status) = rank.try_wait().unwrap() {
            break status;
        }
        assert!(
            abandoned_at.elapsed() < Duration::from_secs(10),
            "the rank still waits for its gang 10 s after its round was abandoned"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = abandoned_at.elapsed();
    let end = RankEnd::read(&end_file).unwrap().expect("an end record");
    assert_eq!(end.kind, EndKind::Abandoned, "{end:?}");
    assert!(!status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(2),
        "left {took:?} after the abandon"
    );
    eprintln!("left its meeting {took:?} after the abandon");
}
