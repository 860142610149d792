//! The job's life cycle around the trainer: suspend deletes the pods and resume continues from
//! the checkpoint without counting a restart; a finished job is deleted after its TTL, and its
//! pods with it.

use std::time::Duration;

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::{
    CHECKPOINT_EVERY, TRAIN_WAIT, TestNamespace, WAIT, copy_job, pod_names, wait_first_checkpoint,
    wait_for, wait_phase, wait_status,
};
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn suspend_deletes_the_pods_and_resume_continues_from_the_checkpoint() {
    let ns = TestNamespace::create("suspend").await;
    let jobs = ns.jobs();
    ns.create_checkpoint_claim("hold-checkpoints").await;
    ns.create_job("hold", copy_job(2, 1_000_000, Some("hold-checkpoints")))
        .await;
    wait_first_checkpoint(&ns, "hold").await;

    let suspend = json!({"spec": {"suspend": true}});
    jobs.patch("hold", &PatchParams::default(), &Patch::Merge(&suspend))
        .await
        .unwrap();
    let suspended = wait_phase(&jobs, "hold", Phase::Suspended, WAIT).await;
    assert!(suspended.is_true("Suspended"), "{suspended:?}");
    wait_for("the pods to go", WAIT, || async {
        let names = pod_names(&ns.pods(), "hold").await;
        (names.is_empty().then_some(()), format!("{names:?}"))
    })
    .await;
    // Suspended stays suspended: no pod comes back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(pod_names(&ns.pods(), "hold").await, Vec::<String>::new());

    let resume = json!({"spec": {"suspend": false}});
    jobs.patch("hold", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .unwrap();
    let resumed = wait_status(&jobs, "hold", "training again, resumed", TRAIN_WAIT, |s| {
        s.phase == Phase::Running
            && s.progress
                .as_ref()
                .is_some_and(|p| p.report.resumed_from_step.is_some())
    })
    .await;
    assert_eq!(resumed.restarts, 0, "suspend/resume is not a failure");
    assert!(resumed.attempt >= 1, "resume starts a new attempt");
    let from = resumed.progress.unwrap().report.resumed_from_step.unwrap();
    assert!(from >= CHECKPOINT_EVERY, "resumed from step {from}");
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn a_finished_job_and_its_pods_are_deleted_after_its_ttl() {
    let ns = TestNamespace::create("ttl").await;
    let jobs = ns.jobs();
    let mut spec = copy_job(2, 20, None);
    spec["ttlSecondsAfterFinished"] = json!(5);
    ns.create_job("short", spec).await;

    let done = wait_phase(&jobs, "short", Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!(done.succeeded_replicas, 2);
    wait_for("the TTL to delete the job", WAIT, || async {
        let found = jobs.get_opt("short").await;
        let gone = matches!(found, Ok(None));
        (
            gone.then_some(()),
            format!("{:?}", found.map(|d| d.map(|d| d.status))),
        )
    })
    .await;
    wait_for("the job's pods to be garbage-collected", WAIT, || async {
        let names = pod_names(&ns.pods(), "short").await;
        (names.is_empty().then_some(()), format!("{names:?}"))
    })
    .await;
}
