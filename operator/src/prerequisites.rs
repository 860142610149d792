//! What a launch reads from the cluster before it builds the gang's objects: the Secret
//! `spec.checkpoint.storeSecretName` (no pod is created until it holds the keys the pods
//! need: a pod whose variable names a missing Secret or key would hold its node and GPUs in
//! CreateContainerConfigError) and the Service the checkpoint store's endpoint names (its pods'
//! selector and ports, for the NetworkPolicy's egress rule).

use std::collections::{BTreeMap, BTreeSet};

use ferrotrain_api::crd::{DistributedTrainingSpec, STORE_SECRET_KEYS};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, GetParams};
use serde::Deserialize;
use serde::de::IgnoredAny;
use tracing::debug;

use crate::context::Context;
use crate::error::{Result, api_err, is_status};
use crate::objects::{self, Owner, StoreService};

/// Whether a launch may go on.
#[derive(Debug, PartialEq)]
pub enum Ready {
    /// Build and create, with the store's Service as read (None: the endpoint names none, the
    /// gang's objects exist already, or the Service could not be read).
    Go(Option<StoreService>),
    /// Create nothing yet: why (the store's Secret is missing, or a key of it).
    Wait(String),
}

/// Checks the store's Secret when a pod of `node_ranks` gets its credentials, and reads the
/// store's Service when the gang's objects are to be applied (`objects_due`).
pub async fn check(
    ctx: &Context,
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    node_ranks: &[i32],
    objects_due: bool,
) -> Result<Ready> {
    if let Some(name) = secret_to_check(spec, node_ranks) {
        let keys = secret_keys(ctx, &owner.namespace, name).await?;
        if let Some(problem) = secret_problem(&owner.namespace, name, keys.as_ref()) {
            return Ok(Ready::Wait(problem));
        }
    }
    let service = match objects::service_to_read(spec, &owner.namespace) {
        Some((name, namespace)) if objects_due => store_service(ctx, &namespace, &name).await?,
        _ => None,
    };
    Ok(Ready::Go(service))
}

/// The store's Secret a launch of `node_ranks` must find first: `spec.checkpoint.storeSecretName`
/// when one of them gets its credentials (the pod that writes checkpoints); else none.
pub fn secret_to_check<'s>(
    spec: &'s DistributedTrainingSpec,
    node_ranks: &[i32],
) -> Option<&'s str> {
    let name = spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.store_secret_name.as_deref())?;
    node_ranks
        .iter()
        .any(|&rank| objects::mounts_checkpoint_volume(spec, rank))
        .then_some(name)
}

/// Why the pods cannot start with the store's Secret `name` holding `keys` (None: it does not
/// exist); None when it holds every key they need.
pub fn secret_problem(
    namespace: &str,
    name: &str,
    keys: Option<&BTreeSet<String>>,
) -> Option<String> {
    let secret = format!(
        "the checkpoint store's Secret {namespace}/{name} (spec.checkpoint.storeSecretName)"
    );
    let Some(keys) = keys else {
        return Some(format!(
            "{secret} does not exist: no pod is created until it does"
        ));
    };
    let missing: Vec<&str> = STORE_SECRET_KEYS
        .iter()
        .copied()
        .filter(|key| !keys.contains(*key))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{secret} has no key {}: no pod is created until it has {}",
            missing.join(" and no key "),
            STORE_SECRET_KEYS.join(" and ")
        )
    })
}

/// A Secret's key names. Its values are skipped while the answer is parsed, never kept.
#[derive(Deserialize)]
struct SecretKeys {
    #[serde(default)]
    data: BTreeMap<String, IgnoredAny>,
}

/// The key names of Secret `namespace/name`; None when it does not exist.
async fn secret_keys(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeSet<String>>> {
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/secrets"))
        .get(name, &GetParams::default())
        .map_err(|e| api_err("get", "Secret", name)(kube::Error::BuildRequest(e)))?;
    // Not `Client::request`: it logs the whole answer when it does not parse.
    let text = match ctx.client.request_text(request).await {
        Ok(text) => text,
        Err(e) if is_status(&e, 404) => return Ok(None),
        Err(e) => return Err(api_err("get", "Secret", name)(e)),
    };
    let secret: SecretKeys = serde_json::from_str(&text)
        .map_err(|e| api_err("get", "Secret", name)(kube::Error::SerdeError(e)))?;
    Ok(Some(secret.data.into_keys().collect()))
}

/// The store's Service `namespace/name` as the egress rule needs it; None when it does not
/// exist or the operator may not read it (RBAC limited to `watchNamespace`): the rule then
/// names the Service's namespace.
async fn store_service(ctx: &Context, namespace: &str, name: &str) -> Result<Option<StoreService>> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let service = match api.get_opt(name).await {
        Ok(service) => service,
        Err(e) if is_status(&e, 403) => {
            debug!(service = name, %namespace, "may not read the checkpoint store's Service");
            None
        }
        Err(e) => return Err(api_err("get", "Service", name)(e)),
    };
    Ok(service.as_ref().map(StoreService::of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_secret_must_exist_and_hold_both_keys() {
        let keys = |names: &[&str]| names.iter().map(|k| k.to_string()).collect();
        let problem = |keys: Option<BTreeSet<String>>| secret_problem("ml", "creds", keys.as_ref());
        assert_eq!(
            problem(None).unwrap(),
            "the checkpoint store's Secret ml/creds (spec.checkpoint.storeSecretName) does not exist: no pod is created until it does"
        );
        assert_eq!(
            problem(Some(keys(&["AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"]))).unwrap(),
            "the checkpoint store's Secret ml/creds (spec.checkpoint.storeSecretName) has no key AWS_SECRET_ACCESS_KEY: no pod is created until it has AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        );
        let neither = problem(Some(keys(&["aws_access_key_id"]))).unwrap();
        assert!(
            neither.contains("has no key AWS_ACCESS_KEY_ID and no key AWS_SECRET_ACCESS_KEY"),
            "{neither}"
        );
        // The session token is optional.
        assert_eq!(
            problem(Some(keys(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]))),
            None
        );
    }

    #[test]
    fn the_secret_is_checked_only_for_a_launch_of_the_pod_that_writes_checkpoints() {
        let mut spec = crate::fixtures::spec();
        assert_eq!(secret_to_check(&spec, &[0, 1]), None, "no store");
        spec.checkpoint = Some(
            serde_json::from_value(serde_json::json!({
                "claimName": "ckpt", "storeSecretName": "creds"
            }))
            .unwrap(),
        );
        let writer = (0..2).find(|&r| objects::mounts_checkpoint_volume(&spec, r));
        let other = (0..2).find(|&r| !objects::mounts_checkpoint_volume(&spec, r));
        let (writer, other) = (writer.expect("a writer"), other.expect("a reader"));
        assert_eq!(secret_to_check(&spec, &[writer]), Some("creds"));
        assert_eq!(secret_to_check(&spec, &[other, writer]), Some("creds"));
        assert_eq!(
            secret_to_check(&spec, &[other]),
            None,
            "a replacement that writes nothing"
        );
    }

    #[test]
    fn a_secrets_values_are_not_kept() {
        let secret: SecretKeys = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
            "data": {"AWS_ACCESS_KEY_ID": "QUtJQQ==", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0"}
        }))
        .unwrap();
        let keys: Vec<String> = secret.data.into_keys().collect();
        assert_eq!(keys, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]);
        let empty: SecretKeys =
            serde_json::from_value(serde_json::json!({"kind": "Secret"})).unwrap();
        assert!(empty.data.is_empty());
    }
}
