//! The controller: what wakes it (the warm [`Caches`]) and the reconcile pipeline
//! observe -> decide -> build -> apply -> status.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, DistributedTrainingStatus, Phase};
use ferrotrain_api::recovery::{AttemptRecord, FailureCost};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::apply;
use crate::caches::Caches;
use crate::carry_out::{self, Created};
use crate::config::Settings;
pub use crate::context::{Context, GangApplied};
pub use crate::error::{Error, Result};
use crate::gang::{self, Observed, ProgressObservation};
use crate::labels;
use crate::metrics::{ErrorLabels, Metrics, ReasonLabels, ReconcileResult, ResultLabels};
use crate::objects::{self, Owner};
use crate::observe;
use crate::pod_cache::PodCache;
use crate::prerequisites::{self, Ready};
use crate::readiness::Readiness;
use crate::scheduling::{self, GangMode};

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
    let namespace = dt.namespace().unwrap_or_default();
    if error.is_namespace_terminating() {
        // The namespace goes, and the job with it: nothing to retry soon, nothing to warn of.
        debug!(job = %dt.name_any(), %namespace, %error, "namespace terminating");
        return Action::requeue(Duration::from_secs(30));
    }
    warn!(job = %dt.name_any(), %namespace, %error, "reconcile failed");
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

/// The pipeline, at a given time (tests pass a fixed one): observe -> decide (pure) -> carry
/// out (the only writes; a launch's objects are built (pure) there, once a launch slot is free).
pub async fn reconcile_at(
    dt: Arc<DistributedTraining>,
    ctx: &Context,
    now: Timestamp,
) -> Result<Action> {
    if !ctx.caches_ready.load(Ordering::Relaxed) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let dt = ctx.freshest(dt, now);
    if dt.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove the pods.
        return Ok(Action::await_change());
    }
    let owner = Owner::of(&dt)?;
    let status = dt.status.clone().unwrap_or_default();

    let observed = observe_job(ctx, &owner, &status, now).await;
    let mut problems = observe::spec_problems(&dt.spec);
    problems.extend(observe::port_problems(
        &dt.spec,
        &[
            ("rendezvous", ctx.settings.master_port),
            ("progress", ctx.settings.trainer_metrics_port),
        ],
    ));
    let timing = ctx.timing();
    let launch_stop = ctx.launch_stop(&dt.uid().unwrap_or_default());
    let gang_mode = scheduling::mode(
        &dt.spec,
        dt.labels(),
        ctx.native_gang,
        ctx.settings.default_gang_scheduler,
    );
    let decision = gang::decide(&Observed {
        now,
        job: &owner.name,
        generation: dt.metadata.generation,
        spec: &dt.spec,
        status: &status,
        pods: &observed.pods,
        progress: observed.progress,
        spec_problems: &problems,
        timing: &timing,
        gang: &gang_mode,
        launch_stop: launch_stop.as_ref(),
    });
    debug!(job = %owner.name, phase = %decision.status.phase, actions = ?decision.actions, "decided");
    carry_out(ctx, &dt, &owner, &status, decision, &gang_mode, now).await
}

/// What the caches and rank 0 say about the job's current state.
struct ObservedJob {
    pods: Vec<gang::PodView>,
    progress: ProgressObservation,
}

async fn observe_job(
    ctx: &Context,
    owner: &Owner,
    status: &DistributedTrainingStatus,
    now: Timestamp,
) -> ObservedJob {
    let pods = ctx
        .unseen
        .with_unseen(owner, owned_pods(&ctx.pods, owner), now);
    let views = pods
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
    let progress = poll_progress(ctx, owner, status, &pods).await;
    ObservedJob {
        pods: views,
        progress,
    }
}

/// Every object of the decision's launches (pure, but for the random token of a Secret that
/// may not exist yet; an existing one is never overwritten).
fn build_launches(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    decision: &gang::Decision,
    gang_mode: &GangMode,
    store_service: Option<objects::StoreService>,
) -> Vec<objects::GangObjects> {
    let mut settings = ctx.build_settings();
    settings.gang = gang_mode.clone();
    settings.store_service = store_service;
    settings.termination_grace_seconds = gang::save_grace_seconds(&decision.status);
    // What is left of the budget: a new gang's launchers count from 0, and so does a pod that
    // replaces a lost one while the others have spent this attempt's in-place restarts
    // (status.restarts counts both; resizes and disruptions spend nothing).
    settings.restarts_left = decision.restarts_left;
    settings.round = decision.status.round.max(0) as u32;
    decision
        .actions
        .iter()
        .filter_map(|action| match action {
            gang::Action::Launch {
                attempt,
                node_ranks,
            } => Some(objects::gang(
                owner,
                &dt.spec,
                *attempt,
                node_ranks,
                &settings,
                &objects::new_token(),
            )),
            _ => None,
        })
        .collect()
}

/// Applies a decision: deletes, then the status, then creates (a crash in between never loses
/// a restart: the status is written before the new attempt's pods exist), then events. The
/// launches are built and created within [`crate::context::PODS_BUILT_AT_ONCE`] pods. The
/// status is written once; a launch that stops (the store's Secret is missing, the API
/// refuses a pod, a name is taken) is remembered for the next decision, which says so in the
/// status ([`gang::LaunchStop`]).
async fn carry_out(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    before: &DistributedTrainingStatus,
    decision: gang::Decision,
    gang_mode: &GangMode,
    now: Timestamp,
) -> Result<Action> {
    apply::delete_pods(ctx, owner, &decision.actions).await?;
    let uid = dt.uid().unwrap_or_default();
    let write_due = ctx.progress_write_due(&uid, now);
    if carry_out::write_status(before, &decision.status, write_due) {
        apply::status(ctx, dt, owner, decision.status.clone(), now).await?;
        ctx.wrote_status(&uid, now);
        record_status_metrics(ctx, dt, before, &decision.status, now);
    }
    let mut events = decision.events.clone();
    let mut requeue = decision.requeue_after;
    if let Some(pods) = decision.pods_to_launch() {
        let launched = launch(ctx, dt, owner, &decision, gang_mode, pods, now).await?;
        events.extend(launched.notes);
        requeue = carry_out::after_launch(&mut events, launched.stop.as_ref(), requeue);
        ctx.launch_went(&uid, launched.stop, now);
    }
    apply::events(
        ctx,
        dt,
        (decision.status.attempt, decision.status.round),
        &events,
    )
    .await?;
    if decision.actions.contains(&gang::Action::DeleteJob) {
        apply::delete_job(ctx, dt, owner).await?;
        return Ok(Action::await_change());
    }
    Ok(requeue
        .map(Action::requeue)
        .unwrap_or_else(Action::await_change))
}

/// How long the controller waits for more events of a job before reconciling it: the burst of
/// one change (a pod's status and its container's, the pods of a gang created at once) is one
/// reconcile, and a new job's pods are created ~0.1 s after it (was 0.5 s: apply -> pods
/// 0.53 s p50 in bench/operator-scale.sh).
const DEBOUNCE: Duration = Duration::from_millis(100);

/// How the launches of a decision went: the events to add, and why they stopped if they did.
struct Launched {
    notes: Vec<gang::EventNote>,
    stop: Option<gang::LaunchStop>,
}

/// The decision's launches: first what they need from the cluster
/// ([`prerequisites::check`]: a launch waiting for the store's Secret stops there, creating
/// nothing), then built and created once there are permits for their `pods`, held until the
/// creates are done ([`crate::context::PODS_BUILT_AT_ONCE`]).
async fn launch(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    decision: &gang::Decision,
    gang_mode: &GangMode,
    pods: usize,
    now: Timestamp,
) -> Result<Launched> {
    let attempt = decision.status.attempt;
    let ranks = decision.node_ranks_to_launch();
    let objects_due = !ctx.gang_applied(&GangApplied {
        uid: dt.uid().unwrap_or_default(),
        attempt,
        generation: dt.metadata.generation,
    });
    let store_service =
        match prerequisites::check(ctx, owner, &dt.spec, &ranks, objects_due).await? {
            Ready::Go(service) => service,
            Ready::Wait(message) => {
                warn!(job = %owner.name, namespace = %owner.namespace, %message, "launch waits");
                return Ok(Launched {
                    notes: Vec::new(),
                    stop: Some(carry_out::waits_for_secret(attempt, message, now)),
                });
            }
        };
    let permits = crate::context::launch_permits(pods);
    let _launching = ctx.launching.acquire_many(permits).await.ok();
    let launches = build_launches(ctx, dt, owner, decision, gang_mode, store_service);
    launch_all(ctx, dt, owner, &launches, attempt, now).await
}

/// Applies the launches of `attempt`. When the API refuses a pod (quota, LimitRange, admission
/// webhook) or a name is taken by an object this job does not control, it stops there and
/// says why, for the next decision to show in the status (and, past the start-up timeout, to
/// fail a refused launch). The gang's own objects are applied once per attempt (and spec
/// generation) by this process: the pods that replace lost ones in the same attempt are
/// created alone (a drain's 800 replacements had cost 8 calls more each).
async fn launch_all(
    ctx: &Context,
    dt: &DistributedTraining,
    owner: &Owner,
    launches: &[objects::GangObjects],
    attempt: i32,
    now: Timestamp,
) -> Result<Launched> {
    let applied = GangApplied {
        uid: dt.uid().unwrap_or_default(),
        attempt,
        generation: dt.metadata.generation,
    };
    let mut notes = Vec::new();
    for objects in launches {
        let conflict = if ctx.gang_applied(&applied) {
            None
        } else {
            apply::gang_objects(ctx, owner, objects).await?
        };
        let result = match conflict {
            Some(conflict) => Ok(conflict),
            None => {
                ctx.note_gang_applied(applied.clone(), now);
                apply::pods(ctx, owner, objects, now).await
            }
        };
        match carry_out::created(result, attempt, now) {
            Created::Next(note) => {
                if let Some(note) = &note {
                    warn!(job = %owner.name, namespace = %owner.namespace, message = %note.note, "gang not enforced");
                }
                notes.extend(note);
            }
            Created::Stop(stop) => {
                warn!(job = %owner.name, namespace = %owner.namespace, reason = stop.reason, message = %stop.message, "launch stopped");
                return Ok(Launched {
                    notes,
                    stop: Some(stop),
                });
            }
            Created::Error(error) => return Err(error),
        }
    }
    Ok(Launched { notes, stop: None })
}

/// The job's pods: labelled with its name and controlled by this very object (a re-created
/// job of the same name does not adopt the old one's pods).
fn owned_pods(cache: &PodCache, owner: &Owner) -> Vec<Arc<Pod>> {
    cache
        .of_job(&owner.namespace, &owner.name)
        .into_iter()
        .filter(|p| owner.controls(&p.metadata))
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
    record_recovery_metrics(ctx, before, after);
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

/// Failures newly ended in the ledger (time to detect) and attempts newly stepping after a
/// failed one (time to recover).
fn record_recovery_metrics(
    ctx: &Context,
    before: &DistributedTrainingStatus,
    after: &DistributedTrainingStatus,
) {
    let Some(after) = after.recovery.as_ref() else {
        return;
    };
    let before = before.recovery.as_ref();
    // A record is its attempt and round; each number is observed once, when it first shows.
    let known = |r: &AttemptRecord| {
        before.and_then(|b| {
            b.attempts
                .iter()
                .find(|a| a.attempt == r.attempt && a.round == r.round)
        })
    };
    for (i, a) in after.attempts.iter().enumerate() {
        let next = after.attempts.get(i + 1);
        let Some(cost) = FailureCost::of(a, next) else {
            continue;
        };
        if known(a).is_none_or(|w| w.end.is_none()) {
            ctx.metrics.failure_detect.observe(cost.detect_seconds);
        }
        let stepped_now = next.is_some_and(|n| known(n).is_none_or(|k| k.first_step_at.is_none()));
        if let Some(seconds) = cost.to_next_step.filter(|_| stepped_now) {
            ctx.metrics.recovery.observe(seconds);
        }
    }
}

/// The jobs with a pod on `node` (a node going NotReady concerns them).
fn jobs_on_node(pods: &PodCache, node: &Node) -> Vec<ObjectRef<DistributedTraining>> {
    let Some(name) = node.metadata.name.as_deref() else {
        return Vec::new();
    };
    let mut jobs: Vec<ObjectRef<DistributedTraining>> = pods
        .store()
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

/// Runs the controller on the warm `caches` until `shutdown` completes: every job in them is
/// reconciled at once, then each as its watches wake it.
pub async fn run(
    client: Client,
    settings: Settings,
    caches: &Caches,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    readiness.lead();
    let native_gang = scheduling::discover_native_api(&client).await;
    info!(native_gang = ?native_gang, "gang scheduling: scheduling.k8s.io as served by the API server");
    let mut context = Context::new(
        client,
        settings,
        metrics,
        caches.pods.clone(),
        caches.nodes.clone(),
        readiness.synced_flag(),
    );
    context.native_gang = native_gang;
    let ctx = Arc::new(context);
    let streams = caches.controller_streams();
    let mapper_pods = caches.pods.clone();
    Controller::for_stream(streams.jobs, caches.jobs.clone())
        .owns_stream(streams.pods)
        .watches_stream(streams.nodes, move |node| jobs_on_node(&mapper_pods, &node))
        // What the caches held before this replica led (all of it, for a standby taking over).
        .reconcile_all_on(futures::stream::once(async {}))
        .with_config(controller::Config::default().debounce(DEBOUNCE))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => {
                    let namespace = object.namespace.as_deref().unwrap_or_default();
                    debug!(job = %object.name, %namespace, "reconciled")
                }
                // error_policy has logged it, with the job.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                // A job deleted while a reconcile of it was queued: nothing to do.
                Err(controller::Error::ObjectNotFound(object)) => {
                    let namespace = object.namespace.as_deref().unwrap_or_default();
                    debug!(job = %object.name, %namespace, "deleted before its queued reconcile")
                }
                Err(e) => warn!(error = %e, "controller error"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
