//! The cluster kit's own processes (../shared/cluster: its API server, its pods' DNS server),
//! stopped from this machine where the kit runs them, and started again with its `up.sh`,
//! which starts whatever is not running.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A process of the kit, as its `run/NAME.pid` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    ApiServer,
    Dns,
}

impl Component {
    fn pid_file(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::Dns => "dnsmasq",
        }
    }
}

/// The kit: FERROTRAIN_CLUSTER_KIT, else ../shared/cluster beside the project.
pub fn kit() -> PathBuf {
    std::env::var_os("FERROTRAIN_CLUSTER_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/cluster"))
}

/// The kit's state directory (its common.sh: FTC_DIR, default /var/lib/ferrotrain-cluster).
pub fn kit_dir() -> PathBuf {
    std::env::var_os("FTC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/ferrotrain-cluster"))
}

/// The pid of `component`, when its pid file names a live process.
pub fn pid_of(component: Component) -> Option<u32> {
    let file = kit_dir().join(format!("run/{}.pid", component.pid_file()));
    let line = std::fs::read_to_string(file).ok()?;
    let pid: u32 = line.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state after the command's closing parenthesis: a zombie is not running.
    let state = stat.rsplit_once(") ")?.1.split_whitespace().next()?;
    (state != "Z").then_some(pid)
}

/// Kills `component` with SIGKILL (a crash: nothing is flushed or handed over); returns the
/// pid it killed.
pub fn kill(component: Component) -> Result<u32, String> {
    let pid = pid_of(component).ok_or_else(|| format!("{component:?} does not run"))?;
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| format!("kill(1): {e}"))?;
    if !status.success() {
        return Err(format!("kill -KILL {pid} ({component:?}) failed"));
    }
    // Gone (reaped by its parent, or a zombie) before anything is started again.
    let until = Instant::now() + Duration::from_secs(10);
    while pid_of(component).is_some() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(pid)
}

/// Runs the kit's `up.sh` (as root: it starts what is not running and waits until the nodes
/// are Ready and the pods' DNS answers); returns how long it took.
pub fn up() -> Result<Duration, String> {
    let started = Instant::now();
    let script = kit().join("up.sh");
    let out = Command::new(&script)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(started.elapsed())
}

/// The host path of a hostPath volume the kit provisioned, from its PersistentVolume's spec.
pub fn host_path(volume: &k8s_openapi::api::core::v1::PersistentVolume) -> Option<PathBuf> {
    let path = &volume.spec.as_ref()?.host_path.as_ref()?.path;
    Some(PathBuf::from(path))
}
