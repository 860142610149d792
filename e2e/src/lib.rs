//! Helpers shared by the end-to-end tests in tests/: a namespace per test that is deleted
//! however the test ends, bounded waits that say what they last saw, and the jobs the tests
//! run (the real trainer on the synthetic copy task, small enough for a laptop's kind cluster).
//!
//! Environment:
//! - `KUBECONFIG`: the cluster, with the operator installed (e2e/kind.sh sets both up).
//! - `FERROTRAIN_E2E_IMAGE`: the trainer image; unset, jobs use the operator's default
//!   (`--trainer-image`, the chart's `trainerImage`).
//! - `FERROTRAIN_E2E_S3_IMAGE`: the S3 server of the checkpoint-bucket tests ([`s3`]); unset,
//!   `ferrotrain/s3-e2e:<S3S_FS_VERSION of docker/versions.env>` (scripts/e2e.sh builds and
//!   loads it).
//! - `FERROTRAIN_E2E_KEEP=1`: keep each test's namespace for a post-mortem.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase};
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::{Value, json};

pub mod fleet;
pub mod hollow;
pub mod pages;
pub mod partition;
pub mod plugin;
pub mod rounds;
pub mod s3;

/// Bound of a wait for the operator (pods created, phases, restarts).
pub const WAIT: Duration = Duration::from_secs(300);
/// Bound of a wait for training (image pull on a cold node, start-up, hundreds of steps).
pub const TRAIN_WAIT: Duration = Duration::from_secs(600);
/// `spec.trainer.checkpoint.everySteps` of the test jobs: the most steps a resume may lose.
pub const CHECKPOINT_EVERY: u64 = 50;

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

/// Polls `check` every second until it returns Some, or panics after `limit` naming `what`
/// and the last observation.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
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

/// Waits until the job's status satisfies `done`; returns that status.
pub async fn wait_status(
    jobs: &Api<DistributedTraining>,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&DistributedTrainingStatus) -> bool,
) -> DistributedTrainingStatus {
    wait_for(&format!("{name}: {what}"), limit, || async {
        match jobs.get_opt(name).await {
            Ok(Some(dt)) => {
                let seen = serde_json::to_string(&dt.status).unwrap_or_default();
                (dt.status.filter(|s| done(s)), seen)
            }
            Ok(None) => (None, "the job does not exist".into()),
            Err(e) => (None, e.to_string()),
        }
    })
    .await
}

/// Waits until the job runs with a first checkpoint in its status (of step
/// `CHECKPOINT_EVERY` or later, on attempt 0); returns that status.
pub async fn wait_first_checkpoint(ns: &TestNamespace, job: &str) -> DistributedTrainingStatus {
    wait_status(&ns.jobs(), job, "a first checkpoint", TRAIN_WAIT, |s| {
        s.phase == Phase::Running
            && s.attempt == 0
            && s.progress
                .as_ref()
                .and_then(|p| p.report.last_checkpoint.as_ref())
                .is_some_and(|c| c.step >= CHECKPOINT_EVERY)
    })
    .await
}

/// Polls rank 0's own report (pod `pod`, through the pod proxy: fresher than the status)
/// until `pick` finds what the caller waits for (`what`); returns it.
pub async fn wait_rank0<T>(
    ns: &TestNamespace,
    pod: &str,
    what: &str,
    pick: impl Fn(&Progress) -> Option<T>,
) -> T {
    wait_for(what, WAIT, || async {
        match rank0_progress(&ns.client, &ns.name, pod).await {
            Ok(p) => (
                pick(&p),
                format!(
                    "round {} world size {} step {}",
                    p.round, p.world_size, p.step
                ),
            ),
            Err(e) => (None, e),
        }
    })
    .await
}

/// Waits until the job is in `phase`.
pub async fn wait_phase(
    jobs: &Api<DistributedTraining>,
    name: &str,
    phase: Phase,
    limit: Duration,
) -> DistributedTrainingStatus {
    wait_status(jobs, name, &format!("phase {phase}"), limit, |s| {
        s.phase == phase
    })
    .await
}

/// The job's pods, sorted by name.
pub async fn pods_of(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    let mut list = pods
        .list(&ListParams::default().labels(&format!("ferrotrain.dev/job={job}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    list
}

/// The names of the job's pods, sorted.
pub async fn pod_names(pods: &Api<Pod>, job: &str) -> Vec<String> {
    pods_of(pods, job)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// What backs the pod's volume mounted at `path`: `claim <name>`, `emptyDir` or `other`.
pub fn volume_at(pod: &Pod, path: &str) -> String {
    let spec = pod.spec.as_ref().expect("a pod has a spec");
    let Some(mount) = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == path)
    else {
        return "nothing".into();
    };
    let volume = spec.volumes.iter().flatten().find(|v| v.name == mount.name);
    match volume {
        Some(v) if v.persistent_volume_claim.is_some() => format!(
            "claim {}",
            v.persistent_volume_claim.as_ref().unwrap().claim_name
        ),
        Some(v) if v.empty_dir.is_some() => "emptyDir".into(),
        _ => "other".into(),
    }
}

/// Rank 0's own /progress, read through the API server's pod proxy: fresher than the status,
/// which the operator refreshes every few seconds.
pub async fn rank0_progress(client: &Client, ns: &str, pod: &str) -> Result<Progress, String> {
    let text = rank0_get(client, ns, pod, "progress").await?;
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

/// `path` (progress, metrics) of rank 0's HTTP server, through the API server's pod proxy.
pub async fn rank0_get(client: &Client, ns: &str, pod: &str, path: &str) -> Result<String, String> {
    let port = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| {
            s.containers[0].env.iter().flatten().find_map(|e| {
                (e.name == ferrotrain_api::env::FERROTRAIN_METRICS_PORT)
                    .then(|| e.value.clone())
                    .flatten()
            })
        })
        .unwrap_or_else(|| "9090".into());
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/{path}"
    ))
    .body(Vec::new())
    .map_err(|e| e.to_string())?;
    // Bounded: a proxy to a pod that was just replaced under the same name can hang on the
    // old pod's address for minutes.
    match tokio::time::timeout(PROXY_TIMEOUT, client.request_text(request)).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "no answer through the pod proxy within {PROXY_TIMEOUT:?}"
        )),
    }
}

/// How long one request through the API server's pod proxy may take.
const PROXY_TIMEOUT: Duration = Duration::from_secs(3);

/// The trainer image of the test jobs, when $FERROTRAIN_E2E_IMAGE names one.
pub fn trainer_image() -> Option<String> {
    std::env::var("FERROTRAIN_E2E_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
}

/// A DistributedTraining object.
pub fn distributed_training(name: &str, ns: &str, spec: Value) -> DistributedTraining {
    serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("not a valid DistributedTraining spec: {e}"))
}

/// The spec of examples/copy-dt.yaml's job, as users get it: the copy task on CPU pods of one
/// rank each (25-60 steps/s with one thread per rank on this project's 2-core machine), with
/// the example's checkpoints ([`CHECKPOINT_EVERY`]), restart policy, elastic world size,
/// timeouts and the Kubernetes defaults it leaves alone (the pods' termination grace), on
/// `replicas` pods, for `max_steps`, its checkpoints on `claim` (when given; else the pod's
/// own disk). Tests change only what they are about.
pub fn copy_job(replicas: i32, max_steps: u64, claim: Option<&str>) -> Value {
    let mut spec = example_spec();
    spec["replicas"] = json!(replicas);
    spec["trainer"]["maxSteps"] = json!(max_steps);
    spec["checkpoint"] = json!({});
    if let Some(claim) = claim {
        spec["checkpoint"]["claimName"] = json!(claim);
    }
    if let Some(image) = trainer_image() {
        spec["image"] = json!(image);
    }
    spec
}

/// The spec of the DistributedTraining in examples/copy-dt.yaml.
fn example_spec() -> Value {
    let text = include_str!("../../examples/copy-dt.yaml");
    let job = text
        .split("\n---\n")
        .find(|doc| doc.contains("kind: DistributedTraining"))
        .expect("examples/copy-dt.yaml has a DistributedTraining");
    let object: Value = serde_saphyr::from_str(job).expect("examples/copy-dt.yaml parses");
    object["spec"].clone()
}

/// A copy job the schema and the operator accept but the trainer refuses at start with exit
/// code 2 (invalid config): `device: cuda` on CPU pods.
pub fn config_error_job() -> Value {
    let mut spec = copy_job(2, 100, None);
    spec["trainer"]["device"] = json!("cuda");
    spec
}

/// A translation job whose training files do not exist: the trainer exits 3 (invalid data)
/// before the rendezvous, naming `data.train.source`.
pub fn missing_data_job() -> Value {
    let mut spec = copy_job(2, 100, None);
    spec["trainer"]["task"] = json!("translation");
    spec["trainer"]["data"] = json!({
        "train": {"source": "missing/train.en", "target": "missing/train.de"},
        // Sentences must fit the model's 32 positions.
        "maxSentenceTokens": 30
    });
    spec
}

/// The value at a printer column's JSONPath (`.status.progress.step`) of the object.
pub fn at_json_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(object, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

/// Runs `sh -c script` in the pod's trainer container; returns its stdout.
pub async fn exec(pods: &Api<Pod>, pod: &str, script: &str) -> String {
    exec_in(pods, pod, "trainer", script).await
}

/// Runs `sh -c script` in container `container` of the pod; returns its stdout as text.
pub async fn exec_in(pods: &Api<Pod>, pod: &str, container: &str, script: &str) -> String {
    String::from_utf8_lossy(&exec_bytes(pods, pod, container, script).await).into_owned()
}

/// Runs `sh -c script` in container `container` of the pod; returns its stdout's bytes (a
/// file's, for example: the exec stream carries them as they are).
pub async fn exec_bytes(pods: &Api<Pod>, pod: &str, container: &str, script: &str) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let params = kube::api::AttachParams::default()
        .container(container)
        .stderr(false);
    let mut process = pods
        .exec(pod, ["sh", "-c", script], &params)
        .await
        .unwrap_or_else(|e| panic!("exec in {pod}/{container}: {e}"));
    let mut out = Vec::new();
    if let Some(mut stdout) = process.stdout() {
        let _ = stdout.read_to_end(&mut out).await;
    }
    let _ = process.join().await;
    out
}

/// Kills (SIGKILL) the launcher of the pod with UID `uid`, the container's first process,
/// from this machine: the cluster kit's kubelets run here, so its containers' processes are
/// this machine's (found by the POD_UID the operator gives them). A process cannot SIGKILL
/// its own container's init from inside; the node's OOM killer or an operator can.
pub fn kill_launcher_from_host(uid: &str) -> u32 {
    let pid = launcher_pid(uid);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -KILL {pid}");
    pid
}

/// The launcher processes (`ferrotrain launch`) of the pod with UID `uid` among this
/// machine's processes: the cluster kit runs its nodes' containers here.
pub fn launchers_of(uid: &str) -> Vec<u32> {
    processes_of(uid, "launch")
}

/// The trainer processes (`ferrotrain run`) of the pod with UID `uid` that train or wait in
/// a round: not the spares waiting for the next one (process name ft-spare).
pub fn trainers_of(uid: &str) -> Vec<u32> {
    processes_of(uid, "run")
        .into_iter()
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim() != "ft-spare"
        })
        .collect()
}

/// This machine's `ferrotrain <subcommand>` processes of the pod with UID `uid` (found by
/// the POD_UID the operator gives its container, which its launcher's ranks inherit).
fn processes_of(uid: &str, subcommand: &str) -> Vec<u32> {
    let wanted = format!("POD_UID={uid}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let cmdline = read("cmdline");
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it = argv.first().is_some_and(|a| a.ends_with(b"ferrotrain"))
            && argv.get(1) == Some(&subcommand.as_bytes());
        let environ = read("environ");
        let of_pod = environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
        if is_it && of_pod {
            found.push(pid);
        }
    }
    found
}

/// The one launcher of the pod with UID `uid` (see [`launchers_of`]).
pub fn launcher_pid(uid: &str) -> u32 {
    let found = launchers_of(uid);
    assert_eq!(
        found.len(),
        1,
        "the launcher of pod {uid} among this machine's processes (the kit runs its nodes here)"
    );
    found[0]
}

/// The pid of the spare trainer (process name ft-spare, launch/spare.rs) waiting in `pod`'s
/// trainer container for the next round, once its agent has started one (bounded wait).
pub async fn wait_spare(pods: &Api<Pod>, pod: &str) -> u32 {
    let script = "for d in /proc/[0-9]*; do \
                    [ \"$(cat $d/comm 2>/dev/null)\" = ft-spare ] && echo ${d#/proc/}; \
                  done; true";
    wait_for(&format!("a spare trainer in {pod}"), WAIT, || async {
        let out = exec(pods, pod, script).await;
        (
            out.trim()
                .lines()
                .next()
                .and_then(|l| l.trim().parse().ok()),
            out,
        )
    })
    .await
}

/// Sends `signal` (KILL, STOP, ...) to the trainer process (`ferrotrain run`) of the pod, not
/// to its launcher; returns the pid it signalled.
pub async fn signal_trainer(pods: &Api<Pod>, pod: &str, signal: &str) -> u32 {
    signal_local_rank(pods, pod, None, signal).await
}

/// Sends `signal` to the trainer of local rank `local_rank` of the pod (its LOCAL_RANK; any
/// trainer when none), not to its launcher nor a spare; returns the pid it signalled.
pub async fn signal_local_rank(
    pods: &Api<Pod>,
    pod: &str,
    local_rank: Option<usize>,
    signal: &str,
) -> u32 {
    // argv[0] a ferrotrain binary and argv[1] `run`: the launcher (`launch`) and this very
    // shell (whose script names the pattern) are left alone, and so are spares waiting for
    // the next round (process name ft-spare, launch/spare.rs). A round's trainer that was a
    // spare keeps the environment it started with, its LOCAL_RANK among it.
    let rank_test = match local_rank {
        Some(r) => format!("&& tr '\\0' '\\n' < $d/environ | grep -qx LOCAL_RANK={r} "),
        None => String::new(),
    };
    let script = format!(
        "for d in /proc/[0-9]*; do \
           set -- $(tr '\\0' ' ' < $d/cmdline 2>/dev/null); \
           if [ \"${{1##*/}}\" = ferrotrain ] && [ \"$2\" = run ] \
              && [ \"$(cat $d/comm 2>/dev/null)\" != ft-spare ] {rank_test}; then \
             kill -{signal} ${{d#/proc/}} && echo ${{d#/proc/}}; \
           fi; \
         done"
    );
    let out = exec(pods, pod, &script).await;
    out.trim()
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no trainer process to signal in {pod}: {out:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_jobs_are_the_example_as_shipped_but_for_their_length_and_claim() {
        let spec = copy_job(2, 123, Some("claim"));
        let mut example = example_spec();
        example["trainer"]["maxSteps"] = json!(123);
        example["checkpoint"] = json!({"claimName": "claim"});
        if let Some(image) = trainer_image() {
            example["image"] = json!(image);
        }
        assert_eq!(spec, example);
        // No tuned grace, backoff or heartbeat: what users get.
        assert!(spec.get("podTemplate").is_none(), "{spec}");
        assert_eq!(
            spec["restartPolicy"],
            json!({"maxRestarts": 5, "backoffSeconds": 5})
        );
    }

    /// The jobs the tests run get past the schema's types and the trainer's own validation
    /// (which the operator applies before creating pods): the config-error tests must fail
    /// in the trainer, not earlier.
    #[test]
    fn the_test_jobs_pass_the_trainers_validation() {
        let plain = copy_job(2, 2000, Some("claim"));
        for spec in [plain, config_error_job(), missing_data_job()] {
            let dt = distributed_training("job", "ns", spec.clone());
            let config = dt.spec.trainer.clone().expect("a trainer config");
            assert_eq!(config.validate(), Vec::new(), "{spec}");
            assert_eq!(config.checkpoint.every_steps, CHECKPOINT_EVERY);
        }
    }

    #[test]
    fn printer_column_paths_resolve_only_when_set() {
        let object =
            json!({"status": {"phase": "Running", "restarts": 0, "progress": {"step": 5}}});
        assert_eq!(
            at_json_path(&object, ".status.phase"),
            Some(&json!("Running"))
        );
        assert_eq!(at_json_path(&object, ".status.restarts"), Some(&json!(0)));
        assert_eq!(
            at_json_path(&object, ".status.progress.step"),
            Some(&json!(5))
        );
        assert_eq!(at_json_path(&object, ".status.progress.loss"), None);
        assert_eq!(
            at_json_path(
                &json!({"status": {"progress": {"loss": null}}}),
                ".status.progress.loss"
            ),
            None
        );
    }
}
