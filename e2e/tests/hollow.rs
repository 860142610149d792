//! Hollow nodes (`ferrotrain_e2e::hollow`, what bench/operator-fleet.sh runs at 1,000 nodes)
//! at a small scale, so that the simulator does not rot: 20 simulated GPU nodes on the real API
//! server and scheduler, ten GPU gangs placed on them by the scheduler and run by the operator,
//! their progress served by the simulator at the pods' loopback IPs; a run that finishes, a
//! pod told to fail, a pod deleted and replaced; then the nodes go.
//!
//! The operator runs in this process (its code at this tree), scoped to the test's namespace:
//! the pods' IPs are this machine's loopback, which the installed operator's pod cannot reach.
//! The installed operator is fenced off the namespace by an admission policy refusing its
//! writes there, so the two never act on the same job.

use std::time::{Duration, Instant};

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::fleet::{access, jobs};
use ferrotrain_e2e::hollow::{self, Config, HOLLOW_LABEL, Simulator};
use ferrotrain_e2e::{TestNamespace, WAIT, pods_of, wait_phase, wait_status};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const NODES: usize = 20;
const STEADY: usize = 8;

#[tokio::test]
#[ignore = "needs a cluster with the operator's CRD (scripts/e2e.sh)"]
async fn hollow_nodes_run_gpu_gangs_through_the_operator_and_are_removed() {
    let started = Instant::now();
    let ns = TestNamespace::create("hollow").await;
    let client = ns.client.clone();
    let _fence = Fence::install(&client, &ns.name).await;
    let sim_name = ns.name.replace("ft-e2e-", "hw-");
    let mut config = Config::named(&sim_name);
    config.nodes = NODES;
    let mut sim = Simulator::start(client.clone(), config)
        .await
        .expect("the hollow nodes start");
    let operator = Operator::start(client.clone(), &ns.name).await;

    check_nodes(&client, &sim_name).await;
    let spec =
        |pods, gpus, rate, total| jobs::hollow_job(&sim_name, pods, gpus, rate, total, json!({}));
    for i in 0..STEADY {
        ns.create_job(&format!("steady-{i}"), spec(4, 2, 5.0, 1_000_000))
            .await;
    }
    ns.create_job("done", spec(2, 1, 10.0, 30)).await;
    ns.create_job("broken", spec(2, 1, 5.0, 1_000_000)).await;

    // Progress reached the status through the simulator's /progress at rank 0's pod IP.
    for i in 0..STEADY {
        wait_status(
            &ns.jobs(),
            &format!("steady-{i}"),
            "Running with steps",
            WAIT,
            |s| s.phase == Phase::Running && s.progress.as_ref().is_some_and(|p| p.report.step > 0),
        )
        .await;
    }
    check_pods_on_hollow_nodes(&ns, &sim).await;

    // A run that reaches its total: every pod exits 0, rank 0 with its final report.
    let done = wait_phase(&ns.jobs(), "done", Phase::Succeeded, WAIT).await;
    let report = done.progress.expect("the final report").report;
    assert_eq!((report.step, done.restarts), (30, 0), "{report:?}");

    // A pod told to exit 3 (invalid data: permanent): the job fails, naming it.
    wait_phase(&ns.jobs(), "broken", Phase::Running, WAIT).await;
    tell_exit(
        &ns.pods(),
        "broken-0-1",
        "3:Error:hollow: the training data is missing",
    )
    .await;
    let failed = wait_phase(&ns.jobs(), "broken", Phase::Failed, WAIT).await;
    let failure = failed.last_failure.expect("lastFailure");
    assert_eq!(
        (failure.exit_code, failed.restarts),
        (Some(3), 0),
        "{failure:?}"
    );
    assert!(
        failure.message.contains("training data is missing"),
        "{failure:?}"
    );

    replaced_pod_steps_again(&ns, &sim).await;

    operator.stop().await;
    let deleted = sim.shutdown().await;
    assert_eq!(deleted, NODES, "every hollow node deleted");
    let nodes: Api<Node> = Api::all(client.clone());
    let left = nodes
        .list_metadata(&ListParams::default().labels(&format!("{HOLLOW_LABEL}={sim_name}")))
        .await
        .expect("listing nodes")
        .items
        .len();
    assert_eq!(left, 0, "hollow nodes left behind");
    eprintln!("hollow-node test: {:.1} s", started.elapsed().as_secs_f64());
}

/// Every node registered with its GPUs, Ready and tainted.
async fn check_nodes(client: &Client, sim: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default().labels(&format!("{HOLLOW_LABEL}={sim}")))
        .await
        .expect("listing nodes")
        .items;
    assert_eq!(list.len(), NODES);
    for node in list {
        let status = node.status.clone().unwrap_or_default();
        let gpus = status
            .allocatable
            .unwrap_or_default()
            .get("nvidia.com/gpu")
            .map(|q| q.0.clone());
        assert_eq!(gpus.as_deref(), Some("8"), "{:?}", node.metadata.name);
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        assert!(ready, "{:?} not Ready", node.metadata.name);
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints
                .iter()
                .any(|t| t.key == HOLLOW_LABEL && t.effect == "NoSchedule")
        );
    }
}

/// The real scheduler placed every pod on a hollow node; each runs with a loopback pod IP, and
/// the simulator's rank 0s were polled.
async fn check_pods_on_hollow_nodes(ns: &TestNamespace, sim: &Simulator) {
    let nodes = sim.node_names();
    let pods = ns
        .pods()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items;
    assert!(pods.len() >= STEADY * 4, "{} pods", pods.len());
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(nodes.contains(&node), "{name} on {node}");
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        assert!(ip.starts_with("127.43."), "{name}: pod IP {ip}");
    }
    let snapshot = sim.snapshot();
    assert!(
        snapshot.counters["polls"] >= STEADY as u64,
        "{:?}",
        snapshot.counters
    );
    assert_eq!(
        snapshot.counters["bindErrors"], 0,
        "{:?}",
        snapshot.counters
    );
}

/// Deleting rank 1's pod of a gang: the simulator stops and deletes it as a kubelet does, the
/// operator replaces it alone, and the gang steps again in its next round.
async fn replaced_pod_steps_again(ns: &TestNamespace, sim: &Simulator) {
    let pods = ns.pods();
    let old = pods
        .get("steady-0-0-1")
        .await
        .expect("the pod")
        .metadata
        .uid;
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    pods.delete("steady-0-0-1", &DeleteParams::default())
        .await
        .expect("deleting the pod");
    let key = format!("{}/steady-0", ns.name);
    jobs::poll(
        "steady-0 stepping again with a new rank 1",
        WAIT,
        Duration::from_millis(200),
        || async {
            let new = pods_of(&pods, "steady-0")
                .await
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some("steady-0-0-1"));
            let replaced = new
                .and_then(|p| p.metadata.uid)
                .is_some_and(|uid| Some(uid) != old);
            let view = sim.snapshot().jobs.get(&key).cloned();
            let stepping = view
                .as_ref()
                .and_then(|v| v.stepping_since_ms)
                .is_some_and(|ms| ms > deleted_at.as_millisecond());
            (
                (replaced && stepping).then_some(()),
                format!("replaced {replaced}, {view:?}"),
            )
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let status = wait_status(&ns.jobs(), "steady-0", "round 1, Running", WAIT, |s| {
        s.phase == Phase::Running && s.round == 1
    })
    .await;
    assert_eq!(status.attempt, 0, "replaced alone, not a new attempt");
}

async fn tell_exit(pods: &Api<Pod>, pod: &str, exit: &str) {
    let body = json!({"metadata": {"annotations": {hollow::ANNOTATION_EXIT: exit}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap_or_else(|e| panic!("annotating {pod}: {e}"));
}

/// The operator at this tree, in this process, acting on one namespace.
struct Operator {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    async fn start(client: Client, ns: &str) -> Operator {
        use clap::Parser;
        use ferrotrain_operator::config::{Cli, Command};
        let cli = Cli::try_parse_from([
            "ferrotrain-operator",
            "run",
            "--namespace",
            ns,
            "--leader-election",
            "false",
            "--http-addr",
            "127.0.0.1:0",
            "--progress-interval-seconds",
            "2",
            "--progress-write-interval-seconds",
            "4",
        ])
        .expect("operator flags");
        let Command::Run(args) = cli.command else {
            unreachable!("run")
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) =
                ferrotrain_operator::app::run(client.into(), *args, listener, shutdown).await
            {
                eprintln!("the in-process operator stopped: {e}");
            }
        });
        Operator { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
    }
}

/// A ValidatingAdmissionPolicy that refuses every write of the installed operator's
/// ServiceAccount in the test's namespace; removed when dropped.
struct Fence {
    name: Option<String>,
}

impl Fence {
    async fn install(client: &Client, ns: &str) -> Fence {
        let Some(user) = installed_operator_user(client).await else {
            return Fence { name: None };
        };
        let name = format!("{ns}-fence");
        let rules = json!([{
            "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["*/*"]
        }]);
        access::refuse(
            client,
            &name,
            rules,
            &format!("request.userInfo.username != '{user}'"),
            "the hollow-node test runs its own operator in this namespace",
            json!({"kubernetes.io/metadata.name": ns}),
        )
        .await
        .expect("fencing the installed operator off the namespace");
        // The policy takes effect once the API server has loaded it: a second or so.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Fence { name: Some(name) }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else {
            return;
        };
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok(client) = Client::try_default().await {
                    access::unrefuse(&client, &name).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// `system:serviceaccount:<ns>:<sa>` of the installed operator's pods, if any run.
async fn installed_operator_user(client: &Client) -> Option<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=ferrotrain-operator"))
        .await
        .ok()?;
    let pod = list.items.into_iter().next()?;
    let ns = pod.metadata.namespace?;
    let sa = pod.spec?.service_account_name?;
    Some(format!("system:serviceaccount:{ns}:{sa}"))
}
