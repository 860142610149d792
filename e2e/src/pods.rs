//! A job's pods: listed by its label, what backs their volumes, commands run in their
//! containers (`sh -c` through the exec API).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

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
