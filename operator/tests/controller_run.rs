//! The operator's smoke test: the real `app::run` (start-up checks, leader election, watches,
//! reflectors, readiness, the applier, the reconcile pipeline, status and event writes)
//! against an in-process fake API server. The mocked-service tests check each call; these
//! check that the pieces are wired: a readiness wait that never woke passed 200 of those.

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use clap::Parser;
use ferrotrain_api::Progress;
use ferrotrain_api::crd::DistributedTraining;
use ferrotrain_operator::app;
use ferrotrain_operator::config::{Cli, Command};
use ferrotrain_operator::labels;
use http::Method;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "ml";
const JOB: &str = "mt";
const PODS: &str = "api/v1/pods";
const JOBS: &str = "apis/ferrotrain.dev/v1alpha1/distributedtrainings";
const LEASES: &str = "apis/coordination.k8s.io/v1/leases";
const WAIT: Duration = Duration::from_secs(20);

/// One operator process, in-process.
struct Operator {
    task: JoinHandle<Result<(), app::Error>>,
    stop: Option<oneshot::Sender<()>>,
    http_port: u16,
}

impl Operator {
    async fn start(fake: &FakeApiServer, flags: &[&str]) -> Operator {
        let mut argv = vec![
            "ferrotrain-operator",
            "run",
            "--progress-interval-seconds",
            "1",
        ];
        argv.extend_from_slice(flags);
        let Command::Run(args) = Cli::try_parse_from(argv).expect("flags").command else {
            panic!("run");
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(app::run(fake.client().into(), *args, listener, shutdown));
        Operator {
            task,
            stop: Some(stop),
            http_port,
        }
    }

    /// SIGTERM, as the kubelet sends it; the run must end cleanly and soon.
    async fn terminate(mut self) -> Result<(), app::Error> {
        let _ = self.stop.take().expect("running").send(());
        tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .expect("the operator stops within 15 s of SIGTERM")
            .expect("the operator task does not panic")
    }

    async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http_port, path).await
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

/// Polls `check` every 100 ms until it returns Some, failing after `timeout`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_ready(op: &Operator) {
    wait_for("/readyz to turn 200", WAIT, || async {
        (op.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
}

fn ready_node(fake: &FakeApiServer, name: &str) {
    fake.insert(
        "api/v1/nodes",
        None,
        json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }),
    );
}

async fn submit_job(fake: &FakeApiServer) {
    let dt: DistributedTraining = serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": JOB, "namespace": NS},
        "spec": {
            "replicas": 2,
            "trainer": {"task": "copy", "maxSteps": 1000},
            "restartPolicy": {"maxRestarts": 3, "backoffSeconds": 1},
        },
    }))
    .unwrap();
    let api: Api<DistributedTraining> = Api::namespaced(fake.client(), NS);
    api.create(&PostParams::default(), &dt).await.unwrap();
}

fn pod_names(fake: &FakeApiServer) -> Vec<String> {
    fake.list(PODS)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn job_status(fake: &FakeApiServer) -> Value {
    fake.get(JOBS, NS, JOB)
        .map(|j| j["status"].clone())
        .unwrap_or(Value::Null)
}

/// Waits until every pod of `want` exists (a failed pod of an older attempt may stay for its
/// logs).
async fn wait_pods(fake: &FakeApiServer, want: &[&str]) {
    let deadline = Instant::now() + WAIT;
    while !want.iter().all(|w| pod_names(fake).iter().any(|p| p == w)) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for pods {want:?}; pods {:?}, job status {}",
            pod_names(fake),
            job_status(fake)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_phase(fake: &FakeApiServer, phase: &str) -> Value {
    wait_for(&format!("phase {phase}"), WAIT, || async {
        let status = job_status(fake);
        (status["phase"] == phase).then_some(status)
    })
    .await
}

fn container_status(state: Value) -> Value {
    json!([{
        "name": labels::TRAINER_CONTAINER, "image": "ferrotrain/trainer:test",
        "imageID": "", "ready": true, "restartCount": 0, "state": state,
    }])
}

/// The kubelet: schedules the pod on `node` and starts its trainer container.
fn kubelet_runs(fake: &FakeApiServer, pod: &str, node: &str) {
    fake.update(PODS, NS, pod, |p| {
        p["spec"]["nodeName"] = node.into();
        p["status"] = json!({
            "phase": "Running", "podIP": "127.0.0.1",
            "containerStatuses": container_status(json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})),
        });
    });
}

/// The kubelet: the trainer container of `pod` exited with `code`.
fn kubelet_exits(fake: &FakeApiServer, pod: &str, code: i32) {
    fake.update(PODS, NS, pod, |p| {
        p["status"]["phase"] = "Failed".into();
        p["status"]["containerStatuses"] = container_status(json!({"terminated": {
            "exitCode": code, "reason": "Error", "message": "rank 1: boom",
            "finishedAt": "2026-01-01T00:01:00Z",
        }}));
    });
}

/// Rank 0's /progress, served on 127.0.0.1 (the pods' IP in these tests).
async fn progress_server(step: u64) -> (u16, JoinHandle<()>) {
    let report = Progress {
        step,
        total_steps: 1000,
        steps_per_second: Some(4.0),
        loss: Some(3.25),
        world_size: 2,
        ..Progress::default()
    };
    let body = serde_json::to_string(&report).unwrap();
    let app = axum::Router::new().route(
        "/progress",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    // Not in the jobs' default portRange (41000-42999): the operator refuses a job whose
    // range holds the progress port (InvalidSpec), and the kernel may draw one from it.
    let listener = loop {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        if !(41000..=42999).contains(&l.local_addr().unwrap().port()) {
            break l;
        }
    };
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_gets_its_gang_progress_in_status_and_a_new_attempt_when_a_pod_fails() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    let (port, progress) = progress_server(120).await;
    let port = port.to_string();
    let op = Operator::start(
        &fake,
        &[
            "--leader-election",
            "false",
            "--trainer-metrics-port",
            &port,
        ],
    )
    .await;
    wait_ready(&op).await;

    submit_job(&fake).await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    for (collection, name) in [
        ("api/v1/services", JOB.to_string()),
        ("api/v1/configmaps", labels::config_map_name(JOB)),
        ("api/v1/secrets", labels::secret_name(JOB)),
    ] {
        assert!(
            fake.get(collection, NS, &name).is_some(),
            "{collection} {name}"
        );
    }
    let status = wait_phase(&fake, "Starting").await;
    assert_eq!(status["attempt"], 0, "{status}");

    for pod in ["mt-0-0", "mt-0-1"] {
        kubelet_runs(&fake, pod, "node-a");
    }
    let status = wait_for("rank 0's progress in status", WAIT, || async {
        let s = job_status(&fake);
        (s["phase"] == "Running" && s["progress"]["step"] == 120).then_some(s)
    })
    .await;
    assert_eq!(status["progress"]["stepsPerSecond"], 4.0, "{status}");
    let requests = fake.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.method == "POST" && r.path.ends_with("/namespaces/ml/events")),
        "events are published"
    );
    let status_writes: Vec<_> = requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/mt/status"))
        .collect();
    assert!(!status_writes.is_empty());
    for write in status_writes {
        assert!(
            write.query.contains("fieldManager=ferrotrain-operator"),
            "{write:?}"
        );
        assert_eq!(
            write.body["apiVersion"], "ferrotrain.dev/v1alpha1",
            "{write:?}"
        );
        assert_eq!(write.body["kind"], "DistributedTraining", "{write:?}");
    }

    kubelet_exits(&fake, "mt-0-1", 1);
    wait_pods(&fake, &["mt-1-0", "mt-1-1"]).await;
    assert!(
        !pod_names(&fake).contains(&"mt-0-0".to_string()),
        "the failed attempt's running pod is deleted"
    );
    let status = job_status(&fake);
    assert_eq!(
        (status["attempt"].clone(), status["restarts"].clone()),
        (json!(1), json!(1)),
        "{status}"
    );
    assert_eq!(status["lastFailure"]["pod"], "mt-0-1", "{status}");
    assert_eq!(status["lastFailure"]["node"], "node-a", "{status}");
    // The ledger: attempt 0 ran, stepped, failed on node-a; attempt 1 has started.
    let attempts = &status["recovery"]["attempts"];
    assert_eq!(attempts[0]["attempt"], 0, "{status}");
    assert_eq!(attempts[0]["lastStep"], 120, "{status}");
    assert_eq!(attempts[0]["end"]["cause"], "Failure", "{status}");
    assert_eq!(attempts[0]["end"]["exitCode"], 1, "{status}");
    assert_eq!(attempts[0]["end"]["node"], "node-a", "{status}");
    assert!(attempts[0]["runningAt"].is_string(), "{status}");
    assert_eq!(attempts[1]["attempt"], 1, "{status}");
    assert_eq!(status["recovery"]["endsByCause"]["Failure"], 1, "{status}");

    let (code, metrics) = op.get("/metrics").await;
    assert_eq!(code, 200);
    for family in [
        "ferrotrain_operator_gang_restarts_total",
        "ferrotrain_operator_failure_detect_seconds_count 1",
        "ferrotrain_operator_job_lost_steps{namespace=\"ml\",job=\"mt\"}",
    ] {
        assert!(metrics.contains(family), "{family} in {metrics}");
    }
    op.terminate().await.expect("a clean stop");
    progress.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_failing_watch_and_nothing_is_decided_until_it_syncs() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    // The pod watch (it lists with the operator's label selector) fails; the start-up check
    // (a plain list) passes.
    fake.fail(Method::GET, "labelSelector=app.kubernetes.io", 500, None);
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    submit_job(&fake).await;
    let deadline = Instant::now() + WAIT;
    let why = loop {
        let (code, body) = op.get("/readyz").await;
        if code == 503 && body.contains("watch pods failing") {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never named the failing watch: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    assert!(why.contains("injected 500"), "{why}");
    assert!(
        pod_names(&fake).is_empty(),
        "no pods from an unsynced pod cache"
    );

    fake.heal();
    wait_ready(&op).await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    op.terminate().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_mistakes_stop_the_operator_with_the_fix() {
    let cases: [(&str, &[&str], &[&str]); 3] = [
        (
            "distributedtrainings",
            &["--leader-election", "false"],
            &["CRD", "kubectl apply -f crds/"],
        ),
        (
            "/api/v1/nodes",
            &["--leader-election", "false"],
            &["RBAC denies list nodes", "rbac.yaml"],
        ),
        (
            "/leases",
            &["--lease-namespace", "ops"],
            &[
                "Lease ops/ferrotrain-operator",
                "leases.coordination.k8s.io",
            ],
        ),
    ];
    for (needle, flags, expected) in cases {
        let fake = FakeApiServer::start().await;
        let code = if needle == "distributedtrainings" {
            404
        } else {
            403
        };
        fake.fail(Method::GET, needle, code, None);
        let mut op = Operator::start(&fake, flags).await;
        let result = tokio::time::timeout(Duration::from_secs(15), &mut op.task)
            .await
            .expect("start-up errors end the run")
            .unwrap();
        let message = result.expect_err("a start-up error").to_string();
        for text in expected {
            assert!(message.contains(text), "{needle}: {message}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_over_when_the_leader_stops_and_releases_the_lease() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    let common = ["--lease-namespace", "ops", "--lease-duration-seconds", "4"];
    let leader = Operator::start(&fake, &[&common[..], &["--identity", "a"]].concat()).await;
    wait_for("a to hold the lease", WAIT, || async {
        let lease = fake.get(LEASES, "ops", "ferrotrain-operator")?;
        (lease["spec"]["holderIdentity"] == "a").then_some(())
    })
    .await;
    let leading = Instant::now();
    let follower = Operator::start(&fake, &[&common[..], &["--identity", "b"]].concat()).await;
    wait_ready(&follower).await;
    wait_ready(&leader).await;

    submit_job(&fake).await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    // The leader renews once per renew period (a fifth of the 4 s duration), not every time
    // it sees the Lease change (its own renewal is a change too).
    let renewals = fake
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.contains("/leases/"))
        .count();
    let periods = (leading.elapsed().as_secs_f64() / 0.8).ceil() as usize;
    assert!(
        renewals <= periods + 2,
        "{renewals} writes of the Lease in {:?} ({periods} renew periods)",
        leading.elapsed()
    );
    let stopped = Instant::now();
    leader.terminate().await.expect("a clean stop");
    let lease = fake.get(LEASES, "ops", "ferrotrain-operator").unwrap();
    assert!(
        lease["spec"]["holderIdentity"].is_null() || lease["spec"]["holderIdentity"] == "b",
        "the stopped leader released the lease: {lease}"
    );
    // The follower watches the Lease: it takes a released one at once, not when the term it
    // last saw ends (4 s here).
    wait_for("b to take the lease", WAIT, || async {
        let lease = fake.get(LEASES, "ops", "ferrotrain-operator")?;
        (lease["spec"]["holderIdentity"] == "b").then_some(())
    })
    .await;
    let takeover = stopped.elapsed();
    assert!(
        takeover < Duration::from_secs(2),
        "took over after {takeover:?}"
    );

    // The new leader acts on the same job, without duplicating its pods.
    for pod in ["mt-0-0", "mt-0-1"] {
        kubelet_runs(&fake, pod, "node-a");
    }
    kubelet_exits(&fake, "mt-0-0", 1);
    wait_pods(&fake, &["mt-1-0", "mt-1-1"]).await;
    let creates = fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/pods"))
        .count();
    assert_eq!(creates, 4, "two pods per attempt, none twice");
    follower.terminate().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_create_the_api_refuses_shows_on_the_job_and_is_retried() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    fake.fail(Method::POST, "/namespaces/ml/pods", 403, None);
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    wait_ready(&op).await;
    submit_job(&fake).await;
    let created = wait_for("Created=False/PodCreateRefused", WAIT, || async {
        let status = job_status(&fake);
        let conditions = status["conditions"].as_array()?.clone();
        conditions
            .into_iter()
            .find(|c| c["type"] == "Created" && c["reason"] == "PodCreateRefused")
    })
    .await;
    assert_eq!(created["status"], "False", "{created}");
    let message = created["message"].as_str().unwrap();
    assert!(
        message.contains("injected 403"),
        "the API's own words: {message}"
    );
    // The status is written before the event is published: wait for it.
    wait_for("a Warning event names the refusal", WAIT, || async {
        fake.requests()
            .iter()
            .any(|r| {
                r.method == "POST"
                    && r.path.ends_with("/events")
                    && r.body["reason"] == "PodCreateRefused"
            })
            .then_some(())
    })
    .await;
    let (_, metrics) = op.get("/metrics").await;
    assert!(
        !metrics.contains("reconcile_errors_total{error=\"create_pod\"} 1"),
        "a refusal is a job condition, not a reconcile error: {metrics}"
    );
    op.terminate().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_service_of_the_jobs_name_is_left_alone_and_named_on_the_job() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    // Someone's own Service, named like the job, with a selector and port of its own.
    let theirs = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": JOB, "namespace": NS, "labels": {"team": "web"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    });
    fake.insert("api/v1/services", Some(NS), theirs);
    let before = fake.get("api/v1/services", NS, JOB).unwrap();
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    wait_ready(&op).await;
    submit_job(&fake).await;
    let created = wait_for("Created=False/NameConflict", WAIT, || async {
        let status = job_status(&fake);
        let conditions = status["conditions"].as_array()?.clone();
        conditions
            .into_iter()
            .find(|c| c["type"] == "Created" && c["reason"] == "NameConflict")
    })
    .await;
    assert_eq!(created["status"], "False", "{created}");
    let message = created["message"].as_str().unwrap();
    assert!(message.contains("Service ml/mt exists"), "{message}");
    assert!(message.contains("rename the job"), "{message}");
    assert_eq!(
        fake.get("api/v1/services", NS, JOB).unwrap(),
        before,
        "their Service is untouched (no apply, no owner reference)"
    );
    assert!(pod_names(&fake).is_empty(), "no pod without its Service");
    // The status is written before the event is published: wait for it.
    wait_for("a Warning event names the conflict", WAIT, || async {
        fake.requests()
            .iter()
            .any(|r| {
                r.method == "POST"
                    && r.path.ends_with("/events")
                    && r.body["reason"] == "NameConflict"
            })
            .then_some(())
    })
    .await;
    op.terminate().await.expect("a clean stop");
}

/// Submits the job `JOB` with these spec fields over the defaults of [`submit_job`].
async fn submit_job_with(fake: &FakeApiServer, extra: Value) {
    let mut spec = json!({
        "replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 1000},
        "restartPolicy": {"maxRestarts": 3, "backoffSeconds": 1},
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let dt: DistributedTraining = serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": JOB, "namespace": NS},
        "spec": spec,
    }))
    .unwrap();
    let api: Api<DistributedTraining> = Api::namespaced(fake.client(), NS);
    api.create(&PostParams::default(), &dt).await.unwrap();
}

/// The index of the first recorded request `method` whose path ends with `suffix`.
fn first_request(fake: &FakeApiServer, method: &str, suffix: &str) -> Option<usize> {
    fake.requests()
        .iter()
        .position(|r| r.method == method && r.path.ends_with(suffix))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_pod_group_per_attempt_is_created_before_its_pods_which_name_it() {
    let fake = FakeApiServer::start().await;
    fake.serve_group("scheduling.k8s.io", &["v1alpha2"]);
    ready_node(&fake, "node-a");
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    wait_ready(&op).await;
    submit_job_with(
        &fake,
        json!({"scheduling": {"topologyKey": "topology.kubernetes.io/zone"}}),
    )
    .await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    const GROUPS: &str = "apis/scheduling.k8s.io/v1alpha2/podgroups";
    let group = fake
        .get(GROUPS, NS, "mt-0")
        .expect("the attempt's PodGroup");
    assert_eq!(group["spec"]["schedulingPolicy"]["gang"]["minCount"], 2);
    assert_eq!(
        group["spec"]["schedulingConstraints"]["topology"][0]["key"],
        "topology.kubernetes.io/zone"
    );
    assert_eq!(
        group["metadata"]["ownerReferences"][0]["kind"],
        "DistributedTraining"
    );
    let created = first_request(&fake, "POST", "/podgroups").unwrap();
    let pod = first_request(&fake, "POST", "/pods").unwrap();
    assert!(created < pod, "the PodGroup comes before its pods");
    for name in ["mt-0-0", "mt-0-1"] {
        let pod = fake.get(PODS, NS, name).unwrap();
        assert_eq!(
            pod["spec"]["schedulingGroup"]["podGroupName"], "mt-0",
            "{pod}"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["name"],
            labels::TRAINER_CONTAINER
        );
    }
    let status = job_status(&fake);
    let gang = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "GangScheduling")
        .cloned()
        .expect("condition GangScheduling");
    assert_eq!(
        (gang["status"].as_str(), gang["reason"].as_str()),
        (Some("True"), Some("NativePodGroup"))
    );
    op.terminate().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_and_volcano_get_their_labels_annotations_and_group_objects() {
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    wait_ready(&op).await;
    // Kueue: the pods carry the queue and the attempt's group; Kueue makes its own Workload.
    submit_job_with(&fake, json!({"queueName": "team-a"})).await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    let pod = fake.get(PODS, NS, "mt-0-1").unwrap();
    assert_eq!(
        pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        "team-a"
    );
    assert_eq!(
        pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"],
        "mt-0"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-name"],
        "mt-0"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"],
        "2"
    );
    assert!(
        first_request(&fake, "POST", "/podgroups").is_none(),
        "no group object for Kueue"
    );

    op.terminate().await.expect("a clean stop");

    // Volcano (a cluster of its own): a PodGroup of its API before the pods, which name it and
    // use its scheduler.
    let fake = FakeApiServer::start().await;
    ready_node(&fake, "node-a");
    let op = Operator::start(&fake, &["--leader-election", "false"]).await;
    wait_ready(&op).await;
    submit_job_with(
        &fake,
        json!({"queueName": "gpu", "scheduling": {"gangScheduler": "volcano"}}),
    )
    .await;
    wait_pods(&fake, &["mt-0-0", "mt-0-1"]).await;
    const VOLCANO: &str = "apis/scheduling.volcano.sh/v1beta1/podgroups";
    let group = fake.get(VOLCANO, NS, "mt-0").expect("the Volcano PodGroup");
    assert_eq!(group["spec"], json!({"minMember": 2, "queue": "gpu"}));
    let pod = fake.get(PODS, NS, "mt-0-0").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
        "mt-0"
    );
    assert_eq!(pod["spec"]["schedulerName"], "volcano");
    op.terminate().await.expect("a clean stop");
}
