//! `ferrotrain-launch` running Python ranks, across processes: the runner runs a script as
//! `__main__` with torchrun's environment, a failed round restarts in place from spares, the
//! progress contract from the Python side, and (with torch: FERROTRAIN_PYTORCH names the
//! directory scripts/setup-pytorch.sh lays out, which scripts/test.sh sets) the example's DDP
//! script under kill -9 of rank 1 and of rank 0 and SIGSTOP: the same launcher, the next step
//! within seconds, no step trained twice and the loss curve of the uninterrupted run; without
//! the package's calls, an in-place restart from the script's own checkpoint; the environment
//! and the loss curve against a real torchrun's.

mod python_support;

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::{Progress, TrainerPhase};
use python_support::*;

/// What the probe script saw, per (round, rank).
fn probes(dir: &std::path::Path) -> BTreeMap<(String, String), serde_json::Value> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix("round-")?.strip_suffix(".json")?;
            let (round, rank) = rest.split_once("-rank-")?;
            let v = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some(((round.to_string(), rank.to_string()), v))
        })
        .collect()
}

/// Round 0: rank 1 fails after 4.5 s (the spares start 3 s into a round); round 1 finishes.
const PROBE: &str = r#"
import json, os, sys, time
rank, rnd = os.environ["RANK"], os.environ.get("FERROTRAIN_ROUND", "-")
with open(os.path.join(os.environ["PROBE_DIR"], f"round-{rnd}-rank-{rank}.json"), "w") as f:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
               "env": dict(os.environ), "pid": os.getpid()}, f)
if rnd == "0":
    time.sleep(4.5)
    if rank == "1":
        sys.exit(7)
    time.sleep(60)
"#;

#[test]
fn a_python_rank_runs_as_main_with_torchruns_environment_and_a_new_round_starts_from_spares() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("probe.py");
    std::fs::write(&script, PROBE).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut run = Launcher::new(2)
        .env("PROBE_DIR", &out)
        .env("FERROTRAIN_PORT_RANGE", "47100-47199")
        .env("FERROTRAIN_JOB", "probe")
        .command(&["python3", script.to_str().unwrap(), "--x", "1"])
        .start();
    let code = run.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{}", run.log());
    assert!(
        run.log()
            .contains("round 1: started 2 rank(s), 2 of them spares"),
        "{}",
        run.log()
    );
    let seen = probes(&out);
    assert_eq!(seen.len(), 4, "{seen:#?}");
    let mut ports = Vec::new();
    for ((round, rank), v) in &seen {
        assert_eq!(v["name"], "__main__");
        assert_eq!(
            v["argv"],
            serde_json::json!([script.to_str().unwrap(), "--x", "1"])
        );
        assert_eq!(v["path0"], dir.path().to_str().unwrap());
        let env = |k: &str| v["env"][k].as_str().unwrap_or("<unset>").to_string();
        let want = [
            ("RANK", rank.as_str()),
            ("LOCAL_RANK", rank.as_str()),
            ("ROLE_RANK", rank.as_str()),
            ("GROUP_RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("ROLE_WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_WORLD_SIZE", "1"),
            ("ROLE_NAME", "default"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("TORCHELASTIC_RESTART_COUNT", round.as_str()),
            ("TORCHELASTIC_RUN_ID", "probe"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
            ("FERROTRAIN_ROUND", round.as_str()),
        ];
        for (k, value) in want {
            assert_eq!(env(k), value, "{k} of round {round} rank {rank}");
        }
        for k in [
            "FERROTRAIN_RDZV_TOKEN",
            "FERROTRAIN_SPARE",
            "FERROTRAIN_METRICS_PORT",
        ] {
            assert_eq!(env(k), "<unset>", "{k} of round {round} rank {rank}");
        }
        let port: u16 = env("MASTER_PORT").parse().unwrap();
        assert!((47100..=47199).contains(&port), "{port}");
        ports.push((round.clone(), port));
    }
    // Both ranks of a round meet on one port, a new one each round.
    ports.dedup();
    assert_eq!(ports.len(), 2, "{ports:?}");
    assert_ne!(ports[0].1, ports[1].1, "{ports:?}");
    // Round 1's ranks were the spares started during round 0, not new processes.
    let pid = |round: &str, rank: &str| seen[&(round.into(), rank.into())]["pid"].as_u64();
    assert_eq!(pid("1", "1"), run.pid_of(1, 1).map(u64::from));
    assert!(
        run.log().contains("rank 1 exited with code 7"),
        "{}",
        run.log()
    );
}

#[test]
fn rust_reads_the_progress_report_the_python_package_writes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rank-0.progress.json");
    let script = r#"
import time, ferrotrain
for step in range(1, 31):
    time.sleep(0.01)
    ferrotrain.report(step=step, loss=4.0 - step * 0.05, tokens=2048, samples=32,
                      total_steps=100, learning_rate=3e-4,
                      eval_loss=3.0 if step == 30 else None)
"#;
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", repo().join("python"))
        .env("FERROTRAIN_PROGRESS_FILE", &file)
        .env("RANK", "0")
        .env("WORLD_SIZE", "4")
        .status()
        .expect("python3");
    assert!(status.success());
    let bytes = std::fs::read(&file).unwrap();
    let p: Progress =
        ferrotrain_api::checksummed::open(&bytes, ferrotrain_api::checksummed::CRC_FIELD).unwrap();
    assert_eq!((p.step, p.total_steps, p.world_size), (30, 100, 4));
    assert_eq!(p.phase, TrainerPhase::Training, "not finished: 30 of 100");
    assert_eq!((p.eval_loss, p.eval_step), (Some(3.0), Some(30)));
    assert_eq!(p.samples, 30 * 32);
    let (rate, eta) = (p.steps_per_second.unwrap(), p.eta_seconds.unwrap());
    assert!(rate > 1.0 && rate < 150.0, "{rate}");
    assert!((eta - 70.0 / rate).abs() < 1e-6, "{eta} {rate}");
    assert!(p.tokens_per_second.unwrap() > 2048.0 * rate * 0.99);
    assert!(p.attempt_first_step_time.is_some() && p.learning_rate == Some(3e-4));
    // The launcher's reader (what node 0 serves on /progress) takes it whole.
    let report = ferrotrain_launch::GangReport::new(dir.path());
    assert_eq!(report.now().step, 30);
    // A changed byte is a damaged file: no report.
    std::fs::write(
        &file,
        String::from_utf8(bytes)
            .unwrap()
            .replace("\"step\": 30", "\"step\": 31"),
    )
    .unwrap();
    assert!(
        ferrotrain_api::checksummed::open::<Progress>(
            &std::fs::read(&file).unwrap(),
            ferrotrain_api::checksummed::CRC_FIELD
        )
        .is_err()
    );
}

/// kill -9 of `rank` (or SIGSTOP) once rank 0 logged step 40 of 80: what it cost.
fn fault(torch: &std::path::Path, rank: usize, signal: i32) -> Faulted {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    let mut run = gpt(torch, &log, 80, &[]).start();
    run.wait_for_step(&log, 40, Duration::from_secs(90));
    let pid = run.pid_of(0, rank).expect("the rank's pid");
    let failed_at = now();
    // SAFETY: a process of this test's launcher.
    unsafe { libc::kill(pid as i32, signal) };
    let code = run.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{}", run.log());
    Faulted::of(&read_steps(&log), failed_at, run.log())
}

/// With the package's three calls, kill -9 of rank 1, of rank 0 and SIGSTOP of rank 1 each
/// restart the ranks in place (the same launcher, round 1 from spares), heal from the
/// survivor's state, train no step twice, take the next step within seconds, and leave every
/// step's loss that of the run without a fault (bit for bit).
#[test]
fn a_killed_or_stopped_rank_costs_the_step_in_flight_in_place() {
    let Some(torch) = pytorch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("unfaulted.jsonl");
    let mut run = gpt(&torch, &log, 80, &[]).start();
    assert_eq!(run.wait(Duration::from_secs(120)), 0, "{}", run.log());
    let unfaulted: BTreeMap<u64, f64> = read_steps(&log).iter().map(|s| (s.step, s.loss)).collect();
    assert_eq!(unfaulted.len(), 80);
    for (what, rank, signal) in [
        ("kill -9 of rank 1", 1, libc::SIGKILL),
        ("kill -9 of rank 0", 0, libc::SIGKILL),
        ("SIGSTOP of rank 1", 1, libc::SIGSTOP),
    ] {
        fault(&torch, rank, signal).assert_healed(what, &unfaulted);
    }
}

#[test]
fn without_the_packages_calls_a_kill_restarts_in_place_from_the_scripts_own_checkpoint() {
    let Some(torch) = pytorch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    let ckpt = dir.path().join("ckpt");
    let extra = [
        "--no-ferrotrain",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--checkpoint-every",
        "25",
    ];
    let mut run = gpt(&torch, &log, 80, &extra).start();
    run.wait_for_step(&log, 40, Duration::from_secs(90));
    let pid = run.pid_of(0, 1).unwrap();
    let failed_at = now();
    // SAFETY: a process of this test's launcher.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(run.wait(Duration::from_secs(120)), 0, "{}", run.log());
    let steps = read_steps(&log);
    let after: Vec<&Step> = steps.iter().filter(|s| s.time > failed_at).collect();
    assert_eq!(
        after[0].step, 26,
        "from its checkpoint of step 25: {:?}",
        after[0]
    );
    assert!(
        run.log().contains("round 1: started 2 rank(s)"),
        "{}",
        run.log()
    );
    let twice = steps.len() - distinct(&steps);
    assert!(twice >= 15, "the steps since step 25 again: {twice}");
    eprintln!(
        "zero lines changed: kill -9 of rank 1 -> next step {:.2} s, {twice} steps trained twice",
        after[0].time - failed_at
    );
}

#[test]
fn the_environment_and_the_loss_curve_are_torchruns() {
    let Some(torch) = pytorch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.jsonl");
    let theirs = dir.path().join("torchrun.jsonl");
    let mut run = gpt(&torch, &ours, 40, &[]).start();
    assert_eq!(run.wait(Duration::from_secs(120)), 0, "{}", run.log());
    let status = torchrun(&torch, 2)
        .arg(repo().join("examples/pytorch/gpt.py"))
        .args(gpt_args(&theirs, 40))
        .status()
        .unwrap();
    assert!(status.success());
    let (a, b) = (read_steps(&ours), read_steps(&theirs));
    assert_eq!(a.len(), 40);
    let losses = |s: &[Step]| s.iter().map(|s| (s.step, s.loss)).collect::<Vec<_>>();
    assert_eq!(losses(&a), losses(&b), "the same seed, the same steps");
    // The environment: every variable torchrun's agent gives a worker, the same values but
    // for node 0's address and port (here torchrun --standalone's localhost and port), the
    // run's id (a random one with --standalone), the error files and the agent's store
    // (torchrun's workers use its c10d store; ours, rank 0's own).
    let env_of = |launcher: bool| {
        let probe = dir
            .path()
            .join(if launcher { "env-ours" } else { "env-torchrun" });
        std::fs::create_dir_all(&probe).unwrap();
        let script = dir.path().join("env.py");
        std::fs::write(
            &script,
            "import json,os\njson.dump(dict(os.environ), open(os.path.join(os.environ['PROBE'], os.environ['RANK']), 'w'))\n",
        )
        .unwrap();
        if launcher {
            let mut run = Launcher::new(2)
                .flags(&["--max-restarts", "0"])
                .env("PROBE", &probe)
                .env("OMP_NUM_THREADS", "1")
                .command(&["python3", script.to_str().unwrap()])
                .start();
            assert_eq!(run.wait(Duration::from_secs(60)), 0);
        } else {
            let status = torchrun(&torch, 2)
                .env("PROBE", &probe)
                .arg(&script)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let read = |rank: &str| -> BTreeMap<String, String> {
            serde_json::from_slice(&std::fs::read(probe.join(rank)).unwrap()).unwrap()
        };
        [read("0"), read("1")]
    };
    let (ours, theirs) = (env_of(true), env_of(false));
    let differ = [
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_USE_AGENT_STORE",
    ];
    // torchrun's agent's own setting, which its workers inherit: the signals it handles.
    let agent_only = ["TORCHELASTIC_SIGNALS_TO_HANDLE"];
    for (o, t) in ours.iter().zip(&theirs) {
        for name in ferrotrain_launch::torchrun::worker_env_names() {
            assert!(t.contains_key(*name), "torchrun sets {name}? {t:?}");
            assert!(o.contains_key(*name), "{name} unset by ferrotrain-launch");
            if !differ.contains(name) {
                assert_eq!(o[*name], t[*name], "{name}");
            }
        }
        // Nothing torchrun gives its workers that ours lack (its own agent's variables aside).
        let torchrun_names = t.keys().filter(|k| {
            (k.starts_with("TORCHELASTIC_") || k.ends_with("_RANK"))
                && !agent_only.contains(&k.as_str())
        });
        for name in torchrun_names {
            assert!(
                o.contains_key(name),
                "torchrun sets {name}, ferrotrain-launch does not"
            );
        }
    }
}
