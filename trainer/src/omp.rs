//! OpenMP's wait policy for a CPU rank. Between two parallel regions libgomp's worker threads
//! either spin (`OMP_WAIT_POLICY=ACTIVE`) or sleep on a futex (`PASSIVE`; unset: spin a little,
//! then sleep). A training step on the CPU is hundreds of short parallel regions with serial
//! stretches between them, and waking a sleeping thread costs more than many of those
//! regions: on the Multi30k recipe (2 threads on 2 cores) ACTIVE steps took 0.38-0.47 s where
//! unset took 0.41-0.48 s and PASSIVE 0.53-0.61 s (docs/performance.md). Spinning only pays
//! when the threads have their cores to themselves; on shared cores it steals them.
//!
//! libgomp reads the variable once, when it is loaded (before `main`), so a rank that
//! chooses ACTIVE starts itself again with it set ([`spin_if_the_cores_are_ours`]). A value
//! set by the user, a test (scripts/env.sh: PASSIVE) or a pod's env is never overridden.

use std::path::Path;

use ferrotrain_api::config::DeviceKind;

/// The variable libgomp reads.
pub const WAIT_POLICY: &str = "OMP_WAIT_POLICY";

/// Where cgroup v2 states the container's CPU limit (`<quota> <period>`, or `max <period>`).
const CPU_MAX: &str = "/sys/fs/cgroup/cpu.max";

/// The cores the ranks of this machine may keep busy: a cgroup CPU limit when there is one
/// (whole cores, at least 1); else, outside a Kubernetes pod, the CPUs this process may run
/// on; else none known: a pod without a CPU limit shares its node's cores with other pods.
pub fn dedicated_cores(cpu_max: Option<&str>, in_pod: bool, available: usize) -> Option<usize> {
    if let Some(line) = cpu_max {
        let mut fields = line.split_whitespace();
        let (quota, period) = (fields.next(), fields.next());
        if let (Some(q), Some(p)) = (quota, period)
            && q != "max"
            && let (Ok(q), Ok(p)) = (q.parse::<f64>(), p.parse::<f64>())
            && p > 0.0
        {
            return Some(((q / p).floor() as usize).max(1));
        }
    }
    (!in_pod).then_some(available)
}

/// ACTIVE when the CPU ranks' threads fit the dedicated cores (and there is more than one
/// thread a rank: a lone thread has no one to wake); None leaves libgomp's default.
pub fn wait_policy(
    on_cpu: bool,
    ranks: usize,
    threads: usize,
    cores: Option<usize>,
) -> Option<&'static str> {
    let fits = cores.is_some_and(|c| ranks.max(1) * threads <= c);
    (on_cpu && threads > 1 && fits).then_some("ACTIVE")
}

/// Whether `kind` trains on the CPU here (auto: no CUDA device visible).
fn on_cpu(kind: DeviceKind) -> bool {
    match kind {
        DeviceKind::Cpu => true,
        DeviceKind::Cuda => false,
        DeviceKind::Auto => !tch::Cuda::is_available(),
    }
}

/// When the user left [`WAIT_POLICY`] unset and [`wait_policy`] says ACTIVE, starts this
/// process again (same pid, arguments and environment, plus the variable) and does not
/// return; otherwise (or if the exec fails, logged) returns and the rank goes on as it is.
pub fn spin_if_the_cores_are_ours(kind: DeviceKind, ranks: usize, threads: usize) {
    if std::env::var_os(WAIT_POLICY).is_some() {
        return;
    }
    let cpu_max = std::fs::read_to_string(Path::new(CPU_MAX)).ok();
    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores = dedicated_cores(cpu_max.as_deref(), in_pod, available);
    // Whether CUDA is there is asked last: only when the cores would allow spinning.
    let Some(policy) = wait_policy(true, ranks, threads, cores) else {
        return;
    };
    if !on_cpu(kind) {
        return;
    }
    tracing::info!(
        "{WAIT_POLICY}={policy}: {ranks} rank(s) x {threads} threads on {} dedicated cores; starting again with it set (set {WAIT_POLICY} to choose yourself)",
        cores.unwrap_or(0)
    );
    reexec(policy);
}

#[cfg(unix)]
fn reexec(policy: &str) {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let error = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(WAIT_POLICY, policy)
        .exec();
    tracing::warn!("could not start again with {WAIT_POLICY}={policy}: {error}; going on without");
}

#[cfg(not(unix))]
fn reexec(_policy: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_limit_counts_whole_cores_and_no_limit_counts_only_outside_a_pod() {
        assert_eq!(dedicated_cores(Some("200000 100000\n"), true, 64), Some(2));
        assert_eq!(dedicated_cores(Some("250000 100000"), false, 64), Some(2));
        assert_eq!(dedicated_cores(Some("50000 100000"), true, 64), Some(1));
        assert_eq!(dedicated_cores(Some("max 100000"), false, 8), Some(8));
        assert_eq!(dedicated_cores(Some("max 100000"), true, 8), None);
        assert_eq!(dedicated_cores(None, true, 8), None);
        assert_eq!(dedicated_cores(Some("garbage"), false, 4), Some(4));
    }

    #[test]
    fn threads_spin_only_on_the_cpu_when_they_fit_their_cores() {
        assert_eq!(wait_policy(true, 1, 2, Some(2)), Some("ACTIVE"));
        assert_eq!(wait_policy(true, 2, 2, Some(4)), Some("ACTIVE"));
        // More threads than cores, unknown cores, a GPU, a lone thread: the default.
        assert_eq!(wait_policy(true, 2, 2, Some(2)), None);
        assert_eq!(wait_policy(true, 1, 2, None), None);
        assert_eq!(wait_policy(false, 1, 2, Some(16)), None);
        assert_eq!(wait_policy(true, 2, 1, Some(2)), None);
    }
}
