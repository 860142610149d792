//! One pod of the gang, from its parts.

use ferrotrain_api::crd::{DistributedTrainingSpec, PodTemplateOverrides};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::container::trainer_container;
use super::environment::pod_env;
use super::owner::Owner;
use super::security::pod_security_context;
use super::settings::{BuildSettings, termination_grace};
use super::storage::storage;
use crate::labels;
use crate::scheduling;

/// The pod of `node_rank` in `attempt`.
pub fn pod(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    attempt: i32,
    node_rank: i32,
    s: &BuildSettings,
) -> Pod {
    let name = labels::pod_name(&owner.name, attempt, node_rank);
    let template = spec.pod_template.clone().unwrap_or_default();
    let mut metadata = pod_metadata(owner, &template, &name, attempt, node_rank);
    let cost = labels::preemption_cost(node_rank, spec.min_replicas());
    metadata
        .labels
        .get_or_insert_default()
        .insert(labels::PREEMPTION_COST.to_string(), cost.to_string());
    let storage = storage(owner, spec, &template, node_rank);
    let env = pod_env(owner, spec, &template, attempt, node_rank, s);
    let container = trainer_container(spec, s, env, storage.mounts, storage.working_dir);
    let volumes = storage.volumes;
    let security_context = pod_security_context(spec, &template);

    let group = scheduling::group_name(&owner.name, attempt);
    let mut pod = Pod {
        metadata,
        spec: Some(PodSpec {
            hostname: Some(name),
            subdomain: Some(labels::service_name(&owner.name)),
            restart_policy: Some("Never".into()),
            containers: vec![container],
            volumes: Some(volumes),
            security_context: Some(security_context),
            termination_grace_period_seconds: Some(termination_grace(spec, s)),
            // No service-link variables and no API token: a trainer talks to its peers only.
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            service_account_name: template.service_account_name.clone(),
            node_selector: (!template.node_selector.is_empty())
                .then(|| template.node_selector.clone()),
            tolerations: (!template.tolerations.is_empty()).then(|| template.tolerations.clone()),
            affinity: template.affinity.clone(),
            priority_class_name: spec.priority_class_of(node_rank),
            scheduler_name: template.scheduler_name.clone(),
            image_pull_secrets: (!template.image_pull_secrets.is_empty())
                .then(|| template.image_pull_secrets.clone()),
            ..PodSpec::default()
        }),
        status: None,
    };
    scheduling::join(&mut pod, &s.gang, &group, spec.pod_count());
    pod
}

/// Name, labels (the template's, then the operator's), annotations, owner.
fn pod_metadata(
    owner: &Owner,
    template: &PodTemplateOverrides,
    name: &str,
    attempt: i32,
    node_rank: i32,
) -> ObjectMeta {
    let mut pod_labels = template.labels.clone();
    pod_labels.extend([
        (labels::ATTEMPT.to_string(), attempt.to_string()),
        (labels::NODE_RANK.to_string(), node_rank.to_string()),
    ]);
    let mut metadata = owner.meta(name.to_string(), pod_labels);
    if !template.annotations.is_empty() {
        metadata.annotations = Some(template.annotations.clone());
    }

    metadata
}
