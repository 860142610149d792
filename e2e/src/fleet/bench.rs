//! The fleet bench's setting: a namespace, the identities the API server counts requests by,
//! the hollow nodes and two operators as processes of their own, the watches, and a teardown
//! that removes all of it (also from `Drop`, when a phase failed).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::json;

use super::access;
use super::procs::Proc;
use super::track::Tracker;
use crate::hollow::nodes;

/// The bench's knobs.
#[derive(Clone, Debug)]
pub struct Settings {
    pub nodes: usize,
    pub gpus_per_node: u32,
    pub running_jobs: usize,
    pub pods_per_job: i32,
    pub gpus_per_pod: i32,
    pub suspended_jobs: usize,
    pub latency_jobs: usize,
    pub window: Duration,
    pub drain_nodes: usize,
    /// Nodes that report NotReady at once (0: that phase is skipped).
    pub lost_nodes: usize,
    pub renew_seconds: u64,
    pub create_concurrency: usize,
    pub operator_bin: PathBuf,
    pub hollow_bin: PathBuf,
    /// Extra flags for both operators.
    pub operator_flags: Vec<String>,
}

/// The Lease the bench's two operators elect a leader on (in the bench's namespace).
pub const LEASE: &str = "ft-fleet";

/// One operator process.
pub struct Operator {
    pub identity: String,
    pub proc: Proc,
    pub metrics: SocketAddr,
}

/// Everything a run holds.
pub struct Bench {
    pub client: Client,
    pub settings: Settings,
    /// Prefix of every cluster-scoped object (FlowSchemas, roles, policies) and the simulator's
    /// name; also the namespace.
    pub prefix: String,
    pub ns: String,
    pub dir: PathBuf,
    pub operator_kubeconfig: PathBuf,
    pub hollow_kubeconfig: PathBuf,
    pub tracker: Tracker,
    pub sim: Option<Proc>,
    pub sim_control: Option<SocketAddr>,
    pub operators: Vec<Operator>,
    pub started: Instant,
    torn_down: bool,
}

impl Bench {
    /// The namespace, identities, FlowSchemas and the refusing admission policy.
    pub async fn set_up(settings: Settings) -> Result<Bench, String> {
        let client = Client::try_default()
            .await
            .map_err(|e| format!("no cluster (set KUBECONFIG): {e}"))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("time")
            .subsec_nanos();
        let prefix = format!("ft-fleet-{:05x}", nanos & 0xfffff);
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": prefix, "labels": {"ferrotrain.dev/bench": "fleet"}}
        }))
        .expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| format!("creating namespace {prefix}: {e}"))?;
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let tracker = Tracker::start(&client, &prefix, LEASE);
        let mut bench = Bench {
            client,
            settings,
            ns: prefix.clone(),
            prefix,
            dir,
            operator_kubeconfig: PathBuf::new(),
            hollow_kubeconfig: PathBuf::new(),
            tracker,
            sim: None,
            sim_control: None,
            operators: Vec::new(),
            started: Instant::now(),
            torn_down: false,
        };
        bench.identities().await?;
        Ok(bench)
    }

    async fn identities(&mut self) -> Result<(), String> {
        let (client, ns, p) = (&self.client, self.ns.clone(), self.prefix.clone());
        for role in ["ferrotrain", "ferrotrain-nodes"] {
            access::cluster_roles(client).get(role).await.map_err(|e| {
                format!("ClusterRole {role} (the chart's RBAC) is missing: run scripts/e2e.sh --setup-only first ({e})")
            })?;
        }
        self.operator_kubeconfig =
            access::service_account_kubeconfig(client, &ns, "operator", &self.dir).await?;
        self.hollow_kubeconfig =
            access::service_account_kubeconfig(client, &ns, "hollow", &self.dir).await?;
        access::bind_cluster_role(
            client,
            &format!("{p}-operator"),
            "ferrotrain",
            &ns,
            "operator",
        )
        .await?;
        access::bind_cluster_role(
            client,
            &format!("{p}-operator-nodes"),
            "ferrotrain-nodes",
            &ns,
            "operator",
        )
        .await?;
        // The leader election's Lease lives in the bench's namespace.
        let leases = json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"]}]);
        access::cluster_role(client, &format!("{p}-leases"), leases).await?;
        access::bind_cluster_role(
            client,
            &format!("{p}-leases"),
            &format!("{p}-leases"),
            &ns,
            "operator",
        )
        .await?;
        access::cluster_role(client, &format!("{p}-hollow"), access::hollow_rules()).await?;
        access::bind_cluster_role(
            client,
            &format!("{p}-hollow"),
            &format!("{p}-hollow"),
            &ns,
            "hollow",
        )
        .await?;
        let mut schemas = access::operator_flow_schemas(&format!("{p}-op"), &ns, "operator");
        schemas.push(access::flow_schema(
            &format!("{p}-hw-writes"),
            100,
            &ns,
            "hollow",
            &access::WRITES,
            &["*"],
            &["*"],
        ));
        schemas.push(access::flow_schema(
            &format!("{p}-hw-reads"),
            120,
            &ns,
            "hollow",
            &["*"],
            &["*"],
            &["*"],
        ));
        for schema in schemas {
            access::create_fresh(&access::flow_schemas(client), schema).await?;
        }
        // The isolation phase's job whose pods admission refuses.
        access::refuse(
            client,
            &format!("{p}-refuse"),
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]),
            "!has(object.metadata.labels) || !('ferrotrain.dev/job' in object.metadata.labels) \
             || !object.metadata.labels['ferrotrain.dev/job'].startsWith('refused')",
            "refused by the fleet bench's admission policy",
            json!({"kubernetes.io/metadata.name": ns}),
        )
        .await
    }

    /// Starts the hollow nodes as a process of their own and waits for them.
    pub fn start_hollow_nodes(&mut self) -> Result<f64, String> {
        let s = &self.settings;
        let args: Vec<String> = [
            "--name",
            &self.prefix,
            "--nodes",
            &s.nodes.to_string(),
            "--gpus",
            &s.gpus_per_node.to_string(),
            "--renew-seconds",
            &s.renew_seconds.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let env = [("KUBECONFIG", self.hollow_kubeconfig.display().to_string())];
        let log = self.dir.join("hollow-nodes.log");
        let mut sim = Proc::spawn("hollow-nodes", &s.hollow_bin, &args, &env, &log)?;
        let limit = Duration::from_secs(600 + s.nodes as u64);
        let registered = sim.wait_line("hollow-nodes:", limit)?;
        let seconds: f64 = registered
            .split(" in ")
            .nth(1)
            .and_then(|r| r.trim_end_matches(" s").parse().ok())
            .unwrap_or(f64::NAN);
        let control = sim.wait_line("hollow-nodes: control http://", Duration::from_secs(10))?;
        self.sim_control = Some(control.parse().map_err(|e| format!("{control}: {e}"))?);
        self.sim = Some(sim);
        Ok(seconds)
    }

    /// Starts an operator (leader election on [`LEASE`]) as `identity`.
    pub fn start_operator(&mut self, identity: &str) -> Result<(), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let metrics: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut args: Vec<String> = [
            "run",
            "--leader-election",
            "true",
            "--lease-name",
            LEASE,
            "--lease-namespace",
            &self.ns,
            "--identity",
            identity,
            "--http-addr",
            &metrics.to_string(),
            "--trainer-image",
            "ferrotrain/trainer:hollow",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(self.settings.operator_flags.iter().cloned());
        let env = [("KUBECONFIG", self.operator_kubeconfig.display().to_string())];
        let log = self.dir.join(format!("{identity}.log"));
        let proc = Proc::spawn(identity, &self.settings.operator_bin, &args, &env, &log)?;
        self.operators.push(Operator {
            identity: identity.to_string(),
            proc,
            metrics,
        });
        Ok(())
    }

    pub fn operator(&mut self, identity: &str) -> Option<&mut Operator> {
        self.operators.iter_mut().find(|o| o.identity == identity)
    }

    /// Stops the operators and the hollow nodes and deletes everything the bench created.
    pub async fn tear_down(&mut self) {
        self.torn_down = true;
        for op in &mut self.operators {
            op.proc.stop(Duration::from_secs(20));
        }
        if let Some(mut sim) = self.sim.take() {
            // Its pods first (no kubelet would finish their deletion), then its nodes.
            force_delete_pods(&self.client, &self.ns).await;
            sim.stop(Duration::from_secs(180));
        }
        remove(&self.client, &self.prefix).await;
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        for op in &mut self.operators {
            op.proc.stop(Duration::from_secs(5));
        }
        if let Some(mut sim) = self.sim.take() {
            sim.stop(Duration::from_secs(5));
        }
        let prefix = self.prefix.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            runtime.block_on(async {
                if let Ok(client) = Client::try_default().await {
                    force_delete_pods(&client, &prefix).await;
                    remove(&client, &prefix).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Deletes the namespace's pods at once (grace 0).
async fn force_delete_pods(client: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = pods
        .delete_collection(&params, &ListParams::default())
        .await;
}

/// The namespace, the hollow nodes and every cluster-scoped object named `<prefix>-...`.
async fn remove(client: &Client, prefix: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(prefix, &DeleteParams::background())
        .await;
    let deleted = nodes::delete_all(client, prefix, Duration::from_secs(180)).await;
    if deleted > 0 {
        eprintln!("fleet: deleted {deleted} hollow nodes left behind");
    }
    access::unrefuse(client, &format!("{prefix}-refuse")).await;
    let kinds: [Api<DynamicObject>; 3] = [
        access::flow_schemas(client),
        access::cluster_role_bindings(client),
        access::cluster_roles(client),
    ];
    for api in kinds {
        let listed = api
            .list_metadata(&ListParams::default().labels("ferrotrain.dev/bench=fleet"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for object in listed {
            let name = object.metadata.name.unwrap_or_default();
            if name.starts_with(prefix) {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
}
