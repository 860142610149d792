//! What this process uses of the machine: CPU seconds and utilisation, resident memory (now
//! and peak) and threads, read from /proc/self (Linux; elsewhere every reading is absent).
//!
//! GPU utilisation and memory (NVML) are not read yet: see docs/observability.md.

use std::path::Path;
use std::time::Instant;

use ferrotrain_api::ResourceUsage;

/// Shortest interval a utilisation is computed over; closer readings keep the previous one,
/// so two scrapes a millisecond apart do not report 0% or 400%.
const MIN_INTERVAL_SECONDS: f64 = 0.2;

/// One reading of a process's counters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcReading {
    /// utime + stime, seconds.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub threads: u64,
}

/// Reads `<proc_dir>/stat` and `<proc_dir>/status` (`proc_dir` is `/proc/self` or
/// `/proc/<pid>`).
pub fn read_proc(proc_dir: &Path) -> Option<ProcReading> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let (ticks, threads) = parse_stat(&stat)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some(ProcReading {
        cpu_seconds: ticks as f64 / hz,
        rss_bytes: status_kib(&status, "VmRSS:")? * 1024,
        peak_rss_bytes: status_kib(&status, "VmHWM:")? * 1024,
        threads,
    })
}

/// (utime + stime in clock ticks, num_threads) from a /proc/<pid>/stat line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime 15, num_threads 20.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let threads: u64 = fields.get(17)?.parse().ok()?;
    Some((utime + stime, threads))
}

/// A `Name:   1234 kB` line of /proc/<pid>/status, in KiB.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Successive readings of this process, with the CPU utilisation between them.
#[derive(Debug, Default)]
pub struct ResourceSampler {
    last: Option<(Instant, f64)>,
    utilization: Option<f64>,
}

impl ResourceSampler {
    /// Reads /proc/self now; utilisation is over the time since the previous sample.
    pub fn sample(&mut self) -> Option<ResourceUsage> {
        let now = Instant::now();
        let r = read_proc(Path::new("/proc/self"))?;
        match self.last {
            Some((at, cpu)) => {
                let dt = now.duration_since(at).as_secs_f64();
                if dt >= MIN_INTERVAL_SECONDS {
                    self.utilization = Some(((r.cpu_seconds - cpu) / dt).max(0.0));
                    self.last = Some((now, r.cpu_seconds));
                }
            }
            None => self.last = Some((now, r.cpu_seconds)),
        }
        Some(ResourceUsage {
            cpu_seconds: r.cpu_seconds,
            cpu_utilization: self.utilization,
            rss_bytes: r.rss_bytes,
            peak_rss_bytes: r.peak_rss_bytes,
            threads: r.threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and a ')' in it; utime 250, stime 50, 7 threads.
        let stat = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 \
                    12345 1000000 500 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((300, 7)));
        assert_eq!(parse_stat("garbage"), None);
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t7\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(1024));
        assert_eq!(status_kib(status, "VmHWM:"), Some(2048));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn samples_this_process() {
        let mut sampler = ResourceSampler::default();
        let first = sampler.sample().expect("/proc/self is readable");
        assert!(first.rss_bytes > 1 << 20 && first.peak_rss_bytes >= first.rss_bytes);
        assert!(first.threads >= 1);
        assert_eq!(first.cpu_utilization, None);
        // Burn CPU for a while: utilisation is then near one core.
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed().as_secs_f64() < 0.4 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let second = sampler.sample().unwrap();
        assert!(second.cpu_seconds > first.cpu_seconds);
        let u = second.cpu_utilization.expect("an interval long enough");
        // Shared machines steal time; the thread was runnable the whole interval.
        assert!(u > 0.2 && u < 4.0, "utilisation {u}");
    }
}
