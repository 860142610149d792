//! The operator keeps all state in the job's status and its pods' labels: deleting the acting
//! operator mid-run leaves the gang alone. In a test binary of its own, so that no other test
//! runs while the operator is away.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, Phase};
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, WAIT, copy_job, pods_of, wait_status};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};

/// The chart's Lease (leaderElection.leaseName) and operator pod label.
const LEASE: &str = "ferrotrain-operator";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=ferrotrain-operator";

/// (namespace, holder) of the operator's Lease, if leader election is on.
async fn leader(client: &Client) -> Option<(String, String)> {
    let leases: Api<Lease> = Api::all(client.clone());
    let list = leases
        .list(&ListParams::default().fields(&format!("metadata.name={LEASE}")))
        .await
        .ok()?;
    list.items.into_iter().find_map(|l| {
        let holder = l.spec?.holder_identity?;
        Some((l.metadata.namespace?, holder))
    })
}

async fn uids(pods: &Api<Pod>, job: &str) -> BTreeMap<String, String> {
    pods_of(pods, job)
        .await
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect()
}

/// Deleting the leader's pod sends its operator SIGTERM: it stops its controller and releases
/// the Lease, and the standby, which watches the Lease, takes it over and writes the job's
/// status within 2 s of the signal (not after the Lease's 15 s).
async fn sigterm_the_leader(
    client: &Client,
    jobs: &Api<DistributedTraining>,
    operator_ns: &str,
    holder: &str,
) {
    let version = |dt: &DistributedTraining| dt.metadata.resource_version.clone();
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), operator_ns);
    let signalled = Instant::now();
    operator_pods
        .delete(holder, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the leader {operator_ns}/{holder}: {e}"));
    let (successor, _) = poll_until(Duration::from_secs(30), || async {
        leader(client).await.filter(|(_, h)| h != holder)
    })
    .await
    .expect("another operator takes the lease within 30 s");
    let taken = signalled.elapsed();
    // Only the successor writes from here: the old leader released the Lease after its
    // controller stopped (the successor needs its caches before it writes: longer than a poll).
    let at_takeover = version(&jobs.get("steady").await.unwrap());
    poll_until(Duration::from_secs(30), || async {
        let now = version(&jobs.get("steady").await.ok()?);
        (now != at_takeover).then_some(())
    })
    .await
    .expect("the successor writes the job's status within 30 s");
    let acted = signalled.elapsed();
    eprintln!(
        "SIGTERM to {holder}: {} took the lease {:.2} s and wrote the job's status {:.2} s after the signal",
        successor.1,
        taken.as_secs_f64(),
        acted.as_secs_f64()
    );
    assert!(
        taken < Duration::from_secs(2),
        "the lease was not released at once: taken over {taken:?} after the signal"
    );
    assert!(
        acted < Duration::from_secs(2),
        "the successor acted {acted:?} after the signal"
    );
}

/// Polls `check` every 100 ms until it gives Some (with the time it took) or `limit` passes.
async fn poll_until<T, F, Fut>(limit: Duration, mut check: F) -> Option<(T, Duration)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(v) = check().await {
            return Some((v, started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn deleting_the_acting_operator_mid_run_leaves_the_job_undisturbed() {
    let ns = TestNamespace::create("operator").await;
    let jobs = ns.jobs();
    ns.create_checkpoint_claim("steady-checkpoints").await;
    ns.create_job("steady", copy_job(2, 1_000_000, Some("steady-checkpoints")))
        .await;
    wait_status(&jobs, "steady", "Running with progress", TRAIN_WAIT, |s| {
        s.phase == Phase::Running && s.progress.as_ref().is_some_and(|p| p.report.step > 0)
    })
    .await;
    let gang = uids(&ns.pods(), "steady").await;
    assert_eq!(gang.len(), 2, "{gang:?}");

    // Delete the leader (or, without leader election, every operator pod).
    let client = ns.client.clone();
    match leader(&client).await {
        Some((operator_ns, holder)) => {
            sigterm_the_leader(&client, &jobs, &operator_ns, &holder).await;
        }
        None => {
            let all: Api<Pod> = Api::all(client.clone());
            let operators = all
                .list(&ListParams::default().labels(OPERATOR_PODS))
                .await
                .unwrap();
            assert!(
                !operators.items.is_empty(),
                "no operator pods ({OPERATOR_PODS})"
            );
            for pod in operators {
                let (Some(name), Some(pod_ns)) = (pod.metadata.name, pod.metadata.namespace) else {
                    continue;
                };
                Api::<Pod>::namespaced(client.clone(), &pod_ns)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
    }

    // The new operator polls the same gang and writes its progress on.
    let after = wait_status(&jobs, "steady", "a status", WAIT, |_| true).await;
    let step = after.progress.as_ref().map_or(0, |p| p.report.step);
    let later = wait_status(
        &jobs,
        "steady",
        "progress written by the new operator",
        WAIT,
        |s| s.progress.as_ref().is_some_and(|p| p.report.step > step),
    )
    .await;
    assert_eq!(later.phase, Phase::Running);
    assert_eq!(later.attempt, 0, "the same attempt");
    assert_eq!(later.restarts, 0, "no restart");
    assert!(later.last_failure.is_none(), "{:?}", later.last_failure);
    assert_eq!(
        uids(&ns.pods(), "steady").await,
        gang,
        "the same pods, untouched"
    );
}
