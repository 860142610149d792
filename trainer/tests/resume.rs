//! Exact resume: a run killed with SIGKILL and started again produces the same loss at every
//! step as a run that was never interrupted, and a half-written checkpoint is never used.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn kill_9_then_resume_gives_the_uninterrupted_loss_sequence() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(tmp.path(), "copy.yaml", &copy_config(80, 20, ""));
    let ckpt = tmp.path().join("ckpt");
    let run = |job: &str| {
        let mut cmd = ferrotrain();
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .args(["--job", job]);
        cmd
    };

    let mut a = Guard::spawn(run("a"));
    let status = a
        .wait_timeout(Duration::from_secs(240))
        .expect("uninterrupted run finishes");
    assert!(status.success(), "uninterrupted run failed: {status}");

    let b_dir = ckpt.join("b");
    let mut b = Guard::spawn(run("b"));
    assert!(
        wait_until(Duration::from_secs(240), || b_dir
            .join("step-00000040")
            .is_dir()),
        "no checkpoint at step 40"
    );
    b.kill(); // SIGKILL, mid-training
    let steps_before_kill = losses(&b_dir).last().map(|l| l.0).unwrap_or(0);
    assert!(
        steps_before_kill < 80,
        "the run finished before it could be killed"
    );

    // A crash mid-save leaves a temporary directory, and a step directory without all its
    // files; both have higher steps than the real latest checkpoint and must be ignored.
    std::fs::create_dir_all(b_dir.join(".tmp-step-00000075-999")).unwrap();
    std::fs::create_dir_all(b_dir.join("step-00000070")).unwrap();
    std::fs::write(b_dir.join("step-00000070/model.safetensors"), b"partial").unwrap();

    let mut again = Guard::spawn(run("b"));
    let status = again
        .wait_timeout(Duration::from_secs(240))
        .expect("resumed run finishes");
    assert!(status.success(), "resumed run failed: {status}");

    let uninterrupted = losses(&ckpt.join("a"));
    let resumed = losses(&b_dir);
    assert_eq!(uninterrupted.len(), 80);
    assert_eq!(resumed, uninterrupted, "resumed loss sequence differs");

    // It resumed from a checkpoint (step 1 ran once), and the steps it replayed after the
    // checkpoint gave the same losses as their first run.
    let lines = loss_lines(&b_dir);
    assert_eq!(
        lines.iter().filter(|l| l.0 == 1).count(),
        1,
        "restarted from scratch"
    );
    for (step, loss) in &lines {
        let first = resumed.iter().find(|l| l.0 == *step).unwrap().1;
        assert_eq!(*loss, first, "step {step} replayed with a different loss");
    }
    assert!(lines.len() > resumed.len() || steps_before_kill.is_multiple_of(20));
}
