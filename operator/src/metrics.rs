//! The operator's own Prometheus metrics (the trainer's live on each rank 0's /metrics).

use ferrotrain_api::crd::Phase;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;

use ferrotrain_api::Recovery;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// `result` label of reconciles.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ReconcileResult {
    Ok,
    Error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: ReconcileResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub namespace: String,
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobPhaseLabels {
    pub namespace: String,
    pub job: String,
    pub phase: String,
}

/// What the per-job gauges read from one job's status at scrape time.
pub struct JobNumbers<'a> {
    pub namespace: String,
    pub job: String,
    pub phase: Phase,
    pub restarts: i32,
    pub recovery: Option<&'a Recovery>,
}

/// Every metric of the operator, registered once.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ResultLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub jobs: Family<PhaseLabels, Gauge>,
    pub restarts: Family<ReasonLabels, Counter>,
    pub time_to_first_step: Histogram,
    pub progress_polls: Family<ResultLabels, Counter>,
    /// From a rank's failure to the operator seeing it.
    pub failure_detect: Histogram,
    /// From a rank's failure to the next attempt's first training step.
    pub recovery: Histogram,
    /// Per job, from status.recovery at scrape time.
    pub goodput: Family<JobLabels, Gauge<f64, AtomicU64>>,
    pub lost_steps: Family<JobLabels, Gauge>,
    /// Per job, status.restarts and status.phase at scrape time.
    pub job_restarts: Family<JobLabels, Gauge>,
    pub job_phase: Family<JobPhaseLabels, Gauge>,
    /// The operator process itself, read at scrape time.
    pub resident_memory: Gauge,
    pub cpu_seconds: Gauge<f64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ferrotrain_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error kind",
            reconcile_errors.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "reconcile_duration",
            "Time spent in one reconcile",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let jobs = Family::<PhaseLabels, Gauge>::default();
        registry.register("jobs", "DistributedTrainings by phase", jobs.clone());
        let restarts = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "gang_restarts",
            "Restarts (in place or of the whole gang) by failure reason, every job together",
            restarts.clone(),
        );
        let time_to_first_step = Histogram::new(exponential_buckets(1.0, 2.0, 16));
        registry.register_with_unit(
            "time_to_first_step",
            "From a job's creation to its first reported training step",
            Unit::Seconds,
            time_to_first_step.clone(),
        );
        let progress_polls = Family::<ResultLabels, Counter>::default();
        registry.register(
            "progress_polls",
            "Polls of rank 0's /progress by result",
            progress_polls.clone(),
        );
        let failure_detect = Histogram::new(exponential_buckets(0.25, 2.0, 12));
        registry.register_with_unit(
            "failure_detect",
            "From a rank's failure (exit, deletion, node loss) to the operator acting on it",
            Unit::Seconds,
            failure_detect.clone(),
        );
        let recovery = Histogram::new(exponential_buckets(1.0, 2.0, 14));
        registry.register_with_unit(
            "recovery",
            "From a rank's failure to the next attempt's first training step",
            Unit::Seconds,
            recovery.clone(),
        );
        let goodput = registered(
            &mut registry,
            "job_goodput_percent",
            "Share of a job's wall time spent on training steps it kept (status.recovery)",
        );
        let lost_steps = registered(
            &mut registry,
            "job_lost_steps",
            "Steps a job trained twice because an attempt ended after its last checkpoint",
        );
        let job_restarts = registered(
            &mut registry,
            "job_restarts",
            "A job's restarts counted against its maxRestarts (status.restarts)",
        );
        let job_phase = registered(
            &mut registry,
            "job_phase",
            "1 for a job's current phase (status.phase)",
        );
        let resident_memory = Gauge::default();
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of the operator process",
            Unit::Bytes,
            resident_memory.clone(),
        );
        let cpu_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "process_cpu",
            "CPU time (user and system) the operator process has used since it started",
            Unit::Seconds,
            cpu_seconds.clone(),
        );
        let metrics = Metrics {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            jobs,
            restarts,
            time_to_first_step,
            progress_polls,
            failure_detect,
            recovery,
            goodput,
            lost_steps,
            job_restarts,
            job_phase,
            resident_memory,
            cpu_seconds,
        };
        // Expose every known series from the start (at 0), so rates and alerts work before
        // the first event.
        for result in [ReconcileResult::Ok, ReconcileResult::Error] {
            let _ = metrics.reconciles.get_or_create(&ResultLabels {
                result: result.clone(),
            });
            let _ = metrics
                .progress_polls
                .get_or_create(&ResultLabels { result });
        }
        metrics.set_jobs([]);
        metrics
    }

    /// Sets the jobs-by-phase gauge from the phases of every known job (at scrape time, so
    /// deleted jobs disappear).
    pub fn set_jobs(&self, phases: impl IntoIterator<Item = Phase>) {
        let mut counts = [0i64; Phase::ALL.len()];
        for phase in phases {
            let i = Phase::ALL.iter().position(|p| *p == phase).unwrap_or(0);
            counts[i] += 1;
        }
        for (phase, count) in Phase::ALL.iter().zip(counts) {
            self.jobs
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().into(),
                })
                .set(count);
        }
    }

    /// Sets the per-job gauges from every known job's status (at scrape time, so deleted
    /// jobs disappear): its phase and restarts, and from its ledger its goodput and lost
    /// steps.
    pub fn set_job_numbers<'a>(&self, jobs: impl IntoIterator<Item = JobNumbers<'a>>) {
        self.goodput.clear();
        self.lost_steps.clear();
        self.job_restarts.clear();
        self.job_phase.clear();
        for j in jobs {
            let labels = JobLabels {
                namespace: j.namespace,
                job: j.job,
            };
            self.job_phase
                .get_or_create(&JobPhaseLabels {
                    namespace: labels.namespace.clone(),
                    job: labels.job.clone(),
                    phase: j.phase.as_str().into(),
                })
                .set(1);
            self.job_restarts
                .get_or_create(&labels)
                .set(i64::from(j.restarts));
            let Some(r) = j.recovery else { continue };
            if let Some(g) = r.goodput_percent {
                self.goodput.get_or_create(&labels).set(g);
            }
            self.lost_steps
                .get_or_create(&labels)
                .set(i64::try_from(r.lost_steps).unwrap_or(i64::MAX));
        }
    }

    /// Sets the process gauges from the kernel's accounting of this process (Linux).
    pub fn set_process(&self) {
        if let Some(rss) = resident_bytes() {
            self.resident_memory.set(rss);
        }
        // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
            let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            self.cpu_seconds
                .set(seconds(usage.ru_utime) + seconds(usage.ru_stime));
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// A new metric of its kind, registered under `name`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// VmRSS of /proc/self/status, in bytes.
fn resident_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_and_counts() {
        let m = Metrics::new();
        m.reconciles
            .get_or_create(&ResultLabels {
                result: ReconcileResult::Ok,
            })
            .inc();
        m.set_jobs([Phase::Running, Phase::Running, Phase::Failed]);
        m.restarts
            .get_or_create(&ReasonLabels {
                reason: "ExitCode".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("ferrotrain_operator_reconciles_total{result=\"Ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferrotrain_operator_jobs{phase=\"Running\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ferrotrain_operator_jobs{phase=\"Failed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferrotrain_operator_jobs{phase=\"Pending\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("ferrotrain_operator_gang_restarts_total{reason=\"ExitCode\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferrotrain_operator_reconcile_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn every_job_has_its_phase_and_restarts_and_a_ledger_its_goodput() {
        let m = Metrics::new();
        let recovery = Recovery {
            goodput_percent: Some(87.5),
            lost_steps: 12,
            ..Recovery::default()
        };
        let job = |name: &str, phase, restarts, recovery| JobNumbers {
            namespace: "ml".into(),
            job: name.into(),
            phase,
            restarts,
            recovery,
        };
        m.set_job_numbers([
            job("a", Phase::Running, 2, Some(&recovery)),
            job("b", Phase::Pending, 0, None),
        ]);
        let text = m.encode();
        for line in [
            "ferrotrain_operator_job_phase{namespace=\"ml\",job=\"a\",phase=\"Running\"} 1",
            "ferrotrain_operator_job_phase{namespace=\"ml\",job=\"b\",phase=\"Pending\"} 1",
            "ferrotrain_operator_job_restarts{namespace=\"ml\",job=\"a\"} 2",
            "ferrotrain_operator_job_restarts{namespace=\"ml\",job=\"b\"} 0",
            "ferrotrain_operator_job_goodput_percent{namespace=\"ml\",job=\"a\"} 87.5",
            "ferrotrain_operator_job_lost_steps{namespace=\"ml\",job=\"a\"} 12",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("job_goodput_percent{namespace=\"ml\",job=\"b\""));
        // A deleted job's series go with it.
        m.set_job_numbers([job("b", Phase::Running, 1, None)]);
        let text = m.encode();
        assert!(!text.contains("job=\"a\""), "{text}");
        assert!(text.contains("job_phase{namespace=\"ml\",job=\"b\",phase=\"Running\"} 1"));
    }

    #[test]
    fn the_process_reports_its_memory_and_cpu() {
        let m = Metrics::new();
        // Some CPU time to count.
        let spin: u64 = (0..2_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(spin > 0);
        m.set_process();
        let rss = m.resident_memory.get();
        assert!(rss > 1_000_000 && rss < 10_000_000_000, "{rss}");
        assert!(m.cpu_seconds.get() > 0.0);
        let text = m.encode();
        for name in [
            "ferrotrain_operator_process_resident_memory_bytes ",
            "ferrotrain_operator_process_cpu_seconds ",
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
    }
}
