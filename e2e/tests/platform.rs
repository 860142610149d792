//! What a platform team checks before it lets an operator onto a shared cluster: the gang runs
//! in a namespace that enforces Pod Security `restricted`, and the operator's ServiceAccount
//! can do what the operator needs and nothing beside it.

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, copy_job, wait_phase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_job_runs_in_a_namespace_that_enforces_pod_security_restricted() {
    let labels = json!({
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
    });
    let ns = TestNamespace::create_labelled("psa", labels).await;
    ns.create_checkpoint_claim("psa-checkpoints").await;
    ns.create_job("psa", copy_job(2, 200, Some("psa-checkpoints")))
        .await;
    // Pod Security admission refuses a non-conforming pod at create: the job would say
    // PodCreateRefused and never get past Pending.
    let done = wait_phase(&ns.jobs(), "psa", Phase::Succeeded, TRAIN_WAIT).await;
    assert_eq!((done.restarts, done.attempt), (0, 0), "{done:?}");
    assert_eq!(done.succeeded_replicas, 2);
}

/// The namespace and name of the operator's ServiceAccount (from its Deployment).
async fn operator_service_account(client: &Client) -> (String, String) {
    let deployments: Api<Deployment> = Api::all(client.clone());
    let list = deployments
        .list(&ListParams::default().labels("app.kubernetes.io/name=ferrotrain-operator"))
        .await
        .expect("listing the operator's Deployment");
    let d = list.items.first().expect("the operator's Deployment");
    let sa = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    (d.metadata.namespace.clone().unwrap(), sa)
}

/// `kubectl auth can-i VERB RESOURCE [-n NS] --as system:serviceaccount:NS:SA`: the same
/// SubjectAccessReview kubectl sends.
async fn can_i(client: &Client, user: &str, verb: &str, resource: &str, ns: Option<&str>) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource,
                "subresource": subresource, "namespace": ns.unwrap_or(""),
            }
        }
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
#[ignore = "needs a cluster with the operator installed by the chart (scripts/e2e.sh)"]
async fn the_operators_service_account_can_do_its_work_and_nothing_beside_it() {
    let client = Client::try_default().await.expect("a cluster");
    let (operator_ns, sa) = operator_service_account(&client).await;
    let user = format!("system:serviceaccount:{operator_ns}:{sa}");
    let jobs_ns = Some("any-team");
    // What the operator does (operator/src: controller, apply, lease, server).
    let needed: &[(&str, &str, Option<&str>)] = &[
        ("list", "distributedtrainings.ferrotrain.dev", None),
        ("watch", "distributedtrainings.ferrotrain.dev", None),
        (
            "patch",
            "distributedtrainings.ferrotrain.dev/status",
            jobs_ns,
        ),
        ("delete", "distributedtrainings.ferrotrain.dev", jobs_ns),
        ("watch", "pods", None),
        ("create", "pods", jobs_ns),
        ("delete", "pods", jobs_ns),
        ("create", "services", jobs_ns),
        ("patch", "configmaps", jobs_ns),
        ("create", "secrets", jobs_ns),
        ("patch", "networkpolicies.networking.k8s.io", jobs_ns),
        ("create", "events.events.k8s.io", jobs_ns),
        ("watch", "nodes", None),
        ("create", "podgroups.scheduling.k8s.io", jobs_ns),
        ("delete", "podgroups.scheduling.k8s.io", jobs_ns),
        ("create", "podgroups.scheduling.volcano.sh", jobs_ns),
        (
            "update",
            "leases.coordination.k8s.io",
            Some(operator_ns.as_str()),
        ),
        (
            "watch",
            "leases.coordination.k8s.io",
            Some(operator_ns.as_str()),
        ),
    ];
    // What it must not be able to do.
    let refused: &[(&str, &str, Option<&str>)] = &[
        ("list", "secrets", jobs_ns),
        ("watch", "secrets", None),
        ("update", "secrets", jobs_ns),
        ("patch", "distributedtrainings.ferrotrain.dev", jobs_ns),
        ("update", "distributedtrainings.ferrotrain.dev", jobs_ns),
        ("create", "pods/exec", jobs_ns),
        ("create", "pods/eviction", jobs_ns),
        ("update", "pods", jobs_ns),
        ("patch", "nodes", None),
        ("delete", "nodes", None),
        ("create", "deployments.apps", jobs_ns),
        ("create", "roles.rbac.authorization.k8s.io", jobs_ns),
        (
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            None,
        ),
        ("delete", "namespaces", None),
        // A job's policy goes with the job (garbage collection), never by the operator's hand.
        ("delete", "networkpolicies.networking.k8s.io", jobs_ns),
        ("update", "leases.coordination.k8s.io", Some("kube-system")),
        (
            "update",
            "customresourcedefinitions.apiextensions.k8s.io",
            None,
        ),
        ("create", "serviceaccounts/token", jobs_ns),
    ];
    let mut wrong = Vec::new();
    for (verb, resource, ns) in needed {
        if !can_i(&client, &user, verb, resource, *ns).await {
            wrong.push(format!("refused but needed: {verb} {resource} in {ns:?}"));
        }
    }
    for (verb, resource, ns) in refused {
        if can_i(&client, &user, verb, resource, *ns).await {
            wrong.push(format!(
                "allowed but not needed: {verb} {resource} in {ns:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{user}:\n{}", wrong.join("\n"));
}
