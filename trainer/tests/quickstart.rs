//! The quick start shows what it says: scripts/quickstart.sh, with a shorter config and the
//! binary under test, kills rank 1's trainer (not a waiting spare) after a checkpoint, and the
//! launcher restarts the ranks in place, as round 1, from the state rank 0 left (not from that
//! checkpoint): the
//! script's account and the launcher's own ledger agree. And the script fails when nothing was
//! killed, so its claim is checked each run.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{copy_config, write};

/// The script, as a user runs it, with the test's binary, config and checkpoint directory.
fn quickstart(dir: &Path, config: &Path, kill_after: u64) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    Command::new("bash")
        .arg(root.join("scripts/quickstart.sh"))
        .args(["--no-build", "--config"])
        .arg(config)
        .args(["--kill-after-checkpoint", &kill_after.to_string()])
        .env("FERROTRAIN", env!("CARGO_BIN_EXE_ferrotrain"))
        .env("FERROTRAIN_CHECKPOINT_DIR", dir)
        .env("OMP_WAIT_POLICY", "PASSIVE")
        .env_remove("FERROTRAIN_JOB")
        .env_remove("FERROTRAIN_CONFIG")
        .env_remove("FERROTRAIN_METRICS_PORT")
        .output()
        .expect("run scripts/quickstart.sh")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_quick_start_kills_a_trainer_and_prints_the_launchers_account_of_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that training goes on well past the kill.
    let config = write(dir.path(), "copy.yaml", &copy_config(1500, 20, ""));
    let out = quickstart(dir.path(), &config, 40);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for said in [
        "kill -9 of rank 1's trainer (pid ",
        "agent: round 0 ended: rank 1 (Killed)",
        "agent: round 1: started 2 rank(s)",
        "launch: attempt 0 round 0: resumed from step 0",
        "Failure (Killed rank 1 exit 137)",
        "launch: attempt 0 round 1: resumed from step ",
        "the launcher blamed it: Killed",
        "the same launcher restarted both ranks in place as round 1",
        "from the failure to round 1's first step: ",
        "steps lost (trained again): ",
        "ended Succeeded",
    ] {
        assert!(
            stdout.contains(said),
            "the quick start did not say {said:?}:\n{all}"
        );
    }
    // What it printed is the ledger's: the killed rank, then a resume from the state rank 0
    // left, at or past the checkpoint it waited for, to the end; only the step in flight was
    // trained again.
    let ledger: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("quickstart.recovery.json")).unwrap(),
    )
    .unwrap();
    let attempts = ledger["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{ledger}");
    let end = &attempts[0]["end"];
    assert_eq!(
        (&end["cause"], &end["rank"], &end["exitCode"]),
        (&"Failure".into(), &1.into(), &137.into()),
        "{ledger}"
    );
    assert_eq!(
        (&attempts[1]["attempt"], &attempts[1]["round"]),
        (&0.into(), &1.into()),
        "the same attempt, the next round: {ledger}"
    );
    let resumed = attempts[1]["resumedFromStep"].as_u64().unwrap();
    assert!(resumed >= 40, "{ledger}");
    assert_eq!(attempts[1]["healedFrom"], "peers", "{ledger}");
    assert!(
        stdout.contains(&format!(
            "resuming from step {resumed}: the state a surviving rank left"
        )),
        "{all}"
    );
    let lost = attempts[0]["lostSteps"].as_u64().unwrap();
    assert!(
        lost <= 1,
        "more than the step in flight trained again: {ledger}"
    );
    assert!(
        stdout.contains(&format!("steps lost (trained again): {lost}")),
        "{all}"
    );
    assert_eq!(attempts[1]["end"]["cause"], "Succeeded", "{ledger}");
    assert_eq!(attempts[1]["lastStep"], 1500, "{ledger}");
}

#[test]
fn the_quick_start_fails_when_it_killed_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Training ends before the checkpoint the script waits for.
    let config = write(dir.path(), "copy.yaml", &copy_config(30, 10, ""));
    let out = quickstart(dir.path(), &config, 1000);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("FAILED: training ended before checkpoint step 1000; nothing was killed"),
        "{all}"
    );
}
