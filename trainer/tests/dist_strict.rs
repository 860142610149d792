//! Every collective call site hands the collective tensors on its device: two ranks train,
//! checkpoint, resume and evaluate through the device-strict twin of NCCL
//! (`FERROTRAIN_STRICT_COLLECTIVES=1`, dist/strict.rs), which fails the run on the first
//! tensor the collective did not allocate, as NCCL fails on a CPU tensor.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ProcessGroup, copy_config, write};

/// Runs `ferrotrain launch` with 2 ranks through the strict twin; returns its stderr.
fn launch_strict(dir: &Path, config: &Path, name: &str) -> String {
    let log = dir.join(format!("{name}.log"));
    let mut cmd = common::launch_command(config, 2, &dir.join("runs"), &log);
    cmd.env("FERROTRAIN_STRICT_COLLECTIVES", "1");
    let mut run = ProcessGroup::spawn(cmd, Some(log));
    let status = run.wait(Duration::from_secs(180));
    let text = run.log();
    assert!(
        status.success(),
        "2 ranks through the strict collective failed: {text}"
    );
    text
}

/// A field of each rank's "strict collectives checked" line (`collectives` or `downloads`).
fn strict_counts(log: &str, field: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("strict collectives checked"))
        .filter_map(|l| {
            let rest = l.split(&format!(" {field}=")).nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

fn checked_counts(log: &str) -> Vec<u64> {
    strict_counts(log, "collectives")
}

/// The copy task with an evaluation (loss and BLEU, all-reduced) every 3 steps.
fn config(max_steps: u64) -> String {
    let text = copy_config(max_steps, 3, "");
    let eval = "eval: {everySteps: 0, maxSentences: 20}";
    assert!(text.contains(eval), "{text}");
    text.replace(
        eval,
        "eval: {everySteps: 3, maxSentences: 8, bleu: true, beamSize: 1}",
    )
}

#[test]
fn two_ranks_train_resume_and_evaluate_through_the_strict_collective() {
    let dir = tempfile::tempdir().unwrap();
    // First run: fresh start (vocabulary, resume header, parameter broadcast), GradSync and
    // the per-step scalars, the final evaluation, a checkpoint.
    let first = write(dir.path(), "job.yaml", &config(6));
    let log = launch_strict(dir.path(), &first, "first");
    let counts = checked_counts(&log);
    assert_eq!(counts.len(), 2, "one count per rank: {log}");
    assert!(counts.iter().all(|&c| c >= 6), "{counts:?}: {log}");
    // Host reads through the collective (each a device synchronisation under NCCL): one per
    // step, one per evaluation (at 3 and 6), and at most 7 at start (the precision every rank
    // chose, vocabulary length and bytes, the gradient completion order, what every rank
    // offers to resume from, the resume header, the state's digest on every rank).
    let downloads = strict_counts(&log, "downloads");
    assert_eq!(downloads.len(), 2, "{log}");
    assert!(
        downloads.iter().all(|&d| (6..=6 + 2 + 7).contains(&d)),
        "{downloads:?}: more than one host read per step: {log}"
    );

    // The gradient buckets go through start/finish (the twin checks nothing wrote to them
    // in between): at least one per step.
    let started = strict_counts(&log, "started");
    assert!(
        started.len() == 2 && started.iter().all(|&n| n >= 6),
        "{started:?}: {log}"
    );

    // Second run resumes: rank 0 broadcasts the restored weights and optimizer moments.
    let second = write(dir.path(), "job.yaml", &config(9));
    let log = launch_strict(dir.path(), &second, "second");
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert_eq!(checked_counts(&log).len(), 2, "{log}");
    let losses = common::losses(&dir.path().join("runs").join("job"));
    assert_eq!(
        losses.iter().map(|l| l.0).collect::<Vec<_>>(),
        (1..=9).collect::<Vec<_>>()
    );
}

#[test]
fn the_learned_vocabulary_reaches_rank_1_through_the_strict_collective() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tgt) = common::write_corpus(dir.path(), 300);
    let config = format!(
        "task: translation\nseed: 3\nmaxSteps: 4\nthreads: 1\n\
         data:\n  train: {{source: '{src}', target: '{tgt}'}}\n  valid: {{source: '{src}', target: '{tgt}'}}\n  tokenizer: {{vocabSize: 100, minFrequency: 1}}\n  maxSentenceTokens: 30\n\
         model: {{dModel: 32, heads: 2, encoderLayers: 1, decoderLayers: 1, ffnDim: 64, dropout: 0.0, maxPositions: 64}}\n\
         batch: {{maxTokens: 400}}\noptimizer: {{lr: 0.005}}\nschedule: {{warmupSteps: 2}}\n\
         eval: {{everySteps: 0, beamSize: 1, maxSentences: 10}}\ncheckpoint: {{everySteps: 0}}\nlogEverySteps: 1\n"
    );
    let config = write(dir.path(), "job.yaml", &config);
    let log = launch_strict(dir.path(), &config, "translation");
    assert_eq!(checked_counts(&log).len(), 2, "{log}");
    assert!(dir.path().join("runs/job/tokenizer.json").is_file());
}
