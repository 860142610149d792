//! `ferrotrain doctor`: what this machine or pod offers the trainer, as one table: libtorch
//! and CUDA, the GPUs seen against those the pod was given, NCCL, NVML, whether the PCI
//! topology NCCL reads is visible, /dev/shm, the network interfaces NCCL could pick, RDMA
//! devices and the pinned port range. The first thing to run when a GPU job fails on a new
//! cluster (`kubectl exec POD -- ferrotrain doctor`); every rank logs its summary line at
//! start-up. Reads only: it opens no device and starts no collective.

use std::path::Path;

use ferrotrain_api::env;

/// One finding: a name, whether it is fine for this pod, and what was seen.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

fn finding(name: &'static str, ok: bool, detail: impl Into<String>) -> Finding {
    Finding {
        name,
        ok,
        detail: detail.into(),
    }
}

/// What the checks read, gathered once (tests build their own).
#[derive(Clone, Debug)]
pub struct Machine {
    /// GPUs the pod was given (FERROTRAIN_EXPECT_GPUS).
    pub expected_gpus: u32,
    pub visible_gpus: usize,
    pub libtorch: String,
    /// NCCL's version, or why it could not be loaded.
    pub nccl: Result<String, String>,
    pub nvml: bool,
    /// PCI devices listed in /sys/bus/pci/devices, and how many are NVIDIA's (None: unreadable).
    pub pci: Option<(usize, usize)>,
    /// /dev/shm's size in bytes (None: not mounted).
    pub shm_bytes: Option<u64>,
    /// Network interfaces other than lo: (name, operstate).
    pub interfaces: Vec<(String, String)>,
    pub socket_ifname: Option<String>,
    pub rdma: Vec<String>,
    /// net.ipv4.ip_local_port_range and FERROTRAIN_PORT_RANGE.
    pub port_range: Option<(u16, u16)>,
    pub declared_range: Option<String>,
}

impl Machine {
    /// This process's machine.
    pub fn here() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        Machine {
            expected_gpus: crate::device::expected_gpus().unwrap_or(0),
            visible_gpus: crate::device::visible_gpus(),
            libtorch: crate::device::startup_line(tch::Device::Cpu)
                .trim_start_matches("device Cpu; ")
                .to_string(),
            nccl: nccl_version(),
            nvml: nvml_present(),
            pci: pci_devices(Path::new("/sys/bus/pci/devices")),
            shm_bytes: filesystem_bytes("/dev/shm"),
            interfaces: interfaces(Path::new("/sys/class/net")),
            socket_ifname: std::env::var("NCCL_SOCKET_IFNAME").ok(),
            rdma: names(Path::new("/sys/class/infiniband")),
            port_range: read("/proc/sys/net/ipv4/ip_local_port_range").and_then(|t| {
                let mut it = t.split_whitespace().filter_map(|v| v.parse().ok());
                Some((it.next()?, it.next()?))
            }),
            declared_range: std::env::var(env::FERROTRAIN_PORT_RANGE).ok(),
        }
    }
}

/// The findings about `m`: each one `ok` when it cannot be why this pod's job fails.
pub fn findings(m: &Machine) -> Vec<Finding> {
    let gpus = m.expected_gpus > 0;
    let mut out = vec![
        finding("libtorch", true, m.libtorch.clone()),
        finding(
            "CUDA devices",
            m.visible_gpus >= m.expected_gpus as usize,
            format!(
                "{} visible, {} given to the pod (FERROTRAIN_EXPECT_GPUS)",
                m.visible_gpus, m.expected_gpus
            ),
        ),
        match &m.nccl {
            Ok(v) => finding("NCCL", true, format!("libnccl {v}")),
            Err(why) => finding("NCCL", !gpus, why.clone()),
        },
        finding(
            "NVML",
            m.nvml || !gpus,
            if m.nvml {
                "libnvidia-ml.so.1 loads (GPU utilisation and memory in /progress)"
            } else {
                "libnvidia-ml.so.1 not found (no GPU numbers in /progress)"
            },
        ),
    ];
    out.push(match m.pci {
        Some((all, nvidia)) => finding(
            "PCI topology",
            !gpus || nvidia > 0,
            format!("/sys/bus/pci/devices: {all} devices, {nvidia} NVIDIA"),
        ),
        None => finding(
            "PCI topology",
            !gpus,
            "/sys/bus/pci/devices unreadable: NCCL cannot see the topology and fails with \
             \"unhandled system error\" (sandboxed runtimes such as gVisor hide it)",
        ),
    });
    out.push(shm(m.shm_bytes, m.expected_gpus));
    out.push(network(m));
    out.push(finding(
        "RDMA devices",
        true,
        if m.rdma.is_empty() {
            "none (/sys/class/infiniband): NCCL uses sockets between nodes".to_string()
        } else {
            format!(
                "{} (NCCL may use them: NCCL_IB_HCA picks)",
                m.rdma.join(", ")
            )
        },
    ));
    out.push(port_range(m));
    out
}

/// NCCL keeps a few buffers per peer in /dev/shm; Docker's default 64 MiB is too small for
/// more than one GPU.
fn shm(bytes: Option<u64>, gpus: u32) -> Finding {
    const MIB: u64 = 1 << 20;
    match bytes {
        None => finding("/dev/shm", gpus == 0, "not mounted"),
        Some(b) => finding(
            "/dev/shm",
            gpus <= 1 || b >= 512 * MIB,
            format!(
                "{} MiB{}",
                b / MIB,
                if gpus > 1 && b < 512 * MIB {
                    " (too small for NCCL between GPUs of a pod: raise spec.podTemplate.shmSize)"
                } else {
                    ""
                }
            ),
        ),
    }
}

fn network(m: &Machine) -> Finding {
    let up: Vec<String> = m
        .interfaces
        .iter()
        .filter(|(_, state)| state == "up" || state == "unknown")
        .map(|(name, _)| name.clone())
        .collect();
    let listed: Vec<String> = m
        .interfaces
        .iter()
        .map(|(n, s)| format!("{n} ({s})"))
        .collect();
    let chosen = match &m.socket_ifname {
        Some(v) => format!("; NCCL_SOCKET_IFNAME={v}"),
        None => "; NCCL picks (NCCL_SOCKET_IFNAME unset)".into(),
    };
    finding(
        "network interfaces",
        !up.is_empty(),
        format!("{}{chosen}", listed.join(", ")),
    )
}

fn port_range(m: &Machine) -> Finding {
    let kernel = m.port_range.map(|(a, b)| format!("{a}-{b}"));
    match (&m.declared_range, &kernel) {
        (Some(declared), Some(k)) => finding(
            "port range",
            declared.trim() == k,
            format!(
                "ephemeral {k}, FERROTRAIN_PORT_RANGE {declared}{}",
                if declared.trim() == k {
                    ""
                } else {
                    " (the sysctl was not applied: NCCL's listeners may fall outside the NetworkPolicy)"
                }
            ),
        ),
        (None, Some(k)) => finding(
            "port range",
            true,
            format!("ephemeral {k} (no NetworkPolicy range)"),
        ),
        (_, None) => finding("port range", true, "unknown (not Linux)"),
    }
}

/// The table `ferrotrain doctor` prints.
pub fn table(findings: &[Finding]) -> String {
    let width = findings.iter().map(|f| f.name.len()).max().unwrap_or(0);
    findings
        .iter()
        .map(|f| {
            let mark = if f.ok { "ok  " } else { "FAIL" };
            format!("{mark}  {:width$}  {}\n", f.name, f.detail)
        })
        .collect()
}

/// One line for the start-up log: the failures, else that all is well.
pub fn summary(findings: &[Finding]) -> String {
    let failed: Vec<String> = findings
        .iter()
        .filter(|f| !f.ok)
        .map(|f| format!("{}: {}", f.name, f.detail))
        .collect();
    if failed.is_empty() {
        format!(
            "doctor: {} checks ok (ferrotrain doctor shows them)",
            findings.len()
        )
    } else {
        format!("doctor: {}", failed.join("; "))
    }
}

#[cfg(feature = "cuda")]
fn nccl_version() -> Result<String, String> {
    match crate::distributed::nccl_lib::nccl() {
        Ok(lib) => lib
            .version()
            .ok_or_else(|| "loaded, no version".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(not(feature = "cuda"))]
fn nccl_version() -> Result<String, String> {
    Err("not in this build (built without the cuda feature)".into())
}

fn nvml_present() -> bool {
    // SAFETY: dlopen with a NUL-terminated name; the handle is closed at once.
    unsafe {
        let lib = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_LAZY);
        if lib.is_null() {
            return false;
        }
        libc::dlclose(lib);
    }
    true
}

fn pci_devices(dir: &Path) -> Option<(usize, usize)> {
    let devices: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    let nvidia = devices
        .iter()
        .filter(|d| {
            std::fs::read_to_string(d.path().join("vendor")).is_ok_and(|v| v.trim() == "0x10de")
        })
        .count();
    Some((devices.len(), nvidia))
}

fn filesystem_bytes(path: &str) -> Option<u64> {
    let c = std::ffi::CString::new(path).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed out-struct.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then(|| st.f_blocks * st.f_frsize)
}

fn interfaces(dir: &Path) -> Vec<(String, String)> {
    names(dir)
        .into_iter()
        .filter(|n| n != "lo")
        .map(|n| {
            let state = std::fs::read_to_string(dir.join(&n).join("operstate"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            (n, state)
        })
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_pod() -> Machine {
        Machine {
            expected_gpus: 8,
            visible_gpus: 8,
            libtorch: "libtorch 2.11.0 (CUDA build)".into(),
            nccl: Ok("2.27.3".into()),
            nvml: true,
            pci: Some((40, 8)),
            shm_bytes: Some(8 << 30),
            interfaces: vec![("eth0".into(), "up".into())],
            socket_ifname: None,
            rdma: vec!["mlx5_0".into()],
            port_range: Some((41000, 42999)),
            declared_range: Some("41000-42999".into()),
        }
    }

    #[test]
    fn a_healthy_gpu_pod_passes_every_check() {
        let f = findings(&gpu_pod());
        assert!(f.iter().all(|f| f.ok), "{}", table(&f));
        assert!(summary(&f).contains("checks ok"));
    }

    #[test]
    fn what_breaks_a_gpu_job_is_named() {
        let broken = Machine {
            visible_gpus: 0,
            nccl: Err("libnccl.so.2: cannot open".into()),
            pci: None,
            shm_bytes: Some(64 << 20),
            port_range: Some((32768, 60999)),
            ..gpu_pod()
        };
        let f = findings(&broken);
        let failed: Vec<&str> = f.iter().filter(|f| !f.ok).map(|f| f.name).collect();
        assert_eq!(
            failed,
            [
                "CUDA devices",
                "NCCL",
                "PCI topology",
                "/dev/shm",
                "port range"
            ]
        );
        let line = summary(&f);
        assert!(line.contains("unhandled system error"), "{line}");
        assert!(table(&f).lines().filter(|l| l.starts_with("FAIL")).count() == 5);
    }

    #[test]
    fn a_cpu_pod_needs_no_gpu_library() {
        let cpu = Machine {
            expected_gpus: 0,
            visible_gpus: 0,
            nccl: Err("not in this build".into()),
            nvml: false,
            pci: None,
            shm_bytes: Some(64 << 20),
            ..gpu_pod()
        };
        assert!(findings(&cpu).iter().all(|f| f.ok));
        // And this machine, whatever it is, yields a table.
        assert!(!table(&findings(&Machine::here())).is_empty());
    }
}
