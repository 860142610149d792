//! The only module that writes to the API: the job's status, its children (Service,
//! ConfigMap, Secret, pods), pod and job deletes, and events. It takes what `decide` and
//! `build` returned and carries it out; it decides nothing beyond what an API answer forces
//! (an object of the same name that another owner controls is left alone and reported).

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::info;

use crate::build::{self, GangObjects, Owner};
use crate::context::Context;
use crate::error::{Error, Result, api_err, is_status};
use crate::gang;
use crate::labels;

/// What applying a gang's objects came to.
#[derive(Debug, PartialEq)]
pub enum Applied {
    /// Every object exists and is this job's.
    Done,
    /// An object of one of the gang's names exists and another owner (or nobody) controls it:
    /// it was not touched and the launch stopped there. The message names it and what to do.
    NameConflict(String),
}

/// Deletes the pods the decision lets go (force: grace 0, for pods stuck on a lost node).
pub async fn delete_pods(ctx: &Context, owner: &Owner, actions: &[gang::Action]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    for action in actions {
        match action {
            gang::Action::DeletePod(name) => delete_pod(&pods, name, false).await?,
            gang::Action::ForceDeletePod(name) => delete_pod(&pods, name, true).await?,
            _ => {}
        }
    }
    Ok(())
}

async fn delete_pod(api: &Api<Pod>, name: &str, force: bool) -> Result<()> {
    let params = if force {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        }
    } else {
        DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            info!(pod = name, force, "deleted pod");
            Ok(())
        }
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(api_err("delete", "Pod", name)(e)),
    }
}

/// Server-side apply of the whole status: every field we do not send is dropped, so the
/// status is exactly what the state machine decided.
pub async fn status(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    status: DistributedTrainingStatus,
) -> Result<()> {
    let api: Api<DistributedTraining> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let (api_version, kind) = build::type_meta::<DistributedTraining>();
    let body = json!({ "apiVersion": api_version, "kind": kind, "status": status });
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let written = api
        .patch_status(&owner.name, &params, &Patch::Apply(&body))
        .await
        .map_err(api_err(
            "patch status of",
            "DistributedTraining",
            &owner.name,
        ))?;
    ctx.remember_write(dt, written);
    Ok(())
}

/// Publishes events on the job.
pub async fn events(
    ctx: &Context,
    dt: &DistributedTraining,
    attempt: i32,
    notes: &[gang::EventNote],
) -> Result<()> {
    let reference = dt.object_ref(&());
    for note in notes {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.into(),
            note: Some(note.note.chars().take(1000).collect()),
            // The recorder folds repeats of (reason, action) into a series that keeps the
            // first note; keying by attempt keeps each attempt's failure message.
            action: format!("Attempt{attempt}"),
            secondary: None,
        };
        ctx.recorder
            .publish(&event, &reference)
            .await
            .map_err(|source| Error::Event {
                reason: note.reason,
                source,
            })?;
    }
    Ok(())
}

/// Deletes the job itself (ttlSecondsAfterFinished), only if it is still this very object.
pub async fn delete_job(ctx: &Context, dt: &DistributedTraining, owner: &Owner) -> Result<()> {
    let api: Api<DistributedTraining> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let mut params = DeleteParams::background();
    params.preconditions = Some(kube::api::Preconditions {
        uid: dt.uid(),
        resource_version: None,
    });
    match api.delete(&owner.name, &params).await {
        Ok(_) => {
            info!(job = %owner.name, "deleted after ttlSecondsAfterFinished");
            Ok(())
        }
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(e) => Err(api_err("delete", "DistributedTraining", &owner.name)(e)),
    }
}

/// Service and ConfigMap (server-side apply), the Secret (created once: ranks of a running
/// attempt read its token at start, so it is never overwritten), then the pods. An existing
/// object of one of these names that this job does not control is never applied over (apply
/// with force would take it over and garbage collection would later delete it with the job):
/// the launch stops with [`Applied::NameConflict`].
pub async fn gang(ctx: &Context, owner: &Owner, objects: &GangObjects) -> Result<Applied> {
    let ns = &owner.namespace;
    if let Some(conflict) = server_side_apply(ctx, owner, &objects.service).await? {
        return Ok(conflict);
    }
    if let Some(config_map) = &objects.config_map
        && let Some(conflict) = server_side_apply(ctx, owner, config_map).await?
    {
        return Ok(conflict);
    }
    if let Some(conflict) = create(ctx, owner, &objects.secret).await? {
        return Ok(conflict);
    }
    for pod in &objects.pods {
        match create(ctx, owner, pod).await? {
            Some(conflict) => return Ok(conflict),
            None => info!(job = %owner.name, namespace = %ns, pod = %pod.name_any(), "created pod"),
        }
    }
    Ok(Applied::Done)
}

/// A namespaced child object of the gang (Service, ConfigMap, Secret, Pod) as the kube client
/// reads and writes it.
trait ChildObject:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
{
}

impl<K> ChildObject for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned
{
}

/// Applies `object` unless an object of its name exists that this job does not control. The
/// check reads metadata only (a Secret's data never reaches the operator).
async fn server_side_apply<K: ChildObject>(
    ctx: &Context,
    owner: &Owner,
    object: &K,
) -> Result<Option<Applied>> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = object.name_any();
    let kind = K::kind(&());
    let existing =
        api.get_metadata_opt(&name)
            .await
            .map_err(api_err("get", static_kind::<K>(), &name))?;
    if let Some(existing) = existing
        && !owner.controls(&existing.metadata)
    {
        return Ok(Some(conflict(owner, &kind, &name)));
    }
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(with_type_meta(object)))
        .await
        .map_err(api_err("apply", static_kind::<K>(), &name))?;
    Ok(None)
}

/// Creates `object`; one that exists already is fine when this job controls it (created by
/// an earlier reconcile whose write the cache has not shown yet), a conflict otherwise.
async fn create<K: ChildObject>(
    ctx: &Context,
    owner: &Owner,
    object: &K,
) -> Result<Option<Applied>> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = object.name_any();
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(None),
        Err(e) if is_status(&e, 409) => {
            let existing = api.get_metadata_opt(&name).await.map_err(api_err(
                "get",
                static_kind::<K>(),
                &name,
            ))?;
            match existing {
                Some(existing) if !owner.controls(&existing.metadata) => {
                    Ok(Some(conflict(owner, &K::kind(&()), &name)))
                }
                // Ours, or gone again since (the next reconcile creates it).
                _ => Ok(None),
            }
        }
        Err(e) => Err(api_err("create", static_kind::<K>(), &name)(e)),
    }
}

fn conflict(owner: &Owner, kind: &str, name: &str) -> Applied {
    Applied::NameConflict(format!(
        "{kind} {}/{name} exists and is not controlled by DistributedTraining {}: the operator \
         leaves it alone and creates no pods; rename the job, or delete or rename the {kind}",
        owner.namespace, owner.name
    ))
}

/// The kinds the operator writes, as `'static` names for [`Error::Api`].
fn static_kind<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "Service" => "Service",
        "ConfigMap" => "ConfigMap",
        "Secret" => "Secret",
        "Pod" => "Pod",
        _ => "object",
    }
}

fn with_type_meta<K>(object: &K) -> serde_json::Value
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut value = serde_json::to_value(object).expect("objects serialize");
    let (api_version, kind) = build::type_meta::<K>();
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    value
}
