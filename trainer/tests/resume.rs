//! Exact resume: a run killed with SIGKILL and started again produces the same loss at every
//! step as a run that was never interrupted, and a half-written checkpoint is never used.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// `ferrotrain run` of `config` as job `job` under `ckpt`.
fn run_job(config: &Path, ckpt: &Path, job: &str) -> Command {
    let mut cmd = run_command(config, ckpt);
    cmd.args(["--job", job]);
    cmd
}

#[test]
fn kill_9_then_resume_gives_the_uninterrupted_loss_sequence() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(tmp.path(), "copy.yaml", &copy_config(80, 20, ""));
    let ckpt = tmp.path().join("ckpt");
    let run = |job: &str| run_job(&config, &ckpt, job);

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

#[test]
fn sigterm_saves_a_checkpoint_at_the_current_step_then_exits_143() {
    let tmp = tempfile::tempdir().unwrap();
    // No periodic checkpoints: the only one can come from the SIGTERM.
    let config = write(
        tmp.path(),
        "copy.yaml",
        &copy_config(1_000_000, 0, "maxSeconds: 600\n"),
    );
    let ckpt = tmp.path().join("ckpt");
    let job_dir = ckpt.join("job");
    let termination_log = tmp.path().join("termination-log");
    let run = || {
        let mut cmd = run_job(&config, &ckpt, "job");
        cmd.env("FERROTRAIN_TERMINATION_LOG", &termination_log);
        cmd
    };

    let mut first = Guard::spawn(run());
    assert!(
        wait_until(Duration::from_secs(120), || losses(&job_dir).len() >= 30),
        "no 30 training steps within 120 s"
    );
    // SAFETY: signalling the child we started and still own.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    let status = first
        .wait_timeout(Duration::from_secs(60))
        .expect("a SIGTERMed run exits within 60 s");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");

    let last_step = losses(&job_dir).last().unwrap().0;
    let saved = format!("step-{last_step:08}");
    assert!(
        job_dir.join(&saved).join("trainer.json").is_file(),
        "no complete checkpoint at the step it stopped ({last_step})"
    );
    let message = std::fs::read_to_string(&termination_log).unwrap();
    assert!(
        message.contains("SIGTERM") && message.contains(&format!("step {last_step}")),
        "{message}"
    );

    // Started again, it continues from that step instead of from scratch.
    let mut again = Guard::spawn(run());
    assert!(
        wait_until(Duration::from_secs(120), || loss_lines(&job_dir)
            .iter()
            .any(|l| l.0 == last_step + 1)),
        "the second run never logged step {}",
        last_step + 1
    );
    again.kill();
    let lines = loss_lines(&job_dir);
    assert_eq!(
        lines.iter().filter(|l| l.0 == 1).count(),
        1,
        "restarted from scratch"
    );
    assert_eq!(
        lines.iter().filter(|l| l.0 == last_step).count(),
        1,
        "step {last_step} was trained again"
    );
}
