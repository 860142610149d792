//! The only module that writes to the API: the job's status, its children (Service,
//! ConfigMap, Secret, the attempt's PodGroup, pods), pod and job deletes, and events. It takes what `decide` and
//! `build` returned and carries it out; it decides nothing beyond what an API answer forces
//! (an object of the same name that another owner controls is left alone and reported).

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus};
use ferrotrain_api::reason;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::info;

use crate::context::Context;
use crate::error::{Error, Result, api_err, is_status};
use crate::gang;
use crate::labels;
use crate::objects::{self, GangObjects, Owner};
use crate::scheduling::GroupObject;

/// What applying a gang's objects came to.
#[derive(Debug, PartialEq)]
pub enum Applied {
    /// Every object exists and is this job's.
    Done,
    /// An object of one of the gang's names exists and another owner (or nobody) controls it:
    /// it was not touched and the launch stopped there. The message names it and what to do.
    NameConflict(String),
    /// Every object exists, but the API server dropped the pods' native scheduling fields
    /// (the API is served, its feature gate is off): the gang is not enforced. Why.
    GangIgnored(String),
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
    now: Timestamp,
) -> Result<()> {
    let api: Api<DistributedTraining> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let (api_version, kind) = objects::type_meta::<DistributedTraining>();
    let body = json!({ "apiVersion": api_version, "kind": kind, "status": status });
    let params = PatchParams::apply(labels::FIELD_MANAGER).force();
    let written = match api
        .patch_status(&owner.name, &params, &Patch::Apply(&body))
        .await
    {
        Ok(written) => written,
        Err(source) => {
            crd_out_of_date(ctx, dt, &source).await;
            return Err(api_err(
                "patch status of",
                "DistributedTraining",
                &owner.name,
            )(source));
        }
    };
    ctx.remember_write(dt, written, now);
    Ok(())
}

/// The action an event is filed under: its attempt, and its in-place round after the first.
fn event_action(attempt: i32, round: i32) -> String {
    match round {
        0 => format!("Attempt{attempt}"),
        _ => format!("Attempt{attempt}Round{round}"),
    }
}

/// A status the API server refused because the installed CRD lacks fields this operator
/// writes: a Warning event on the job says so and how to fix it (best effort; the reconcile
/// fails and is retried with backoff either way).
async fn crd_out_of_date(ctx: &Context, dt: &DistributedTraining, source: &kube::Error) {
    let fields = crate::error::fields_not_in_schema(source);
    if fields.is_empty() {
        return;
    }
    let note = gang::EventNote {
        warning: true,
        reason: reason::CRD_OUT_OF_DATE,
        note: crd_out_of_date_note(&fields),
        round: None,
    };
    let at = dt.status.as_ref().map_or((0, 0), |s| (s.attempt, s.round));
    if let Err(e) = events(ctx, dt, at, &[note]).await {
        tracing::warn!(job = %dt.name_any(), error = %e, "the CrdOutOfDate event was not published");
    }
}

/// What the event says: the fields, the cause and the fix.
fn crd_out_of_date_note(fields: &[String]) -> String {
    format!(
        "the installed DistributedTraining CRD is older than this operator ({}): it does not \
         declare {}, so the job's status cannot be written (training goes on); apply this \
         version's CRD: kubectl apply --server-side --force-conflicts -f \
         crds/distributedtrainings.yaml (helm upgrade never upgrades a chart's CRDs; \
         docs/install.md#upgrade)",
        env!("CARGO_PKG_VERSION"),
        fields.join(", ")
    )
}

/// Publishes events on the job.
pub async fn events(
    ctx: &Context,
    dt: &DistributedTraining,
    (attempt, round): (i32, i32),
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
            // first note; keying by attempt and the round the note tells of keeps each one's
            // failure message (one reconcile may count several rounds).
            action: event_action(attempt, note.round.unwrap_or(round)),
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

/// The gang's own objects: Service and ConfigMap (server-side apply), the Secret (created
/// once: ranks of a running attempt read its token at start, so it is never overwritten), the
/// NetworkPolicy and the attempt's group, all at once (none needs another; a launch waits for
/// one round trip of them instead of one after the other: 9 calls in a row were 1.1 s of a new
/// job's 1.3 s on a loaded API server). An existing object of one of these names that this job
/// does not control is never applied over (apply with force would take it over and garbage
/// collection would later delete it with the job): the first such conflict, in that order, is
/// returned and no pod must be created.
pub async fn gang_objects(
    ctx: &Context,
    owner: &Owner,
    objects: &GangObjects,
) -> Result<Option<Applied>> {
    let service = server_side_apply(ctx, owner, &objects.service);
    let config_map = async {
        match &objects.config_map {
            Some(config_map) => server_side_apply(ctx, owner, config_map).await,
            None => Ok(None),
        }
    };
    let secret = async {
        create(ctx, owner, &objects.secret)
            .await
            .map(Made::conflict)
    };
    let policy = async {
        match &objects.network_policy {
            Some(policy) => server_side_apply(ctx, owner, policy).await,
            None => Ok(None),
        }
    };
    let group = async {
        match &objects.group {
            Some(group) => create_group(ctx, owner, group).await,
            None => Ok(None),
        }
    };
    let (service, config_map, secret, policy, group) =
        futures::join!(service, config_map, secret, policy, group);
    for applied in [service, config_map, secret, policy, group] {
        if let Some(conflict) = applied? {
            return Ok(Some(conflict));
        }
    }
    Ok(None)
}

/// The gang's pods, after [`gang_objects`] (before any pod: a pod is never reachable by
/// strangers, not even for a moment). Each pod created at `now` counts as present until the
/// pod cache shows it ([`crate::unseen`]).
pub async fn pods(
    ctx: &Context,
    owner: &Owner,
    objects: &GangObjects,
    now: Timestamp,
) -> Result<Applied> {
    let ns = &owner.namespace;
    // The pods at once: a 64-pod gang takes one API round trip, not 64 (the requests leave in
    // rank order all the same).
    let created = futures::future::join_all(objects.pods.iter().map(|pod| async move {
        match &objects.pod_fields {
            None => create(ctx, owner, pod).await.map(|c| (c, None)),
            Some(fields) => create_with_fields(ctx, owner, pod, fields).await,
        }
    }))
    .await;
    let mut ignored = None;
    let mut first_conflict = None;
    for (pod, result) in objects.pods.iter().zip(created) {
        let (made, dropped) = result?;
        ignored = ignored.or(dropped);
        match made {
            Made::Conflict(c) => first_conflict = first_conflict.or(Some(c)),
            Made::Created(created) => {
                info!(job = %owner.name, namespace = %ns, pod = %pod.name_any(), "created pod");
                ctx.unseen.created(created, now);
            }
            Made::Ours => {}
        }
    }
    if let Some(conflict) = first_conflict {
        return Ok(conflict);
    }
    Ok(ignored.map_or(Applied::Done, Applied::GangIgnored))
}

/// Creates the attempt's PodGroup (or Workload), after deleting the previous attempt's: its
/// pods are gone by now (one attempt at a time), and the job's deletion collects the rest.
async fn create_group(
    ctx: &Context,
    owner: &Owner,
    group: &GroupObject,
) -> Result<Option<Applied>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &owner.namespace, &group.resource);
    let name = group.object.name_any();
    if let Some(previous) = previous_group_name(&name) {
        match api.delete(&previous, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(api_err("delete", "PodGroup", &previous)(e)),
        }
    }
    match api.create(&PostParams::default(), &group.object).await {
        Ok(_) => {
            info!(job = %owner.name, namespace = %owner.namespace, group = %name, kind = %group.resource.kind, "created the gang's group");
            Ok(None)
        }
        Err(e) if is_status(&e, 409) => {
            let existing = api
                .get_metadata_opt(&name)
                .await
                .map_err(api_err("get", "PodGroup", &name))?;
            let meta = existing.as_ref().map(|e| &e.metadata);
            Ok(taken(owner, meta, &group.resource.kind, &name))
        }
        Err(e) => Err(api_err("create", "PodGroup", &name)(e)),
    }
}

/// `<job>-<attempt - 1>` for a group named `<job>-<attempt>` (none for attempt 0).
fn previous_group_name(name: &str) -> Option<String> {
    let (job, attempt) = name.rsplit_once('-')?;
    let attempt: i32 = attempt.parse().ok()?;
    (attempt > 0).then(|| format!("{job}-{}", attempt - 1))
}

/// Creates `pod` with `fields` merged into its JSON (spec fields of a newer API than the
/// typed Pod's). The second value says why the gang is not enforced when the API server
/// dropped them.
async fn create_with_fields(
    ctx: &Context,
    owner: &Owner,
    pod: &Pod,
    fields: &serde_json::Value,
) -> Result<(Made<Pod>, Option<String>)> {
    let resource = ApiResource::erase::<Pod>(&());
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &owner.namespace, &resource);
    let name = pod.name_any();
    let mut json = serde_json::to_value(pod).expect("a pod serializes");
    merge(&mut json, fields);
    let object: DynamicObject = serde_json::from_value(json).expect("a pod is an object");
    match api.create(&PostParams::default(), &object).await {
        Ok(created) => {
            let dropped = dropped_fields(&created.data, fields);
            let pod = serde_json::to_value(created)
                .and_then(serde_json::from_value)
                .expect("the API returns a pod");
            Ok((Made::Created(pod), dropped))
        }
        Err(e) if is_status(&e, 409) => Ok((create(ctx, owner, pod).await?, None)),
        Err(e) => Err(api_err("create", "Pod", &name)(e)),
    }
}

/// The spec fields of `fields` missing from `created`, as a message (None when all stayed).
fn dropped_fields(created: &serde_json::Value, fields: &serde_json::Value) -> Option<String> {
    let keys: Vec<&String> = fields["spec"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| created["spec"][k.as_str()].is_null())
        .collect();
    (!keys.is_empty()).then(|| {
        let keys: Vec<String> = keys.iter().map(|k| format!("spec.{k}")).collect();
        format!(
            "the API server dropped the pods' {}: it serves the gang API but its GenericWorkload feature gate is off, so the gang is scheduled pod by pod",
            keys.join(", ")
        )
    })
}

/// JSON merge patch semantics, objects only (RFC 7386 without deletions).
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
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

/// What a create came to.
enum Made<K> {
    /// Created: the object as the API returned it.
    Created(K),
    /// It existed already and this job controls it (created by an earlier reconcile whose
    /// write the cache has not shown yet), or it is gone again since.
    Ours,
    /// An object of its name exists that this job does not control.
    Conflict(Applied),
}

impl<K> Made<K> {
    fn conflict(self) -> Option<Applied> {
        match self {
            Made::Conflict(c) => Some(c),
            Made::Created(_) | Made::Ours => None,
        }
    }
}

/// Creates `object`; one that exists already is fine when this job controls it (created by
/// an earlier reconcile whose write the cache has not shown yet), a conflict otherwise.
async fn create<K: ChildObject>(ctx: &Context, owner: &Owner, object: &K) -> Result<Made<K>> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = object.name_any();
    match api.create(&PostParams::default(), object).await {
        Ok(created) => Ok(Made::Created(created)),
        Err(e) if is_status(&e, 409) => {
            let existing = api.get_metadata_opt(&name).await.map_err(api_err(
                "get",
                static_kind::<K>(),
                &name,
            ))?;
            let meta = existing.as_ref().map(|e| &e.metadata);
            Ok(taken(owner, meta, &K::kind(&()), &name).map_or(Made::Ours, Made::Conflict))
        }
        Err(e) => Err(api_err("create", static_kind::<K>(), &name)(e)),
    }
}

/// What an object `kind`/`name` that exists already (`existing`: its metadata, None when it
/// went again since) means for a create: a conflict when another owner, or nobody, controls
/// it; None when it is this job's own (an earlier reconcile's create the cache has not shown
/// yet) or gone (the next reconcile creates it).
fn taken(owner: &Owner, existing: Option<&ObjectMeta>, kind: &str, name: &str) -> Option<Applied> {
    existing
        .filter(|meta| !owner.controls(meta))
        .map(|_| conflict(owner, kind, name))
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
        "NetworkPolicy" => "NetworkPolicy",
        _ => "object",
    }
}

fn with_type_meta<K>(object: &K) -> serde_json::Value
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut value = serde_json::to_value(object).expect("objects serialize");
    let (api_version, kind) = objects::type_meta::<K>();
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{api_pod, job};

    #[test]
    fn a_name_held_by_another_owner_or_by_nobody_is_taken_and_one_of_ours_or_gone_is_not() {
        let owner = objects::Owner::of(&job()).unwrap();
        let ours = api_pod(0, 1).metadata;
        assert!(owner.controls(&ours), "the fixture's pod is the job's");
        let mut nobodys = ours.clone();
        nobodys.owner_references = None;
        let mut anothers = ours.clone();
        anothers.owner_references.as_mut().unwrap()[0].uid = "another-uid".into();
        assert_eq!(taken(&owner, Some(&ours), "Pod", "mt-0-1"), None);
        assert_eq!(taken(&owner, None, "Pod", "mt-0-1"), None, "gone again");
        for meta in [&nobodys, &anothers] {
            let Some(Applied::NameConflict(message)) = taken(&owner, Some(meta), "Pod", "mt-0-1")
            else {
                panic!("a conflict")
            };
            assert!(message.starts_with("Pod "), "{message}");
            assert!(
                message.contains("is not controlled by DistributedTraining"),
                "{message}"
            );
        }
    }

    #[test]
    fn each_round_files_its_events_apart_so_a_series_keeps_its_own_note() {
        // The recorder folds (reason, action) repeats into one series with the first note.
        assert_eq!(event_action(0, 0), "Attempt0");
        assert_eq!(event_action(2, 0), "Attempt2");
        let rounds: std::collections::BTreeSet<String> =
            (1..=7).map(|r| event_action(0, r)).collect();
        assert_eq!(rounds.len(), 7, "{rounds:?}");
        assert!(!rounds.contains(&event_action(1, 0)));
    }

    #[test]
    fn the_crd_out_of_date_note_names_the_fields_and_the_fix() {
        let note = crd_out_of_date_note(&[".status.recovery.secondsByWorldSize".into()]);
        for part in [
            ".status.recovery.secondsByWorldSize",
            "kubectl apply --server-side --force-conflicts -f crds/distributedtrainings.yaml",
            "docs/install.md#upgrade",
            env!("CARGO_PKG_VERSION"),
        ] {
            assert!(note.contains(part), "{part} in {note}");
        }
    }
}
