//! The trainer's `metrics` module as far as its exposition goes, compiled into the docs check
//! as `crate::metrics` (where its own code and tests look for `crate::metrics::fixtures`):
//! trainer/src/metrics/prometheus.rs needs only the api crate, prometheus-client and
//! trainer/src/rfc3339.rs, so no libtorch. Its tests run here too.

#[path = "../../../trainer/src/metrics/fixtures.rs"]
mod fixtures;
#[path = "../../../trainer/src/metrics/prometheus.rs"]
mod prometheus;

/// Rank 0's exposition of a progress report with every field set (the trainer's own fixture).
pub fn full_exposition() -> String {
    prometheus::prometheus_text(&fixtures::full_progress())
}
