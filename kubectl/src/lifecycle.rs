//! `suspend`, `resume`, `delete`: one request each. Suspend and resume set `spec.suspend` with a
//! merge patch (the operator deletes the pods, or starts a new attempt from the latest
//! checkpoint); delete deletes the object, and the pods go with it (they are its children).

use ferrotrain_api::crd::{DistributedTraining, GROUP};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::connect::Cluster;
use crate::error::{Error, Result};
use crate::submit::FIELD_MANAGER;

fn jobs(cluster: &Cluster) -> Api<DistributedTraining> {
    Api::namespaced(cluster.client.clone(), &cluster.namespace)
}

fn not_found(cluster: &Cluster, name: &str) -> impl FnOnce(kube::Error) -> Error {
    let (name, namespace) = (name.to_string(), cluster.namespace.clone());
    move |e| match e {
        kube::Error::Api(ref status) if status.is_not_found() => {
            Error::NotFound { name, namespace }
        }
        other => Error::api(format!("changing {name}"))(other),
    }
}

/// Sets `spec.suspend` of job `name`.
pub async fn set_suspend(cluster: &Cluster, name: &str, suspend: bool) -> Result<()> {
    let patch = json!({"spec": {"suspend": suspend}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    jobs(cluster)
        .patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(not_found(cluster, name))?;
    let done = if suspend { "suspended" } else { "resumed" };
    println!("distributedtraining.{GROUP}/{name} {done}");
    Ok(())
}

/// Deletes job `name`.
pub async fn delete(cluster: &Cluster, name: &str) -> Result<()> {
    jobs(cluster)
        .delete(name, &DeleteParams::background())
        .await
        .map_err(not_found(cluster, name))?;
    println!("distributedtraining.{GROUP}/{name} deleted");
    Ok(())
}
