//! The progress report as Prometheus / OpenMetrics text, encoded by prometheus-client (the
//! library the operator's endpoint uses): a gauge `ferrotrain_*` per field the report has.

use ferrotrain_api::progress::GangResources;
use ferrotrain_api::{DataStats, Progress, ResourceUsage, TrainerPhase};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// The OpenMetrics content type (Prometheus negotiates it; what the operator serves too).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition of a progress report.
///
/// Every value is a gauge named `ferrotrain_*` (CPU seconds a counter); a field the report
/// does not have yet (no evaluation so far, no checkpoint) is left out rather than exported
/// as 0.
pub fn prometheus_text(p: &Progress) -> String {
    let mut r = Registry::with_prefix("ferrotrain");
    phase_metrics(&mut r, p.phase);
    for (name, help, v) in int_gauges(p) {
        if let Some(v) = v {
            r.register(name, help, ConstGauge::new(v));
        }
    }
    for (name, help, v) in float_gauges(p) {
        if let Some(v) = v {
            r.register(name, help, ConstGauge::new(v));
        }
    }
    if let Some(res) = &p.resources {
        resource_metrics(&mut r, res);
    }
    if let Some(g) = &p.gang_resources {
        gang_metrics(&mut r, g);
    }
    if let Some(d) = &p.data {
        data_metrics(&mut r, d);
    }
    refused_metrics(&mut r, &p.rejected_connections);
    save_failure_metrics(&mut r, p);
    precision_metrics(&mut r, p);

    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// `rejected_connections_total{reason}`: connections the rendezvous store and rank 0's ring
/// listener refused (docs/security.md). Always present, 0 until one is refused, so an alert
/// on its rate needs no absent() case.
fn refused_metrics(r: &mut Registry, counts: &std::collections::BTreeMap<String, u64>) {
    let family = Family::<Vec<(&'static str, String)>, Counter>::default();
    let _ = family.get_or_create(&vec![("reason", "bad_token".to_string())]);
    for (reason, n) in counts {
        family
            .get_or_create(&vec![("reason", reason.clone())])
            .inc_by(*n);
    }
    r.register(
        "rejected_connections",
        "Connections refused by the rendezvous store or rank 0's ring listener, by reason",
        family,
    );
}

/// `checkpoint_save_failures_total`: saves that failed in this run, always present (0 until
/// one fails) like the refusals; `checkpoint_error_since_timestamp_seconds` only while the
/// last save failed: since when no save completed.
fn save_failure_metrics(r: &mut Registry, p: &Progress) {
    r.register(
        "checkpoint_save_failures",
        "Checkpoint saves that failed in this run of the trainer (a disk that refused the write: full, over quota, read-only, failing)",
        ConstCounter::new(p.checkpoint_save_failures),
    );
    if let Some(e) = &p.checkpoint_error {
        r.register(
            "checkpoint_error_since_timestamp_seconds",
            "Unix time of the first failed save since the last that completed (absent while saves complete)",
            ConstGauge::new(e.since.as_second()),
        );
    }
}

/// `precision{used, requested}` 1 once the precision is decided; with fp16 the loss scale
/// and `skipped_steps_total` (steps skipped on a gradient overflow, this run).
fn precision_metrics(r: &mut Registry, p: &Progress) {
    if let Some(choice) = &p.precision {
        let family =
            Family::<Vec<(&'static str, String)>, ConstGauge<i64>>::new_with_constructor(|| {
                ConstGauge::new(1)
            });
        let _ = family.get_or_create(&vec![
            ("used", choice.used.as_str().to_string()),
            ("requested", choice.requested.as_str().to_string()),
        ]);
        r.register(
            "precision",
            "The precision of the matrix multiplies (used) and the config's (requested)",
            family,
        );
    }
    if let Some(scale) = p.loss_scale {
        r.register(
            "loss_scale",
            "fp16: the dynamic loss scale",
            ConstGauge::new(scale),
        );
        r.register(
            "skipped_steps",
            "fp16: optimizer steps skipped because the gradients overflowed, this run",
            ConstCounter::new(p.skipped_steps),
        );
    }
}

/// One family `phase` with a 1 for the current phase and a 0 for each other.
fn phase_metrics(r: &mut Registry, current: TrainerPhase) {
    let phases = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    for (phase, label) in [
        (TrainerPhase::Starting, "starting"),
        (TrainerPhase::Training, "training"),
        (TrainerPhase::Evaluating, "evaluating"),
        (TrainerPhase::Finished, "finished"),
    ] {
        phases
            .get_or_create(&vec![("phase", label)])
            .set(i64::from(current == phase));
    }
    r.register(
        "phase",
        "What the trainer is doing (1 for the current phase)",
        phases,
    );
}

/// The Unix time (whole seconds) of an RFC 3339 text; None if it is not one, or before 1970.
fn unix_seconds(text: &str) -> Option<u64> {
    let t: jiff::Timestamp = text.parse().ok()?;
    u64::try_from(t.as_second()).ok()
}

/// A gauge's name, help and value (`None`: not known yet, left out).
type Entry<T> = (&'static str, &'static str, Option<T>);

/// The whole-number gauges in exposition order: the run's position (step, epoch, samples,
/// ranks, last evaluation), its checkpoints, and its size.
fn int_gauges(p: &Progress) -> [Entry<u64>; 13] {
    let ckpt = p.last_checkpoint.as_ref();
    [
        ("step", "Optimizer steps completed", Some(p.step)),
        (
            "total_steps",
            "Steps the run will take (maxSteps)",
            Some(p.total_steps),
        ),
        (
            "epoch",
            "Passes over the training data started so far (0-based)",
            Some(p.epoch),
        ),
        (
            "samples",
            "Training examples consumed so far over all ranks (the global data position)",
            Some(p.samples),
        ),
        (
            "world_size",
            "Ranks exchanging gradients",
            Some(u64::from(p.world_size)),
        ),
        ("eval_step", "Step of the last evaluation", p.eval_step),
        (
            "last_checkpoint_step",
            "Step held by the newest complete checkpoint",
            ckpt.map(|c| c.step),
        ),
        (
            "last_checkpoint_bytes",
            "Size on disk of the newest complete checkpoint",
            ckpt.map(|c| c.size_bytes),
        ),
        (
            "last_checkpoint_timestamp_seconds",
            "Unix time the newest checkpoint became complete",
            ckpt.and_then(|c| unix_seconds(&c.time)),
        ),
        (
            "durable_checkpoint_step",
            "Step held by the newest checkpoint complete in the bucket (checkpoint.store)",
            p.durable_checkpoint.as_ref().map(|d| d.step),
        ),
        (
            "resumed_from_step",
            "Step this run resumed from (absent for a fresh start)",
            p.resumed_from_step,
        ),
        ("parameters", "Model parameters", Some(p.parameters)),
        (
            "peak_memory_bytes",
            "Peak resident memory of rank 0",
            p.peak_memory_bytes,
        ),
    ]
}

/// The fractional gauges in exposition order: speed, loss and evaluation, the schedule, and
/// the newest checkpoint's cost.
fn float_gauges(p: &Progress) -> [Entry<f64>; 13] {
    [
        (
            "steps_per_second",
            "Optimizer steps per second, recent average",
            p.steps_per_second,
        ),
        (
            "samples_per_second",
            "Training examples per second over all ranks, recent average",
            p.samples_per_second,
        ),
        (
            "tokens_per_second",
            "Source+target tokens (no padding) per second over all ranks, recent average",
            p.tokens_per_second,
        ),
        (
            "step_time_seconds",
            "Wall-clock seconds per optimizer step, recent average",
            p.step_time_seconds,
        ),
        (
            "comm_fraction",
            "Share of step time spent waiting on gradient exchange (0..1)",
            p.comm_fraction,
        ),
        (
            "loss",
            "Training loss (label-smoothed cross-entropy per target token), recent average",
            p.loss,
        ),
        (
            "eval_loss",
            "Validation loss (cross-entropy per target token) at the last evaluation",
            p.eval_loss,
        ),
        (
            "eval_bleu",
            "Corpus BLEU on the validation set at the last evaluation (sacreBLEU 13a, cased)",
            p.eval_bleu,
        ),
        (
            "best_eval_loss",
            "Lowest validation loss so far",
            p.best_eval_loss,
        ),
        ("learning_rate", "Current learning rate", p.learning_rate),
        (
            "eta_seconds",
            "Seconds until training ends, as rank 0 estimates them: the steps left at the recent rate, plus the evaluations to come, capped by maxSeconds",
            p.eta_seconds,
        ),
        (
            "last_checkpoint_blocking_seconds",
            "Seconds the newest checkpoint blocked training (the rest is written in the background)",
            p.last_checkpoint.as_ref().and_then(|c| c.blocking_seconds),
        ),
        (
            "durable_checkpoint_seconds",
            "Seconds from the newest durable checkpoint's save to its manifest in the bucket",
            p.durable_checkpoint
                .as_ref()
                .and_then(|d| d.durable_seconds),
        ),
    ]
}

fn resource_metrics(r: &mut Registry, res: &ResourceUsage) {
    r.register(
        "process_cpu_seconds",
        "CPU seconds (user + system) this trainer process has used",
        ConstCounter::new(res.cpu_seconds),
    );
    if let Some(u) = res.cpu_utilization {
        r.register(
            "process_cpu_utilization",
            "CPU seconds per second since the previous scrape (1 = one core busy)",
            ConstGauge::new(u),
        );
    }
    let gauges = [
        (
            "process_resident_memory_bytes",
            "Resident memory of this trainer process (VmRSS)",
            res.rss_bytes,
        ),
        (
            "process_peak_resident_memory_bytes",
            "Peak resident memory of this trainer process (VmHWM)",
            res.peak_rss_bytes,
        ),
        (
            "process_threads",
            "Threads of this trainer process",
            res.threads,
        ),
    ];
    for (name, help, v) in gauges {
        r.register(name, help, ConstGauge::new(v));
    }
    if let Some(gpu) = &res.gpu {
        r.register(
            "gpu_utilization",
            "Share of NVML's last sample period in which a kernel ran on this rank's GPU (0..1)",
            ConstGauge::new(gpu.utilization),
        );
        let gauges = [
            (
                "gpu_memory_used_bytes",
                "Device memory in use on this rank's GPU (NVML, all processes)",
                gpu.memory_used_bytes,
            ),
            (
                "gpu_peak_memory_used_bytes",
                "Highest device memory in use this process has read",
                gpu.peak_memory_used_bytes,
            ),
            (
                "gpu_memory_total_bytes",
                "Device memory of this rank's GPU",
                gpu.memory_total_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            r.register(name, help, ConstGauge::new(v));
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct StatLabels {
    stat: &'static str,
}

/// The gang's spread of one resource: `stat` mean, min, max, and the ranks of the extremes.
fn gang_metrics(r: &mut Registry, g: &GangResources) {
    let spreads = [
        (
            "gang_cpu_utilization",
            "CPU seconds per second over the ranks (stat: mean, min, max)",
            &g.cpu_utilization,
        ),
        (
            "gang_resident_memory_bytes",
            "Resident memory over the ranks (stat: mean, min, max)",
            &g.rss_bytes,
        ),
        (
            "gang_gpu_utilization",
            "GPU utilisation over the ranks, 0..1 (stat: mean, min, max)",
            &g.gpu_utilization,
        ),
        (
            "gang_gpu_memory_used_bytes",
            "GPU memory in use over the ranks (stat: mean, min, max)",
            &g.gpu_memory_used_bytes,
        ),
    ];
    for (name, help, spread) in spreads {
        let Some(s) = spread else { continue };
        let family = Family::<StatLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (stat, v) in [
            ("mean", s.mean),
            ("min", s.min),
            ("max", s.max),
            ("min_rank", f64::from(s.min_rank)),
            ("max_rank", f64::from(s.max_rank)),
        ] {
            family.get_or_create(&StatLabels { stat }).set(v);
        }
        r.register(name, help, family);
    }
    r.register(
        "gang_ranks_reporting",
        "Ranks whose resources reached rank 0 in the last summary",
        ConstGauge::new(i64::from(g.ranks)),
    );
}

fn data_metrics(r: &mut Registry, d: &DataStats) {
    let ints = [
        (
            "data_train_lines",
            "Sentence pairs in the training files, before filtering",
            d.train_lines,
        ),
        (
            "data_train_pairs",
            "Sentence pairs trained on, after filtering",
            d.train_pairs,
        ),
        (
            "data_train_tokens",
            "Source + target tokens of the pairs trained on",
            d.train_tokens,
        ),
        (
            "data_vocabulary_size",
            "Subword vocabulary size",
            d.vocabulary_size,
        ),
        (
            "data_filtered_empty",
            "Training pairs dropped for an empty side",
            d.filtered_empty,
        ),
        (
            "data_filtered_long",
            "Training pairs dropped for a side longer than data.maxSentenceTokens",
            d.filtered_long,
        ),
        ("data_valid_pairs", "Validation pairs", d.valid_pairs),
        (
            "data_valid_truncated",
            "Validation pairs truncated to data.maxSentenceTokens for the loss",
            d.valid_truncated,
        ),
    ];
    for (name, help, v) in ints {
        r.register(name, help, ConstGauge::new(v));
    }
    r.register(
        "data_mean_source_tokens",
        "Mean source sentence length in tokens",
        ConstGauge::new(d.mean_source_tokens),
    );
    r.register(
        "data_mean_target_tokens",
        "Mean target sentence length in tokens",
        ConstGauge::new(d.mean_target_tokens),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::fixtures::*;

    #[test]
    fn metrics_text_has_every_field() {
        let m = parse_metrics(&prometheus_text(&full_progress()));
        let want = [
            ("ferrotrain_step", 1234.0),
            ("ferrotrain_total_steps", 20000.0),
            ("ferrotrain_epoch", 3.0),
            ("ferrotrain_samples", 1_234_000.0),
            ("ferrotrain_world_size", 4.0),
            ("ferrotrain_steps_per_second", 2.5),
            ("ferrotrain_samples_per_second", 320.0),
            ("ferrotrain_tokens_per_second", 5210.75),
            ("ferrotrain_step_time_seconds", 0.4),
            ("ferrotrain_comm_fraction", 0.125),
            ("ferrotrain_loss", 3.5),
            ("ferrotrain_eval_loss", 3.75),
            ("ferrotrain_eval_bleu", 21.5),
            ("ferrotrain_eval_step", 1000.0),
            ("ferrotrain_best_eval_loss", 3.625),
            ("ferrotrain_learning_rate", 0.0007),
            ("ferrotrain_eta_seconds", 7500.0),
            ("ferrotrain_last_checkpoint_step", 1000.0),
            ("ferrotrain_last_checkpoint_bytes", 61_234_567.0),
            ("ferrotrain_last_checkpoint_blocking_seconds", 0.0625),
            (
                "ferrotrain_last_checkpoint_timestamp_seconds",
                1_767_323_045.0,
            ),
            ("ferrotrain_resumed_from_step", 500.0),
            ("ferrotrain_durable_checkpoint_step", 500.0),
            ("ferrotrain_durable_checkpoint_seconds", 2.5),
            ("ferrotrain_gang_cpu_utilization{stat=\"mean\"}", 1.5),
            ("ferrotrain_gang_cpu_utilization{stat=\"min\"}", 0.25),
            ("ferrotrain_gang_cpu_utilization{stat=\"min_rank\"}", 3.0),
            ("ferrotrain_gang_cpu_utilization{stat=\"max\"}", 2.0),
            ("ferrotrain_gang_cpu_utilization{stat=\"max_rank\"}", 1.0),
            ("ferrotrain_gang_resident_memory_bytes{stat=\"mean\"}", 2e9),
            ("ferrotrain_gang_resident_memory_bytes{stat=\"min\"}", 1.5e9),
            (
                "ferrotrain_gang_resident_memory_bytes{stat=\"min_rank\"}",
                0.0,
            ),
            ("ferrotrain_gang_resident_memory_bytes{stat=\"max\"}", 2.5e9),
            (
                "ferrotrain_gang_resident_memory_bytes{stat=\"max_rank\"}",
                2.0,
            ),
            ("ferrotrain_gang_gpu_utilization{stat=\"mean\"}", 0.75),
            ("ferrotrain_gang_gpu_utilization{stat=\"min\"}", 0.5),
            ("ferrotrain_gang_gpu_utilization{stat=\"min_rank\"}", 1.0),
            ("ferrotrain_gang_gpu_utilization{stat=\"max\"}", 0.875),
            ("ferrotrain_gang_gpu_utilization{stat=\"max_rank\"}", 0.0),
            ("ferrotrain_gang_gpu_memory_used_bytes{stat=\"mean\"}", 6e9),
            ("ferrotrain_gang_gpu_memory_used_bytes{stat=\"min\"}", 5e9),
            (
                "ferrotrain_gang_gpu_memory_used_bytes{stat=\"min_rank\"}",
                2.0,
            ),
            ("ferrotrain_gang_gpu_memory_used_bytes{stat=\"max\"}", 7e9),
            (
                "ferrotrain_gang_gpu_memory_used_bytes{stat=\"max_rank\"}",
                3.0,
            ),
            ("ferrotrain_gang_ranks_reporting", 4.0),
            ("ferrotrain_parameters", 9_876_543.0),
            ("ferrotrain_peak_memory_bytes", (1u64 << 30) as f64),
            ("ferrotrain_phase{phase=\"training\"}", 1.0),
            ("ferrotrain_phase{phase=\"starting\"}", 0.0),
            ("ferrotrain_phase{phase=\"evaluating\"}", 0.0),
            ("ferrotrain_phase{phase=\"finished\"}", 0.0),
            (
                "ferrotrain_rejected_connections_total{reason=\"bad_token\"}",
                3.0,
            ),
            ("ferrotrain_process_cpu_seconds_total", 12.5),
            ("ferrotrain_process_cpu_utilization", 1.75),
            ("ferrotrain_process_resident_memory_bytes", (3 << 20) as f64),
            (
                "ferrotrain_process_peak_resident_memory_bytes",
                (5 << 20) as f64,
            ),
            ("ferrotrain_process_threads", 9.0),
            ("ferrotrain_gpu_utilization", 0.875),
            ("ferrotrain_gpu_memory_used_bytes", (7u64 << 30) as f64),
            ("ferrotrain_gpu_peak_memory_used_bytes", (9u64 << 30) as f64),
            ("ferrotrain_gpu_memory_total_bytes", (80u64 << 30) as f64),
            ("ferrotrain_data_train_lines", 29000.0),
            ("ferrotrain_data_train_pairs", 28990.0),
            ("ferrotrain_data_train_tokens", 800_000.0),
            ("ferrotrain_data_vocabulary_size", 8000.0),
            ("ferrotrain_data_filtered_empty", 4.0),
            ("ferrotrain_data_filtered_long", 6.0),
            ("ferrotrain_data_valid_pairs", 1014.0),
            ("ferrotrain_data_valid_truncated", 2.0),
            ("ferrotrain_data_mean_source_tokens", 13.5),
            ("ferrotrain_data_mean_target_tokens", 14.25),
            (
                "ferrotrain_precision{used=\"fp16\",requested=\"auto\"}",
                1.0,
            ),
            ("ferrotrain_loss_scale", 8192.0),
            ("ferrotrain_skipped_steps_total", 3.0),
            ("ferrotrain_checkpoint_save_failures_total", 2.0),
            (
                "ferrotrain_checkpoint_error_since_timestamp_seconds",
                1_767_323_645.0,
            ),
        ];
        for (series, v) in want {
            assert_eq!(m.get(series), Some(&v), "{series}");
        }
        assert_eq!(m.len(), want.len(), "unexpected series: {m:?}");
    }

    #[test]
    fn absent_fields_are_omitted_and_special_floats_kept() {
        let p = Progress {
            step: 7,
            loss: Some(f64::NAN),
            eta_seconds: Some(f64::INFINITY),
            ..Default::default()
        };
        let text = prometheus_text(&p);
        let m = parse_metrics(&text);
        assert_eq!(m["ferrotrain_step"], 7.0);
        assert!(m["ferrotrain_loss"].is_nan());
        assert_eq!(m["ferrotrain_eta_seconds"], f64::INFINITY);
        for absent in [
            "ferrotrain_eval_loss",
            "ferrotrain_comm_fraction",
            "ferrotrain_last_checkpoint_step",
            "ferrotrain_resumed_from_step",
            "ferrotrain_durable_checkpoint",
            "ferrotrain_process_",
            "ferrotrain_data_",
            "ferrotrain_gpu_",
            "ferrotrain_precision",
            "ferrotrain_loss_scale",
            "ferrotrain_skipped_steps",
            "ferrotrain_checkpoint_error",
        ] {
            assert!(
                !text.contains(absent),
                "{absent} should be omitted:\n{text}"
            );
        }
        assert_eq!(m["ferrotrain_phase{phase=\"starting\"}"], 1.0);
        assert_eq!(m["ferrotrain_checkpoint_save_failures_total"], 0.0);
    }
}
