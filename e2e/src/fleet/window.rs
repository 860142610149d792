//! One measurement window: every counter the bench reads, at its start and at its end (the API
//! server's requests by verb and by FlowSchema, the CPU and memory of each process that shares
//! the machine, the machine's busy time), and what they come to in between.

use std::collections::BTreeMap;
use std::time::Instant;

use super::access;
use super::bench::Bench;
use super::metrics::{self, ApiServer};
use super::procs::{self, Reading, Usage};

/// The counters at one moment.
pub struct Counters {
    at: Instant,
    api: ApiServer,
    operator: BTreeMap<String, f64>,
    hollow: BTreeMap<String, f64>,
    procs: BTreeMap<String, Reading>,
    machine: f64,
}

/// What a window came to.
pub struct Window {
    pub seconds: f64,
    /// Every client's requests per second, by verb.
    pub api_rates: BTreeMap<String, f64>,
    pub api_cpu_cores: f64,
    pub api_rss: f64,
    /// p99 of mutating requests' latency (bucket bound), seconds.
    pub api_write_p99: Option<f64>,
    /// The operators' dispatched requests by FlowSchema (`pods`, `jobs`, ..., `reads`).
    pub operator: BTreeMap<String, f64>,
    /// The hollow nodes' dispatched requests (`writes`, `reads`).
    pub hollow: BTreeMap<String, f64>,
    /// CPU (cores) and RSS by process: fleet-a, fleet-b, hollow-nodes, kube-apiserver, etcd,
    /// kube-scheduler, kube-controller-manager, bench.
    pub usage: BTreeMap<String, Usage>,
    /// The machine's busy cores.
    pub machine_cores: f64,
    pub objects: BTreeMap<String, f64>,
}

/// The processes a window reads, by name.
fn pids(b: &Bench) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for op in &b.operators {
        out.insert(op.identity.clone(), op.proc.pid());
    }
    if let Some(sim) = &b.sim {
        out.insert("hollow-nodes".into(), sim.pid());
    }
    for kit in [
        "kube-apiserver",
        "etcd",
        "kube-scheduler",
        "kube-controller-manager",
    ] {
        if let Some(pid) = procs::kit_pid(kit) {
            out.insert(kit.into(), pid);
        }
    }
    out.insert("bench".into(), std::process::id());
    out
}

impl Counters {
    pub async fn read(b: &Bench) -> Result<Counters, String> {
        let text = metrics::api_text(&b.client, "/metrics").await?;
        let procs = pids(b)
            .into_iter()
            .filter_map(|(name, pid)| Some((name, Reading::of(pid)?)))
            .collect();
        Ok(Counters {
            at: Instant::now(),
            api: ApiServer::parse(&text),
            operator: access::dispatched(&text, &format!("{}-op", b.prefix)),
            hollow: access::dispatched(&text, &format!("{}-hw", b.prefix)),
            procs,
            machine: procs::machine_busy_seconds(),
        })
    }

    /// From `self` (the start) to `end`.
    pub fn to(&self, end: &Counters) -> Window {
        let seconds = (end.at - self.at).as_secs_f64().max(1e-9);
        let delta =
            |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
                b.iter()
                    .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
                    .collect()
            };
        let usage = end
            .procs
            .iter()
            .filter_map(|(name, r)| Some((name.clone(), r.since(self.procs.get(name)?))))
            .collect();
        Window {
            seconds,
            api_rates: end.api.rates(&self.api, seconds),
            api_cpu_cores: (end.api.cpu_seconds - self.api.cpu_seconds) / seconds,
            api_rss: end.api.rss_bytes,
            api_write_p99: end.api.write_latency_quantile(&self.api, 0.99),
            operator: delta(&self.operator, &end.operator),
            hollow: delta(&self.hollow, &end.hollow),
            usage,
            machine_cores: (end.machine - self.machine) / seconds,
            objects: end.api.objects.clone(),
        }
    }
}

impl Window {
    /// The operators' writes in the window (every FlowSchema but reads).
    pub fn operator_writes(&self) -> f64 {
        self.operator
            .iter()
            .filter(|(k, _)| k.as_str() != "reads")
            .map(|(_, v)| v)
            .sum()
    }

    /// "pods 12, jobs 40, ..." (writes only, largest first).
    pub fn operator_writes_by_kind(&self) -> String {
        let mut kinds: Vec<(&String, &f64)> = self
            .operator
            .iter()
            .filter(|(k, v)| k.as_str() != "reads" && **v > 0.0)
            .collect();
        kinds.sort_by(|a, b| b.1.total_cmp(a.1));
        kinds
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every client's requests per second.
    pub fn api_total_rate(&self) -> f64 {
        self.api_rates.values().sum()
    }

    /// "PATCH 80.1, GET 20.0, ..." (largest first).
    pub fn api_rates_by_verb(&self) -> String {
        let mut verbs: Vec<(&String, &f64)> = self.api_rates.iter().collect();
        verbs.sort_by(|a, b| b.1.total_cmp(a.1));
        verbs
            .iter()
            .take(6)
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn usage_of(&self, name: &str) -> Usage {
        self.usage.get(name).copied().unwrap_or_default()
    }

    /// "kube-apiserver 0.61, etcd 0.20, ..." cores by process, largest first.
    pub fn cores_by_process(&self) -> String {
        let mut all: Vec<(&String, &Usage)> = self.usage.iter().collect();
        all.sort_by(|a, b| b.1.cores.total_cmp(&a.1.cores));
        all.iter()
            .map(|(k, u)| format!("{k} {:.2}", u.cores))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
