//! bench/operator-scale.sh's measurements of the installed operator on a live cluster
//! ($KUBECONFIG, e.g. ../shared/cluster set up by scripts/e2e.sh):
//!
//! 1. apply -> pods: N jobs created one after another; for each, the time from the create's
//!    answer to the watch seeing its last pod (pods made unschedulable by a node selector, so
//!    nothing trains); p50, p99, max.
//! 2. API writes per running job per minute: K jobs that train, counted by the API server
//!    itself (API Priority and Fairness: a FlowSchema that matches the operator's
//!    ServiceAccount's writes to the jobs' objects, `apiserver_flowcontrol_dispatched_requests_total`),
//!    over a window in which they all run.
//! 3. The operator's RSS and CPU, and reconciles per minute, with 100 and 1,000 jobs
//!    (suspended: no pods) after they settled: from the leader's own /metrics.
//!
//! Prints a Markdown table. Everything it creates lives in one namespace (deleted at the end,
//! also on failure) and one FlowSchema (deleted at the end).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferrotrain_e2e::{TestNamespace, copy_job, distributed_training, wait_for};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams,
};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

const OPERATOR_NS: &str = "ferrotrain-system";
const LEASE: &str = "ferrotrain-operator";
const FLOW_SCHEMA: &str = "ferrotrain-bench-operator-writes";

struct Args {
    latency_jobs: usize,
    running_jobs: usize,
    window: Duration,
    idle_counts: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args {
        latency_jobs: 50,
        running_jobs: 4,
        window: Duration::from_secs(120),
        idle_counts: vec![100, 1000],
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or_default();
        match pair[0].as_str() {
            "--latency-jobs" => a.latency_jobs = value.parse().expect("--latency-jobs N"),
            "--running-jobs" => a.running_jobs = value.parse().expect("--running-jobs N"),
            "--window-seconds" => {
                a.window = Duration::from_secs(value.parse().expect("--window-seconds S"))
            }
            "--idle-jobs" => {
                a.idle_counts = value
                    .split(',')
                    .map(|n| n.parse().expect("--idle-jobs N,M"))
                    .collect()
            }
            other => panic!(
                "unknown argument {other} (--latency-jobs, --running-jobs, --window-seconds, --idle-jobs)"
            ),
        }
    }
    a
}

#[tokio::main]
async fn main() {
    let args = args();
    let ns = TestNamespace::create("scale").await;
    let client = ns.client.clone();
    let mut rows: Vec<(String, String, String)> = Vec::new();

    let latencies = apply_to_pods(&ns, args.latency_jobs).await;
    rows.push((
        format!(
            "apply -> all pods created, {} jobs of 2 pods (p50 / p99 / max)",
            args.latency_jobs
        ),
        format!(
            "{:.3} / {:.3} / {:.3} s",
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
            quantile(&latencies, 1.0)
        ),
        "< 0.3 s".into(),
    ));
    delete_jobs(&ns).await;

    let writes = writes_per_running_job(&ns, args.running_jobs, args.window).await;
    rows.push((
        format!(
            "API writes per running job per minute ({} jobs, {} s window)",
            args.running_jobs,
            args.window.as_secs()
        ),
        format_writes(&writes),
        "<= 6".into(),
    ));
    delete_jobs(&ns).await;

    let mut created = 0;
    for &count in &args.idle_counts {
        create_suspended(&ns, created, count).await;
        created = count;
        let idle = idle_operator(&client, count).await;
        rows.push((
            format!("operator RSS with {count} jobs"),
            format!("{:.1} MB", idle.rss_bytes / 1e6),
            if count >= 1000 {
                "< 100 MB".into()
            } else {
                String::new()
            },
        ));
        rows.push((
            format!("operator CPU with {count} jobs, idle"),
            format!("{:.2}% of a core", 100.0 * idle.cpu_per_second),
            String::new(),
        ));
        rows.push((
            format!("reconciles per minute with {count} idle jobs"),
            format!("{:.1}", idle.reconciles_per_minute),
            String::new(),
        ));
    }
    delete_jobs(&ns).await;

    println!("\n| measurement | value | target |\n|---|---|---|");
    for (what, value, target) in rows {
        println!("| {what} | {value} | {target} |");
    }
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i]
}

/// A copy job of 2 pods that never get scheduled (no node has the label): the operator's
/// part (create the Service, ConfigMap, Secret and pods) is all there is to time.
fn unschedulable_job() -> Value {
    let mut spec = copy_job(2, 100, None);
    spec["podTemplate"]["nodeSelector"] = json!({"ferrotrain.dev/bench": "no-such-node"});
    spec["startupTimeoutSeconds"] = json!(0);
    spec
}

/// Seconds from each job's create answer to the watch seeing its second pod.
async fn apply_to_pods(ns: &TestNamespace, jobs: usize) -> Vec<f64> {
    let pods = ns.pods();
    let mut stream = pods
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watching pods")
        .boxed();
    let mut latencies = Vec::new();
    for i in 0..jobs {
        let name = format!("lat-{i:03}");
        let dt = distributed_training(&name, &ns.name, unschedulable_job());
        ns.jobs()
            .create(&PostParams::default(), &dt)
            .await
            .expect("creating a job");
        let created = Instant::now();
        let mut seen = 0;
        while seen < 2 {
            let event = tokio::time::timeout(Duration::from_secs(30), stream.try_next())
                .await
                .unwrap_or_else(|_| panic!("{name}: its pods did not appear within 30 s"))
                .expect("the pod watch")
                .expect("the pod watch ended");
            if let WatchEvent::Added(pod) = event
                && pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("ferrotrain.dev/job"))
                    == Some(&name)
            {
                seen += 1;
            }
        }
        latencies.push(created.elapsed().as_secs_f64());
        // Spaced, as jobs arrive in a real cluster, not a burst the debounce would batch.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    latencies
}

async fn delete_jobs(ns: &TestNamespace) {
    let _ = ns
        .jobs()
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await;
    wait_for(
        "the jobs and their pods gone",
        Duration::from_secs(300),
        || async {
            let jobs = ns
                .jobs()
                .list(&ListParams::default())
                .await
                .map_or(1, |l| l.items.len());
            let pods = ns
                .pods()
                .list(&ListParams::default())
                .await
                .map_or(1, |l| l.items.len());
            (
                ((jobs + pods) == 0).then_some(()),
                format!("{jobs} jobs, {pods} pods"),
            )
        },
    )
    .await;
}

/// The operator's writes to the jobs' objects, as the API server counts them.
struct Writes {
    total: f64,
    per_job_minute: f64,
    by_kind: BTreeMap<String, f64>,
}

fn format_writes(w: &Writes) -> String {
    let kinds: Vec<String> = w
        .by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n:.0}"))
        .collect();
    format!(
        "{:.2} ({:.0} writes: {})",
        w.per_job_minute,
        w.total,
        kinds.join(", ")
    )
}

/// K training jobs; the writes the API server dispatched for the operator while all of them
/// ran for `window`.
async fn writes_per_running_job(ns: &TestNamespace, jobs: usize, window: Duration) -> Writes {
    let client = &ns.client;
    let operator = operator_user(client).await;
    let kinds = [
        "pods",
        "distributedtrainings",
        "events",
        "services",
        "configmaps",
        "secrets",
    ];
    for kind in kinds {
        flow_schema(client, &operator, kind).await;
    }
    for i in 0..jobs {
        let mut spec = copy_job(2, 10_000_000, None);
        spec["resources"] =
            json!({"requests": {"cpu": "25m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}});
        let dt = distributed_training(&format!("run-{i}"), &ns.name, spec);
        ns.jobs()
            .create(&PostParams::default(), &dt)
            .await
            .expect("creating a job");
    }
    wait_for(
        "every job Running with progress",
        Duration::from_secs(600),
        || async {
            let list = ns
                .jobs()
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let running = list
                .iter()
                .filter(|d| {
                    d.status.as_ref().is_some_and(|s| {
                        s.phase == ferrotrain_api::crd::Phase::Running
                            && s.progress.as_ref().is_some_and(|p| p.report.step > 0)
                    })
                })
                .count();
            (
                (running == jobs).then_some(()),
                format!("{running} of {jobs} running"),
            )
        },
    )
    .await;
    let before = dispatched(client).await;
    tokio::time::sleep(window).await;
    let after = dispatched(client).await;
    for kind in kinds {
        let _ = flow_schemas(client)
            .delete(&format!("{FLOW_SCHEMA}-{kind}"), &DeleteParams::default())
            .await;
    }
    let by_kind: BTreeMap<String, f64> = after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0.0)))
        .collect();
    let total: f64 = by_kind.values().sum();
    Writes {
        total,
        per_job_minute: total / jobs as f64 / (window.as_secs_f64() / 60.0),
        by_kind,
    }
}

/// `system:serviceaccount:<ns>:<sa>` of the operator's pods.
async fn operator_user(client: &Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NS);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=ferrotrain-operator"))
        .await
        .expect("listing the operator's pods");
    let sa = list
        .items
        .first()
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .expect("an operator pod with a ServiceAccount");
    format!("system:serviceaccount:{OPERATOR_NS}:{sa}")
}

fn flow_schemas(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1".into(),
        api_version: "flowcontrol.apiserver.k8s.io/v1".into(),
        kind: "FlowSchema".into(),
        plural: "flowschemas".into(),
    };
    Api::all_with(client.clone(), &resource)
}

/// A FlowSchema per resource, matching the operator's writes to it (one counter each).
async fn flow_schema(client: &Client, user: &str, resource: &str) {
    let (sa_ns, sa_name) = {
        let parts: Vec<&str> = user.split(':').collect();
        (parts[2].to_string(), parts[3].to_string())
    };
    let (group, resources) = match resource {
        "distributedtrainings" => (
            "ferrotrain.dev",
            vec!["distributedtrainings", "distributedtrainings/status"],
        ),
        "events" => ("*", vec!["events"]),
        other => ("", vec![other]),
    };
    let schema: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": format!("{FLOW_SCHEMA}-{resource}")},
        "spec": {
            "matchingPrecedence": 100,
            "priorityLevelConfiguration": {"name": "workload-low"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": sa_ns, "name": sa_name}}],
                "resourceRules": [{
                    "verbs": ["create", "update", "patch", "delete", "deletecollection"],
                    "apiGroups": [group],
                    "resources": resources,
                    "namespaces": ["*"]
                }]
            }]
        }
    }))
    .unwrap();
    let api = flow_schemas(client);
    let _ = api
        .delete(
            &format!("{FLOW_SCHEMA}-{resource}"),
            &DeleteParams::default(),
        )
        .await;
    api.create(&PostParams::default(), &schema)
        .await
        .expect("creating a FlowSchema");
}

/// The API server's dispatched-request counters of the bench's FlowSchemas, by resource.
async fn dispatched(client: &Client) -> BTreeMap<String, f64> {
    let text = metrics_text(client, "/metrics").await;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if !line.starts_with("apiserver_flowcontrol_dispatched_requests_total{") {
            continue;
        }
        let Some(rest) = line.split(&format!("flow_schema=\"{FLOW_SCHEMA}-")).nth(1) else {
            continue;
        };
        let kind = rest.split('"').next().unwrap_or_default().to_string();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(kind).or_insert(0.0) += value;
    }
    out
}

async fn metrics_text(client: &Client, path: &str) -> String {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Creates suspended jobs `from..to` (no pods: the operator's cost of holding them).
async fn create_suspended(ns: &TestNamespace, from: usize, to: usize) {
    let mut spec = unschedulable_job();
    spec["suspend"] = json!(true);
    let jobs = ns.jobs();
    let creates = futures::stream::iter(from..to)
        .map(|i| {
            let dt = distributed_training(&format!("idle-{i:04}"), &ns.name, spec.clone());
            let jobs = jobs.clone();
            async move { jobs.create(&PostParams::default(), &dt).await.map(|_| ()) }
        })
        .buffer_unordered(8);
    let results: Vec<_> = creates.collect().await;
    assert!(results.iter().all(Result::is_ok), "creating suspended jobs");
}

struct Idle {
    rss_bytes: f64,
    cpu_per_second: f64,
    reconciles_per_minute: f64,
}

/// After the jobs settled (every one Suspended), one minute of the leader's own numbers.
async fn idle_operator(client: &Client, count: usize) -> Idle {
    let jobs: Api<ferrotrain_api::crd::DistributedTraining> = Api::all(client.clone());
    wait_for(
        &format!("{count} jobs Suspended"),
        Duration::from_secs(600),
        || async {
            let list = jobs
                .list(&ListParams::default().labels(""))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let n = list
                .iter()
                .filter(|d| {
                    d.status
                        .as_ref()
                        .is_some_and(|s| s.phase == ferrotrain_api::crd::Phase::Suspended)
                })
                .count();
            ((n >= count).then_some(()), format!("{n} suspended"))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let first = operator_metrics(client).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let second = operator_metrics(client).await;
    let seconds = started.elapsed().as_secs_f64();
    let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    let reconciles = |m: &BTreeMap<String, f64>| {
        get(m, "ferrotrain_operator_reconciles_total{result=\"Ok\"}")
            + get(m, "ferrotrain_operator_reconciles_total{result=\"Error\"}")
    };
    Idle {
        rss_bytes: get(&second, "ferrotrain_operator_process_resident_memory_bytes"),
        cpu_per_second: (get(&second, "ferrotrain_operator_process_cpu_seconds")
            - get(&first, "ferrotrain_operator_process_cpu_seconds"))
            / seconds,
        reconciles_per_minute: (reconciles(&second) - reconciles(&first)) / seconds * 60.0,
    }
}

/// The leader's /metrics (the Lease names its pod), through the API server's pod proxy.
async fn operator_metrics(client: &Client) -> BTreeMap<String, f64> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let holder = leases
        .get(LEASE)
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
        .expect("the operator's Lease names its leader");
    let text = metrics_text(
        client,
        &format!("/api/v1/namespaces/{OPERATOR_NS}/pods/{holder}:8080/proxy/metrics"),
    )
    .await;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}
