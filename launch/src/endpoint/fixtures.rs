//! What the metrics tests build from: a progress report with every field set, and a
//! parser of the OpenMetrics text the tests read back.

use ferrotrain_api::config::Precision;
use ferrotrain_api::progress::{GangResources, PrecisionChoice};
use ferrotrain_api::{CheckpointInfo, DataStats, GpuUsage, Progress, ResourceUsage, TrainerPhase};

pub(super) fn full_progress() -> Progress {
    Progress {
        phase: TrainerPhase::Training,
        step: 1234,
        total_steps: 20000,
        epoch: 3,
        samples: 1_234_000,
        world_size: 4,
        steps_per_second: Some(2.5),
        samples_per_second: Some(320.0),
        tokens_per_second: Some(5210.75),
        step_time_seconds: Some(0.4),
        comm_fraction: Some(0.125),
        loss: Some(3.5),
        eval_loss: Some(3.75),
        eval_bleu: Some(21.5),
        eval_step: Some(1000),
        best_eval_loss: Some(3.625),
        learning_rate: Some(0.0007),
        eta_seconds: Some(7500.0),
        last_checkpoint: Some(CheckpointInfo {
            step: 1000,
            size_bytes: 61_234_567,
            time: "2026-01-02T03:04:05Z".into(),
            blocking_seconds: Some(0.0625),
            ..Default::default()
        }),
        durable_checkpoint: Some(ferrotrain_api::DurableCheckpoint {
            step: 500,
            url: "s3://ckpt/runs/job/step-00000500/".into(),
            time: "2026-01-02T02:04:05Z".into(),
            durable_seconds: Some(2.5),
            upload_bytes_per_second: Some(48e6),
            upload_error: None,
        }),
        checkpoint_error: Some(ferrotrain_api::CheckpointError {
            step: 1200,
            message: "checkpoint: writing /ckpt/job/.tmp-step-00001200-a0-7/model.safetensors: \
                      No space left on device (os error 28)"
                .into(),
            since: "2026-01-02T03:14:05Z".parse().unwrap(),
            failed_saves: 2,
        }),
        checkpoint_save_failures: 2,
        resumed_from_step: Some(500),
        healed_from: Some(ferrotrain_api::recovery::HealedFrom::Peers),
        attempt_first_step_time: Some("2026-01-02T03:00:00Z".parse().unwrap()),
        round: 0,
        round_ends: Vec::new(),
        precision: Some(PrecisionChoice {
            requested: Precision::Auto,
            used: Precision::Fp16,
            reason: "auto: GPU compute capability 7.0 has fp16 tensor cores but no bf16".into(),
        }),
        loss_scale: Some(8192.0),
        skipped_steps: 3,
        rejected_connections: [("bad_token".to_string(), 3)].into(),
        gang_resources: Some(GangResources {
            ranks: 4,
            cpu_utilization: Some(spread(1.5, 0.25, 3, 2.0, 1)),
            rss_bytes: Some(spread(2e9, 1.5e9, 0, 2.5e9, 2)),
            gpu_utilization: Some(spread(0.75, 0.5, 1, 0.875, 0)),
            gpu_memory_used_bytes: Some(spread(6e9, 5e9, 2, 7e9, 3)),
        }),
        parameters: 9_876_543,
        peak_memory_bytes: Some(1 << 30),
        resources: Some(ResourceUsage {
            cpu_seconds: 12.5,
            cpu_utilization: Some(1.75),
            rss_bytes: 3 << 20,
            peak_rss_bytes: 5 << 20,
            threads: 9,
            gpu: Some(GpuUsage {
                utilization: 0.875,
                memory_used_bytes: 7 << 30,
                peak_memory_used_bytes: 9 << 30,
                memory_total_bytes: 80 << 30,
            }),
        }),
        data: Some(DataStats {
            train_lines: 29000,
            train_pairs: 28990,
            train_tokens: 800_000,
            vocabulary_size: 8000,
            mean_source_tokens: 13.5,
            mean_target_tokens: 14.25,
            filtered_empty: 4,
            filtered_long: 6,
            valid_pairs: 1014,
            valid_truncated: 2,
        }),
        no_step_reports: false,
    }
}

fn spread(
    mean: f64,
    min: f64,
    min_rank: u32,
    max: f64,
    max_rank: u32,
) -> ferrotrain_api::progress::Spread {
    ferrotrain_api::progress::Spread {
        mean,
        min,
        min_rank,
        max,
        max_rank,
    }
}

/// Parses OpenMetrics text into (series -> value), checking a TYPE line precedes each
/// family and the text ends with `# EOF`.
pub(super) fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
    let mut values = std::collections::BTreeMap::new();
    let mut typed = std::collections::BTreeMap::new();
    assert!(text.ends_with("# EOF\n"), "{text}");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                typed.insert(name.to_string(), kind.to_string()).is_none(),
                "duplicate TYPE {name}"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap();
        let family = typed
            .iter()
            .find(|(f, kind)| {
                name == f.as_str() || (kind.as_str() == "counter" && name == format!("{f}_total"))
            })
            .unwrap_or_else(|| panic!("{name} has no TYPE line before it"));
        assert!(family.0.starts_with("ferrotrain_"), "{name}");
        let v = match value {
            "NaN" => f64::NAN,
            "+Inf" | "inf" => f64::INFINITY,
            "-Inf" | "-inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        assert!(
            values.insert(series.to_string(), v).is_none(),
            "duplicate {series}"
        );
    }
    values
}
