//! What a run tells the world besides its checkpoints: TensorBoard events read back by the
//! `tensorboard` Python package's own reader, and the process's CPU and memory in /metrics
//! checked against /proc of the running trainer.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Guard, copy_config, http_get, run_command, wait_until, write};
use ferrotrain_trainer::tensorboard::EventWriter;

/// The TensorBoard release the read-back is checked with.
const TENSORBOARD: &str = "tensorboard==2.20.0";

/// A Python with `tensorboard` importable: a venv cached under ~/.cache/ferrotrain, made on
/// first use. `None` (and a loud message) only when pip cannot install it (offline).
fn tensorboard_python() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let venv = home.join(".cache/ferrotrain/tb-venv");
    let python = venv.join("bin/python");
    let works = |py: &Path| {
        Command::new(py)
            .args([
                "-c",
                "import tensorboard.backend.event_processing.event_accumulator",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works(&python) {
        return Some(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", TENSORBOARD])
            .status()
            .is_ok_and(|s| s.success());
    if made && works(&python) {
        return Some(python);
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED: cannot install {TENSORBOARD} into {} (offline?); the TensorBoard \
         read-back was NOT checked !!!!!!!!\n",
        venv.display()
    );
    None
}

/// Every scalar in the run directory `dir` as TensorBoard's EventAccumulator reads it:
/// tag -> [(step, value)].
fn read_scalars(python: &Path, dir: &Path) -> BTreeMap<String, Vec<(u64, f64)>> {
    let script = "import json, sys\n\
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n\
        acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})\n\
        acc.Reload()\n\
        print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}))\n";
    run_reader(python, script, dir)
}

/// Runs a reader `script` (with `dir` as its argument) and parses the JSON it prints.
fn run_reader<T: serde::de::DeserializeOwned>(python: &Path, script: &str, dir: &Path) -> T {
    let out = Command::new(python)
        .args(["-c", script])
        .arg(dir)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the reader's JSON")
}

/// A Python that reads TensorBoard events, and an event writer in a fresh directory.
fn board() -> Option<(PathBuf, tempfile::TempDir, EventWriter)> {
    let python = tensorboard_python()?;
    let tmp = tempfile::tempdir().unwrap();
    let events = EventWriter::create(tmp.path()).unwrap();
    Some((python, tmp, events))
}

#[test]
fn tensorboard_reads_back_the_scalars_written() {
    let Some((python, tmp, mut events)) = board() else {
        return;
    };
    assert!(
        events
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("events.out.tfevents.")
    );
    for step in 1..=5u64 {
        let s = step as f64;
        events
            .scalars(
                step,
                &[("train/loss", 4.0 / s), ("train/learning_rate", 1e-3 * s)],
            )
            .unwrap();
    }
    events.scalars(5, &[("eval/bleu", 37.25)]).unwrap();
    events.flush().unwrap();

    let scalars = read_scalars(&python, tmp.path());
    assert_eq!(
        scalars.keys().collect::<Vec<_>>(),
        ["eval/bleu", "train/learning_rate", "train/loss"]
    );
    let loss = &scalars["train/loss"];
    assert_eq!(
        loss.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    for (step, v) in loss {
        // simple_value is an f32.
        assert!((v - 4.0 / *step as f64).abs() < 1e-6, "{loss:?}");
    }
    assert!((scalars["train/learning_rate"][2].1 - 3e-3).abs() < 1e-9);
    assert_eq!(scalars["eval/bleu"], [(5, 37.25)]);
}

#[test]
fn tensorboard_reads_back_the_precision_as_hparams() {
    let Some((python, tmp, mut events)) = board() else {
        return;
    };
    events
        .hparams(&[
            ("precision", "bf16"),
            ("precision_requested", "auto"),
            ("precision_reason", "auto: this CPU has AVX512-BF16"),
        ])
        .unwrap();
    events.scalars(1, &[("train/loss", 2.5)]).unwrap();
    events.flush().unwrap();
    let script = "import json, sys\n\
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n\
        from tensorboard.plugins.hparams import plugin_data_pb2\n\
        acc = EventAccumulator(sys.argv[1])\n\
        acc.Reload()\n\
        content = acc.PluginTagToContent('hparams')['_hparams_/session_start_info']\n\
        data = plugin_data_pb2.HParamsPluginData.FromString(content)\n\
        assert data.version == 0 and data.HasField('session_start_info')\n\
        hp = data.session_start_info.hparams\n\
        print(json.dumps({k: v.string_value for k, v in hp.items()}))\n";
    let hparams: BTreeMap<String, String> = run_reader(&python, script, tmp.path());
    assert_eq!(hparams["precision"], "bf16");
    assert_eq!(hparams["precision_requested"], "auto");
    assert_eq!(
        hparams["precision_reason"],
        "auto: this CPU has AVX512-BF16"
    );
}

#[test]
fn a_copy_run_writes_every_tag_per_attempt() {
    let Some(python) = tensorboard_python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = copy_config(30, 10, "").replace(
        "eval: {everySteps: 0, maxSentences: 20}",
        "eval: {everySteps: 15, maxSentences: 8}",
    );
    let config = write(tmp.path(), "copy.yaml", &config);
    let ckpt = tmp.path().join("ckpt");
    let mut cmd = run_command(&config, &ckpt);
    cmd.env("FERROTRAIN_ATTEMPT", "2").stderr(Stdio::null());
    let mut child = Guard::spawn(cmd);
    let status = child
        .wait_timeout(Duration::from_secs(240))
        .expect("finishes");
    assert!(status.success(), "{status:?}");

    let dir = ckpt.join("copy/tensorboard/attempt-2");
    let scalars = read_scalars(&python, &dir);
    let tags: Vec<&str> = scalars.keys().map(String::as_str).collect();
    assert_eq!(
        tags,
        [
            "checkpoint/save_seconds",
            "eval/bleu",
            "eval/loss",
            "train/grad_norm",
            "train/learning_rate",
            "train/loss",
            "train/step_time_seconds",
            "train/tokens_per_second",
        ],
        "(train/comm_fraction only with more than one rank)"
    );
    let steps = |tag: &str| scalars[tag].iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(steps("train/loss"), (1..=30).collect::<Vec<_>>());
    assert_eq!(steps("eval/loss"), [15, 30]);
    // Each save at its own step (every 10, the evaluated ones, the final one), seen when
    // its background write completed.
    let saves = steps("checkpoint/save_seconds");
    assert!(saves.contains(&10) && saves.ends_with(&[30]), "{saves:?}");
    assert!(
        scalars["checkpoint/save_seconds"]
            .iter()
            .all(|p| p.1 >= 0.0)
    );
    // The loss per step is the one in the job's log.
    let logged = common::losses(&ckpt.join("copy"));
    for ((s1, a), (s2, b)) in scalars["train/loss"].iter().zip(&logged) {
        assert_eq!(s1, s2);
        assert!(
            (a - b).abs() < 1e-4 * b.abs().max(1.0),
            "step {s1}: {a} vs {b}"
        );
    }
    assert!(
        scalars["eval/bleu"]
            .iter()
            .all(|p| (0.0..=100.0).contains(&p.1))
    );
}

/// GET `path` from 127.0.0.1:`port`: the body.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

/// (utime + stime seconds, VmRSS bytes) of a process.
fn proc_of(pid: u32) -> (f64, f64) {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let r = ferrotrain_trainer::resources::read_proc(&dir).expect("the child's /proc");
    (r.cpu_seconds, r.rss_bytes as f64)
}

#[test]
fn metrics_report_the_cpu_and_memory_proc_shows_for_the_process() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(
        tmp.path(),
        "copy.yaml",
        &copy_config(1_000_000, 0, "maxSeconds: 300\n"),
    );
    let log = tmp.path().join("stderr.log");
    let mut cmd = run_command(&config, &tmp.path().join("ckpt"));
    cmd.arg("--metrics-port")
        .arg("0")
        .stderr(std::fs::File::create(&log).unwrap());
    let child = Guard::spawn(cmd);
    let pid = child.id();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut port = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            port = read_log()
                .split("addr=0.0.0.0:")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok());
            port.is_some()
        }),
        "no metrics address in the log:\n{}",
        read_log()
    );
    let port: u16 = port.unwrap();
    // Let it train a little, so CPU time and memory are those of a training process.
    assert!(
        wait_until(Duration::from_secs(120), || http_get(port, "/metrics")
            .is_some_and(
                |m| m.contains("ferrotrain_step ") && metric(&m, "ferrotrain_step") >= 5.0
            )),
        "no steps:\n{}",
        read_log()
    );
    let (cpu_before, _) = proc_of(pid);
    let text = http_get(port, "/metrics").expect("a scrape");
    let (cpu_after, rss) = proc_of(pid);
    let cpu = metric(&text, "ferrotrain_process_cpu_seconds_total");
    assert!(
        cpu >= cpu_before - 0.02 && cpu <= cpu_after + 0.02,
        "/metrics says {cpu} CPU s, /proc {cpu_before}..{cpu_after}"
    );
    let rss_metric = metric(&text, "ferrotrain_process_resident_memory_bytes");
    assert!(
        (rss_metric - rss).abs() <= 0.1 * rss,
        "/metrics says {rss_metric} bytes resident, /proc {rss}"
    );
    assert!(metric(&text, "ferrotrain_process_peak_resident_memory_bytes") >= rss_metric);
    // libtorch's pool, the metrics thread, the main thread at least.
    assert!(metric(&text, "ferrotrain_process_threads") >= 2.0);
    assert_eq!(metric(&text, "ferrotrain_data_train_pairs"), 2000.0);

    // Utilisation needs two readings at least 0.2 s apart.
    std::thread::sleep(Duration::from_millis(300));
    let progress: serde_json::Value =
        serde_json::from_str(&http_get(port, "/progress").unwrap()).unwrap();
    let res = &progress["resources"];
    assert!(
        res["cpuSeconds"].as_f64().unwrap() >= cpu_before - 0.02,
        "{progress}"
    );
    let u = res["cpuUtilization"].as_f64().expect("a second reading");
    assert!((0.0..=8.0).contains(&u), "{u}");
    assert_eq!(progress["data"]["trainPairs"], 2000);
    assert_eq!(progress["data"]["vocabularySize"], 16);
    drop(child);
}

#[test]
fn a_resumed_attempt_continues_the_curve_in_its_own_run() {
    let Some(python) = tensorboard_python() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    // Attempt 0 stops at step 20 (its final checkpoint); attempt 1 resumes there and goes on
    // to 30 (the config digest ignores the training length).
    for (attempt, max_steps) in [(0, 20), (1, 30)] {
        let config = write(tmp.path(), "copy.yaml", &copy_config(max_steps, 10, ""));
        let mut cmd = run_command(&config, &ckpt);
        cmd.env("FERROTRAIN_ATTEMPT", attempt.to_string())
            .stderr(Stdio::null());
        let mut child = Guard::spawn(cmd);
        let status = child
            .wait_timeout(Duration::from_secs(240))
            .expect("finishes");
        assert!(status.success(), "attempt {attempt}: {status:?}");
    }
    let steps = |attempt: u32| {
        let scalars = read_scalars(
            &python,
            &ckpt.join(format!("copy/tensorboard/attempt-{attempt}")),
        );
        scalars["train/loss"]
            .iter()
            .map(|p| p.0)
            .collect::<Vec<_>>()
    };
    assert_eq!(steps(0), (1..=20).collect::<Vec<_>>());
    assert_eq!(steps(1), (21..=30).collect::<Vec<_>>());
}
