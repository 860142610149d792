//! A gang's endpoint is its launcher's: `ferrotrain launch` with FERROTRAIN_METRICS_PORT
//! serves /progress and /metrics itself, rank 0's report (its progress file, with rank 0's
//! own resources) beside what only the launcher knows (the round, how each round ended). It
//! answers through an in-place restart, when no rank 0 runs, and the ranks serve nothing.

mod common;

use std::time::{Duration, Instant};

use common::{
    ProcessGroup, copy_config, free_port, http_get, progress, rank_pid, wait_until, write,
};

#[test]
fn the_launcher_serves_the_gangs_report_through_an_in_place_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(tmp.path(), "job.yaml", &copy_config(1_000_000, 0, ""));
    let port = free_port();
    let log = tmp.path().join("launch.log");
    let mut cmd = common::ferrotrain();
    cmd.arg("launch")
        .arg("--config")
        .arg(&config)
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--max-restarts",
            "3",
        ])
        .env("FERROTRAIN_CHECKPOINT_DIR", tmp.path().join("ckpt"))
        .env("OMP_NUM_THREADS", "1")
        .env("FERROTRAIN_METRICS_PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let gang = ProcessGroup::spawn(cmd, Some(log));
    let stepped = |min: u64| progress(port).and_then(|p| p["step"].as_u64()).unwrap_or(0) >= min;
    assert!(
        wait_until(Duration::from_secs(120), || stepped(20)),
        "the gang did not report training:\n{}",
        gang.log()
    );
    let before = progress(port).unwrap();
    assert_eq!(before["round"].as_u64().unwrap_or(0), 0, "{before}");
    assert!(
        before["resources"]["cpuSeconds"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "rank 0's own resources: {before}"
    );
    let metrics = http_get(port, "/metrics").expect("/metrics answers");
    assert!(metrics.contains("ferrotrain_step "), "{metrics}");

    let rank1 = rank_pid(gang.pid(), 1).expect("rank 1's trainer");
    // SAFETY: signalling a pid read from /proc; the worst case is a stale pid (test fails).
    unsafe { libc::kill(rank1, libc::SIGKILL) };
    // Polled every 20 ms from the kill until round 1 reports: it never stops answering.
    let started = Instant::now();
    let mut unanswered = 0;
    let after = loop {
        match progress(port) {
            Some(p)
                if p["round"].as_u64() == Some(1)
                    && p["step"].as_u64() > before["step"].as_u64() =>
            {
                break p;
            }
            Some(_) => {}
            None => unanswered += 1,
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no round 1:\n{}",
            gang.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(unanswered, 0, "/progress went away during the restart");
    let ends = after["roundEnds"].as_array().expect("roundEnds");
    assert_eq!(ends.len(), 1, "{after}");
    assert_eq!(
        (&ends[0]["reason"], &ends[0]["rank"]),
        (&"Killed".into(), &1.into())
    );
    assert!(ends[0]["lastStep"].as_u64().is_some(), "{after}");
}
