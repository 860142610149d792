//! End-to-end tests against the cluster $KUBECONFIG points at, with the operator installed
//! (e2e/kind.sh sets one up). Ignored by default: run them with
//!   cargo test -p ferrotrain-operator --test e2e -- --ignored --test-threads 2
//!
//! Each test works in a namespace of its own and deletes it at the end, pass or fail. Every
//! wait is bounded. Images: $FERROTRAIN_E2E_IMAGE (default `ferrotrain/trainer:e2e`, which
//! kind.sh builds and loads); it must have `sh` (the gang-mechanics tests run shell commands in
//! it, so they do not depend on the trainer) and `ferrotrain` (the progress test trains).

use std::future::Future;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, Phase};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(300);

fn image() -> String {
    std::env::var("FERROTRAIN_E2E_IMAGE").unwrap_or_else(|_| "ferrotrain/trainer:e2e".into())
}

/// Runs `body` in a fresh namespace and deletes the namespace afterwards, even on panic.
async fn in_namespace<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = Client::try_default()
        .await
        .expect("no cluster: set KUBECONFIG (e2e/kind.sh creates one)");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let ns = format!("ft-e2e-{prefix}-{nanos:x}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": ns, "labels": {"ferrotrain.dev/e2e": "true"}}}),
            )
            .unwrap(),
        )
        .await
        .expect("creating the test namespace");
    let outcome = std::panic::AssertUnwindSafe(body(client.clone(), ns.clone()))
        .catch_unwind()
        .await;
    let _ = namespaces.delete(&ns, &DeleteParams::foreground()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Polls `check` every second until it returns Some, or panics after `limit` with `what` and
/// the last observation.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = (Option<T>, String)>,
{
    let started = Instant::now();
    loop {
        let (found, seen) = check().await;
        if let Some(v) = found {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn job(name: &str, ns: &str, spec: Value) -> DistributedTraining {
    serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .expect("a valid DistributedTraining")
}

/// A job whose ranks run a shell command (the gang mechanics without the trainer).
fn shell_job(name: &str, ns: &str, replicas: i32, script: &str) -> DistributedTraining {
    job(
        name,
        ns,
        json!({
            "replicas": replicas,
            "image": image(),
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script],
            "restartPolicy": {"maxRestarts": 3, "backoffSeconds": 1, "maxBackoffSeconds": 2},
            "podTemplate": {"terminationGracePeriodSeconds": 1},
        }),
    )
}

async fn status_of(
    api: &Api<DistributedTraining>,
    name: &str,
) -> (Option<DistributedTraining>, String) {
    match api.get_opt(name).await {
        Ok(Some(dt)) => {
            let seen = serde_json::to_string(&dt.status).unwrap();
            (Some(dt), seen)
        }
        Ok(None) => (None, "absent".into()),
        Err(e) => (None, e.to_string()),
    }
}

async fn wait_phase(
    api: &Api<DistributedTraining>,
    name: &str,
    phase: Phase,
) -> DistributedTraining {
    wait_for(&format!("{name} to be {phase}"), WAIT, || async {
        let (dt, seen) = status_of(api, name).await;
        (
            dt.filter(|d| d.status.as_ref().is_some_and(|s| s.phase == phase)),
            seen,
        )
    })
    .await
}

async fn pod_names(pods: &Api<Pod>, job: &str) -> Vec<String> {
    let mut names: Vec<String> = pods
        .list(&ListParams::default().labels(&format!("ferrotrain.dev/job={job}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn the_api_server_rejects_invalid_objects_naming_the_field() {
    in_namespace("crd", |client, ns| async move {
        let resource = ApiResource::erase::<DistributedTraining>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let good = json!({
            "replicas": 2,
            "trainer": {"task": "copy", "maxSteps": 10, "model": {"dModel": 64, "heads": 4}}
        });
        let object = |spec: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "ferrotrain.dev/v1alpha1",
                "kind": "DistributedTraining",
                "metadata": {"name": "bad"},
                "spec": spec,
            }))
            .unwrap()
        };
        api.create(&dry_run, &object(good.clone()))
            .await
            .expect("a valid object is accepted");

        let with = |pointer: &str, value: Value| {
            let mut spec = good.clone();
            *spec
                .pointer_mut(pointer)
                .unwrap_or_else(|| panic!("{pointer}")) = value;
            spec
        };
        let mut bad_model = good.clone();
        bad_model["trainer"]["model"] = json!({"dModel": 250, "heads": 4});
        let mut negative_restarts = good.clone();
        negative_restarts["restartPolicy"] = json!({"maxRestarts": -1});
        let cases = [
            ("replicas 0", with("/replicas", json!(0)), "spec.replicas"),
            (
                "unknown task",
                with("/trainer/task", json!("summarize")),
                "spec.trainer.task",
            ),
            (
                "negative maxRestarts",
                negative_restarts,
                "spec.restartPolicy.maxRestarts",
            ),
            (
                "dModel % heads",
                bad_model,
                "model.dModel must be divisible by model.heads",
            ),
        ];
        for (what, spec, needle) in cases {
            match api.create(&dry_run, &object(spec)).await {
                Ok(_) => panic!("{what}: accepted"),
                Err(kube::Error::Api(status)) => {
                    assert_eq!(status.code, 422, "{what}: {status:?}");
                    assert!(
                        status.message.contains(needle),
                        "{what}: message does not name {needle:?}: {}",
                        status.message
                    );
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn deleting_a_pod_restarts_the_whole_gang_as_a_new_attempt() {
    in_namespace("restart", |client, ns| async move {
        let api: Api<DistributedTraining> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.create(
            &PostParams::default(),
            &shell_job("gang", &ns, 2, "sleep 3600"),
        )
        .await
        .unwrap();
        wait_phase(&api, "gang", Phase::Running).await;
        assert_eq!(pod_names(&pods, "gang").await, ["gang-0-0", "gang-0-1"]);

        pods.delete("gang-0-1", &DeleteParams::default())
            .await
            .unwrap();

        let dt = wait_for("attempt 1 running", WAIT, || async {
            let (dt, seen) = status_of(&api, "gang").await;
            let ok = dt.filter(|d| {
                d.status
                    .as_ref()
                    .is_some_and(|s| s.attempt == 1 && s.phase == Phase::Running)
            });
            (ok, seen)
        })
        .await;
        let status = dt.status.unwrap();
        assert_eq!(status.restarts, 1);
        let failure = status.last_failure.unwrap();
        assert_eq!(failure.reason, "PodDeleted");
        assert_eq!(failure.node_rank, Some(1));
        // The whole old gang is gone; the new one has the new names.
        wait_for("only attempt 1's pods", WAIT, || async {
            let names = pod_names(&pods, "gang").await;
            let done = names == ["gang-1-0", "gang-1-1"];
            (done.then_some(()), format!("{names:?}"))
        })
        .await;
        let rank1 = pods.get("gang-1-1").await.unwrap();
        let env = &rank1.spec.unwrap().containers[0].env.clone().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            value("MASTER_ADDR").as_deref(),
            Some(format!("gang-1-0.gang.{ns}.svc").as_str())
        );
        assert_eq!(value("TORCHELASTIC_RESTART_COUNT").as_deref(), Some("1"));

        api.delete("gang", &DeleteParams::foreground())
            .await
            .unwrap();
        wait_for("the job's pods to be garbage-collected", WAIT, || async {
            let names = pod_names(&pods, "gang").await;
            (names.is_empty().then_some(()), format!("{names:?}"))
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn a_permanent_exit_code_fails_the_job_with_the_ranks_message() {
    in_namespace("permanent", |client, ns| async move {
        let api: Api<DistributedTraining> = Api::namespaced(client, &ns);
        let script = "if [ \"$NODE_RANK\" = 1 ]; then echo 'data/train.en: no such file' > /dev/termination-log; exit 3; fi; sleep 3600";
        api.create(&PostParams::default(), &shell_job("perm", &ns, 2, script))
            .await
            .unwrap();
        let dt = wait_phase(&api, "perm", Phase::Failed).await;
        let status = dt.status.unwrap();
        assert_eq!(status.restarts, 0, "a permanent failure is not retried");
        let failure = status.last_failure.unwrap();
        assert_eq!(failure.exit_code, Some(3));
        assert_eq!(failure.message, "data/train.en: no such file");
        let failed = status.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
        assert!(failed.message.contains("exited with code 3"), "{}", failed.message);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn every_rank_exiting_zero_succeeds_and_ttl_deletes_the_job() {
    in_namespace("success", |client, ns| async move {
        let api: Api<DistributedTraining> = Api::namespaced(client, &ns);
        let mut dt = shell_job(
            "ok",
            &ns,
            2,
            "test -n \"$FERROTRAIN_RDZV_TOKEN\" && test \"$WORLD_SIZE\" = 2",
        );
        dt.spec.ttl_seconds_after_finished = Some(5);
        api.create(&PostParams::default(), &dt).await.unwrap();
        let done = wait_phase(&api, "ok", Phase::Succeeded).await;
        assert_eq!(done.status.unwrap().succeeded_replicas, 2);
        wait_for("the ttl to delete the job", WAIT, || async {
            let (dt, seen) = status_of(&api, "ok").await;
            (dt.is_none().then_some(()), seen)
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed (e2e/kind.sh)"]
async fn suspend_deletes_the_pods_and_resume_starts_a_new_attempt() {
    in_namespace("suspend", |client, ns| async move {
        let api: Api<DistributedTraining> = Api::namespaced(client.clone(), &ns);
        let pods: Api<Pod> = Api::namespaced(client, &ns);
        let mut dt = shell_job("hold", &ns, 1, "sleep 3600");
        dt.spec.suspend = true;
        api.create(&PostParams::default(), &dt).await.unwrap();
        wait_phase(&api, "hold", Phase::Suspended).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            pod_names(&pods, "hold").await.is_empty(),
            "a suspended job has no pods"
        );

        let resume = json!({"spec": {"suspend": false}});
        api.patch("hold", &PatchParams::default(), &Patch::Merge(&resume))
            .await
            .unwrap();
        wait_phase(&api, "hold", Phase::Running).await;

        let suspend = json!({"spec": {"suspend": true}});
        api.patch("hold", &PatchParams::default(), &Patch::Merge(&suspend))
            .await
            .unwrap();
        wait_phase(&api, "hold", Phase::Suspended).await;
        wait_for("the pods to go", WAIT, || async {
            let names = pod_names(&pods, "hold").await;
            (names.is_empty().then_some(()), format!("{names:?}"))
        })
        .await;
        api.patch("hold", &PatchParams::default(), &Patch::Merge(&resume))
            .await
            .unwrap();
        let running = wait_phase(&api, "hold", Phase::Running).await;
        let status = running.status.unwrap();
        assert_eq!(status.restarts, 0, "suspend/resume is not a failure");
        assert!(status.attempt >= 1);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_trainer_reports_progress_into_the_status() {
    in_namespace("progress", |client, ns| async move {
        let api: Api<DistributedTraining> = Api::namespaced(client, &ns);
        let dt = job(
            "copy",
            &ns,
            json!({
                "replicas": 2,
                "image": image(),
                "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                "trainer": {
                    "task": "copy",
                    "maxSteps": 100000,
                    "model": {"dModel": 32, "heads": 2, "encoderLayers": 1, "decoderLayers": 1, "ffnDim": 64},
                    "copy": {"maxLength": 8, "trainSamples": 2000, "validSamples": 50},
                    "batch": {"maxTokens": 256},
                    "eval": {"everySteps": 0, "bleu": false},
                },
            }),
        );
        api.create(&PostParams::default(), &dt).await.unwrap();
        let training = wait_for("status.progress.step > 0", Duration::from_secs(600), || async {
            let (dt, seen) = status_of(&api, "copy").await;
            let ok = dt.filter(|d| {
                d.status
                    .as_ref()
                    .and_then(|s| s.progress.as_ref())
                    .is_some_and(|p| p.report.step > 0)
            });
            (ok, seen)
        })
        .await;
        let status = training.status.unwrap();
        let progress = status.progress.unwrap();
        assert_eq!(progress.report.total_steps, 100000);
        assert_eq!(progress.report.world_size, 2);
        assert!(status.conditions.iter().any(|c| c.type_ == "ProgressAvailable" && c.status == "True"));
    })
    .await;
}
