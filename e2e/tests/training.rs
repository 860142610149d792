//! The real trainer under the operator: the copy job trains to the end with its progress in
//! the status, a lost pod costs at most one checkpoint interval, and errors no restart can fix
//! fail the job at once with the trainer's own message.

use ferrotrain_api::crd::{Phase, custom_resource_definition};
use ferrotrain_e2e::{
    CHECKPOINT_EVERY, TRAIN_WAIT, TestNamespace, WAIT, at_json_path, config_error_job, copy_job,
    missing_data_job, pods_of, rank0_progress, volume_at, wait_first_checkpoint, wait_for,
    wait_phase, wait_status,
};
use kube::api::{DeleteParams, LogParams};

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_copy_job_runs_with_progress_in_the_printer_columns_then_succeeds() {
    let ns = TestNamespace::create("copy").await;
    let jobs = ns.jobs();
    ns.create_checkpoint_claim("copy-checkpoints").await;
    // A minute or two on the kit: several progress writes (every 15 s) while it runs.
    let max_steps = 1000;
    ns.create_job("copy", copy_job(2, max_steps, Some("copy-checkpoints")))
        .await;

    // Running, with every printer column filled (Age comes from the metadata).
    let running = wait_status(
        &jobs,
        "copy",
        "Running with steps/s, loss and ETA",
        TRAIN_WAIT,
        |s| {
            s.phase == Phase::Running
                && s.progress.as_ref().is_some_and(|p| {
                    p.report.step > 0
                        && p.report.steps_per_second.is_some_and(|r| r > 0.0)
                        && p.report.loss.is_some()
                        && p.eta.is_some()
                })
        },
    )
    .await;
    assert_eq!(running.restarts, 0);
    let progress = running.progress.as_ref().unwrap();
    assert_eq!(progress.report.world_size, 2);
    assert_eq!(progress.report.total_steps, max_steps);
    let object = serde_json::json!({"status": running});
    let crd = custom_resource_definition();
    for column in crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
    {
        if column.json_path.starts_with(".status") {
            assert!(
                at_json_path(&object, &column.json_path).is_some(),
                "printer column {} ({}) is empty while the job runs: {}",
                column.name,
                column.json_path,
                object["status"]
            );
        }
    }

    // Only rank 0's pod mounts the (ReadWriteOnce) claim; the other writes nothing there.
    let pods = pods_of(&ns.pods(), "copy").await;
    let mounts: Vec<String> = pods.iter().map(|p| volume_at(p, "/checkpoints")).collect();
    assert_eq!(mounts, ["claim copy-checkpoints", "emptyDir"]);

    let done = wait_phase(&jobs, "copy", Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!(done.restarts, 0, "{done:?}");
    assert_eq!(done.attempt, 0);
    assert_eq!(done.succeeded_replicas, 2);
    assert!(done.completion_time.is_some());
    // The status holds rank 0's final report (its termination message), not the last poll.
    let last = done.progress.expect("the final report is in the status");
    assert_eq!(last.report.step, max_steps, "{last:?}");
    assert_eq!(last.report.phase, ferrotrain_api::TrainerPhase::Finished);
    assert_eq!(
        last.report.last_checkpoint.as_ref().map(|c| c.step),
        Some(max_steps),
        "{last:?}"
    );
    assert_eq!(
        last.report.steps_per_second, None,
        "a finished job has no rate"
    );
    assert_eq!(last.report.resumed_from_step, None, "a fresh start");
    let log = ns
        .pods()
        .logs("copy-0-0", &LogParams::default())
        .await
        .expect("rank 0's pod stays after success, with its log");
    let finished = log
        .lines()
        .find(|l| l.contains("finished"))
        .unwrap_or_else(|| panic!("no `finished` line in rank 0's log:\n{log}"));
    assert!(
        finished.contains(&format!("step={max_steps}"))
            && finished.contains(&format!("checkpoint={max_steps}")),
        "rank 0 trains to maxSteps and saves there: {finished}"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn deleting_a_pod_after_a_checkpoint_restarts_the_gang_from_that_checkpoint() {
    let ns = TestNamespace::create("resume").await;
    let jobs = ns.jobs();
    ns.create_checkpoint_claim("resume-checkpoints").await;
    // Never finishes on its own: the namespace goes at the end. The whole-gang path
    // (tests/in_place.rs has the pod replaced alone, the default).
    let mut spec = copy_job(2, 1_000_000, Some("resume-checkpoints"));
    spec["restartPolicy"]["inPlace"] = serde_json::json!(false);
    spec.as_object_mut().unwrap().remove("elastic");
    ns.create_job("resume", spec).await;

    wait_first_checkpoint(&ns, "resume").await;
    // The step right before the failure, from rank 0 itself (the status lags a poll).
    let before = rank0_progress(&ns.client, &ns.name, "resume-0-0")
        .await
        .expect("rank 0's /progress through the API server's pod proxy");
    let checkpoint_before = before.last_checkpoint.as_ref().map_or(0, |c| c.step);
    ns.pods()
        .delete("resume-0-1", &DeleteParams::default())
        .await
        .unwrap();

    let resumed = wait_status(
        &jobs,
        "resume",
        "attempt 1 training, resumed",
        TRAIN_WAIT,
        |s| {
            s.attempt == 1
                && s.phase == Phase::Running
                && s.progress
                    .as_ref()
                    .is_some_and(|p| p.report.resumed_from_step.is_some())
        },
    )
    .await;
    assert_eq!(resumed.restarts, 1);
    let failure = resumed.last_failure.as_ref().expect("the failure is kept");
    assert_eq!(failure.attempt, 0, "{failure:?}");
    let from = resumed
        .progress
        .as_ref()
        .and_then(|p| p.report.resumed_from_step)
        .unwrap();
    assert!(from > 0, "resumedFromStep {from}");
    assert!(
        from >= checkpoint_before,
        "resumed from {from}, but checkpoint {checkpoint_before} was complete before the failure"
    );
    let lost = before.step.saturating_sub(from);
    assert!(
        lost <= CHECKPOINT_EVERY,
        "rank 0 was at step {} when its peer was deleted and the gang resumed from {from}: \
         {lost} steps lost, more than the checkpoint interval {CHECKPOINT_EVERY}",
        before.step
    );
    eprintln!(
        "deleted at step >= {}, resumed from {from}: {lost} steps lost",
        before.step
    );

    // The new gang has the new names, and its rank 0 has the claim again. Of the old gang,
    // nothing runs: a pod that exited on its own stays (for its log) until the next attempt.
    let new_rank0 = wait_for("attempt 1's pods, attempt 0's stopped", WAIT, || async {
        let pods = pods_of(&ns.pods(), "resume").await;
        let seen: Vec<String> = pods.iter().map(describe_pod).collect();
        let names: Vec<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        let new_gang = names.contains(&"resume-1-0") && names.contains(&"resume-1-1");
        let old_stopped = pods
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("resume-0-"))
            })
            .all(|p| {
                let state = describe_pod(p);
                ["Succeeded", "Failed", "terminating"]
                    .iter()
                    .any(|s| state.ends_with(s))
            });
        let rank0 = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("resume-1-0"))
            .cloned();
        (
            (new_gang && old_stopped).then_some(rank0).flatten(),
            format!("{seen:?}"),
        )
    })
    .await;
    assert_eq!(
        volume_at(&new_rank0, "/checkpoints"),
        "claim resume-checkpoints"
    );
    // And it trains on from there.
    let trained_on = wait_status(&jobs, "resume", "steps after the resume", WAIT, |s| {
        s.attempt == 1 && s.progress.as_ref().is_some_and(|p| p.report.step > from)
    })
    .await;
    // The ledger: attempt 0 ended with the deleted pod, attempt 1 resumed where the gang did.
    let recovery = trained_on.recovery.as_ref().expect("status.recovery");
    let (a0, a1) = (&recovery.attempts[0], &recovery.attempts[1]);
    let end = a0.end.as_ref().expect("attempt 0 ended");
    assert_eq!(
        end.cause,
        ferrotrain_api::recovery::EndCause::Failure,
        "{recovery:?}"
    );
    assert!(end.detected_at >= end.failed_at, "{recovery:?}");
    assert!(end.node.is_some(), "the failed pod's node: {recovery:?}");
    assert_eq!(a1.resumed_from_step, Some(from), "{recovery:?}");
    assert!(
        a1.first_step_at.is_some_and(|t| t > end.failed_at),
        "{recovery:?}"
    );
    assert!(
        a0.lost_steps.is_some_and(|l| l <= CHECKPOINT_EVERY),
        "{recovery:?}"
    );
    assert!(recovery.mean_recovery_seconds.is_some(), "{recovery:?}");
    assert!(
        recovery
            .goodput_percent
            .is_some_and(|g| g > 0.0 && g < 100.0),
        "{recovery:?}"
    );
    eprintln!(
        "recovery: detect {:?} s, failure to next first step {:?} s, goodput {:?} %",
        recovery.mean_detect_seconds, recovery.mean_recovery_seconds, recovery.goodput_percent
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn a_config_error_fails_the_job_with_the_trainers_message_and_no_restart() {
    let ns = TestNamespace::create("config").await;
    let jobs = ns.jobs();
    // The schema and the operator's checks accept `device: cuda` on a CPU pod; the trainer
    // refuses it at start (exit 2, invalid config).
    ns.create_job("config", config_error_job()).await;

    let failed = wait_phase(&jobs, "config", Phase::Failed, WAIT).await;
    assert_eq!(failed.restarts, 0, "a permanent failure is not retried");
    assert_eq!(failed.attempt, 0);
    let failure = failed.last_failure.as_ref().expect("the failure is kept");
    assert_eq!(failure.exit_code, Some(2), "{failure:?}");
    assert!(
        failure.message.contains("device: cuda"),
        "the trainer's termination message: {:?}",
        failure.message
    );
    let condition = failed.condition("Failed").expect("condition Failed");
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains("exited with code 2") && condition.message.contains("cuda"),
        "{}",
        condition.message
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn missing_training_data_fails_the_job_with_exit_code_3_and_no_restart() {
    let ns = TestNamespace::create("data").await;
    let jobs = ns.jobs();
    ns.create_job("data", missing_data_job()).await;

    let failed = wait_phase(&jobs, "data", Phase::Failed, WAIT).await;
    assert_eq!(failed.restarts, 0, "a permanent failure is not retried");
    let failure = failed.last_failure.as_ref().expect("the failure is kept");
    assert_eq!(failure.exit_code, Some(3), "{failure:?}");
    assert!(
        failure.message.contains("data.train.source"),
        "the message names the field: {:?}",
        failure.message
    );
}

/// `<name> <phase>`, or `<name> terminating` once it is being deleted.
fn describe_pod(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return format!("{name} terminating");
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    format!("{name} {phase}")
}
