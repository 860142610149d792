//! Who is who on the API server during a bench: a ServiceAccount per measured party (the
//! operators, the hollow nodes) with its RBAC and a kubeconfig of its own, and FlowSchemas
//! matching each one's requests so that the API server itself counts them
//! (`apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`). Also the
//! ValidatingAdmissionPolicies a bench or a test uses to refuse pods or fence off a client.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

/// A cluster-scoped object by its API (for creating and deleting by name).
pub fn cluster_api(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let api_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version,
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::all_with(client.clone(), &resource)
}

pub fn flow_schemas(client: &Client) -> Api<DynamicObject> {
    cluster_api(
        client,
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
        "flowschemas",
    )
}

pub fn cluster_roles(client: &Client) -> Api<DynamicObject> {
    cluster_api(
        client,
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
    )
}

pub fn cluster_role_bindings(client: &Client) -> Api<DynamicObject> {
    cluster_api(
        client,
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
    )
}

pub fn admission_policies(client: &Client) -> Api<DynamicObject> {
    cluster_api(
        client,
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    )
}

pub fn admission_policy_bindings(client: &Client) -> Api<DynamicObject> {
    cluster_api(
        client,
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    )
}

/// Creates `value` with `api` (replacing an object of the same name left by an earlier run).
pub async fn create_fresh(api: &Api<DynamicObject>, value: Value) -> Result<(), String> {
    let object: DynamicObject = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let _ = api.delete(&name, &DeleteParams::default()).await;
    for _ in 0..50 {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            // The old one still being deleted.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("creating {name}: {e}")),
        }
    }
    Err(format!("creating {name}: an object of that name stays"))
}

/// A ServiceAccount in `ns` with a token, and a kubeconfig file for it in `dir`.
pub async fn service_account_kubeconfig(
    client: &Client,
    ns: &str,
    name: &str,
    dir: &Path,
) -> Result<PathBuf, String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a ServiceAccount");
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating ServiceAccount {ns}/{name}: {e}")),
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(4 * 3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("a token for {ns}/{name}: {e}"))?
        .status
        .map(|s| s.token)
        .ok_or_else(|| format!("no token for {ns}/{name}"))?;
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig_with_token(&token, ns)?).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The current kubeconfig's cluster with a bearer token as its user (JSON: valid YAML).
fn kubeconfig_with_token(token: &str, ns: &str) -> Result<String, String> {
    let config =
        kube::config::Kubeconfig::read().map_err(|e| format!("reading the kubeconfig: {e}"))?;
    let context_name = config.current_context.clone().unwrap_or_default();
    let cluster_name = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or("the kubeconfig has no current context")?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or("the kubeconfig's current cluster is missing")?;
    let cluster = serde_json::to_value(&cluster).map_err(|e| e.to_string())?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": cluster}],
        "users": [{"name": "bench", "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench", "namespace": ns}}],
        "current-context": "bench"
    })
    .to_string())
}

/// Binds `cluster_role` to the ServiceAccount `ns/name`.
pub async fn bind_cluster_role(
    client: &Client,
    binding: &str,
    cluster_role: &str,
    ns: &str,
    name: &str,
) -> Result<(), String> {
    create_fresh(
        &cluster_role_bindings(client),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding, "labels": {"ferrotrain.dev/bench": "fleet"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
        }),
    )
    .await
}

/// A ClusterRole with these rules.
pub async fn cluster_role(client: &Client, name: &str, rules: Value) -> Result<(), String> {
    create_fresh(
        &cluster_roles(client),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"ferrotrain.dev/bench": "fleet"}},
            "rules": rules
        }),
    )
    .await
}

/// What the hollow nodes do: their nodes and leases, the pods bound to them.
pub fn hollow_rules() -> Value {
    json!([
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "get", "list", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}
    ])
}

/// One FlowSchema: the requests of ServiceAccount `ns/sa` with these verbs on these
/// resources, in the priority level such requests get anyway (workload-low, as the built-in
/// `service-accounts` schema gives them), so that counting changes nothing.
pub fn flow_schema(
    name: &str,
    precedence: u32,
    ns: &str,
    sa: &str,
    verbs: &[&str],
    groups: &[&str],
    resources: &[&str],
) -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name, "labels": {"ferrotrain.dev/bench": "fleet"}},
        "spec": {
            "matchingPrecedence": precedence,
            "priorityLevelConfiguration": {"name": "workload-low"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"namespace": ns, "name": sa}}],
                "resourceRules": [{
                    "verbs": verbs, "apiGroups": groups, "resources": resources,
                    "clusterScope": true, "namespaces": ["*"]
                }]
            }]
        }
    })
}

/// The write verbs.
pub const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// The FlowSchemas that count an operator's requests: its writes per kind of object, its other
/// writes, and its reads (get, list, watch). Names `<prefix>-<what>`.
pub fn operator_flow_schemas(prefix: &str, ns: &str, sa: &str) -> Vec<Value> {
    let kinds: [(&str, &[&str], &[&str]); 8] = [
        ("pods", &[""], &["pods"]),
        (
            "jobs",
            &["ferrotrain.dev"],
            &["distributedtrainings", "distributedtrainings/status"],
        ),
        ("events", &["", "events.k8s.io"], &["events"]),
        ("services", &[""], &["services"]),
        ("configmaps", &[""], &["configmaps"]),
        ("secrets", &[""], &["secrets"]),
        (
            "networkpolicies",
            &["networking.k8s.io"],
            &["networkpolicies"],
        ),
        ("leases", &["coordination.k8s.io"], &["leases"]),
    ];
    let mut schemas: Vec<Value> = kinds
        .iter()
        .map(|(what, groups, resources)| {
            flow_schema(
                &format!("{prefix}-{what}"),
                100,
                ns,
                sa,
                &WRITES,
                groups,
                resources,
            )
        })
        .collect();
    schemas.push(flow_schema(
        &format!("{prefix}-other-writes"),
        110,
        ns,
        sa,
        &WRITES,
        &["*"],
        &["*"],
    ));
    schemas.push(flow_schema(
        &format!("{prefix}-reads"),
        120,
        ns,
        sa,
        &["*"],
        &["*"],
        &["*"],
    ));
    schemas
}

/// The API server's dispatched-request counters of FlowSchemas named `<prefix>-<what>`, by
/// `<what>`, from its /metrics text.
pub fn dispatched(metrics: &str, prefix: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let marker = format!("flow_schema=\"{prefix}-");
    for line in metrics.lines() {
        if !line.starts_with("apiserver_flowcontrol_dispatched_requests_total{") {
            continue;
        }
        let Some(rest) = line.split(&marker).nth(1) else {
            continue;
        };
        let what = rest.split('"').next().unwrap_or_default().to_string();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(what).or_insert(0.0) += value;
    }
    out
}

/// A ValidatingAdmissionPolicy (and its binding, both named `name`) refusing what `matches`
/// (resource rules) when `expression` (CEL) is false, in namespaces labelled `selector`.
pub async fn refuse(
    client: &Client,
    name: &str,
    rules: Value,
    expression: &str,
    message: &str,
    selector: Value,
) -> Result<(), String> {
    create_fresh(
        &admission_policies(client),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"ferrotrain.dev/bench": "fleet"}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": expression, "message": message}]
            }
        }),
    )
    .await?;
    create_fresh(
        &admission_policy_bindings(client),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"ferrotrain.dev/bench": "fleet"}},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": selector}}
            }
        }),
    )
    .await
}

/// Deletes the policy and binding `name` (what [`refuse`] made).
pub async fn unrefuse(client: &Client, name: &str) {
    let _ = admission_policy_bindings(client)
        .delete(name, &DeleteParams::default())
        .await;
    let _ = admission_policies(client)
        .delete(name, &DeleteParams::default())
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatched_counts_are_summed_per_schema_of_the_prefix() {
        let text = "\
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"fx-pods\",priority_level=\"workload-low\"} 7
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"fx-reads\",priority_level=\"workload-low\"} 3
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"global-default\",priority_level=\"global-default\"} 99
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"fx-pods\",priority_level=\"exempt\"} 1";
        let d = dispatched(text, "fx");
        assert_eq!(d.len(), 2);
        assert_eq!(d["pods"], 8.0);
        assert_eq!(d["reads"], 3.0);
    }

    #[test]
    fn every_operator_write_kind_has_a_schema_and_the_rest_fall_through() {
        let schemas = operator_flow_schemas("fx", "ns", "op");
        let names: Vec<&str> = schemas
            .iter()
            .map(|s| s["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"fx-pods") && names.contains(&"fx-reads"));
        let precedence = |n: &str| {
            schemas.iter().find(|s| s["metadata"]["name"] == n).unwrap()["spec"]["matchingPrecedence"]
                .as_u64()
                .unwrap()
        };
        assert!(precedence("fx-pods") < precedence("fx-other-writes"));
        assert!(precedence("fx-other-writes") < precedence("fx-reads"));
    }
}
