//! What this process uses of the machine: CPU seconds and utilisation, resident memory (now
//! and peak) and threads, read from /proc/self (Linux; elsewhere every reading is absent).
//!
//! On CUDA, the GPU's utilisation and memory come from NVML: libnvidia-ml.so.1 is opened
//! with dlopen the first time a sample finds libcuda mapped into this process (so never on a
//! CPU run, and a missing library is no error, only no GPU reading).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::Path;
use std::time::Instant;

use ferrotrain_api::{GpuUsage, ResourceUsage};

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
#[derive(Default)]
pub struct ResourceSampler {
    last: Option<(Instant, f64)>,
    utilization: Option<f64>,
    gpu: GpuProbe,
}

/// NVML for this rank's GPU: not tried yet, unavailable (CPU run, no library, no device), or
/// open.
#[derive(Default)]
enum GpuProbe {
    #[default]
    Untried,
    Unavailable,
    Open(Nvml, u64),
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
            gpu: self.gpu(),
        })
    }

    fn gpu(&mut self) -> Option<GpuUsage> {
        if let GpuProbe::Untried = self.gpu {
            self.gpu = match cuda_in_use().then(Nvml::open).flatten() {
                Some(nvml) => {
                    tracing::info!("reading GPU utilisation and memory from NVML");
                    GpuProbe::Open(nvml, 0)
                }
                None => GpuProbe::Unavailable,
            };
        }
        let GpuProbe::Open(nvml, peak) = &mut self.gpu else {
            return None;
        };
        let (utilization, used, total) = nvml.read()?;
        *peak = (*peak).max(used);
        Some(GpuUsage {
            utilization,
            memory_used_bytes: used,
            peak_memory_used_bytes: *peak,
            memory_total_bytes: total,
        })
    }
}

/// Whether this process has loaded the CUDA driver library (libtorch does on a CUDA device).
fn cuda_in_use() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|maps| maps.contains("/libcuda.so"))
}

/// The CUDA_VISIBLE_DEVICES entry of CUDA device `ordinal` (the one the rank computes on,
/// `device::cuda_ordinal`): an NVML index or a `GPU-...` UUID. None: NVML index = ordinal.
fn visible_device(visible: Option<&str>, ordinal: usize) -> String {
    visible
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
        })
        .and_then(|devices| devices.get(ordinal).map(|d| d.to_string()))
        .unwrap_or_else(|| ordinal.to_string())
}

const NVML_SUCCESS: c_int = 0;

#[repr(C)]
#[derive(Default)]
struct NvmlUtilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

type NvmlDevice = *mut c_void;

/// The few NVML entry points used, resolved from libnvidia-ml.so.1 (never unloaded: NVML
/// stays initialised for the life of the process).
struct Nvml {
    device: NvmlDevice,
    utilization: unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> c_int,
    memory: unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> c_int,
}

// SAFETY: NVML is thread-safe; the handle is only used through NVML calls.
unsafe impl Send for Nvml {}

impl Nvml {
    fn open() -> Option<Nvml> {
        let local_rank = std::env::var(ferrotrain_api::env::LOCAL_RANK)
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        // The GPU this rank computes on: with fewer GPUs than ranks (two ranks on one GPU),
        // local rank 1 is CUDA device 0, not NVML device 1.
        let ordinal = crate::device::cuda_ordinal(local_rank, crate::device::visible_gpus());
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let device = visible_device(visible.as_deref(), ordinal);
        // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is transmuted to the
        // signature nvml.h declares for it.
        unsafe {
            let lib = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW);
            if lib.is_null() {
                return None;
            }
            let sym = |name: &CStr| {
                let f = libc::dlsym(lib, name.as_ptr());
                (!f.is_null()).then_some(f)
            };
            let init: unsafe extern "C" fn() -> c_int = std::mem::transmute(sym(c"nvmlInit_v2")?);
            if init() != NVML_SUCCESS {
                return None;
            }
            let mut handle: NvmlDevice = std::ptr::null_mut();
            let found = if device.starts_with("GPU-") || device.starts_with("MIG-") {
                let by_uuid: unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_int =
                    std::mem::transmute(sym(c"nvmlDeviceGetHandleByUUID")?);
                let uuid = CString::new(device.clone()).ok()?;
                by_uuid(uuid.as_ptr(), &mut handle)
            } else {
                let by_index: unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> c_int =
                    std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
                by_index(device.parse().ok()?, &mut handle)
            };
            if found != NVML_SUCCESS {
                tracing::warn!(device, "NVML: no such GPU; no GPU readings");
                return None;
            }
            Some(Nvml {
                device: handle,
                utilization: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(NvmlDevice, *mut NvmlUtilization) -> c_int,
                >(sym(c"nvmlDeviceGetUtilizationRates")?),
                memory: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(NvmlDevice, *mut NvmlMemory) -> c_int,
                >(sym(c"nvmlDeviceGetMemoryInfo")?),
            })
        }
    }

    /// (utilisation 0..1, memory used, memory total).
    fn read(&self) -> Option<(f64, u64, u64)> {
        let (mut u, mut m) = (NvmlUtilization::default(), NvmlMemory::default());
        // SAFETY: the device handle came from NVML; the out-pointers are valid structs of the
        // layout nvml.h declares.
        unsafe {
            if (self.utilization)(self.device, &mut u) != NVML_SUCCESS
                || (self.memory)(self.device, &mut m) != NVML_SUCCESS
            {
                return None;
            }
        }
        Some((f64::from(u.gpu) / 100.0, m.used, m.total))
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
    fn the_gpu_is_this_ranks_visible_device() {
        assert_eq!(visible_device(None, 1), "1");
        assert_eq!(visible_device(Some("3,5"), 1), "5");
        assert_eq!(visible_device(Some("GPU-abc, GPU-def"), 1), "GPU-def");
        // Two ranks on one GPU (seen on an H200): local rank 1 computes on CUDA device 0,
        // whose entry NVML must be asked for, not an NVML device 1 that does not exist.
        let ordinal = crate::device::cuda_ordinal(1, 1);
        assert_eq!(visible_device(None, ordinal), "0");
        assert_eq!(visible_device(Some("2"), ordinal), "2");
    }

    #[test]
    fn no_gpu_reading_on_a_cpu_run() {
        // These tests never touch CUDA, so libcuda is not mapped and NVML is never opened.
        assert!(!cuda_in_use());
        let mut sampler = ResourceSampler::default();
        assert_eq!(sampler.sample().unwrap().gpu, None);
        assert!(matches!(sampler.gpu, GpuProbe::Unavailable));
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
