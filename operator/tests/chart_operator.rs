//! The operator binary, started exactly as the Helm chart starts it (the rendered Deployment's
//! args and environment), against the in-process fake API server through a kubeconfig, gets
//! the copy example (examples/copy-dt.yaml: its own ReadWriteOnce claim and the job) running
//! as pods, and stops cleanly on SIGTERM, releasing its Lease.
//!
//! With `FERROTRAIN_OPERATOR_IMAGE` set (scripts/test-images.sh sets it), the same test runs
//! the operator image instead of the host binary, the way the chart's pod runs it: uid 65532,
//! read-only root, no capabilities, the kubeconfig mounted, on the host network to reach the
//! fake API server.

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use support::helm::{documents, find, run};
use support::repo_root;

const RELEASE_NAMESPACE: &str = "ferrotrain-system";
const JOBS_NAMESPACE: &str = "default";

/// The operator process; killed if the test ends early, its log printed on failure.
struct OperatorProcess {
    child: Child,
    log: PathBuf,
    /// The container to remove, when the image runs.
    container: Option<String>,
}

impl OperatorProcess {
    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }
}

/// The container's name when the image runs (unique per test run: the port is free).
fn container_name(http_port: u16) -> String {
    format!("ferrotrain-operator-chart-test-{http_port}")
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(name) = &self.container {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
        if std::thread::panicking() {
            eprintln!("operator log:\n{}", self.log());
        }
    }
}

/// The chart's operator container, rendered with `helm template`.
fn chart_container(helm: &std::path::Path) -> Value {
    let rendered = run(
        helm,
        &[
            "template",
            "ferrotrain",
            "charts/ferrotrain",
            "--namespace",
            RELEASE_NAMESPACE,
        ],
    );
    let docs = documents(&rendered);
    let deployment = find(&docs, "Deployment", "ferrotrain");
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn kubeconfig(dir: &std::path::Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n\
         \x20   user: fake\n    namespace: {JOBS_NAMESPACE}\ncurrent-context: fake\n"
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// Starts the binary with the container's args and env. The downward-API variables get the
/// values the kubelet would give; only the listen address moves to a free loopback port.
fn start_as_the_chart_does(
    container: &Value,
    kubeconfig: &PathBuf,
    http_port: u16,
) -> OperatorProcess {
    let dir = kubeconfig.parent().unwrap();
    let log = dir.join("operator.log");
    let image = std::env::var("FERROTRAIN_OPERATOR_IMAGE").ok();
    let mut env = vec![];
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match (name, var["value"].as_str()) {
            ("POD_NAME", _) => "ferrotrain-7d4b9c-abcde".to_string(),
            ("POD_NAMESPACE" | "FERROTRAIN_OPERATOR_POD_NAMESPACE", _) => {
                RELEASE_NAMESPACE.to_string()
            }
            ("FERROTRAIN_OPERATOR_HTTP_ADDR", Some(addr)) => {
                assert_eq!(addr, "0.0.0.0:8080", "the chart's listen address");
                format!("127.0.0.1:{http_port}")
            }
            (_, Some(v)) => v.to_string(),
            (_, None) => panic!("env {name} has no value and no known downward-API source"),
        };
        env.push((name.to_string(), value));
    }
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut command = match &image {
        None => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_ferrotrain-operator"));
            c.env_clear().env("KUBECONFIG", kubeconfig).envs(env);
            c
        }
        Some(image) => {
            let mut c = Command::new("docker");
            c.args(["run", "--rm", "--name", &container_name(http_port)])
                .args(["--network", "host", "--read-only", "--user", "65532:65532"])
                .args(["--cap-drop", "ALL", "--security-opt", "no-new-privileges"])
                .arg("-v")
                .arg(format!(
                    "{}:/etc/ferrotrain/kubeconfig:ro",
                    kubeconfig.display()
                ))
                .args(["-e", "KUBECONFIG=/etc/ferrotrain/kubeconfig"]);
            for (name, value) in &env {
                c.arg("-e").arg(format!("{name}={value}"));
            }
            c.arg(image);
            c
        }
    };
    command.args(&args);
    let file = std::fs::File::create(&log).unwrap();
    let child = command
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .expect("starting ferrotrain-operator");
    let container = image.map(|_| container_name(http_port));
    OperatorProcess {
        child,
        log,
        container,
    }
}

/// The example's documents: the claim and the job.
fn copy_example() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("examples/copy-dt.yaml")).unwrap();
    documents(&text)
}

async fn http_status(port: u16, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.get(9..12)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_started_as_the_chart_starts_it_runs_the_copy_example() {
    let helm = support::helm::helm_or_skip!();
    let container = chart_container(&helm);
    let fake = FakeApiServer::start().await;
    fake.insert(
        "api/v1/nodes",
        None,
        json!({"metadata": {"name": "kind-worker"}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), &fake.url);
    let http_port = free_port();
    let operator = start_as_the_chart_does(&container, &config, http_port);

    // `kubectl apply -f examples/copy-dt.yaml`
    for doc in copy_example() {
        let collection = match doc["kind"].as_str().unwrap() {
            "PersistentVolumeClaim" => "api/v1/persistentvolumeclaims",
            "DistributedTraining" => "apis/ferrotrain.dev/v1alpha1/distributedtrainings",
            other => panic!("unexpected kind {other} in examples/copy-dt.yaml"),
        };
        fake.insert(collection, Some(JOBS_NAMESPACE), doc);
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut placed = false;
    let pods = loop {
        let pods = fake.list("api/v1/pods");
        if pods.len() == 2 {
            break pods;
        }
        // The example is elastic and the fake serves no gang scheduler: node 0's pod comes
        // first (Node0First), the other once it has a node. The scheduler's part:
        if !placed && pods.len() == 1 {
            fake.update("api/v1/pods", JOBS_NAMESPACE, "copy-0-0", |p| {
                p["spec"]["nodeName"] = "kind-worker".into();
            });
            placed = true;
        }
        assert!(
            Instant::now() < deadline,
            "no gang within 30 s; pods {pods:?}, job {:?}",
            fake.get(
                "apis/ferrotrain.dev/v1alpha1/distributedtrainings",
                "default",
                "copy"
            )
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let names: Vec<&str> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["copy-0-0", "copy-0-1"]);
    let trainer_image = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "FERROTRAIN_OPERATOR_TRAINER_IMAGE")
        .unwrap()["value"]
        .clone();
    let claim_mounted = |pod: &Value| {
        pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["persistentVolumeClaim"]["claimName"] == "copy-checkpoints")
    };
    for pod in &pods {
        assert_eq!(
            pod["spec"]["containers"][0]["image"], trainer_image,
            "the chart's trainer image"
        );
    }
    assert!(
        claim_mounted(&pods[0]),
        "rank 0 mounts the ReadWriteOnce claim"
    );
    assert!(!claim_mounted(&pods[1]), "rank 1 does not");

    assert_eq!(http_status(http_port, "/readyz").await, Some(200));
    let lease = fake
        .get(
            "apis/coordination.k8s.io/v1/leases",
            RELEASE_NAMESPACE,
            "ferrotrain-operator",
        )
        .expect("the chart's operator elects a leader in the release namespace");
    assert_eq!(lease["spec"]["holderIdentity"], "ferrotrain-7d4b9c-abcde");

    // The kubelet stops the pod with SIGTERM: a clean exit that releases the Lease.
    let mut operator = operator;
    sigterm(operator.child.id());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = operator.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 15 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "exit {status:?}; log:\n{}",
        operator.log()
    );
    let lease = fake
        .get(
            "apis/coordination.k8s.io/v1/leases",
            RELEASE_NAMESPACE,
            "ferrotrain-operator",
        )
        .unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "released: {lease}"
    );
    let log = operator.log();
    assert!(log.contains("released the lease"), "{log}");
}

/// SIGTERM, as the kubelet sends it.
fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -TERM {pid}");
}
