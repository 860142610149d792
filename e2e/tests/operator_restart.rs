//! The operator keeps all state in the job's status and its pods' labels: deleting the acting
//! operator mid-run leaves the gang alone. In a test binary of its own, so that no other test
//! runs while the operator is away.

use std::collections::BTreeMap;

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, WAIT, copy_job, pods_of, wait_for, wait_status};
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
            let operator_pods: Api<Pod> = Api::namespaced(client.clone(), &operator_ns);
            operator_pods
                .delete(&holder, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("deleting the leader {operator_ns}/{holder}: {e}"));
            wait_for("another operator to take the lease", WAIT, || async {
                let now = leader(&client).await;
                let moved = now.as_ref().is_some_and(|(_, h)| h != &holder);
                (moved.then_some(()), format!("{now:?}"))
            })
            .await;
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
