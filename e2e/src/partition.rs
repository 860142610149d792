//! A network partition of one pod on the cluster kit (../shared/cluster), made from this
//! machine, where the kit's kubelets and containers run: every packet into and out of the
//! pod's network namespace is dropped (iptables rules inside that namespace only: the kit's
//! own firewall is not touched), and the kubelet of its node is stopped, so that Kubernetes
//! loses the node as it would behind a real partition, while the pod's processes keep running.
//! [`Partition::heal`] (also on drop, however the test ends) removes the rules and starts the
//! kubelet again with the kit's `up.sh`.

use std::path::PathBuf;
use std::process::Command;

/// One pod cut off from the network, and its node's kubelet stopped.
pub struct Partition {
    /// A process of the pod (its launcher): the way into its network namespace.
    pid: u32,
    node: String,
    network_cut: bool,
    kubelet_stopped: bool,
}

/// The rules that cut the pod off, inserted first in its namespace's INPUT and OUTPUT: every
/// packet but those on its loopback (its own processes still talk to one another).
const CHAINS: [(&str, &str); 2] = [("INPUT", "-i"), ("OUTPUT", "-o")];

impl Partition {
    /// Cuts off the pod with UID `uid`, running on the kit's node `node`.
    pub fn cut(uid: &str, node: &str) -> Partition {
        let pid = crate::processes::launcher_pid(uid);
        let mut p = Partition {
            pid,
            node: node.to_string(),
            network_cut: false,
            kubelet_stopped: false,
        };
        for (chain, not_lo) in CHAINS {
            p.iptables(&["-I", chain, "1", "!", not_lo, "lo", "-j", "DROP"])
                .unwrap_or_else(|e| panic!("cutting the pod off: {e}"));
            p.network_cut = true;
        }
        let pid_file = kit_dir().join(format!("run/kubelet-{node}.pid"));
        let line = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let kubelet = line.split_whitespace().next().expect("a pid").to_string();
        let status = Command::new("kill")
            .arg(&kubelet)
            .status()
            .expect("kill(1)");
        assert!(
            status.success(),
            "stopping the kubelet of {node} (pid {kubelet})"
        );
        p.kubelet_stopped = true;
        p
    }

    /// The pod's network comes back; its node's kubelet stays stopped (see
    /// [`Self::start_kubelet`]).
    pub fn restore_network(&mut self) -> Result<(), String> {
        if self.network_cut {
            for (chain, not_lo) in CHAINS {
                self.iptables(&["-D", chain, "!", not_lo, "lo", "-j", "DROP"])?;
            }
            self.network_cut = false;
        }
        Ok(())
    }

    /// Starts the node's kubelet again (the kit's up.sh starts what is not running).
    pub fn start_kubelet(&mut self) -> Result<(), String> {
        if self.kubelet_stopped {
            let up = kit().join("up.sh");
            let out = Command::new(&up)
                .output()
                .map_err(|e| format!("{}: {e}", up.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} (restarting the kubelet of {}): {}",
                    up.display(),
                    self.node,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            self.kubelet_stopped = false;
        }
        Ok(())
    }

    /// Both: the partition is over.
    pub fn heal(&mut self) -> Result<(), String> {
        let network = self.restore_network();
        self.start_kubelet()?;
        network
    }

    /// iptables in the pod's network namespace. Once its process is gone (the fence made it
    /// leave, or the kubelet reaped it), so is the namespace, and nothing is left to undo.
    fn iptables(&self, args: &[&str]) -> Result<(), String> {
        let alive = || std::path::Path::new(&format!("/proc/{}", self.pid)).exists();
        if !alive() {
            return Ok(());
        }
        let pid = self.pid.to_string();
        let out = Command::new("nsenter")
            .args(["-t", &pid, "-n", "iptables", "-w"])
            .args(args)
            .output()
            .map_err(|e| format!("nsenter(1) and iptables(8): {e}"))?;
        if out.status.success() || !alive() {
            return Ok(());
        }
        Err(format!(
            "iptables {args:?} in the network namespace of pid {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Drop for Partition {
    /// However the test ended, the pod's network and its node's kubelet come back.
    fn drop(&mut self) {
        if let Err(e) = self.heal() {
            eprintln!("healing the partition: {e}");
        }
    }
}

/// The cluster kit: FERROTRAIN_CLUSTER_KIT, else ../shared/cluster beside the project.
fn kit() -> PathBuf {
    std::env::var_os("FERROTRAIN_CLUSTER_KIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/cluster"))
}

/// The kit's state directory (its common.sh: FTC_DIR, default /var/lib/ferrotrain-cluster).
fn kit_dir() -> PathBuf {
    std::env::var_os("FTC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/ferrotrain-cluster"))
}
