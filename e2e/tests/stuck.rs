//! A gang that cannot start explains itself on the job: the pods' own reason in the Running
//! condition and a Warning event, then the start-up timeout ends the attempt (Failed for an
//! image no restart can pull, a gang restart for pods the scheduler cannot place).

use std::time::Duration;

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase, condition};
use ferrotrain_api::reason;
use ferrotrain_e2e::{TestNamespace, WAIT, copy_job, wait_for, wait_status};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;

/// Start-up timeout of these jobs: short, so a test ends in minutes.
const STARTUP_TIMEOUT_SECONDS: u64 = 30;

/// The job's Warning events as "Reason: message".
async fn warnings(ns: &TestNamespace, job: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(ns.client.clone(), &ns.name);
    let selector = format!("involvedObject.name={job},type=Warning");
    events
        .list(&ListParams::default().fields(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// Waits for a Warning event of the job whose reason is one of `reasons`.
async fn wait_warning(ns: &TestNamespace, job: &str, reasons: &[&str]) -> String {
    wait_for(&format!("a Warning event {reasons:?}"), WAIT, || async {
        let seen = warnings(ns, job).await;
        let found = seen
            .iter()
            .find(|w| reasons.iter().any(|r| w.starts_with(&format!("{r}:"))))
            .cloned();
        (found, format!("{seen:?}"))
    })
    .await
}

/// Job `huge` once its attempt 0 ended at the start-up timeout: a restart blaming
/// Unschedulable.
async fn restarted_for_unschedulable(jobs: &Api<DistributedTraining>) -> DistributedTrainingStatus {
    let restarted = wait_status(
        jobs,
        "huge",
        "a restart for Unschedulable",
        WAIT + Duration::from_secs(STARTUP_TIMEOUT_SECONDS),
        |s| s.restarts >= 1,
    )
    .await;
    let failure = restarted
        .last_failure
        .as_ref()
        .expect("the failure that ended attempt 0");
    assert_eq!(failure.reason, reason::UNSCHEDULABLE, "{failure:?}");
    restarted
}

fn running_condition(s: &DistributedTrainingStatus) -> (String, String, String) {
    s.condition(condition::RUNNING)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs a cluster with the operator (e2e/kind.sh)"]
async fn an_unpullable_image_is_shown_on_the_job_then_fails_it_at_the_startup_timeout() {
    const PULL_REASONS: [&str; 2] = ["ImagePullBackOff", "ErrImagePull"];
    let ns = TestNamespace::create("pull").await;
    let jobs = ns.jobs();
    let mut spec = copy_job(2, 100, None);
    spec["image"] = json!("registry.invalid/ferrotrain/no-such-trainer:does-not-exist");
    spec["imagePullPolicy"] = json!("Always");
    spec["startupTimeoutSeconds"] = json!(STARTUP_TIMEOUT_SECONDS);
    ns.create_job("nopull", spec).await;

    let waiting = wait_status(
        &jobs,
        "nopull",
        "Running=False/ImagePullBackOff",
        WAIT,
        |s| {
            let (status, reason, _) = running_condition(s);
            status == "False" && PULL_REASONS.contains(&reason.as_str())
        },
    )
    .await;
    let (_, reason, message) = running_condition(&waiting);
    eprintln!("Running False {reason}: {message}");
    assert!(message.contains("nopull-0-"), "names the pod: {message}");
    assert!(
        message.contains("no-such-trainer"),
        "names the image: {message}"
    );
    assert_ne!(waiting.phase, Phase::Running);
    let event = wait_warning(&ns, "nopull", &PULL_REASONS).await;
    eprintln!("Warning {event}");

    let failed = wait_status(
        &jobs,
        "nopull",
        "phase Failed at the start-up timeout",
        WAIT + Duration::from_secs(STARTUP_TIMEOUT_SECONDS),
        |s| s.phase == Phase::Failed,
    )
    .await;
    let c = failed
        .condition(condition::FAILED)
        .expect("a Failed condition");
    eprintln!("Failed {}: {}", c.reason, c.message);
    assert!(PULL_REASONS.contains(&c.reason.as_str()), "{c:?}");
    assert!(c.message.contains("after its creation"), "{c:?}");
    assert_eq!(failed.restarts, 0, "a restart would pull the same image");
}

#[tokio::test]
#[ignore = "needs a cluster with the operator (e2e/kind.sh)"]
async fn an_unschedulable_gang_shows_the_schedulers_message_and_restarts_at_the_startup_timeout() {
    let ns = TestNamespace::create("unsched").await;
    let jobs = ns.jobs();
    let mut spec = copy_job(2, 100, None);
    spec["resources"]["requests"]["cpu"] = json!("1000");
    spec["startupTimeoutSeconds"] = json!(STARTUP_TIMEOUT_SECONDS);
    // A fixed gang: every pod is created at once (an elastic job's is the test below).
    spec.as_object_mut().unwrap().remove("elastic");
    ns.create_job("huge", spec).await;

    let waiting = wait_status(&jobs, "huge", "Running=False/Unschedulable", WAIT, |s| {
        let (status, why, _) = running_condition(s);
        status == "False" && why == reason::UNSCHEDULABLE
    })
    .await;
    let (_, _, message) = running_condition(&waiting);
    eprintln!("Running False Unschedulable: {message}");
    // The scheduler's own words: "0/N nodes are available: N Insufficient cpu. ...".
    assert!(message.contains("nodes are available"), "{message}");
    assert!(message.contains("Insufficient cpu"), "{message}");
    assert_eq!(waiting.phase, Phase::Starting);
    let event = wait_warning(&ns, "huge", &[reason::UNSCHEDULABLE]).await;
    assert!(event.contains("Insufficient cpu"), "{event}");

    // Past the start-up timeout the gang is restarted afresh (a new attempt may fit).
    let restarted = restarted_for_unschedulable(&jobs).await;
    assert_eq!(
        restarted.restarts_by_cause.get(reason::UNSCHEDULABLE),
        Some(&1)
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator (e2e/kind.sh)"]
async fn an_elastic_job_whose_node_0_cannot_be_placed_creates_no_other_pod_and_restarts_at_the_startup_timeout()
 {
    let ns = TestNamespace::create("node0first").await;
    let jobs = ns.jobs();
    let mut spec = copy_job(2, 100, None);
    assert!(spec.get("elastic").is_some(), "the example is elastic");
    spec["resources"]["requests"]["cpu"] = json!("1000");
    spec["startupTimeoutSeconds"] = json!(STARTUP_TIMEOUT_SECONDS);
    ns.create_job("huge", spec).await;

    // The kit serves no gang scheduler: node 0's pod first, the other once it has a node.
    let waiting = wait_status(&jobs, "huge", "Created=False/Node0First", WAIT, |s| {
        s.condition(condition::CREATED)
            .is_some_and(|c| c.status == "False" && c.reason == reason::NODE_0_FIRST)
    })
    .await;
    let message = waiting
        .condition(condition::CREATED)
        .unwrap()
        .message
        .clone();
    eprintln!("Created False Node0First: {message}");
    assert!(message.contains("huge-0-0"), "{message}");
    assert!(message.contains("Insufficient cpu"), "{message}");
    assert_eq!(waiting.phase, Phase::Pending);
    let pods: Vec<_> = ferrotrain_e2e::pods_of(&ns.pods(), "huge")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(pods, ["huge-0-0"], "only node 0's pod");

    restarted_for_unschedulable(&jobs).await;
}
