//! The faults' mechanisms: signals to a pod's processes from this machine (where the kit runs
//! its containers), the API's deletion and eviction, a kubelet's own eviction, a partition, the
//! operator's pod deleted, the kit's API server and DNS server killed and started again.

use std::time::{Duration, Instant};

use ferrotrain_api::recovery::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, ListParams};

use crate::chaos::fault::{Fault, Kind};
use crate::chaos::kit::{self, Component, Hold};
use crate::chaos::observe::{PodView, job_pods, patiently, pod_of};
use crate::namespace::TestNamespace;
use crate::partition::Partition;
use crate::pods::exec;
use crate::processes::{launchers_of, trainers_of};

/// The label of the operator's pods (the chart's).
const OPERATOR_PODS: &str = "app.kubernetes.io/name=ferrotrain-operator";

/// A fault as it was injected.
#[derive(Default)]
pub struct Injected {
    /// When it was injected.
    pub at: Option<Timestamp>,
    /// When it took effect, when later (the kubelet's eviction).
    pub acted: Option<Timestamp>,
    /// The pod it hit, and its node rank when another than the one scheduled (a partition
    /// cuts off a pod alone on its node).
    pub pod: Option<String>,
    pub node_rank: Option<i32>,
    /// What was done, for the report (a pid, a node).
    pub detail: String,
    /// Why it could not be injected (no such process at that moment): not a fault of the job.
    pub missed: Option<String>,
    /// A partition to heal once the gang is whole again, its kubelet held down until then.
    pub partition: Option<(Partition, Hold)>,
}

impl Injected {
    fn missed(why: String) -> Injected {
        Injected {
            missed: Some(why),
            ..Injected::default()
        }
    }

    fn done(pod: Option<&PodView>, detail: String) -> Injected {
        Injected {
            at: Some(Timestamp::now()),
            pod: pod.map(|p| p.name.clone()),
            detail,
            ..Injected::default()
        }
    }
}

/// Injects `fault` into job `job` of `ns` (its pods as they are now).
pub async fn inject(ns: &TestNamespace, job: &str, fault: &Fault) -> Injected {
    let pods = job_pods(ns, job).await;
    let victim = pod_of(&pods, fault.node).cloned();
    if fault.kind.targets_a_pod() && victim.is_none() {
        return Injected::missed(format!("no pod of node rank {} to hit", fault.node));
    }
    let pod = victim.as_ref();
    match fault.kind {
        Kind::KillTrainer => signal_trainer(pod.unwrap(), fault.local, "KILL").await,
        Kind::StopTrainer => signal_trainer(pod.unwrap(), fault.local, "STOP").await,
        Kind::KillLauncher => kill_launcher(pod.unwrap()),
        Kind::DeletePod => delete_pod(ns, pod.unwrap()).await,
        Kind::EvictPod => evict_pod(ns, pod.unwrap()).await,
        Kind::KubeletEvict => kubelet_evict(ns, pod.unwrap()).await,
        Kind::Partition => partition(&pods, pod.unwrap()),
        Kind::OperatorDeleted => delete_operator(ns).await,
        Kind::ApiServerDown => api_server_down(fault.hold_seconds).await,
        Kind::DnsDownReplace => dns_down_replace(ns, pod.unwrap(), fault.hold_seconds).await,
    }
}

/// The trainer (`ferrotrain run`, not a spare) of local rank `local` in the pod, found among
/// this machine's processes; a second between two rounds may have none, so it is looked for
/// a few seconds.
async fn trainer_pid(pod: &PodView, local: i32) -> Option<u32> {
    let wanted = format!("LOCAL_RANK={local}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let found = trainers_of(&pod.uid).into_iter().find(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes())
        });
        if found.is_some() || Instant::now() > until {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kill(pid: u32, signal: &str) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .map_err(|e| format!("kill(1): {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -{signal} {pid} failed (gone already?)"))
}

async fn signal_trainer(pod: &PodView, local: i32, signal: &str) -> Injected {
    let Some(pid) = trainer_pid(pod, local).await else {
        return Injected::missed(format!("no trainer of local rank {local} in {}", pod.name));
    };
    match kill(pid, signal) {
        Ok(()) => Injected::done(Some(pod), format!("SIG{signal} to pid {pid}")),
        Err(e) => Injected::missed(e),
    }
}

fn kill_launcher(pod: &PodView) -> Injected {
    let launchers = launchers_of(&pod.uid);
    let [pid] = launchers[..] else {
        return Injected::missed(format!("{} launchers in {}", launchers.len(), pod.name));
    };
    match kill(pid, "KILL") {
        Ok(()) => Injected::done(Some(pod), format!("SIGKILL to launcher pid {pid}")),
        Err(e) => Injected::missed(e),
    }
}

async fn delete_pod(ns: &TestNamespace, pod: &PodView) -> Injected {
    let pods: Api<Pod> = ns.pods();
    let at = Timestamp::now();
    let params = DeleteParams::default();
    match patiently("deleting a pod", || pods.delete(&pod.name, &params)).await {
        Ok(_) => Injected {
            at: Some(at),
            ..Injected::done(Some(pod), "deleted".into())
        },
        Err(e) => Injected::missed(format!("deleting {}: {e}", pod.name)),
    }
}

async fn evict_pod(ns: &TestNamespace, pod: &PodView) -> Injected {
    let pods: Api<Pod> = ns.pods();
    let at = Timestamp::now();
    let params = EvictParams::default();
    match patiently("evicting a pod", || pods.evict(&pod.name, &params)).await {
        Ok(_) => Injected {
            at: Some(at),
            ..Injected::done(Some(pod), "evicted through the API".into())
        },
        Err(e) => Injected::missed(format!("evicting {}: {e}", pod.name)),
    }
}

/// 200 MiB into the pod's /tmp (an emptyDir) against its 100Mi limit; returns once the
/// kubelet has evicted it (the pod Failed, or gone), at most 4 minutes later.
async fn kubelet_evict(ns: &TestNamespace, pod: &PodView) -> Injected {
    let written = exec(
        &ns.pods(),
        &pod.name,
        "head -c 200M /dev/zero > /tmp/fill; echo written",
    )
    .await;
    let mut injected = Injected::done(Some(pod), "200 MiB written into /tmp".into());
    if !written.contains("written") {
        return Injected::missed(format!("writing into {}'s /tmp: {written:?}", pod.name));
    }
    let pods: Api<Pod> = ns.pods();
    let until = Instant::now() + Duration::from_secs(240);
    while Instant::now() < until {
        let now = patiently("reading the evicted pod", || pods.get_opt(&pod.name)).await;
        let evicted = match now {
            Ok(Some(p)) => {
                p.metadata.uid.as_deref() != Some(&pod.uid)
                    || p.status.and_then(|s| s.phase).as_deref() == Some("Failed")
            }
            Ok(None) => true,
            Err(_) => false,
        };
        if evicted {
            injected.acted = Some(Timestamp::now());
            injected.detail += &format!(
                ", evicted {:.0} s later",
                Timestamp::now()
                    .duration_since(injected.at.unwrap())
                    .as_secs_f64()
            );
            return injected;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    injected.detail += ", not evicted within 240 s";
    injected
}

/// Whether no other pod of the job shares `pod`'s node (a partition stops its kubelet: they
/// would be lost with it, a different fault).
fn alone(pods: &[PodView], pod: &PodView) -> bool {
    pod.node.is_some()
        && !pods
            .iter()
            .any(|p| p.uid != pod.uid && p.node == pod.node && !p.leaving)
}

/// Cuts the pod off, or, when it shares its node with another pod of the job, another pod
/// (not node 0's) that is alone on its node.
fn partition(pods: &[PodView], pod: &PodView) -> Injected {
    let victim = if alone(pods, pod) {
        Some(pod)
    } else {
        pods.iter()
            .filter(|p| p.node_rank > 0 && !p.leaving && p.phase == "Running")
            .find(|p| alone(pods, p))
    };
    let Some(victim) = victim else {
        return Injected::missed(format!(
            "no pod but node 0's is alone on its node ({:?})",
            pods.iter().map(|p| (&p.name, &p.node)).collect::<Vec<_>>()
        ));
    };
    let node = victim.node.clone().expect("placed");
    let hold = Hold::new();
    let cut = Partition::cut(&victim.uid, &node);
    Injected {
        partition: Some((cut, hold)),
        node_rank: Some(victim.node_rank),
        ..Injected::done(
            Some(victim),
            format!("cut off on {node}, its kubelet stopped"),
        )
    }
}

/// Deletes the operator's pod that holds its Lease (every operator pod when none does).
async fn delete_operator(ns: &TestNamespace) -> Injected {
    let all: Api<Pod> = Api::all(ns.client.clone());
    let params = ListParams::default().labels(OPERATOR_PODS);
    let Ok(list) = patiently("listing the operator's pods", || all.list(&params)).await else {
        return Injected::missed("cannot list the operator's pods".into());
    };
    let leases: Api<Lease> = Api::all(ns.client.clone());
    let all_leases = ListParams::default();
    let holders: Vec<String> = patiently("listing Leases", || leases.list(&all_leases))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|l| l.spec?.holder_identity)
                .collect()
        })
        .unwrap_or_default();
    let operators: Vec<(String, String)> = list
        .items
        .iter()
        .filter_map(|p| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?)))
        .collect();
    let leader: Vec<&(String, String)> = operators
        .iter()
        .filter(|(_, name)| holders.contains(name))
        .collect();
    let victims: Vec<&(String, String)> = if leader.is_empty() {
        operators.iter().collect()
    } else {
        leader
    };
    let at = Timestamp::now();
    let mut deleted = Vec::new();
    let params = DeleteParams::default();
    for (namespace, name) in victims {
        let pods: Api<Pod> = Api::namespaced(ns.client.clone(), namespace);
        if patiently("deleting the operator", || pods.delete(name, &params))
            .await
            .is_ok()
        {
            deleted.push(name.clone());
        }
    }
    if deleted.is_empty() {
        return Injected::missed("no operator pod deleted".into());
    }
    Injected {
        at: Some(at),
        ..Injected::done(None, format!("deleted {deleted:?}"))
    }
}

/// Kills the kit's API server, keeps it down `hold` seconds, starts it again (up.sh).
async fn api_server_down(hold: u64) -> Injected {
    let _held = Hold::new();
    let at = Timestamp::now();
    let pid = match kit::kill(Component::ApiServer) {
        Ok(pid) => pid,
        Err(e) => return Injected::missed(e),
    };
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let up = tokio::task::spawn_blocking(kit::up).await.expect("up.sh");
    let detail = match up {
        Ok(took) => format!(
            "kube-apiserver pid {pid} killed, up.sh after {hold} s took {:.1} s",
            took.as_secs_f64()
        ),
        Err(e) => format!("kube-apiserver pid {pid} killed; up.sh failed: {e}"),
    };
    Injected {
        at: Some(at),
        ..Injected::done(None, detail)
    }
}

/// Kills the kit's DNS server, deletes the pod, keeps DNS down `hold` seconds, starts it again.
async fn dns_down_replace(ns: &TestNamespace, pod: &PodView, hold: u64) -> Injected {
    let _held = Hold::new();
    let at = Timestamp::now();
    let pid = match kit::kill(Component::Dns) {
        Ok(pid) => pid,
        Err(e) => return Injected::missed(e),
    };
    let deleted = delete_pod(ns, pod).await;
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let up = tokio::task::spawn_blocking(kit::up).await.expect("up.sh");
    let detail = match (&deleted.missed, up) {
        (Some(missed), _) => format!("dnsmasq pid {pid} killed; {missed}"),
        (None, Ok(took)) => format!(
            "dnsmasq pid {pid} killed, {} deleted, up.sh after {hold} s took {:.1} s",
            pod.name,
            took.as_secs_f64()
        ),
        (None, Err(e)) => format!(
            "dnsmasq pid {pid} killed, {} deleted; up.sh failed: {e}",
            pod.name
        ),
    };
    Injected {
        at: Some(at),
        missed: deleted.missed,
        ..Injected::done(Some(pod), detail)
    }
}
