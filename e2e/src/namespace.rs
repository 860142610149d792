//! A namespace of its own for each test: created with the test's labels, the API of its jobs
//! and pods, the jobs, claims and events the tests read there; deleted however the test ends,
//! after printing what it held when the test failed (`FERROTRAIN_E2E_KEEP=1` keeps it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::{Value, json};

use crate::jobs::distributed_training;

/// A namespace of its own for one test; dropping it deletes the namespace (and everything in
/// it), also when the test panicked, after printing what the namespace held.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    /// Creates `ft-e2e-<prefix>-<random>`.
    pub async fn create(prefix: &str) -> TestNamespace {
        Self::create_labelled(prefix, json!({})).await
    }

    /// Creates `ft-e2e-<prefix>-<random>` with these labels too (Pod Security admission's
    /// `pod-security.kubernetes.io/enforce`, ...).
    pub async fn create_labelled(prefix: &str, labels: Value) -> TestNamespace {
        let client = Client::try_default()
            .await
            .expect("no cluster: set KUBECONFIG (e2e/kind.sh creates one)");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("ft-e2e-{prefix}-{nanos:x}");
        let mut all = json!({"ferrotrain.dev/e2e": "true"});
        all.as_object_mut()
            .unwrap()
            .extend(labels.as_object().cloned().unwrap_or_default());
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": all}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("creating the test namespace");
        TestNamespace { client, name }
    }

    /// The jobs of this namespace.
    pub fn jobs(&self) -> Api<DistributedTraining> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// The pods of this namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates a job from its spec (see [`copy_job`]).
    pub async fn create_job(&self, name: &str, spec: Value) -> DistributedTraining {
        let dt = distributed_training(name, &self.name, spec);
        self.jobs()
            .create(&PostParams::default(), &dt)
            .await
            .unwrap_or_else(|e| panic!("creating job {name}: {e}"))
    }

    /// The events about object `name` of this namespace: (reason, message).
    pub async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.name);
        let list = events
            .list(&ListParams::default())
            .await
            .expect("listing events");
        list.into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Creates a ReadWriteOnce claim of 1Gi in the default storage class (kind's local-path
    /// provisioner binds it when the first pod using it is scheduled).
    pub async fn create_checkpoint_claim(&self, name: &str) {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}
            }
        }))
        .unwrap();
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &self.name)
            .create(&PostParams::default(), &claim)
            .await
            .unwrap_or_else(|e| panic!("creating claim {name}: {e}"));
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        let failed = std::thread::panicking();
        let keep = std::env::var("FERROTRAIN_E2E_KEEP").is_ok_and(|v| v == "1");
        // The test's runtime may be unwinding (and a current-thread runtime is blocked here):
        // talk to the cluster from a thread with a runtime and a client of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the namespace cleanup");
            runtime.block_on(async move {
                let Ok(client) = Client::try_default().await else {
                    return;
                };
                if failed {
                    let dump = tokio::time::timeout(
                        Duration::from_secs(30),
                        describe_namespace(&client, &name),
                    )
                    .await
                    .unwrap_or_else(|_| "(timed out reading the namespace)".into());
                    eprintln!("==== namespace {name} when the test failed ====\n{dump}");
                }
                if keep {
                    eprintln!("FERROTRAIN_E2E_KEEP=1: namespace {name} kept");
                    return;
                }
                let namespaces: Api<Namespace> = Api::all(client);
                let deleted = tokio::time::timeout(
                    Duration::from_secs(30),
                    namespaces.delete(&name, &DeleteParams::background()),
                )
                .await;
                if !matches!(deleted, Ok(Ok(_))) {
                    eprintln!("could not delete namespace {name}: {deleted:?}");
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Job statuses, pods, events and the tail of each trainer's log: what a failed test leaves
/// to look at.
async fn describe_namespace(client: &Client, ns: &str) -> String {
    let mut out = String::new();
    let jobs: Api<DistributedTraining> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = jobs.list(&ListParams::default()).await {
        for dt in list {
            let status = serde_json::to_string_pretty(&dt.status).unwrap_or_default();
            out += &format!(
                "--- job {}\n{status}\n",
                dt.metadata.name.unwrap_or_default()
            );
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = pods.list(&ListParams::default()).await {
        for pod in list {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            out += &format!("--- pod {name} ({phase})\n");
            let params = LogParams {
                tail_lines: Some(20),
                ..LogParams::default()
            };
            if let Ok(log) = pods.logs(&name, &params).await {
                out += &log;
            }
        }
    }
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    if let Ok(list) = events.list(&ListParams::default()).await {
        out += "--- events\n";
        for e in list {
            out += &format!(
                "{} {} {}: {}\n",
                e.type_.unwrap_or_default(),
                e.involved_object.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            );
        }
    }
    out
}
