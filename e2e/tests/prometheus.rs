//! A real Prometheus (Debian's `prometheus`, started here on the host with a config this test
//! writes) scrapes the operator and a running job's rank 0 as the chart's ServiceMonitor and
//! PodMonitor tell the Prometheus Operator to (the same label selectors and port names, the
//! same labels on the series: the job's name as `job`, the operator's labels honoured), loads
//! the chart's alert rules, and answers queries: the job's step rate, the operator's per-job
//! series joined on (namespace, job), and an alert fired by a real refused connection.
//!
//! What this cannot show: Debian builds Prometheus without Kubernetes service discovery, so
//! the test finds the targets itself through the API server with the monitors' selectors and
//! hands them to Prometheus as files (file_sd); the cluster kit enforces no NetworkPolicy
//! (../shared/cluster/README.md), so that the job's policy admits the scraper through
//! `metricsFrom` is checked on the policy object, not on the wire; and it has no kube-proxy, so
//! Prometheus reaches pods by their IPs (as a Prometheus inside a cluster does anyway).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, WAIT, copy_job, wait_for, wait_status};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

/// Where the test's Prometheus listens and keeps its data; killed and removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("FERROTRAIN_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Prometheus {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET `path` of its HTTP API (HTTP/1.0, bounded by a timeout).
    fn get(&self, path: &str) -> Result<String, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| e.to_string())?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{}: {body}", head.lines().next().unwrap_or("")));
        }
        Ok(body.to_string())
    }

    /// The result vector of an instant query.
    fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let body = self.get(&format!("/api/v1/query?query={}", encode(promql)))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        v["data"]["result"]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("no result: {body}"))
    }
}

/// Percent-encoding of a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A free port on 127.0.0.1 (bound and released: Prometheus takes it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The scrape configuration the chart's monitors stand for: the operator (its labels honoured,
/// as the ServiceMonitor says) and rank 0 of the job, each from a file of targets.
fn config(dir: &Path, rules: &Path) -> String {
    let from = |file: &str| json!([{"files": [dir.join(file)], "refresh_interval": "2s"}]);
    json!({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": [rules],
        "scrape_configs": [
            {
                "job_name": "ferrotrain-operator",
                "honor_labels": true,
                "file_sd_configs": from("operator.json")
            },
            {"job_name": "ferrotrain-rank0", "file_sd_configs": from("rank0.json")}
        ]
    })
    .to_string()
}

/// `ip:port` of a pod's container port named `port`.
fn address(pod: &Pod, port: &str) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let number = pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port))
            .map(|p| p.container_port)
    })?;
    Some(format!("{ip}:{number}"))
}

/// The pods of `namespace` that `selector` selects.
async fn selected(ns: &TestNamespace, namespace: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), namespace);
    let params = ListParams::default().labels(selector);
    pods.list(&params).await.unwrap().items
}

/// The targets the monitors select, as file_sd entries: the operator's pods (its metrics
/// Service's selector, port `http`) and the job's rank-0 pod (the PodMonitor's selector, port
/// `metrics`), labelled as the monitors' relabelling labels them.
async fn targets(ns: &TestNamespace) -> (Value, Value) {
    let operator: Vec<Value> = selected(
        ns,
        "ferrotrain-system",
        "app.kubernetes.io/name=ferrotrain-operator",
    )
    .await
    .iter()
    .filter_map(|pod| {
        let labels = json!({"namespace": "ferrotrain-system", "pod": pod.metadata.name});
        Some(json!({"targets": [address(pod, "http")?], "labels": labels}))
    })
    .collect();
    let selector = "app.kubernetes.io/managed-by=ferrotrain-operator,ferrotrain.dev/node-rank=0";
    let rank0: Vec<Value> = selected(ns, &ns.name, selector)
        .await
        .iter()
        .filter_map(|pod| {
            let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
            let labels = json!({
                "namespace": ns.name,
                "pod": pod.metadata.name,
                "job": pod_labels.get("ferrotrain.dev/job")?,
                "attempt": pod_labels.get("ferrotrain.dev/attempt")?,
            });
            Some(json!({"targets": [address(pod, "metrics")?], "labels": labels}))
        })
        .collect();
    (Value::from(operator), Value::from(rank0))
}

fn start_prometheus(job_namespace: &str, operator: &Value, rank0: &Value) -> Prometheus {
    let binary = which("prometheus").expect(
        "no prometheus binary: apt-get install prometheus (scripts/e2e.sh installs it as root)",
    );
    let dir = std::env::temp_dir().join(format!("ferrotrain-e2e-prometheus-{job_namespace}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("operator.json"), operator.to_string()).unwrap();
    std::fs::write(dir.join("rank0.json"), rank0.to_string()).unwrap();
    let rules = repo_root().join("charts/ferrotrain/files/prometheus-rules.yaml");
    let file = dir.join("prometheus.yml");
    // JSON is YAML.
    std::fs::write(&file, config(&dir, &rules)).unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(binary)
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    Prometheus { child, dir, port }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Polls `promql` until `accept` takes its result, within `limit`; panics with the last result
/// and Prometheus' log.
async fn wait_query<T>(
    prometheus: &Prometheus,
    what: &str,
    promql: &str,
    limit: Duration,
    accept: impl Fn(&[Value]) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let last = match prometheus.query(promql) {
            Ok(result) => {
                if let Some(t) = accept(&result) {
                    println!("{what}: {promql} -> {}", Value::from(result));
                    return t;
                }
                Value::from(result).to_string()
            }
            Err(e) => e,
        };
        if tokio::time::Instant::now() > deadline {
            let log = prometheus.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let targets = prometheus.get("/api/v1/targets").unwrap_or_default();
            panic!(
                "{what}: {promql} within {limit:?}; last: {last}\ntargets: {targets}\nprometheus log (newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn value_of(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh), and prometheus"]
async fn prometheus_scrapes_the_operator_and_rank_0_and_its_alerts_fire() {
    let ns = TestNamespace::create("prom").await;
    // Admit the scraper through the job's policy as a cluster that enforces it needs: this
    // Prometheus runs on the host, which reaches pods from the bridge's address.
    let mut spec = copy_job(2, 6000, None);
    spec["networkPolicy"] = json!({"metricsFrom": [{"ipBlock": {"cidr": "10.201.0.1/32"}}]});
    ns.create_job("scraped", spec).await;

    let policies: Api<NetworkPolicy> = Api::namespaced(ns.client.clone(), &ns.name);
    let policy = wait_for("the job's NetworkPolicy", WAIT, || async {
        match policies.get("scraped").await {
            Ok(p) => (Some(p), String::new()),
            Err(e) => (None, e.to_string()),
        }
    })
    .await;
    let ingress = serde_json::to_value(policy.spec.unwrap().ingress.unwrap()).unwrap();
    let admitted = ingress.as_array().unwrap().iter().any(|rule| {
        rule["from"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["ipBlock"]["cidr"] == "10.201.0.1/32")
            && rule["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["port"] == 9090)
    });
    assert!(
        admitted,
        "metricsFrom is not on the progress port: {ingress}"
    );

    let running = wait_status(
        &ns.jobs(),
        "scraped",
        "Running with a step rate",
        TRAIN_WAIT,
        |s| {
            s.phase == Phase::Running
                && s.progress
                    .as_ref()
                    .is_some_and(|p| p.report.steps_per_second.is_some_and(|r| r > 0.0))
        },
    )
    .await;
    let status_rate = running.progress.unwrap().report.steps_per_second.unwrap();

    let (operator, rank0) = targets(&ns).await;
    println!("targets: operator {operator}, rank 0 {rank0}");
    assert_eq!(rank0.as_array().unwrap().len(), 1, "{rank0}");
    assert!(!operator.as_array().unwrap().is_empty(), "{operator}");
    let prometheus = start_prometheus(&ns.name, &operator, &rank0);
    wait_for(
        "prometheus to be ready",
        Duration::from_secs(60),
        || async {
            let ready = prometheus.get("/-/ready");
            (
                ready.is_ok().then_some(()),
                format!("{ready:?}: {}", prometheus.log()),
            )
        },
    )
    .await;

    // The step rate, from rank 0, under the job's own name.
    let selector = format!("namespace=\"{}\", job=\"scraped\"", ns.name);
    let rate = wait_query(
        &prometheus,
        "the job's step rate",
        &format!("ferrotrain_steps_per_second{{{selector}}}"),
        Duration::from_secs(120),
        |r| (r.len() == 1 && value_of(&r[0]) > 0.0).then(|| value_of(&r[0])),
    )
    .await;
    println!("step rate: {rate:.1} steps/s in Prometheus, {status_rate:.1} in the job's status");
    assert!(
        rate > status_rate / 4.0 && rate < status_rate * 4.0,
        "Prometheus {rate}, status {status_rate}"
    );
    let increase = wait_query(
        &prometheus,
        "steps taken in the last 20 s",
        &format!("increase(ferrotrain_step{{{selector}}}[20s])"),
        Duration::from_secs(60),
        |r| (r.len() == 1 && value_of(&r[0]) > 0.0).then(|| value_of(&r[0])),
    )
    .await;
    println!("steps in 20 s: {increase:.0}");

    // The operator's per-job series carry the same (namespace, job): they join.
    wait_query(
        &prometheus,
        "the operator's phase of the job, joined with rank 0's rate",
        &format!(
            "ferrotrain_operator_job_phase{{{selector}, phase=\"Running\"}} == 1 \
             and on(namespace, job) ferrotrain_steps_per_second > 0"
        ),
        Duration::from_secs(120),
        |r| (r.len() == 1).then_some(()),
    )
    .await;
    wait_query(
        &prometheus,
        "the operator's reconciles",
        "sum(ferrotrain_operator_reconciles_total{result=\"Ok\"}) > 0",
        Duration::from_secs(60),
        |r| (!r.is_empty()).then_some(()),
    )
    .await;

    // A connection that is no rank's to the job's rendezvous store fires the alert.
    let pod = ns.pods().get("scraped-0-0").await.unwrap();
    let ip = pod.status.unwrap().pod_ip.unwrap();
    let mut intruder = TcpStream::connect((ip.as_str(), 29500)).expect("the rendezvous store");
    intruder.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(intruder);
    let alert = wait_query(
        &prometheus,
        "the refused-connection alert",
        &format!("ALERTS{{alertname=\"FerrotrainRejectedConnections\", alertstate=\"firing\", {selector}}}"),
        Duration::from_secs(120),
        |r| r.first().map(|a| a["metric"].clone()),
    )
    .await;
    println!("alert: {alert}");

    // Every rule of the chart loaded and evaluates on the real series.
    let rules = prometheus.get("/api/v1/rules").unwrap();
    let rules: Value = serde_json::from_str(&rules).unwrap();
    let health: Vec<(String, String)> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap_or("").to_string();
            (field("name"), field("health"))
        })
        .collect();
    println!("rules: {health:?}");
    assert_eq!(health.len(), 8, "{health:?}");
    assert!(health.iter().all(|(_, h)| h == "ok"), "{health:?}");
}
