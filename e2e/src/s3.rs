//! An S3-compatible server in a test's namespace: the checkpoint bucket of tests/store.rs.
//!
//! s3s-fs (SigV4, multipart uploads, ListObjectsV2, conditional PUTs; the test-only image
//! `ferrotrain/s3-e2e`, which scripts/e2e.sh builds once and loads into the nodes) runs in pod
//! `s3` and serves the directories of an emptyDir as buckets, so a restart of its container
//! keeps them. Pods reach it through the headless Service `s3` on port 9000: the cluster kit
//! routes no ClusterIP, and its DNS answers a headless Service's name with the pods' addresses.
//! The server runs under a shell, so that a test can kill the server process alone (a
//! container's first process ignores the signals it has no handler for, and only the kernel
//! of another namespace may SIGKILL it); the container then exits and the kubelet restarts it.
//!
//! The tests read the bucket through the pod (`find`, `cat`): what the trainer wrote is
//! checked without an S3 client of the tests' own. The namespace goes with the test
//! ([`TestNamespace`]), the server with it.
//!
//! Environment: `FERROTRAIN_E2E_S3_IMAGE`, the server's image (default
//! `ferrotrain/s3-e2e:<S3S_FS_VERSION of docker/versions.env>`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferrotrain_api::checksummed;
use ferrotrain_api::crd::STORE_SECRET_KEYS;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::jobs::copy_job;
use crate::namespace::TestNamespace;
use crate::pods::{exec_bytes, exec_in};
use crate::wait::wait_for;

/// The server's pod, container and headless Service.
pub const NAME: &str = "s3";
/// The server's port (and the name of the pod's port: `s3`).
pub const PORT: u16 = 9000;
/// The credentials the server accepts.
pub const ACCESS_KEY: &str = "ferrotrain-e2e";
pub const SECRET_KEY: &str = "ferrotrain-e2e-secret-key";
/// The region the jobs name (s3s-fs accepts any).
pub const REGION: &str = "us-east-1";
/// Bound of a wait for the server to serve (its image is on the nodes: seconds).
pub const SERVER_WAIT: Duration = Duration::from_secs(120);
/// The pod's label, the Service's selector.
pub(crate) const APP: &str = "ferrotrain-e2e-s3";
/// Where the buckets are: one directory each.
const DATA_DIR: &str = "/data";
/// A file in the data directory that holds the server back this many seconds after its next
/// start (see [`S3Server::kill`]); not a bucket: the server starts after it is gone.
const HOLD_FILE: &str = "/data/.hold-seconds";

/// The server's image: `$FERROTRAIN_E2E_S3_IMAGE`, else what scripts/e2e.sh builds.
pub fn image() -> String {
    std::env::var("FERROTRAIN_E2E_S3_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("ferrotrain/s3-e2e:{}", s3s_fs_version()))
}

/// The s3s-fs version docker/versions.env pins (the image's tag).
fn s3s_fs_version() -> &'static str {
    include_str!("../../docker/versions.env")
        .lines()
        .find_map(|l| l.strip_prefix("S3S_FS_VERSION="))
        .map(str::trim)
        .expect("docker/versions.env pins S3S_FS_VERSION")
}

/// The server in a test's namespace.
pub struct S3Server {
    pods: Api<Pod>,
    namespace: String,
}

impl S3Server {
    /// Starts the server (pod and headless Service `s3`) in the namespace and waits, bounded,
    /// until it serves.
    pub async fn start(ns: &TestNamespace) -> S3Server {
        let started = Instant::now();
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": NAME},
            "spec": {
                "clusterIP": "None",
                "selector": {"app.kubernetes.io/name": APP},
                "ports": [{"name": "s3", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
                // The name resolves while the server restarts: clients see refused
                // connections, as from a crashed server, not a name that comes and goes.
                "publishNotReadyAddresses": true
            }
        }))
        .unwrap();
        Api::<Service>::namespaced(ns.client.clone(), &ns.name)
            .create(&PostParams::default(), &service)
            .await
            .expect("creating the S3 server's Service");
        let pods = ns.pods();
        pods.create(&PostParams::default(), &server_pod())
            .await
            .expect("creating the S3 server's pod");
        let server = S3Server {
            pods,
            namespace: ns.name.clone(),
        };
        server.wait_serving(0).await;
        eprintln!(
            "S3 server {} ({}) serving in {:.1} s",
            server.endpoint(),
            image(),
            started.elapsed().as_secs_f64()
        );
        server
    }

    /// `http://s3.<namespace>.svc.cluster.local:9000`: the endpoint the jobs name.
    pub fn endpoint(&self) -> String {
        format!("http://{NAME}.{}.svc.cluster.local:{PORT}", self.namespace)
    }

    /// `spec.trainer.checkpoint.store` for `url` (`s3://BUCKET/PREFIX`) on this server.
    pub fn store(&self, url: &str) -> Value {
        store_spec(&self.endpoint(), url)
    }

    /// Creates bucket `bucket` (empty).
    pub async fn create_bucket(&self, bucket: &str) {
        check_name(bucket);
        let out = self
            .sh(&format!("mkdir '{DATA_DIR}/{bucket}' && echo made"))
            .await;
        assert_eq!(out.trim(), "made", "creating bucket {bucket}");
    }

    /// The bucket's objects under `prefix` (a key prefix ending at a `/`, or empty): key →
    /// size in bytes.
    pub async fn objects(&self, bucket: &str, prefix: &str) -> BTreeMap<String, u64> {
        check_name(bucket);
        check_name(prefix);
        let start = if prefix.is_empty() { "." } else { prefix };
        // Objects are written to a temporary file outside the bucket, then renamed: a file
        // here is a whole object.
        let out = self
            .sh(&format!(
                "cd '{DATA_DIR}/{bucket}' && {{ find '{start}' -type f -printf '%p\\t%s\\n' 2>/dev/null; true; }}"
            ))
            .await;
        parse_listing(&out)
    }

    /// The bytes of object `key` of `bucket`.
    pub async fn read(&self, bucket: &str, key: &str) -> Vec<u8> {
        check_name(bucket);
        check_name(key);
        exec_bytes(
            &self.pods,
            NAME,
            NAME,
            &format!("cat '{DATA_DIR}/{bucket}/{key}'"),
        )
        .await
    }

    /// Kills the server process (SIGKILL: an upload in flight is cut, no connection closed
    /// cleanly); its container exits and the kubelet starts it again with the same emptyDir,
    /// where it serves `down_for` later (0: at once). Returns the container's restart count
    /// before the kill, for [`Self::wait_restarted`].
    pub async fn kill(&self, down_for: Duration) -> i32 {
        let before = self.restarts().await;
        let script = format!(
            "echo {} > {HOLD_FILE} && \
             for d in /proc/[0-9]*; do \
               if [ \"$(cat $d/comm 2>/dev/null)\" = s3s-fs ]; then kill -KILL ${{d#/proc/}}; fi; \
             done",
            down_for.as_secs()
        );
        // The exec ends with the container (its shell is killed with it): nothing to read.
        let _ = self.sh(&script).await;
        before
    }

    /// Waits until the server serves again after its container restarted (its restart count
    /// above `restarts_before`); returns the count.
    pub async fn wait_restarted(&self, restarts_before: i32) -> i32 {
        self.wait_serving(restarts_before + 1).await
    }

    /// The pod (labels, IP), for the tests of the job's NetworkPolicy.
    pub async fn pod(&self) -> Pod {
        self.pods.get(NAME).await.expect("the S3 server's pod")
    }

    async fn restarts(&self) -> i32 {
        let pod = self.pod().await;
        server_container_restarts(&pod)
    }

    async fn sh(&self, script: &str) -> String {
        exec_in(&self.pods, NAME, NAME, script).await
    }

    /// Waits until the pod is ready with at least `restarts` restarts of its container;
    /// fails at once when its image cannot be had.
    async fn wait_serving(&self, restarts: i32) -> i32 {
        let what = format!("the S3 server (pod {NAME}) serving, restarted {restarts}+ times");
        wait_for(&what, SERVER_WAIT, || async {
            let pod = match self.pods.get_opt(NAME).await {
                Ok(Some(pod)) => pod,
                Ok(None) => return (None, "no pod".to_string()),
                Err(e) => return (None, e.to_string()),
            };
            let status = pod.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let waiting = status
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == NAME)
                .and_then(|c| c.state.as_ref()?.waiting.clone());
            if let Some(w) = &waiting {
                let reason = w.reason.as_deref().unwrap_or_default();
                assert!(
                    !IMAGE_ERRORS.contains(&reason),
                    "the S3 server's image {} is not on the nodes ({reason}: {}); \
                     scripts/e2e.sh builds and loads it (FERROTRAIN_E2E_S3_IMAGE names another)",
                    image(),
                    w.message.as_deref().unwrap_or_default()
                );
            }
            let now = server_container_restarts(&pod);
            let seen = format!(
                "phase {:?}, ready {ready}, restarts {now}, waiting {:?}",
                status.phase,
                waiting.map(|w| w.reason)
            );
            ((ready && now >= restarts).then_some(now), seen)
        })
        .await
    }
}

/// Why a container cannot start for want of its image.
const IMAGE_ERRORS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
];

fn server_container_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == NAME))
        .map_or(0, |c| c.restart_count)
}

/// The server's pod: s3s-fs under a shell (see the module's doc), restricted as Pod Security
/// admission's `restricted` wants, its buckets in an emptyDir.
fn server_pod() -> Pod {
    let serve = format!(
        "if [ -f {HOLD_FILE} ]; then sleep \"$(cat {HOLD_FILE})\"; rm -f {HOLD_FILE}; fi; \
         s3s-fs --host 0.0.0.0 --port {PORT} --access-key \"$ACCESS_KEY\" \
           --secret-key \"$SECRET_KEY\" {DATA_DIR} & \
         wait $!"
    );
    serde_json::from_value(json!({
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": APP}},
        "spec": {
            // Its shell ignores SIGTERM: deleting the pod kills it a second later.
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": NAME,
                "image": image(),
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", serve],
                "env": [
                    {"name": "ACCESS_KEY", "value": ACCESS_KEY},
                    {"name": "SECRET_KEY", "value": SECRET_KEY},
                    // Its start and every refused request, for a failed test's dump.
                    {"name": "RUST_LOG", "value": "info"}
                ],
                "ports": [{"name": "s3", "containerPort": PORT, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                "resources": {
                    "requests": {"cpu": "50m", "memory": "32Mi"},
                    "limits": {"memory": "256Mi"}
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}
                },
                "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}]
            }],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }
    }))
    .unwrap()
}

/// A bucket name or key the tests chose: nothing a shell's single quotes would end.
fn check_name(name: &str) {
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)),
        "not a plain bucket name or key: {name:?}"
    );
}

/// `find -printf '%p\t%s\n'` from a bucket's directory → key → size.
fn parse_listing(out: &str) -> BTreeMap<String, u64> {
    out.lines()
        .filter_map(|line| {
            let (path, size) = line.split_once('\t')?;
            let key = path.strip_prefix("./").unwrap_or(path);
            Some((key.to_string(), size.trim().parse().ok()?))
        })
        .collect()
}

/// Creates the Secret `name` a job's `spec.checkpoint.storeSecretName` names, holding these
/// credentials under the keys the operator hands the pods (STORE_SECRET_KEYS).
pub async fn create_store_secret(
    ns: &TestNamespace,
    name: &str,
    access_key: &str,
    secret_key: &str,
) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "Opaque",
        "stringData": {
            STORE_SECRET_KEYS[0]: access_key,
            STORE_SECRET_KEYS[1]: secret_key
        }
    }))
    .unwrap();
    Api::<Secret>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {name}: {e}"));
}

/// `spec.trainer.checkpoint.store`: bucket `url` (`s3://BUCKET/PREFIX`) on `endpoint`.
pub fn store_spec(endpoint: &str, url: &str) -> Value {
    json!({"url": url, "endpoint": endpoint, "region": REGION})
}

/// The copy job ([`copy_job`]) without a claim, checkpointing to bucket `url` on `endpoint`
/// with the credentials of Secret `secret`: its rank 0's checkpoint directory is an emptyDir,
/// a cache of the bucket.
pub fn store_job(endpoint: &str, url: &str, secret: &str, replicas: i32, max_steps: u64) -> Value {
    let mut spec = copy_job(replicas, max_steps, None);
    spec["trainer"]["checkpoint"]["store"] = store_spec(endpoint, url);
    spec["checkpoint"]["storeSecretName"] = json!(secret);
    spec
}

/// The checkpoints among a bucket's objects (key → size) under `job_prefix`
/// (`<prefix>/<job>`): step → file name → size, from the keys
/// `<job_prefix>/step-XXXXXXXX/<file>`.
pub fn checkpoints_in(
    objects: &BTreeMap<String, u64>,
    job_prefix: &str,
) -> BTreeMap<u64, BTreeMap<String, u64>> {
    let mut steps: BTreeMap<u64, BTreeMap<String, u64>> = BTreeMap::new();
    for (key, size) in objects {
        let Some(rest) = key
            .strip_prefix(job_prefix)
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let Some((dir, file)) = rest.split_once('/') else {
            continue;
        };
        let Some(step) = dir
            .strip_prefix("step-")
            .filter(|d| d.len() == 8)
            .and_then(|d| d.parse().ok())
        else {
            continue;
        };
        if !file.contains('/') {
            steps.entry(step).or_default().insert(file.into(), *size);
        }
    }
    steps
}

/// The name `<job_prefix>/step-XXXXXXXX` of a step's checkpoint.
pub fn step_prefix(job_prefix: &str, step: u64) -> String {
    format!("{job_prefix}/step-{step:08}")
}

/// One file a manifest names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestFile {
    pub name: String,
    pub size: u64,
    /// CRC-32C, 8 hex digits.
    pub crc32c: String,
}

/// Checks checkpoint `step`'s manifest.json (`bytes`) against the files the bucket holds in
/// its directory (name → size): it is intact (its own CRC-32C), names this step, and every
/// file it lists is there at its size. Returns the files it lists.
pub fn check_manifest(
    step: u64,
    bytes: &[u8],
    listed: &BTreeMap<String, u64>,
) -> Result<Vec<ManifestFile>, String> {
    match checksummed::verify(bytes, checksummed::CRC_FIELD)? {
        checksummed::Seal::Intact => {}
        checksummed::Seal::Absent => return Err("the manifest has no crc32c".into()),
    }
    let manifest: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if manifest["step"].as_u64() != Some(step) {
        return Err(format!("it names step {}", manifest["step"]));
    }
    let files = manifest["files"]
        .as_array()
        .ok_or("it lists no files")?
        .iter()
        .map(|f| {
            Some(ManifestFile {
                name: f["name"].as_str()?.to_string(),
                size: f["size"].as_u64()?,
                crc32c: f["crc32c"].as_str()?.to_string(),
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or("a file without name, size or crc32c")?;
    for file in &files {
        match listed.get(&file.name) {
            None => return Err(format!("{} is not in the bucket", file.name)),
            Some(size) if *size != file.size => {
                return Err(format!(
                    "{} holds {size} bytes, the manifest says {}",
                    file.name, file.size
                ));
            }
            Some(_) => {}
        }
    }
    Ok(files)
}

/// CRC-32C as manifests write it.
pub fn crc32c_hex(bytes: &[u8]) -> String {
    format!("{:08x}", crc32c::crc32c(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::distributed_training;

    #[test]
    fn the_image_is_tagged_with_the_pinned_server_version() {
        let version = s3s_fs_version();
        assert!(
            version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
            "{version}"
        );
        if std::env::var("FERROTRAIN_E2E_S3_IMAGE").is_err() {
            assert_eq!(image(), format!("ferrotrain/s3-e2e:{version}"));
        }
    }

    /// The store jobs get past the schema's types and the trainer's own validation.
    #[test]
    fn the_store_job_is_valid() {
        let spec = store_job(
            "http://s3.ns.svc.cluster.local:9000",
            "s3://ckpt/runs",
            "s3-creds",
            1,
            300,
        );
        let dt = distributed_training("job", "ns", spec.clone());
        let config = dt.spec.trainer.clone().expect("a trainer config");
        assert_eq!(config.validate(), Vec::new(), "{spec}");
        let store = config.checkpoint.store.expect("a store");
        assert_eq!(store.url, "s3://ckpt/runs");
        assert_eq!(store.region.as_deref(), Some(REGION));
        let checkpoint = dt.spec.checkpoint.expect("spec.checkpoint");
        assert_eq!(checkpoint.store_secret_name.as_deref(), Some("s3-creds"));
        assert_eq!(checkpoint.claim_name, None);
    }

    #[test]
    fn the_server_pod_mounts_its_buckets_and_holds_on_request() {
        let pod = serde_json::to_value(server_pod()).unwrap();
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["volumeMounts"][0]["mountPath"], DATA_DIR);
        assert_eq!(pod["spec"]["volumes"][0]["emptyDir"], json!({}));
        let script = container["command"][2].as_str().unwrap();
        assert!(
            script.starts_with(&format!("if [ -f {HOLD_FILE} ]")),
            "{script}"
        );
        assert!(
            script.contains("& wait $!"),
            "s3s-fs is not the first process: {script}"
        );
        assert!(HOLD_FILE.starts_with(DATA_DIR));
    }

    #[test]
    fn listings_parse_into_checkpoints() {
        let listing = parse_listing(
            "runs/job/fence.json\t300\n\
             runs/job/step-00000050/model.safetensors\t1000\n\
             runs/job/step-00000050/manifest.json\t400\n\
             runs/job/step-00000100/model.safetensors\t1000\n\
             runs/other/step-00000050/model.safetensors\t9\n\
             runs/job/step-50/model.safetensors\t9\n\
             ./runs/job/step-00000100/trainer.json\t20\n",
        );
        assert_eq!(listing["runs/job/step-00000100/trainer.json"], 20);
        let steps = checkpoints_in(&listing, "runs/job");
        assert_eq!(steps.keys().copied().collect::<Vec<_>>(), [50, 100]);
        assert_eq!(steps[&50]["manifest.json"], 400);
        assert_eq!(steps[&100].len(), 2);
        assert_eq!(step_prefix("runs/job", 50), "runs/job/step-00000050");
    }

    fn manifest(step: u64, size: u64) -> Vec<u8> {
        let value = json!({
            "step": step,
            "files": [{"name": "model.safetensors", "size": size, "crc32c": crc32c_hex(b"m")}],
            "writer": {"attempt": 0},
            "time": "2026-12-02T05:00:00Z"
        });
        checksummed::seal(&value, checksummed::CRC_FIELD).unwrap()
    }

    #[test]
    fn a_manifest_counts_only_intact_and_with_its_files_at_their_sizes() {
        let listed = BTreeMap::from([("model.safetensors".to_string(), 1000)]);
        let files = check_manifest(50, &manifest(50, 1000), &listed).unwrap();
        assert_eq!(files[0].name, "model.safetensors");
        assert_eq!(files[0].crc32c, crc32c_hex(b"m"));
        let e = check_manifest(50, &manifest(50, 999), &listed).unwrap_err();
        assert!(e.contains("holds 1000 bytes"), "{e}");
        let e = check_manifest(60, &manifest(50, 1000), &listed).unwrap_err();
        assert!(e.contains("step 50"), "{e}");
        let e = check_manifest(50, &manifest(50, 1000), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("not in the bucket"), "{e}");
        let damaged = String::from_utf8(manifest(50, 1000))
            .unwrap()
            .replace("1000", "1001");
        assert!(check_manifest(50, damaged.as_bytes(), &listed).is_err());
        let unsealed = serde_json::to_vec(&json!({"step": 50, "files": []})).unwrap();
        assert!(check_manifest(50, &unsealed, &listed).is_err());
    }
}
