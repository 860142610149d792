//! The cluster kit's own processes (../shared/cluster: its API server, its pods' DNS server),
//! stopped from this machine where the kit runs them, and started again with its `up.sh`,
//! which starts whatever is not running.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    pid_named(component.pid_file())
}

/// The pid of the kit's process `name` (its `run/NAME.pid`), when it lives.
fn pid_named(name: &str) -> Option<u32> {
    let file = kit_dir().join(format!("run/{name}.pid"));
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

/// Faults holding a kit process down on purpose (the API server, DNS, a kubelet): while any
/// does, [`supervise`] starts nothing.
static HOLDS: AtomicUsize = AtomicUsize::new(0);

/// A kit process held down on purpose, until dropped.
pub struct Hold(());

impl Hold {
    pub fn new() -> Hold {
        HOLDS.fetch_add(1, Ordering::SeqCst);
        Hold(())
    }
}

impl Default for Hold {
    fn default() -> Self {
        Hold::new()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        HOLDS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The control plane's processes no fault stops: a real cluster's kubelet restarts them
/// (static pods) when they crash, as up.sh does here.
const SUPERVISED: [&str; 5] = [
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "api-relay",
    "agent",
];

/// What [`supervise`] started again, and when.
static RESTARTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Every 5 s, while no fault holds a process down: starts again (up.sh) whichever of the
/// control plane's processes died (the kube-scheduler exits when it finds its cache
/// corrupted, e.g. after the API server came back); never returns (abort it).
pub async fn supervise() {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let dead: Vec<&str> = SUPERVISED
            .into_iter()
            .filter(|name| pid_named(name).is_none())
            .collect();
        if dead.is_empty() || HOLDS.load(Ordering::SeqCst) > 0 {
            continue;
        }
        let up = tokio::task::spawn_blocking(up).await;
        let note = format!(
            "{} {dead:?} had died; up.sh started {}: {up:?}",
            ferrotrain_api::recovery::Timestamp::now(),
            if dead.len() == 1 { "it" } else { "them" }
        );
        eprintln!("  kit: {note}");
        RESTARTED.lock().expect("restarts").push(note);
    }
}

/// What [`supervise`] started again since the last call (taken).
pub fn restarted() -> Vec<String> {
    std::mem::take(&mut *RESTARTED.lock().expect("restarts"))
}
