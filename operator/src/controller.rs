//! The controller: wiring (watches, caches, predicates) and the reconcile pipeline
//! observe -> decide -> build -> apply -> status.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::runtime::{Controller, WatchStreamExt, predicates};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::build::{self, BuildSettings, Owner};
use crate::config::Settings;
use crate::gang::{self, Observed, ProgressObservation, Timing};
use crate::labels;
use crate::metrics::{ErrorLabels, Metrics, ReasonLabels, ReconcileResult, ResultLabels};
use crate::observe;
use crate::progress::ProgressClient;
use crate::readiness::Readiness;

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Build(#[from] build::Error),
    #[error("publishing event {reason}: {source}")]
    Event {
        reason: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Short label for the errors metric.
    pub fn kind(&self) -> String {
        match self {
            Error::Api { verb, kind, .. } => {
                format!("{verb}_{kind}").to_lowercase().replace(' ', "_")
            }
            Error::Build(_) => "build".into(),
            Error::Event { .. } => "event".into(),
        }
    }
}

impl Error {
    /// A pod create the API refused for a reason a retry alone does not fix: a ResourceQuota
    /// or RBAC (403), a LimitRange or validation (422), an admission webhook's denial (400).
    pub fn is_refused_create(&self) -> bool {
        matches!(
            self,
            Error::Api { verb: "create", kind: "Pod", source: kube::Error::Api(s), .. }
                if matches!(s.code, 400 | 403 | 422)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api_err(
    verb: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_string();
    move |source| Error::Api {
        verb,
        kind,
        name,
        source,
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The object as our last status write returned it, and every resourceVersion our writes
/// replaced: while the cache shows one of those, it is older than what we know (the job watch
/// lags behind the pod watch), and deciding from it would repeat a restart.
struct Written {
    superseded: Vec<String>,
    object: Arc<DistributedTraining>,
}

/// Shared state of every reconcile, built once.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub progress: ProgressClient,
    /// False until the pod and node caches are synced: deciding from an empty pod cache would
    /// see every pod "deleted".
    pub caches_ready: Arc<AtomicBool>,
    written: Mutex<HashMap<String, Written>>,
    error_counts: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Arc<Metrics>,
        pods: Store<Pod>,
        nodes: Store<Node>,
        caches_ready: Arc<AtomicBool>,
    ) -> Self {
        let reporter = Reporter {
            controller: labels::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            progress: ProgressClient::new(settings.progress_timeout),
            client,
            metrics,
            settings,
            pods,
            nodes,
            caches_ready,
            written: Mutex::new(HashMap::new()),
            error_counts: Mutex::new(HashMap::new()),
        }
    }

    fn build_settings(&self) -> BuildSettings {
        BuildSettings {
            trainer_image: self.settings.trainer_image.clone(),
            master_port: self.settings.master_port,
            trainer_metrics_port: self.settings.trainer_metrics_port,
        }
    }

    fn timing(&self) -> Timing {
        Timing {
            progress_interval: self.settings.progress_interval,
            progress_grace: self.settings.progress_grace,
            node_lost_grace: self.settings.node_lost_grace,
            force_delete_grace: self.settings.force_delete_grace,
        }
    }

    /// The newest version of the object we know: ours while the cache shows a version our
    /// writes replaced, else the cache's (it caught up, or someone else wrote after us).
    fn freshest(&self, dt: Arc<DistributedTraining>) -> Arc<DistributedTraining> {
        let uid = dt.uid().unwrap_or_default();
        let mut written = self.written.lock().expect("lock");
        let Some(w) = written.get(&uid) else {
            return dt;
        };
        match dt.resource_version() {
            Some(v) if w.superseded.contains(&v) => w.object.clone(),
            _ => {
                written.remove(&uid);
                dt
            }
        }
    }

    fn remember_write(&self, read: &DistributedTraining, object: DistributedTraining) {
        let uid = object.uid().unwrap_or_default();
        let mut written = self.written.lock().expect("lock");
        let mut superseded = written
            .remove(&uid)
            .map(|w| w.superseded)
            .unwrap_or_default();
        superseded.extend(read.resource_version());
        // A handful is plenty: the cache lags by a write or two.
        if superseded.len() > 16 {
            superseded.drain(..superseded.len() - 16);
        }
        written.insert(
            uid,
            Written {
                superseded,
                object: Arc::new(object),
            },
        );
    }
}

/// Now, truncated to whole seconds: status times have second resolution, and a time that
/// differs only in its nanoseconds would make every status look changed.
pub fn now_seconds() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).expect("now is a valid time")
}

/// One reconcile, timed and counted.
pub async fn reconcile(dt: Arc<DistributedTraining>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = reconcile_at(dt.clone(), &ctx, now_seconds()).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let outcome = if result.is_ok() {
        ctx.error_counts
            .lock()
            .expect("lock")
            .remove(&dt.uid().unwrap_or_default());
        ReconcileResult::Ok
    } else {
        ReconcileResult::Error
    };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabels { result: outcome })
        .inc();
    result
}

/// Transient errors: retry with exponential backoff (5s doubling to 5 min) per object.
pub fn error_policy(dt: Arc<DistributedTraining>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(job = %dt.name_any(), namespace = ?dt.namespace(), %error, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            error: error.kind(),
        })
        .inc();
    let mut counts = ctx.error_counts.lock().expect("lock");
    let n = counts.entry(dt.uid().unwrap_or_default()).or_insert(0);
    *n = (*n + 1).min(10);
    Action::requeue(Duration::from_secs((5u64 << (*n - 1)).min(300)))
}

/// The pipeline, at a given time (tests pass a fixed one).
pub async fn reconcile_at(
    dt: Arc<DistributedTraining>,
    ctx: &Context,
    now: Timestamp,
) -> Result<Action> {
    if !ctx.caches_ready.load(Ordering::Relaxed) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let dt = ctx.freshest(dt);
    if dt.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove the pods.
        return Ok(Action::await_change());
    }
    let owner = Owner::of(&dt)?;
    let status = dt.status.clone().unwrap_or_default();

    // observe
    let pods = owned_pods(&ctx.pods, &owner);
    let views: Vec<gang::PodView> = pods
        .iter()
        .filter_map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .and_then(|n| ctx.nodes.get(&ObjectRef::new(n)));
            observe::pod_view(p, node.as_deref())
        })
        .collect();
    let progress = poll_progress(ctx, &owner, &status, &pods).await;
    let problems = observe::spec_problems(&dt.spec);
    let timing = ctx.timing();

    // decide
    let decision = gang::decide(&Observed {
        now,
        job: &owner.name,
        generation: dt.metadata.generation,
        spec: &dt.spec,
        status: &status,
        pods: &views,
        progress,
        spec_problems: &problems,
        timing: &timing,
    });
    debug!(job = %owner.name, phase = %decision.status.phase, actions = ?decision.actions, "decided");

    // apply: deletes, then the status, then creates (a crash in between never loses a restart:
    // the status is written before the new attempt's pods exist).
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    for action in &decision.actions {
        match action {
            gang::Action::DeletePod(name) => delete_pod(&pods_api, name, false).await?,
            gang::Action::ForceDeletePod(name) => delete_pod(&pods_api, name, true).await?,
            _ => {}
        }
    }
    if decision.status != status {
        write_status(ctx, &dt, &owner, decision.status.clone()).await?;
        record_status_metrics(ctx, &dt, &status, &decision.status, now);
    }
    let mut events = decision.events.clone();
    let mut requeue = decision.requeue_after;
    if let Some(note) = launch_all(ctx, &dt, &owner, &decision, now).await? {
        events.extend(note);
        requeue = Some(REFUSED_RETRY);
    }
    publish_events(ctx, &dt, decision.status.attempt, &events).await?;
    if decision.actions.contains(&gang::Action::DeleteJob) {
        let api: Api<DistributedTraining> = Api::namespaced(ctx.client.clone(), &owner.namespace);
        let mut params = DeleteParams::background();
        params.preconditions = Some(kube::api::Preconditions {
            uid: dt.uid(),
            resource_version: None,
        });
        match api.delete(&owner.name, &params).await {
            Ok(_) => info!(job = %owner.name, "deleted after ttlSecondsAfterFinished"),
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
            Err(e) => return Err(api_err("delete", "DistributedTraining", &owner.name)(e)),
        }
        return Ok(Action::await_change());
    }

    Ok(requeue
        .map(Action::requeue)
        .unwrap_or_else(Action::await_change))
}

/// How soon a launch the API refused (quota, LimitRange, webhook) is tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// Runs the decision's launches. When the API refuses a pod (quota, LimitRange, admission
/// webhook), the job says so in its status (Created=False) instead of only in the log: returns
/// `Some(event)` (None inside when this refusal was already reported) and the caller retries
/// later; the state machine fails the job past its startup timeout.
async fn launch_all(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    decision: &gang::Decision,
    now: Timestamp,
) -> Result<Option<Option<gang::EventNote>>> {
    for action in &decision.actions {
        let gang::Action::Launch {
            attempt,
            node_ranks,
        } = action
        else {
            continue;
        };
        match launch(ctx, dt, owner, *attempt, node_ranks).await {
            Ok(()) => {}
            Err(error) if error.is_refused_create() => {
                warn!(job = %owner.name, namespace = %owner.namespace, %error, "the API refused a pod of the gang");
                let (refused, note) = gang::launch_refused(
                    &decision.status,
                    &error.to_string(),
                    now,
                    dt.metadata.generation,
                );
                if refused != decision.status {
                    write_status(ctx, dt, owner, refused).await?;
                }
                return Ok(Some(note));
            }
            Err(error) => return Err(error),
        }
    }
    Ok(None)
}

/// Publishes the decision's events on the job.
async fn publish_events(
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

/// The job's pods: labelled with its name and controlled by this very object (a re-created
/// job of the same name does not adopt the old one's pods).
fn owned_pods(store: &Store<Pod>, owner: &Owner) -> Vec<Arc<Pod>> {
    store
        .state()
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(owner.namespace.as_str())
                && p.labels().get(labels::JOB) == Some(&owner.name)
                && p.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.uid == owner.reference.uid)
        })
        .collect()
}

async fn poll_progress(
    ctx: &Context,
    owner: &Owner,
    status: &DistributedTrainingStatus,
    pods: &[Arc<Pod>],
) -> ProgressObservation {
    if !matches!(status.phase, Phase::Starting | Phase::Running) {
        return ProgressObservation::NotPolled;
    }
    let rank0 = labels::pod_name(&owner.name, status.attempt, 0);
    let Some(ip) = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(rank0.as_str()))
        .and_then(|p| p.status.as_ref())
        .filter(|s| s.phase.as_deref() == Some("Running"))
        .and_then(|s| s.pod_ip.clone())
    else {
        return ProgressObservation::NotPolled;
    };
    match ctx
        .progress
        .fetch(&ip, ctx.settings.trainer_metrics_port)
        .await
    {
        Ok(report) => {
            ctx.metrics
                .progress_polls
                .get_or_create(&ResultLabels {
                    result: ReconcileResult::Ok,
                })
                .inc();
            ProgressObservation::Report(Box::new(report))
        }
        Err(e) => {
            debug!(job = %owner.name, error = %e, "no progress report");
            ctx.metrics
                .progress_polls
                .get_or_create(&ResultLabels {
                    result: ReconcileResult::Error,
                })
                .inc();
            ProgressObservation::Unavailable(e.to_string())
        }
    }
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
async fn write_status(
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

fn record_status_metrics(
    ctx: &Context,
    dt: &DistributedTraining,
    before: &DistributedTrainingStatus,
    after: &DistributedTrainingStatus,
    now: Timestamp,
) {
    // Every gang restart, disruptions included (they do not count against maxRestarts).
    for (cause, count) in &after.restarts_by_cause {
        let earlier = before.restarts_by_cause.get(cause).copied().unwrap_or(0);
        if *count > earlier {
            ctx.metrics
                .restarts
                .get_or_create(&ReasonLabels {
                    reason: cause.clone(),
                })
                .inc_by((*count - earlier) as u64);
        }
    }
    let stepped =
        |s: &DistributedTrainingStatus| s.progress.as_ref().is_some_and(|p| p.report.step > 0);
    if !stepped(before)
        && stepped(after)
        && let Some(created) = dt.metadata.creation_timestamp.as_ref()
    {
        let seconds = now.duration_since(created.0).as_secs_f64();
        ctx.metrics.time_to_first_step.observe(seconds.max(0.0));
    }
}

/// Service, ConfigMap and Secret (idempotent), then the missing pods of the attempt.
async fn launch(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    attempt: i32,
    node_ranks: &[i32],
) -> Result<()> {
    let settings = ctx.build_settings();
    let apply = PatchParams::apply(labels::FIELD_MANAGER).force();

    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let service = build::service(owner, &settings);
    services
        .patch(&owner.name, &apply, &Patch::Apply(with_type_meta(&service)))
        .await
        .map_err(api_err("apply", "Service", &owner.name))?;

    if let Some(config) = build::config_map(owner, &dt.spec) {
        let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &owner.namespace);
        let name = labels::config_map_name(&owner.name);
        config_maps
            .patch(&name, &apply, &Patch::Apply(with_type_meta(&config)))
            .await
            .map_err(api_err("apply", "ConfigMap", &name))?;
    }

    // The token is random: create it once and never overwrite it (ranks of a running attempt
    // read it at start).
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let secret = build::secret(owner, &build::new_token());
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(e) if is_status(&e, 409) => {}
        Err(e) => {
            return Err(api_err(
                "create",
                "Secret",
                &labels::secret_name(&owner.name),
            )(e));
        }
    }

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    for &rank in node_ranks {
        let pod = build::pod(owner, &dt.spec, attempt, rank, &settings);
        let name = pod.name_any();
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => info!(job = %owner.name, pod = %name, "created pod"),
            // Created by an earlier reconcile whose write the cache has not shown yet.
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(api_err("create", "Pod", &name)(e)),
        }
    }
    Ok(())
}

fn with_type_meta<K>(object: &K) -> serde_json::Value
where
    K: Resource<DynamicType = ()> + serde::Serialize,
{
    let mut value = serde_json::to_value(object).expect("objects serialize");
    let (api_version, kind) = build::type_meta::<K>();
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    value
}

/// The jobs with a pod on `node` (a node going NotReady concerns them).
fn jobs_on_node(pods: &Store<Pod>, node: &Node) -> Vec<ObjectRef<DistributedTraining>> {
    let Some(name) = node.metadata.name.as_deref() else {
        return Vec::new();
    };
    let mut jobs: Vec<ObjectRef<DistributedTraining>> = pods
        .state()
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
        .filter_map(|p| {
            let job = p.labels().get(labels::JOB)?;
            Some(ObjectRef::new(job).within(p.metadata.namespace.as_deref()?))
        })
        .collect();
    jobs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    jobs.dedup();
    jobs
}

/// The names the watches go by in logs and `/readyz`.
const WATCHES: [&str; 3] = ["distributedtrainings", "pods", "nodes"];

/// Runs the controller until `shutdown` completes. `jobs` receives the jobs cache (for the
/// metrics endpoint); `readiness` follows the watches (synced, failing).
pub async fn run(
    client: Client,
    settings: Settings,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    jobs: Arc<std::sync::OnceLock<Store<DistributedTraining>>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (dts, pods_api): (Api<DistributedTraining>, Api<Pod>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let nodes_api: Api<Node> = Api::all(client.clone());
    readiness.track(&WATCHES);
    let [dt_watch, pod_watch, node_watch] = WATCHES;

    let (dt_store, dt_writer) = reflector::store();
    let health = readiness.clone();
    // Our own status writes do not bump the generation: they never trigger a reconcile.
    let dt_stream = watcher(dts, watcher::Config::default())
        .default_backoff()
        .reflect(dt_writer)
        .inspect(move |item| health.observe(dt_watch, item))
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());

    let (pod_store, pod_writer) = reflector::store();
    let pod_selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGER);
    let health = readiness.clone();
    let pod_stream = watcher(pods_api, watcher::Config::default().labels(&pod_selector))
        .default_backoff()
        .reflect(pod_writer)
        .inspect(move |item| health.observe(pod_watch, item))
        .touched_objects();

    let (node_store, node_writer) = reflector::store();
    let health = readiness.clone();
    let node_stream = watcher(nodes_api, watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .inspect(move |item| health.observe(node_watch, item))
        .touched_objects();

    let _ = jobs.set(dt_store.clone());
    let ctx = Arc::new(Context::new(
        client,
        settings,
        metrics,
        pod_store.clone(),
        node_store,
        readiness.synced_flag(),
    ));
    let mapper_pods = pod_store;
    Controller::for_stream(dt_stream, dt_store)
        .owns_stream(pod_stream)
        .watches_stream(node_stream, move |node| jobs_on_node(&mapper_pods, &node))
        .with_config(controller::Config::default().debounce(Duration::from_millis(500)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => {
                    debug!(job = %object.name, namespace = ?object.namespace, "reconciled")
                }
                // error_policy has logged it, with the job.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "controller error"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
