//! Data parallelism preserves the training run: 1, 2 and 4 ranks on 127.0.0.1 with the same
//! global batches (`batch.maxTokens` is per rank: 600, 300 and 150), seed and no dropout log
//! the same loss curve, up to float summation order; so do 2 ranks standing in for a gang of
//! 4 (an elastic round shrunk to half: FERROTRAIN_VIRTUAL_WORLD=4, each rank covering two
//! ranks' shards), 2 ranks given the 1-rank recipe's batch as `batch.globalTokens: 600`
//! (with `maxTokens` unchanged at 600), and gangs grown beyond the size asked for
//! (elastic.maxReplicas: FERROTRAIN_BATCH_WORLD is the size asked for): 2 ranks cutting the
//! 1-rank recipe's batch in two, and 3 ranks of a gang of up to 4 cutting the 2-rank recipe's
//! batch in four.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::ProcessGroup;

const STEPS: u64 = 30;
/// Largest tolerated |loss(n ranks) - loss(1 rank)| at any step. The gradients are the same
/// sums added in another order (measured: max difference 6e-7 over 30 steps); the margin
/// covers other machines' float behaviour while still catching any real divergence (a
/// missing shard, an unsynchronized parameter or a wrong scale moves the loss by > 1e-2).
const TOLERANCE: f64 = 1e-4;

/// How the runs say their batch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Batch {
    /// `maxTokens: 600 / gang`, per rank.
    PerRank,
    /// `maxTokens: 600` and `globalTokens: 600`, whatever the number of ranks.
    Global,
}

/// Runs the job with `ranks` processes (1 = plain `ferrotrain run`) standing for a gang of
/// `gang` ranks whose batch is sized for `asked` ranks; returns the losses.
fn losses(dir: &Path, ranks: usize, (gang, asked): (usize, usize), batch: Batch) -> Vec<f64> {
    let runs = dir.join(format!("runs-{ranks}-{gang}-{asked}-{batch:?}"));
    // The job is named after the file: one directory per run, each with job.yaml.
    let config_dir = dir.join(format!("config-{ranks}-{gang}-{asked}-{batch:?}"));
    std::fs::create_dir_all(&config_dir).unwrap();
    let config = config_dir.join("job.yaml");
    let job = common::GangCopyJob {
        seed: 11,
        max_steps: STEPS,
        train_samples: 2000,
        valid_samples: 16,
        max_tokens: if batch == Batch::Global {
            600
        } else {
            600 / asked
        },
        global_tokens: (batch == Batch::Global).then_some(600),
        checkpoint_every: 0,
        keep_latest: 1,
        collective_timeout_seconds: 20,
        log_every: 1000,
    };
    std::fs::write(&config, job.yaml()).unwrap();
    let log = dir.join(format!("stderr-{ranks}-{gang}-{asked}-{batch:?}.log"));
    let cmd = if ranks == 1 {
        let mut cmd = common::run_command(&config, &runs);
        cmd.env("OMP_NUM_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        cmd
    } else {
        let mut cmd = common::launch_command(&config, ranks, &runs, &log);
        if gang > ranks {
            cmd.env("FERROTRAIN_VIRTUAL_WORLD", gang.to_string());
        }
        if asked != gang {
            cmd.env("FERROTRAIN_BATCH_WORLD", asked.to_string());
        }
        cmd
    };
    let mut run = ProcessGroup::spawn(cmd, Some(log));
    let status = run.wait(Duration::from_secs(120));
    assert!(status.success(), "{ranks} rank(s) failed: {}", run.log());
    let log = std::fs::read_to_string(runs.join("job").join("train-log.jsonl")).unwrap();
    let losses: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss").and_then(|x| x.as_f64()))
        .collect();
    assert_eq!(losses.len() as u64, STEPS, "{ranks} rank(s): {log}");
    losses
}

#[test]
fn one_two_and_four_ranks_follow_the_same_loss_curve() {
    let dir = tempfile::tempdir().unwrap();
    let single = losses(dir.path(), 1, (1, 1), Batch::PerRank);
    assert!(
        single[STEPS as usize - 1] < single[0] - 0.3,
        "the run must learn something for the comparison to mean anything: {single:?}"
    );
    // (ranks, (gang, asked), batch).
    let runs = [
        (2, (2, 2), Batch::PerRank),
        (4, (4, 4), Batch::PerRank),
        (2, (4, 4), Batch::PerRank),
        (2, (2, 2), Batch::Global),
        (2, (2, 1), Batch::PerRank),
        (3, (4, 2), Batch::PerRank),
    ];
    for (ranks, (gang, asked), batch) in runs {
        let multi = losses(dir.path(), ranks, (gang, asked), batch);
        let worst = single
            .iter()
            .zip(&multi)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "{ranks} ranks (gang of {gang}, batch of {asked}, {batch:?}): final loss {:.6} vs {:.6} (1 rank), max |diff| over \
             {STEPS} steps {worst:.2e}",
            multi[STEPS as usize - 1],
            single[STEPS as usize - 1]
        );
        assert!(
            worst <= TOLERANCE,
            "{ranks} ranks (gang of {gang}, batch of {asked}, {batch:?}) diverge from 1 rank by {worst}: {multi:?} vs {single:?}"
        );
    }
}
