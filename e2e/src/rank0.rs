//! Rank 0's own HTTP server (`/progress`, `/metrics`), read through the API server's pod
//! proxy: fresher than the job's status, which the operator refreshes every few seconds.

use std::time::Duration;

use ferrotrain_api::Progress;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;

use crate::namespace::TestNamespace;
use crate::wait::{WAIT, wait_for};

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
