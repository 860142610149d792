//! Checkpoints in an S3-compatible bucket (`trainer.checkpoint.store`, docs/checkpoints.md),
//! against a real server in each test's namespace (`ferrotrain_e2e::s3`: s3s-fs, its buckets
//! in the pod's emptyDir). The jobs have no claim: rank 0's checkpoint directory is an
//! emptyDir, a cache of the bucket, so a new attempt can only resume from the bucket. Each
//! test prints what it measured.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::Phase;
use ferrotrain_api::exit::INVALID_CONFIG;
use ferrotrain_api::reason::STORE_SECRET_MISSING;
use ferrotrain_e2e::network_policy::{Destination, egress_allows};
use ferrotrain_e2e::s3::{
    ACCESS_KEY, PORT, S3Server, SECRET_KEY, check_manifest, checkpoints_in, crc32c_hex,
    create_store_secret, step_prefix, store_job,
};
use ferrotrain_e2e::{
    CHECKPOINT_EVERY, TRAIN_WAIT, TestNamespace, WAIT, distributed_training, pod_names,
    rank0_progress, volume_at, wait_for, wait_phase, wait_rank0, wait_status,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, LogParams};
use serde_json::{Value, json};

/// The bucket, and the prefix the jobs' checkpoints go under (`<prefix>/<job>/...`).
const BUCKET: &str = "ckpt";
const PREFIX: &str = "runs";
/// The Secret the jobs name (`spec.checkpoint.storeSecretName`).
const SECRET: &str = "s3-creds";
/// A complete checkpoint's objects: the manifest is written last and lists the others.
const CHECKPOINT_FILES: [&str; 4] = [
    "manifest.json",
    "model.safetensors",
    "optimizer.safetensors",
    "trainer.json",
];
/// How long the killed server stays down (its container sleeps before serving again).
const OUTAGE: Duration = Duration::from_secs(5);

/// `s3://ckpt/runs`.
fn url() -> String {
    format!("s3://{BUCKET}/{PREFIX}")
}

/// `runs/<job>`: the job's objects.
fn job_prefix(job: &str) -> String {
    format!("{PREFIX}/{job}")
}

/// A namespace with the S3 server and its bucket, and (unless `secret_key` is None) the
/// Secret `s3-creds` with the server's access key and `secret_key`.
async fn with_bucket(test: &str, secret_key: Option<&str>) -> (TestNamespace, S3Server) {
    let ns = TestNamespace::create(test).await;
    let s3 = S3Server::start(&ns).await;
    s3.create_bucket(BUCKET).await;
    if let Some(key) = secret_key {
        create_store_secret(&ns, SECRET, ACCESS_KEY, key).await;
    }
    (ns, s3)
}

/// The copy job on `replicas` pods of one rank, checkpointing to the bucket with `s3-creds`.
fn job_spec(s3: &S3Server, replicas: i32, max_steps: u64) -> Value {
    store_job(&s3.endpoint(), &url(), SECRET, replicas, max_steps)
}

/// The job's checkpoints in the bucket, once the job is done (nothing writes meanwhile):
/// the complete steps, whose manifest is intact, names its step and lists files the bucket
/// holds at those sizes and CRC-32C, and the steps without manifest (an upload that was cut);
/// with every object of the job (key → size).
async fn bucket_checkpoints(
    s3: &S3Server,
    job: &str,
) -> (Vec<u64>, Vec<u64>, BTreeMap<String, u64>) {
    let prefix = job_prefix(job);
    let objects = s3.objects(BUCKET, &prefix).await;
    let (mut complete, mut partial) = (Vec::new(), Vec::new());
    for (step, files) in checkpoints_in(&objects, &prefix) {
        let dir = step_prefix(&prefix, step);
        if !files.contains_key("manifest.json") {
            partial.push(step);
            continue;
        }
        let manifest = s3.read(BUCKET, &format!("{dir}/manifest.json")).await;
        let listed = check_manifest(step, &manifest, &files)
            .unwrap_or_else(|e| panic!("{dir}/manifest.json: {e}"));
        for file in listed {
            let bytes = s3.read(BUCKET, &format!("{dir}/{}", file.name)).await;
            assert_eq!(
                crc32c_hex(&bytes),
                file.crc32c,
                "{dir}/{}: its CRC-32C is not the manifest's",
                file.name
            );
        }
        complete.push(step);
    }
    (complete, partial, objects)
}

/// The steps rank 0's log says are durable in the bucket under `job_url`
/// (`checkpoint step N durable in s3://.../<job>/...`).
fn durable_steps_in_log(log: &str, job_url: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|line| {
            let rest = line.split_once("checkpoint step ")?.1;
            let (step, rest) = rest.split_once(' ')?;
            rest.starts_with(&format!("durable in {job_url}/"))
                .then(|| step.parse().ok())
                .flatten()
        })
        .collect()
}

async fn rank0_log(ns: &TestNamespace, pod: &str) -> String {
    ns.pods()
        .logs(pod, &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("the log of {pod}: {e}"))
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn a_job_checkpoints_into_the_bucket_and_its_final_step_is_durable() {
    let (ns, s3) = with_bucket("bucket", Some(SECRET_KEY)).await;
    let job = "bucket";
    let max_steps = 300;
    let spec = job_spec(&s3, 1, max_steps);
    let policy = distributed_training(job, &ns.name, spec.clone())
        .spec
        .trainer
        .expect("a trainer config")
        .checkpoint;
    let started = Instant::now();
    ns.create_job(job, spec).await;

    let rank0 = format!("{job}-0-0");
    let pod = wait_for("rank 0's pod", WAIT, || async {
        match ns.pods().get_opt(&rank0).await {
            Ok(pod) => (pod, "not created yet".to_string()),
            Err(e) => (None, e.to_string()),
        }
    })
    .await;
    assert_eq!(volume_at(&pod, "/checkpoints"), "emptyDir", "no claim");

    let done = wait_phase(&ns.jobs(), job, Phase::Succeeded, TRAIN_WAIT).await;
    let took = started.elapsed();
    assert_eq!((done.attempt, done.restarts), (0, 0), "{done:?}");
    let report = done
        .progress
        .as_ref()
        .expect("the final report")
        .report
        .clone();
    assert_eq!(report.step, max_steps);
    let durable = report
        .durable_checkpoint
        .clone()
        .expect("status.progress.durableCheckpoint");
    assert_eq!(durable.step, max_steps, "{durable:?}");
    assert_eq!(
        durable.url,
        format!("{}/{job}/step-{max_steps:08}/", url()),
        "{durable:?}"
    );
    assert_eq!(durable.upload_error, None, "{durable:?}");

    // The bucket: the fence, and the kept checkpoints, each whole with its manifest.
    let (complete, partial, objects) = bucket_checkpoints(&s3, job).await;
    let listing: Vec<String> = objects.iter().map(|(k, s)| format!("{k} {s}")).collect();
    println!("bucket {BUCKET} after the job:\n  {}", listing.join("\n  "));
    assert!(
        objects.contains_key(&format!("{}/fence.json", job_prefix(job))),
        "no fence.json: {objects:?}"
    );
    assert_eq!(
        partial,
        Vec::<u64>::new(),
        "steps without manifest after a clean end"
    );
    let checkpoints = checkpoints_in(&objects, &job_prefix(job));
    for step in &complete {
        assert_eq!(step % CHECKPOINT_EVERY, 0, "step {step}");
        let names: BTreeSet<&str> = checkpoints[step].keys().map(String::as_str).collect();
        assert_eq!(names, BTreeSet::from(CHECKPOINT_FILES), "step {step}");
    }
    let newest: Vec<u64> = (0..u64::from(policy.keep_latest))
        .map(|i| max_steps - i * CHECKPOINT_EVERY)
        .collect();
    assert!(
        newest.iter().all(|s| complete.contains(s)),
        "keepLatest {}: the bucket holds {complete:?}",
        policy.keep_latest
    );
    assert!(
        complete.len() <= (policy.keep_latest + policy.keep_best) as usize,
        "keepLatest {} + keepBest {}: the bucket holds {complete:?}",
        policy.keep_latest,
        policy.keep_best
    );

    let log = rank0_log(&ns, &rank0).await;
    let logged = durable_steps_in_log(&log, &format!("{}/{job}", url()));
    assert!(
        logged.contains(&max_steps),
        "rank 0's log says these steps are durable: {logged:?}"
    );
    println!(
        "Succeeded in {:.1} s; {} checkpoints durable by rank 0's log, kept in the bucket \
         {complete:?}; the last: {:?} s from save to manifest, {:?} B/s",
        took.as_secs_f64(),
        logged.len(),
        durable.durable_seconds,
        durable.upload_bytes_per_second
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn with_every_pod_gone_a_new_attempt_resumes_from_the_bucket() {
    let (ns, s3) = with_bucket("rebuild", Some(SECRET_KEY)).await;
    let job = "rebuild";
    let max_steps = 600;
    let mut spec = job_spec(&s3, 2, max_steps);
    // The whole-gang path: no pod stays to hand its state over, the next attempt's are new.
    spec["restartPolicy"]["inPlace"] = json!(false);
    spec.as_object_mut().unwrap().remove("elastic");
    let started = Instant::now();
    ns.create_job(job, spec).await;

    let at_least = 2 * CHECKPOINT_EVERY;
    let before = wait_rank0(
        &ns,
        &format!("{job}-0-0"),
        &format!("a checkpoint of step {at_least} or later durable in the bucket"),
        |p| {
            p.durable_checkpoint
                .as_ref()
                .is_some_and(|d| d.step >= at_least)
                .then(|| p.clone())
        },
    )
    .await;
    let durable_before = before.durable_checkpoint.as_ref().unwrap().step;
    // Every pod at once, forced: none survives to hand over its state. (The kubelet still
    // sends SIGTERM and kills 2 s later: a SIGTERM save of rank 0 that reaches the bucket in
    // that time is what the next attempt resumes from; on 2026-12-02 it did, step 113.)
    let deleted_at = Instant::now();
    ns.pods()
        .delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
            &ListParams::default().labels(&format!("ferrotrain.dev/job={job}")),
        )
        .await
        .expect("deleting every pod of the job");

    let resumed = wait_status(
        &ns.jobs(),
        job,
        "a new attempt training, resumed",
        TRAIN_WAIT,
        |s| {
            s.attempt >= 1
                && s.phase == Phase::Running
                && s.progress
                    .as_ref()
                    .is_some_and(|p| p.report.resumed_from_step.is_some())
        },
    )
    .await;
    let resumed_after = deleted_at.elapsed();
    let from = resumed
        .progress
        .as_ref()
        .and_then(|p| p.report.resumed_from_step)
        .unwrap();
    assert!(
        from >= durable_before,
        "resumed from step {from}, but step {durable_before} was durable in the bucket \
         before the pods were deleted"
    );
    // The new rank 0 had nothing but an empty directory: it downloaded the checkpoint.
    let rank0 = format!("{job}-{}-0", resumed.attempt);
    let pod = ns.pods().get(&rank0).await.expect("the new rank 0's pod");
    assert_eq!(volume_at(&pod, "/checkpoints"), "emptyDir");
    let log = rank0_log(&ns, &rank0).await;
    let line = log
        .lines()
        .find(|l| l.contains("resuming from the bucket"))
        .unwrap_or_else(|| panic!("no `resuming from the bucket` in {rank0}'s log:\n{log}"));
    assert!(
        line.contains(&format!("downloaded step {from} from {}/{job}/", url())),
        "{line}"
    );
    println!(
        "every pod deleted with rank 0 at step >= {} and step {durable_before} durable: \
         attempt {} resumed from step {from} ({} steps lost) {:.1} s after the deletion \
         ({:.1} s after the job's creation)\n  {}",
        before.step,
        resumed.attempt,
        before.step.saturating_sub(from),
        resumed_after.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        line.trim()
    );

    let done = wait_phase(&ns.jobs(), job, Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!(
        done.attempt, resumed.attempt,
        "no further attempt: {done:?}"
    );
    let report = done.progress.expect("the final report").report;
    assert_eq!(report.step, max_steps);
    assert_eq!(
        report.durable_checkpoint.as_ref().map(|d| d.step),
        Some(max_steps),
        "{report:?}"
    );
    if let Some(recovery) = &done.recovery {
        println!(
            "recovery: detect {:?} s, failure to the next first step {:?} s",
            recovery.mean_detect_seconds, recovery.mean_recovery_seconds
        );
    }
    println!(
        "Succeeded {:.1} s after the job's creation",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn a_killed_server_fails_uploads_not_training_and_no_cut_checkpoint_counts() {
    let (ns, s3) = with_bucket("outage", Some(SECRET_KEY)).await;
    let job = "outage";
    // Room for an outage of 15 s (the kubelet's back-off) at 20 steps/s after the first
    // durable checkpoint, and no more: what comes after the server is back is not checked.
    let max_steps = 800;
    let mut spec = job_spec(&s3, 1, max_steps);
    // An upload every few tenths of a second: the kill cuts one.
    spec["trainer"]["checkpoint"]["everySteps"] = json!(10);
    ns.create_job(job, spec).await;
    let rank0 = format!("{job}-0-0");
    let (step_at_kill, durable_at_kill) =
        wait_rank0(&ns, &rank0, "a first durable checkpoint", |p| {
            p.durable_checkpoint.as_ref().map(|d| (p.step, d.step))
        })
        .await;

    let killed_at = Instant::now();
    let restarts = s3.kill(OUTAGE).await;
    // While it is down: rank 0 trains on, its uploads fail.
    let errors = Mutex::new(BTreeSet::new());
    let note_error = |p: &ferrotrain_api::Progress| {
        if let Some(e) = p
            .durable_checkpoint
            .as_ref()
            .and_then(|d| d.upload_error.clone())
        {
            errors.lock().unwrap().insert(e);
        }
    };
    while killed_at.elapsed() < OUTAGE {
        if let Ok(p) = rank0_progress(&ns.client, &ns.name, &rank0).await {
            note_error(&p);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    s3.wait_restarted(restarts).await;
    let down = killed_at.elapsed();
    let at_back = rank0_progress(&ns.client, &ns.name, &rank0)
        .await
        .expect("rank 0's /progress");
    note_error(&at_back);
    assert!(
        at_back.step >= step_at_kill + CHECKPOINT_EVERY,
        "rank 0 was at step {step_at_kill} when the server was killed and at {} when it \
         served again {:.1} s later: training waited on the bucket",
        at_back.step,
        down.as_secs_f64()
    );
    let status = ns.jobs().get(job).await.unwrap().status.unwrap();
    assert_eq!(
        (status.phase, status.attempt, status.restarts),
        (Phase::Running, 0, 0),
        "an upload failure fails no rank: {status:?}"
    );

    // Durable again: a checkpoint saved after the server came back reaches the bucket.
    let (durable_again, step_then) = wait_rank0(
        &ns,
        &rank0,
        "a checkpoint saved after the server came back, durable",
        |p| {
            note_error(p);
            p.durable_checkpoint
                .as_ref()
                .filter(|d| d.step > at_back.step && d.upload_error.is_none())
                .map(|d| (d.step, p.step))
        },
    )
    .await;
    let again_after = killed_at.elapsed();

    let done = wait_phase(&ns.jobs(), job, Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!((done.attempt, done.restarts), (0, 0), "{done:?}");
    let durable = done
        .progress
        .as_ref()
        .and_then(|p| p.report.durable_checkpoint.clone())
        .expect("status.progress.durableCheckpoint");
    assert_eq!(
        (durable.step, &durable.upload_error),
        (max_steps, &None),
        "{durable:?}"
    );

    // Every manifest in the bucket describes files that are there, whole; a step whose
    // upload was cut has none and is not what the status calls durable.
    let (complete, partial, _) = bucket_checkpoints(&s3, job).await;
    assert!(complete.contains(&max_steps), "{complete:?}");
    assert!(!partial.contains(&durable.step));
    let log = rank0_log(&ns, &rank0).await;
    let logged = durable_steps_in_log(&log, &format!("{}/{job}", url()));
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("upload") && (l.contains("WARN") || l.contains("ERROR")))
        .collect();
    println!(
        "server killed at step {step_at_kill} (step {durable_at_kill} durable), serving again \
         {:.1} s later with rank 0 at step {}; step {durable_again} durable again {:.1} s after \
         the kill (rank 0 at step {step_then}); uploadError seen: {:?}; {} upload warnings in \
         rank 0's log (first: {:?}); {} checkpoints durable in all; the bucket at the end: \
         complete {complete:?}, without manifest {partial:?}",
        down.as_secs_f64(),
        at_back.step,
        again_after.as_secs_f64(),
        errors.lock().unwrap(),
        failures.len(),
        failures.first(),
        logged.len()
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn wrong_credentials_fail_the_job_at_once_naming_the_secret() {
    let (ns, s3) = with_bucket("badkey", Some("not-the-servers-secret-key")).await;
    let job = "badkey";
    let started = Instant::now();
    ns.create_job(job, job_spec(&s3, 1, 200)).await;

    let failed = wait_phase(&ns.jobs(), job, Phase::Failed, WAIT).await;
    let took = started.elapsed();
    assert_eq!((failed.attempt, failed.restarts), (0, 0), "{failed:?}");
    let failure = failed.last_failure.as_ref().expect("status.lastFailure");
    assert_eq!(failure.exit_code, Some(INVALID_CONFIG), "{failure:?}");
    assert!(
        failure.message.contains(SECRET),
        "lastFailure does not name Secret {SECRET}: {failure:?}"
    );
    let condition = failed.condition("Failed").expect("condition Failed");
    assert_eq!(condition.status, "True");
    assert!(condition.message.contains(SECRET), "{condition:?}");
    // No restart loop: still failed, on attempt 0 and its pods, a while later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = ns.jobs().get(job).await.unwrap().status.unwrap();
    assert_eq!(
        (later.phase, later.attempt, later.restarts),
        (Phase::Failed, 0, 0),
        "{later:?}"
    );
    let pods = pod_names(&ns.pods(), job).await;
    assert!(
        pods.iter().all(|p| p.starts_with(&format!("{job}-0-"))),
        "{pods:?}"
    );
    println!(
        "a wrong secret key: Failed {:.1} s after the job's creation, exit code {:?}: {}",
        took.as_secs_f64(),
        failure.exit_code,
        failure.message
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn a_missing_secret_holds_the_pods_back_until_it_is_created() {
    let (ns, s3) = with_bucket("nosecret", None).await;
    let job = "nosecret";
    let started = Instant::now();
    ns.create_job(job, job_spec(&s3, 1, 200)).await;

    // What `kubectl describe` shows: the conditions and the events.
    let said = wait_for(
        &format!("the job's conditions or events to name Secret {SECRET}"),
        WAIT,
        || async {
            let conditions: Vec<String> = match ns.jobs().get(job).await {
                Ok(dt) => dt
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .map(|c| {
                        format!(
                            "condition {} {} {}: {}",
                            c.type_, c.status, c.reason, c.message
                        )
                    })
                    .collect(),
                Err(e) => vec![e.to_string()],
            };
            let events = ns
                .events_of(job)
                .await
                .into_iter()
                .map(|(reason, message)| format!("event {reason}: {message}"));
            let all: Vec<String> = conditions.into_iter().chain(events).collect();
            let naming: Vec<String> = all.iter().filter(|l| l.contains(SECRET)).cloned().collect();
            ((!naming.is_empty()).then_some(naming), format!("{all:?}"))
        },
    )
    .await;
    let named_after = started.elapsed();
    assert!(
        said.iter().any(|l| l.contains(STORE_SECRET_MISSING)),
        "not as {STORE_SECRET_MISSING}: {said:?}"
    );
    assert_eq!(pod_names(&ns.pods(), job).await, Vec::<String>::new());
    // It waits; it creates no pod that could not start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(pod_names(&ns.pods(), job).await, Vec::<String>::new());

    create_store_secret(&ns, SECRET, ACCESS_KEY, SECRET_KEY).await;
    let created = Instant::now();
    let stepping = wait_status(
        &ns.jobs(),
        job,
        "steps once the Secret exists",
        TRAIN_WAIT,
        |s| s.progress.as_ref().is_some_and(|p| p.report.step > 0),
    )
    .await;
    let stepping_after = created.elapsed();
    assert_eq!(
        (stepping.attempt, stepping.restarts),
        (0, 0),
        "{stepping:?}"
    );
    let done = wait_phase(&ns.jobs(), job, Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!(done.restarts, 0, "{done:?}");
    println!(
        "without Secret {SECRET}: named {:.1} s after the job's creation, no pod:\n  {}\n\
         with it: steps {:.1} s after its creation, Succeeded {:.1} s after",
        named_after.as_secs_f64(),
        said.join("\n  "),
        stepping_after.as_secs_f64(),
        created.elapsed().as_secs_f64()
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator, the trainer image and the S3 server's (scripts/e2e.sh)"]
async fn a_job_restricting_egress_may_reach_the_store_pods_port_and_no_other() {
    let (ns, s3) = with_bucket("egress", Some(SECRET_KEY)).await;
    let job = "egress";
    let mut spec = job_spec(&s3, 1, 100);
    spec["networkPolicy"] = json!({"restrictEgress": true});
    ns.create_job(job, spec).await;

    let policies: Api<NetworkPolicy> = Api::namespaced(ns.client.clone(), &ns.name);
    let policy = wait_for("the job's NetworkPolicy", WAIT, || async {
        match policies.get_opt(job).await {
            Ok(policy) => (policy, "none yet".to_string()),
            Err(e) => (None, e.to_string()),
        }
    })
    .await;
    let spec = policy.spec.expect("a policy has a spec");
    assert!(
        spec.policy_types.iter().flatten().any(|t| t == "Egress"),
        "{spec:?}"
    );
    let rules = spec.egress.clone().unwrap_or_default();
    println!(
        "the job's egress rules: {}",
        serde_json::to_string_pretty(&rules).unwrap()
    );
    // The cluster kit enforces no NetworkPolicy: the rules are read as a network plugin would.
    let pod = s3.pod().await;
    let namespace = Api::<Namespace>::all(ns.client.clone())
        .get(&ns.name)
        .await
        .expect("the test's namespace");
    let store = Destination {
        namespace_labels: namespace.metadata.labels.unwrap_or_default(),
        pod_labels: pod.metadata.labels.clone().unwrap_or_default(),
        ip: pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
            .expect("the server's pod IP"),
        port: PORT,
        port_name: Some("s3".into()),
        protocol: "TCP".into(),
    };
    assert!(
        egress_allows(&rules, &ns.name, &store),
        "no egress rule lets the job's pods reach the store's pod {:?} on port {PORT}",
        store
    );
    // Only there: the same port of a pod elsewhere is not let out.
    let elsewhere = Destination {
        namespace_labels: BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            "elsewhere".to_string(),
        )]),
        pod_labels: BTreeMap::new(),
        ip: "192.0.2.1".parse().unwrap(),
        ..store.clone()
    };
    assert!(
        !egress_allows(&rules, &ns.name, &elsewhere),
        "restrictEgress lets port {PORT} of any pod out"
    );
}
