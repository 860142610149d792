//! The `ferrotrain` command line: bad input fails with the right exit code and a message
//! naming the field or file; a small translation job trains, evaluates, translates and scores.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;

fn output_of(mut cmd: std::process::Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn");
    let pid = child.id();
    // Bound the wait: a watchdog kills the process if it hangs.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("wait");
    drop(watchdog);
    out
}

fn validate(config: &Path) -> Output {
    let mut cmd = ferrotrain();
    cmd.arg("validate").arg("--config").arg(config);
    output_of(cmd)
}

fn run_job(config: &Path, ckpt: &Path, termination_log: &Path) -> Output {
    let mut cmd = run_command(config, ckpt);
    cmd.env("FERROTRAIN_TERMINATION_LOG", termination_log);
    output_of(cmd)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the process exited with `code` and its error names `needle` (a field or file).
fn assert_fails(out: &Output, code: i32, needle: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", stderr(out));
    assert!(
        stderr(out).contains(needle),
        "the error does not name {needle}: {}",
        stderr(out)
    );
}

fn translation_config(train: &(String, String), extra: &str) -> String {
    format!(
        "task: translation\nseed: 3\nmaxSteps: 120\nthreads: 1\n\
         data:\n  train: {{source: '{}', target: '{}'}}\n  valid: {{source: '{}', target: '{}'}}\n  tokenizer: {{vocabSize: 100, minFrequency: 1}}\n  maxSentenceTokens: 30\n\
         model: {{dModel: 32, heads: 2, encoderLayers: 1, decoderLayers: 1, ffnDim: 64, dropout: 0.0, maxPositions: 64}}\n\
         batch: {{maxTokens: 400}}\noptimizer: {{lr: 0.005}}\nschedule: {{warmupSteps: 20}}\nlabelSmoothing: 0.1\n\
         eval: {{everySteps: 60, beamSize: 1, maxSentences: 30}}\ncheckpoint: {{everySteps: 60}}\nlogEverySteps: 20\nprecision: fp32\n{extra}",
        train.0, train.1, train.0, train.1
    )
}

#[test]
fn unknown_field_exits_2_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(
        tmp.path(),
        "c.yaml",
        &copy_config(10, 5, "modle: {dModel: 8}\n"),
    );
    let out = validate(&cfg);
    assert_fails(&out, 2, "modle");
    // `run` fails the same way and leaves the reason in the termination log.
    let log = tmp.path().join("termination-log");
    let out = run_job(&cfg, &tmp.path().join("ckpt"), &log);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let message = std::fs::read_to_string(&log).expect("termination message written");
    assert!(
        message.contains("modle") && !message.contains('\n'),
        "{message}"
    );
}

#[test]
fn negative_learning_rate_exits_2_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(
        tmp.path(),
        "c.yaml",
        &copy_config(10, 5, "").replace("optimizer: {lr: 0.003}", "optimizer: {lr: -0.1}"),
    );
    let out = validate(&cfg);
    assert_fails(&out, 2, "optimizer.lr");
}

#[test]
fn vocabulary_too_small_exits_2_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = write_corpus(tmp.path(), 50);
    let cfg = write(
        tmp.path(),
        "c.yaml",
        &translation_config(&corpus, "").replace("vocabSize: 100", "vocabSize: 20"),
    );
    let out = validate(&cfg);
    assert_fails(&out, 2, "data.tokenizer.vocabSize");
}

#[test]
fn missing_data_file_exits_3_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = (
        tmp.path().join("nope.en").display().to_string(),
        tmp.path().join("nope.de").display().to_string(),
    );
    let cfg = write(tmp.path(), "c.yaml", &translation_config(&corpus, ""));
    let out = validate(&cfg);
    assert_fails(&out, 3, "nope.en");
    let out = run_job(&cfg, &tmp.path().join("ckpt"), &tmp.path().join("log"));
    assert_fails(&out, 3, "nope.en");
}

#[test]
fn empty_corpus_exits_3_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (s, t) = (tmp.path().join("empty.en"), tmp.path().join("empty.de"));
    std::fs::write(&s, "").unwrap();
    std::fs::write(&t, "").unwrap();
    let corpus = (s.display().to_string(), t.display().to_string());
    let cfg = write(tmp.path(), "c.yaml", &translation_config(&corpus, ""));
    let out = run_job(&cfg, &tmp.path().join("ckpt"), &tmp.path().join("log"));
    assert_fails(&out, 3, "empty.en");
}

#[test]
fn incompatible_checkpoint_exits_4() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let cfg = write(tmp.path(), "job.yaml", &copy_config(6, 3, ""));
    let out = run_job(&cfg, &ckpt, &tmp.path().join("log"));
    assert!(out.status.success(), "{}", stderr(&out));
    // Same job, wider model: the checkpoint cannot be loaded into it.
    let wider = copy_config(12, 3, "").replace("dModel: 32", "dModel: 64");
    let cfg = write(tmp.path(), "job.yaml", &wider);
    let out = run_job(&cfg, &ckpt, &tmp.path().join("log"));
    assert_fails(&out, 4, "digest");
}

/// Issue 44: damaged state in the job directory stops a resume before any step, naming the
/// file: a token of tokenizer.json renamed (a valid vocabulary of the right size, which
/// loaded before its CRC: exit 3, permanent), then fence.json's attempt changed (exit 1,
/// retryable). Put back, the job resumes.
#[test]
fn a_damaged_tokenizer_or_fence_stops_the_resume_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let log = tmp.path().join("log");
    let cfg = write(tmp.path(), "job.yaml", &copy_config(6, 3, ""));
    assert!(run_job(&cfg, &ckpt, &log).status.success());
    let job = ckpt.join("job");
    let cfg = write(tmp.path(), "job.yaml", &copy_config(12, 3, ""));
    let damage = |file: &str, from: &str, to: &str| {
        let good = std::fs::read_to_string(job.join(file)).unwrap();
        let bad = good.replacen(from, to, 1);
        assert_ne!(bad, good, "{from} in {file}");
        std::fs::write(job.join(file), bad).unwrap();
        good
    };
    let tokenizer = damage("tokenizer.json", "\"s11\"", "\"t11\"");
    assert_fails(&run_job(&cfg, &ckpt, &log), 3, "tokenizer.json");
    std::fs::write(job.join("tokenizer.json"), tokenizer).unwrap();
    let fence = damage("fence.json", "\"attempt\": 0", "\"attempt\": 5");
    assert_fails(&run_job(&cfg, &ckpt, &log), 1, "fence.json");
    assert!(!job.join("step-00000009").exists(), "nothing trained");
    std::fs::write(job.join("fence.json"), fence).unwrap();
    assert!(run_job(&cfg, &ckpt, &log).status.success());
    assert!(job.join("step-00000012").is_dir());
}

#[test]
fn translation_job_trains_evaluates_translates_and_scores() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = write_corpus(tmp.path(), 400);
    let cfg = write(tmp.path(), "tiny.yaml", &translation_config(&corpus, ""));
    let ckpt = tmp.path().join("ckpt");
    let out = run_job(&cfg, &ckpt, &tmp.path().join("log"));
    assert!(out.status.success(), "{}", stderr(&out));
    let job = ckpt.join("tiny");
    assert!(job.join("tokenizer.json").is_file());
    assert!(job.join("step-00000120/model.safetensors").is_file());

    let losses = losses(&job);
    assert_eq!(losses.len(), 120);
    let first: f64 = losses[..10].iter().map(|l| l.1).sum::<f64>() / 10.0;
    let last: f64 = losses[110..].iter().map(|l| l.1).sum::<f64>() / 10.0;
    assert!(last < 0.6 * first, "loss did not fall: {first} -> {last}");
    let log = std::fs::read_to_string(job.join("train-log.jsonl")).unwrap();
    let bleu: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["evalBleu"].as_f64())
        .collect();
    assert_eq!(bleu.len(), 2, "evaluations at steps 60 and 120");

    // translate reads stdin and writes one line per input line; bleu scores them.
    let sources = "the red dog runs in park .\na small cat sleeps .\n";
    let out = translate(&job, &["--beam", "2"], sources);
    assert!(out.status.success(), "{}", stderr(&out));
    let hyps = String::from_utf8(out.stdout).unwrap();
    assert_eq!(hyps.lines().count(), 2, "{hyps}");

    // The mean of the two saved checkpoints, decoded greedily in bf16.
    let out = translate(
        &job,
        &["--beam", "1", "--average", "2", "--precision", "bf16"],
        sources,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("steps=[60, 120]"), "{}", stderr(&out));
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 2);
    for bad in [["--average", "0"], ["--precision", "fp8"]] {
        let out = translate(&job, &bad, sources);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(bad[0]), "{}", stderr(&out));
    }

    let refs = write(
        tmp.path(),
        "refs.de",
        "der rote Hund läuft im Park .\nein kleine Katze schläft .\n",
    );
    let mut cmd = ferrotrain();
    cmd.arg("bleu").arg("--reference").arg(&refs);
    let out = with_stdin(cmd, &hyps);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("BLEU = "));
}

#[test]
fn select_chooses_on_validation_bleu_and_translate_uses_the_choice() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = write_corpus(tmp.path(), 400);
    // Evaluated and saved at 40, 80 and 120, all three kept.
    let config = translation_config(&corpus, "")
        .replace("everySteps: 60, beamSize", "everySteps: 40, beamSize")
        .replace(
            "checkpoint: {everySteps: 60}",
            "checkpoint: {everySteps: 40, keepLatest: 3}",
        );
    let cfg = write(tmp.path(), "sel.yaml", &config);
    let ckpt = tmp.path().join("ckpt");
    let out = run_job(&cfg, &ckpt, &tmp.path().join("log"));
    assert!(out.status.success(), "{}", stderr(&out));
    let job = ckpt.join("sel");
    let out = translate(&job, &["--selected"], "a small cat sleeps .\n");
    assert_fails(&out, 3, "ferrotrain select");

    // A validation set: the first 30 pairs (the selection only needs files that pair up).
    let (src, tgt) = (&corpus.0, &corpus.1);
    let head = |path: &str| -> String {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().take(30).map(|l| format!("{l}\n")).collect()
    };
    let val_src = write(tmp.path(), "val.en", &head(src));
    let val_ref = write(tmp.path(), "val.de", &head(tgt));
    // `ferrotrain select` of `job` on that set with `args`; what it wrote.
    let select = |args: &[&str]| -> serde_json::Value {
        let mut cmd = ferrotrain();
        cmd.arg("select").arg("--job").arg(&job);
        cmd.arg("--source")
            .arg(&val_src)
            .arg("--reference")
            .arg(&val_ref);
        cmd.args(args);
        let out = with_stdin(cmd, "");
        assert!(out.status.success(), "{}", stderr(&out));
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(printed.contains("selected: "), "{printed}");
        let written = std::fs::read_to_string(job.join("selected.json")).unwrap();
        serde_json::from_str(&written).unwrap()
    };
    let selection = select(&["--beam", "1", "--max-average", "3"]);
    let scored = selection["scored"].as_array().unwrap();
    let names: Vec<&str> = scored
        .iter()
        .map(|s| s[0]["name"].as_str().unwrap())
        .collect();
    for name in ["step 40", "step 80", "step 120", "last 2", "last 3"] {
        assert!(names.contains(&name), "{name} not scored: {names:?}");
    }
    let best = scored
        .iter()
        .map(|s| s[1].as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert_eq!(selection["valBleu"].as_f64().unwrap(), best, "{selection}");
    let steps: Vec<u64> = selection["chosen"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();

    let out = translate(
        &job,
        &["--selected", "--beam", "1"],
        "a small cat sleeps .\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("steps={steps:?}")),
        "{steps:?}: {}",
        stderr(&out)
    );
    let out = translate(&job, &["--steps", "40,120", "--beam", "1"], "a cat .\n");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("steps=[40, 120]"), "{}", stderr(&out));
    let out = translate(&job, &["--steps", "50"], "a cat .\n");
    assert_fails(&out, 3, "step 50");

    // With a beam, every candidate is scored under each length penalty asked for, and
    // `translate --selected` decodes with the chosen one unless told another.
    let selection = select(&[
        "--beam",
        "2",
        "--max-average",
        "2",
        "--length-penalties",
        "0.5,2",
    ]);
    let penalties: Vec<(String, f64)> = selection["scored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (name, alpha) = (&s[0]["name"], &s[0]["lengthPenalty"]);
            (name.as_str().unwrap().to_string(), alpha.as_f64().unwrap())
        })
        .collect();
    for name in ["step 40", "last 2"] {
        for alpha in [0.5, 2.0] {
            let scored = (name.to_string(), alpha);
            assert!(penalties.contains(&scored), "{penalties:?}");
        }
    }
    let chosen = selection["chosen"]["lengthPenalty"].as_f64().unwrap();
    let out = translate(&job, &["--selected", "--beam", "2"], "a cat sleeps .\n");
    assert!(out.status.success(), "{}", stderr(&out));
    let logged = format!("length_penalty={chosen:?}");
    assert!(stderr(&out).contains(&logged), "{logged}: {}", stderr(&out));
    let told = ["--selected", "--length-penalty", "1.3"];
    let out = translate(&job, &told, "a cat .\n");
    assert!(
        stderr(&out).contains("length_penalty=1.3"),
        "{}",
        stderr(&out)
    );
    let out = translate(&job, &["--length-penalty", "7"], "a cat .\n");
    assert_fails(&out, 2, "--length-penalty");
}

#[test]
fn evaluated_steps_are_saved_so_keep_best_keeps_evaluated_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    // Evaluations at 7, 14 and 21; periodic checkpoints never (every 100 steps).
    let config = copy_config(21, 100, "")
        .replace(
            "eval: {everySteps: 0, maxSentences: 20}",
            "eval: {everySteps: 7, maxSentences: 8, beamSize: 1}",
        )
        .replace("keepLatest: 2}", "keepLatest: 1, keepBest: 1}");
    let cfg = write(tmp.path(), "job.yaml", &config);
    let out = run_job(&cfg, &ckpt, &tmp.path().join("log"));
    assert!(out.status.success(), "{}", stderr(&out));
    for step in ["step-00000007", "step-00000014", "step-00000021"] {
        assert!(stderr(&out).contains(step), "{step} was not saved");
    }
    let kept: Vec<serde_json::Value> = std::fs::read_dir(ckpt.join("job"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
        })
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p.join("trainer.json")).unwrap()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!kept.is_empty() && kept.len() <= 2, "{kept:?}");
    for state in &kept {
        assert!(
            state["evalLoss"].is_f64(),
            "kept without an eval loss: {state}"
        );
    }
}

/// `ferrotrain translate --checkpoint JOB ARGS` with `input` on stdin.
fn translate(job: &Path, args: &[&str], input: &str) -> Output {
    let mut cmd = ferrotrain();
    cmd.arg("translate").arg("--checkpoint").arg(job).args(args);
    with_stdin(cmd, input)
}

/// Runs `cmd` with `input` on its stdin; captures stdout and stderr.
fn with_stdin(mut cmd: std::process::Command, input: &str) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Rank 0's /progress server ends with training, so its final report (step, eval,
/// checkpoint) travels in the termination message, through the launcher to the container's.
#[test]
fn a_finished_run_leaves_its_final_progress_in_the_termination_message() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write(tmp.path(), "job.yaml", &copy_config(8, 4, ""));
    let log = tmp.path().join("launcher.termination-log");
    let mut cmd = ferrotrain();
    cmd.arg("launch")
        .arg("--config")
        .arg(&cfg)
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--max-restarts",
            "0",
        ])
        .arg("--")
        .arg("--checkpoint-dir")
        .arg(tmp.path().join("ckpt"))
        .env("FERROTRAIN_TERMINATION_LOG", &log);
    let out = output_of(cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    let message = std::fs::read_to_string(&log).expect("a termination message");
    assert!(message.len() <= 4000, "{}", message.len());
    let report = ferrotrain_api::Progress::from_termination_message(&message)
        .unwrap_or_else(|| panic!("not a final report: {message}"));
    assert_eq!(report.phase, ferrotrain_api::TrainerPhase::Finished);
    assert_eq!((report.step, report.total_steps), (8, 8));
    assert_eq!(report.world_size, 2);
    assert_eq!(report.last_checkpoint.map(|c| c.step), Some(8));
    assert!(report.loss.is_some());
}

/// The wait policy a rank with 2 threads should pick on this machine (outside a pod).
fn expected_policy() -> &'static str {
    use ferrotrain_trainer::omp;
    let cpu_max = std::fs::read_to_string("/sys/fs/cgroup/cpu.max").ok();
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores = omp::dedicated_cores(cpu_max.as_deref(), false, available);
    omp::wait_policy(true, 1, 2, cores).unwrap_or("default")
}

#[test]
fn a_cpu_rank_that_has_its_cores_starts_again_with_spinning_threads_unless_told_otherwise() {
    let tmp = tempfile::tempdir().unwrap();
    let text = copy_config(2, 0, "").replace("threads: 1", "threads: 2");
    let cfg = write(tmp.path(), "job.yaml", &text);
    let started_with = |policy: Option<&str>| {
        let mut cmd = run_command(&cfg, &tmp.path().join("ckpt"));
        cmd.env_remove("KUBERNETES_SERVICE_HOST");
        match policy {
            Some(p) => cmd.env("OMP_WAIT_POLICY", p),
            None => cmd.env_remove("OMP_WAIT_POLICY"),
        };
        let out = output_of(cmd);
        assert!(out.status.success(), "{}", stderr(&out));
        let err = stderr(&out);
        let line = err
            .lines()
            .find(|l| l.contains("starting") && l.contains("omp_wait_policy"))
            .unwrap_or_else(|| panic!("no start-up line: {err}"))
            .to_string();
        (line, err.contains("starting again"))
    };
    let expected = expected_policy();
    let (line, again) = started_with(None);
    assert!(
        line.contains(&format!("omp_wait_policy={expected}")),
        "{line}"
    );
    assert_eq!(again, expected == "ACTIVE");
    // Set by the user (or a test harness): kept, no second start.
    let (line, again) = started_with(Some("PASSIVE"));
    assert!(line.contains("omp_wait_policy=PASSIVE"), "{line}");
    assert!(!again);
}
