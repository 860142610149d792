//! Reconciles against kube-rs's mocked API service (tower-test): every call the operator makes
//! is asserted in order (method, path, body); a call nobody expects fails the test.

use super::*;
use crate::fixtures::{
    JobExt, NAME, NS, PodExt, UID, api_pod, cond, job, report, running_status, t, trainer_exited,
    trainer_running,
};
use crate::pod_cache::{PodCacheWriter, pod_cache};
use ferrotrain_api::Progress;
use ferrotrain_api::crd::{TrainingProgress, condition};
use ferrotrain_api::reason;
use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::client::Body;
use kube::runtime::{reflector, watcher};
use serde_json::Value;
use std::sync::atomic::AtomicBool;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

impl Context {
    /// A context on a mocked API server, with the pod cache holding `pods`; the writer lets a
    /// test change the cache between reconciles.
    fn test(pods: Vec<Pod>, settings: Settings) -> (Arc<Context>, Handle, PodCacheWriter) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (pod_store, mut writer) = pod_cache();
        for p in pods {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let (node_store, _) = reflector::store::<Node>();
        // These tests follow launches and restarts call by call; gang scheduling's own calls
        // and condition are tested in gang::queue and scheduling.
        let settings = Settings {
            default_gang_scheduler: Some(ferrotrain_api::crd::GangScheduler::None),
            ..settings
        };
        let ctx = Context::new(
            client,
            settings,
            Arc::new(Metrics::new()),
            pod_store,
            node_store,
            Arc::new(AtomicBool::new(true)),
        );
        (Arc::new(ctx), handle, writer)
    }
}

/// How the mocked API server answers a call.
enum Answer {
    /// The request body back (creates and applies).
    Echo,
    /// A deleted pod's Status.
    Deleted,
    /// An HTTP error with a Status body.
    Error(u16, &'static str),
    /// The object with the status from the request and a new resourceVersion (status patches).
    Patched(Arc<DistributedTraining>, &'static str),
    /// This object (a GET of an existing one).
    Json(Value),
}

/// One expected API call: method, path, a check of the request body, and the answer.
struct Call {
    method: Method,
    path: String,
    check: Box<dyn FnOnce(&Value) + Send>,
    answer: Answer,
    /// One of a run of calls that may come in any order (made at once): matched by method
    /// and path among them.
    unordered: bool,
}

/// Calls made at once (a launch's Service, ConfigMap, Secret, NetworkPolicy): any order among
/// them, but all of them after the calls before and before the calls after. Calls of the
/// same method and path are matched in their order here.
fn any_order(calls: Vec<Call>) -> Vec<Call> {
    calls
        .into_iter()
        .map(|c| Call {
            unordered: true,
            ..c
        })
        .collect()
}

fn call(
    method: Method,
    path: &str,
    answer: Answer,
    check: impl FnOnce(&Value) + Send + 'static,
) -> Call {
    Call {
        method,
        path: path.to_string(),
        check: Box::new(check),
        answer,
        unordered: false,
    }
}

fn status_path() -> String {
    format!("/apis/ferrotrain.dev/v1alpha1/namespaces/{NS}/distributedtrainings/{NAME}/status")
}

fn status_call(
    dt: &Arc<DistributedTraining>,
    version: &'static str,
    check: impl FnOnce(DistributedTrainingStatus) + Send + 'static,
) -> Call {
    call(
        Method::PATCH,
        &status_path(),
        Answer::Patched(dt.clone(), version),
        move |body| {
            assert_eq!(body["apiVersion"], "ferrotrain.dev/v1alpha1");
            assert_eq!(body["kind"], "DistributedTraining");
            check(serde_json::from_value(body["status"].clone()).unwrap())
        },
    )
}

fn event_call(reason: &'static str) -> Call {
    call(
        Method::POST,
        &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        Answer::Echo,
        move |body| {
            assert_eq!(body["reason"], reason, "{body}");
            assert_eq!(body["regarding"]["kind"], "DistributedTraining");
            assert_eq!(body["regarding"]["name"], NAME);
            assert_eq!(body["reportingController"], "ferrotrain-operator");
        },
    )
}

/// The expected call `request` is: the next one, or the first of the next run of
/// [`any_order`] calls with its method and path (the next one when none has: the assertions
/// then name the difference).
fn take_expected(calls: &mut Vec<Call>, request: &Request<Body>) -> Call {
    let run = calls.iter().take_while(|c| c.unordered).count();
    let matching = calls[..run]
        .iter()
        .position(|c| c.method == request.method() && c.path == request.uri().path());
    calls.remove(matching.unwrap_or(0))
}

/// Serves `calls` in order (runs of [`any_order`] calls in any order) on the mocked API
/// server; panics on any difference.
async fn serve(mut handle: Handle, mut calls: Vec<Call>) -> Handle {
    let mut i = 0;
    while !calls.is_empty() {
        let (request, send) = handle.next_request().await.unwrap_or_else(|| {
            panic!(
                "call {i} ({} {}) never came",
                calls[0].method, calls[0].path
            )
        });
        let expected = take_expected(&mut calls, &request);
        assert_eq!(
            request.method(),
            expected.method,
            "call {i}: {}",
            request.uri()
        );
        assert_eq!(request.uri().path(), expected.path, "call {i}");
        if request.method() == Method::PATCH {
            let query = request.uri().query().unwrap_or_default().to_string();
            assert!(
                query.contains("fieldManager=ferrotrain-operator"),
                "call {i}: {query}"
            );
            assert!(query.contains("force=true"), "call {i}: {query}");
            assert_eq!(
                request.headers()["content-type"],
                "application/apply-patch+yaml",
                "call {i}: server-side apply"
            );
        }
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (expected.check)(&body);
        let (code, answer) = match expected.answer {
            Answer::Echo => (200, body),
            Answer::Deleted => (
                200,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200, "metadata": {}}),
            ),
            Answer::Error(code, reason) => (
                code,
                serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason, "metadata": {}}),
            ),
            Answer::Json(object) => (200, object),
            Answer::Patched(dt, version) => {
                let mut out = (*dt).clone();
                out.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
                out.metadata.resource_version = Some(version.into());
                (200, serde_json::to_value(out).unwrap())
            }
        };
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap(),
        );
        i += 1;
    }
    handle
}

/// A GET of a child that does not exist.
fn get_absent(path: &str) -> Call {
    call(Method::GET, path, Answer::Error(404, "NotFound"), |_| {})
}

/// A GET of an existing child, controlled by the object of `controller_uid` (None: by nobody).
fn get_existing(path: &str, kind: &str, controller_uid: Option<&str>) -> Call {
    let name = path.rsplit('/').next().unwrap();
    let mut object = serde_json::json!({
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "uid": "child-uid"},
    });
    if let Some(uid) = controller_uid {
        object["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": "ferrotrain.dev/v1alpha1",
            "kind": "DistributedTraining",
            "name": NAME,
            "uid": uid,
            "controller": true,
        }]);
    }
    call(Method::GET, path, Answer::Json(object), |_| {})
}

fn service_path() -> String {
    format!("/api/v1/namespaces/{NS}/services/{NAME}")
}

fn policy_path() -> String {
    format!("/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/{NAME}")
}

fn config_map_path() -> String {
    format!("/api/v1/namespaces/{NS}/configmaps/{NAME}-config")
}

/// Runs one reconcile against exactly the expected calls: a call nobody expects makes the
/// reconcile hang (no answer) and fails the test, and so does an expected call that never
/// comes or a call still pending afterwards.
async fn reconcile_expecting(
    ctx: &Arc<Context>,
    handle: Handle,
    dt: Arc<DistributedTraining>,
    now: Timestamp,
    calls: Vec<Call>,
) -> (Action, Handle) {
    let server = tokio::spawn(serve(handle, calls));
    let action = tokio::time::timeout(Duration::from_secs(10), reconcile_at(dt, ctx, now))
        .await
        .expect("reconcile hung: it made a call nobody expected")
        .expect("reconcile failed");
    let mut handle = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("expected calls never came")
        .expect("an expected call did not match");
    let extra = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
    if let Ok(Some((request, _))) = extra {
        panic!("unexpected call {} {}", request.method(), request.uri());
    }
    (action, handle)
}

#[tokio::test]
async fn first_reconcile_writes_status_then_creates_the_gang() {
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let dt = Arc::new(job());
    let now = t(100);
    let mut calls = vec![status_call(&dt, "101", move |s| {
        assert_eq!(
            s,
            DistributedTrainingStatus {
                phase: Phase::Pending,
                observed_generation: Some(1),
                start_time: Some(Time(t(100))),
                // Attempt 0 is in the ledger before its pods exist.
                recovery: pending_status().recovery,
                ..DistributedTrainingStatus::default()
            }
        );
    })];
    // The gang's own objects at once; who may reach the pods before any pod exists.
    calls.extend(any_order(vec![
        get_absent(&service_path()),
        call(
            Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/services/{NAME}"),
            Answer::Echo,
            |body| {
                assert_eq!(body["kind"], "Service");
                assert_eq!(body["apiVersion"], "v1");
                assert_eq!(body["spec"]["clusterIP"], "None");
                assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
            },
        ),
        get_absent(&config_map_path()),
        call(
            Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/configmaps/{NAME}-config"),
            Answer::Echo,
            |body| {
                assert_eq!(body["kind"], "ConfigMap");
                let yaml = body["data"]["trainer.yaml"].as_str().unwrap();
                let config = ferrotrain_api::TrainerConfig::from_yaml(yaml, "cm").unwrap();
                assert_eq!(config.max_steps, 1000);
            },
        ),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Answer::Echo,
            |body| {
                assert_eq!(body["metadata"]["name"], "mt-rdzv");
                assert_eq!(body["stringData"]["token"].as_str().unwrap().len(), 64);
            },
        ),
        get_absent(&policy_path()),
        call(Method::PATCH, &policy_path(), Answer::Echo, |body| {
            assert_eq!(body["kind"], "NetworkPolicy");
            assert_eq!(body["apiVersion"], "networking.k8s.io/v1");
            assert_eq!(
                body["spec"]["podSelector"]["matchLabels"]["ferrotrain.dev/job"],
                NAME
            );
            assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
        }),
    ]));
    calls.extend([
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            |body| {
                assert_eq!(body["metadata"]["name"], "mt-0-0");
                assert_eq!(body["spec"]["hostname"], "mt-0-0");
                assert_eq!(body["spec"]["subdomain"], "mt");
            },
        ),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            |body| {
                assert_eq!(body["metadata"]["name"], "mt-0-1");
            },
        ),
        event_call("Created"),
    ]);
    let (action, _) = reconcile_expecting(&ctx, handle, dt, now, calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

#[tokio::test]
async fn objects_that_already_exist_are_not_an_error() {
    // The cache does not show the pods of an earlier reconcile yet: creating them again gets
    // 409, and a GET shows they are this job's, which is fine; the token Secret is never
    // overwritten.
    let status = pending_status();
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let exists = || Answer::Error(409, "AlreadyExists");
    let secret = format!("/api/v1/namespaces/{NS}/secrets/{NAME}-rdzv");
    let pod = |rank: i32| format!("/api/v1/namespaces/{NS}/pods/{NAME}-0-{rank}");
    let mut calls = any_order(vec![
        get_existing(&service_path(), "Service", Some(UID)),
        call(Method::PATCH, &service_path(), Answer::Echo, |_| {}),
        get_existing(&config_map_path(), "ConfigMap", Some(UID)),
        call(Method::PATCH, &config_map_path(), Answer::Echo, |_| {}),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            exists(),
            |_| {},
        ),
        get_existing(&secret, "Secret", Some(UID)),
        get_existing(&policy_path(), "NetworkPolicy", Some(UID)),
        call(Method::PATCH, &policy_path(), Answer::Echo, |_| {}),
    ]);
    calls.extend([
        // The pods are created at once: both POSTs leave before either answer's GET.
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            exists(),
            |_| {},
        ),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            exists(),
            |_| {},
        ),
        get_existing(&pod(0), "Pod", Some(UID)),
        get_existing(&pod(1), "Pod", Some(UID)),
        event_call("Created"),
    ]);
    let (action, _) = reconcile_expecting(
        &ctx,
        handle,
        Arc::new(job().with_status(status)),
        t(101),
        calls,
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

/// A job whose attempt 0 is decided (and recorded in the ledger) but has no pods yet.
fn pending_status() -> DistributedTrainingStatus {
    let mut recovery = ferrotrain_api::Recovery::default();
    recovery.start(0, t(100));
    DistributedTrainingStatus {
        phase: Phase::Pending,
        observed_generation: Some(1),
        start_time: Some(Time(t(100))),
        recovery: Some(recovery),
        ..DistributedTrainingStatus::default()
    }
}

/// Checks the status write of a stopped launch: Created=False with `reason`, naming `what`.
fn created_false_call(reason: &'static str, what: &'static str) -> Call {
    call(
        Method::PATCH,
        &status_path(),
        Answer::Patched(Arc::new(job()), "102"),
        move |body| {
            let s: DistributedTrainingStatus =
                serde_json::from_value(body["status"].clone()).unwrap();
            let created = s.condition(condition::CREATED).unwrap();
            assert_eq!(
                (created.status.as_str(), created.reason.as_str()),
                ("False", reason)
            );
            assert!(created.message.contains(what), "{}", created.message);
            assert!(created.message.contains("rename"), "{}", created.message);
        },
    )
}

#[tokio::test]
async fn a_users_service_of_the_jobs_name_is_never_taken_over() {
    // Someone's own headless Service `mt` exists: applying with force would take it over and
    // the garbage collector would delete it with the job. It is left alone: no apply, no pod;
    // Created=False/NameConflict names it, with a Warning event. (The job's other objects,
    // applied at the same time, are its own: they go with it.)
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let mut calls = vec![get_existing(&service_path(), "Service", None)];
    calls.extend(config_map_secret_and_policy());
    let calls = any_order(calls);
    stopped_then_shown(&ctx, handle, calls, "Service ml/mt exists").await;
}

#[tokio::test]
async fn a_config_map_another_job_controls_is_never_applied_over() {
    // A ConfigMap `mt-config` controlled by another object (say a deleted and re-created job
    // of the same name, or another operator): left alone, as is the launch.
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let calls = any_order(vec![
        get_absent(&service_path()),
        call(Method::PATCH, &service_path(), Answer::Echo, |_| {}),
        get_existing(&config_map_path(), "ConfigMap", Some("another-uid")),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Answer::Echo,
            |_| {},
        ),
        get_absent(&policy_path()),
        call(Method::PATCH, &policy_path(), Answer::Echo, |_| {}),
    ]);
    stopped_then_shown(&ctx, handle, calls, "ConfigMap ml/mt-config exists").await;
}

#[tokio::test]
async fn a_secret_of_the_jobs_name_that_is_not_ours_stops_the_launch() {
    // A 409 on the token Secret used to be assumed ours: the pods would have read someone
    // else's Secret. The GET after the 409 shows no controller: no pod is created.
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let calls = any_order(vec![
        get_absent(&service_path()),
        call(Method::PATCH, &service_path(), Answer::Echo, |_| {}),
        get_absent(&config_map_path()),
        call(Method::PATCH, &config_map_path(), Answer::Echo, |_| {}),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Answer::Error(409, "AlreadyExists"),
            |_| {},
        ),
        get_existing(
            &format!("/api/v1/namespaces/{NS}/secrets/{NAME}-rdzv"),
            "Secret",
            None,
        ),
        get_absent(&policy_path()),
        call(Method::PATCH, &policy_path(), Answer::Echo, |_| {}),
    ]);
    stopped_then_shown(&ctx, handle, calls, "Secret ml/mt-rdzv exists").await;
}

/// A new job's ConfigMap, Secret and NetworkPolicy, none of which exists yet.
fn config_map_secret_and_policy() -> Vec<Call> {
    config_map_secret_and_checked_policy(|_| {})
}

/// [`config_map_secret_and_policy`], the applied policy checked by `policy`.
fn config_map_secret_and_checked_policy(policy: impl FnOnce(&Value) + Send + 'static) -> Vec<Call> {
    vec![
        get_absent(&config_map_path()),
        call(Method::PATCH, &config_map_path(), Answer::Echo, |_| {}),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Answer::Echo,
            |_| {},
        ),
        get_absent(&policy_path()),
        call(Method::PATCH, &policy_path(), Answer::Echo, policy),
    ]
}

/// A launch that stopped on a name taken (the calls `first` up to the stop, with no status
/// write and no "creating 2 pods" event) is shown by the next reconcile: Created=False naming
/// `what` and one Warning event, with the next try of the launch 30 s after the stop
/// (gang::launch's tests: shown once however often it is seen).
async fn stopped_then_shown(
    ctx: &Arc<Context>,
    handle: Handle,
    first: Vec<Call>,
    what: &'static str,
) {
    let dt = Arc::new(job().with_status(pending_status()));
    let (action, handle) = reconcile_expecting(ctx, handle, dt.clone(), t(101), first).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(1)),
        "shown at once"
    );
    let shown = vec![
        created_false_call(reason::NAME_CONFLICT, what),
        event_call(reason::NAME_CONFLICT),
    ];
    let (action, _) = reconcile_expecting(ctx, handle, dt, t(102), shown).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(29)));
}

#[tokio::test]
async fn a_failed_rank_restarts_the_whole_gang_once_even_from_a_stale_cache() {
    let pods = vec![
        api_pod(0, 0)
            .with_trainer(trainer_running())
            .with_ip("10.0.0.1"),
        api_pod(0, 1)
            .with_trainer(trainer_exited(
                1,
                "collective all_reduce timed out after 60s",
            ))
            .with_ip("10.0.0.2"),
    ];
    let (ctx, handle, mut pod_cache) = Context::test(pods, Settings::default());
    let dt = Arc::new(job().with_status(running_status(0, 0)));
    let calls = vec![
        call(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/mt-0-0"),
            Answer::Deleted,
            |_| {},
        ),
        status_call(&dt, "101", |s| {
            assert_eq!(s.phase, Phase::Restarting);
            assert_eq!((s.attempt, s.restarts), (0, 1));
            let f = s.last_failure.clone().unwrap();
            assert_eq!((f.node_rank, f.exit_code), (Some(1), Some(1)));
            assert_eq!(f.reason, "ExitCode");
            assert_eq!(f.message, "collective all_reduce timed out after 60s");
            assert!(s.is_true(condition::RESTARTING));
            assert!(!s.is_true(condition::RUNNING));
        }),
        event_call("RankFailed"),
        event_call("Restarting"),
    ];
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(100), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    let restarts = ctx
        .metrics
        .restarts
        .get_or_create(&ReasonLabels {
            reason: "ExitCode".into(),
        })
        .get();
    assert_eq!(restarts, 1);

    // The pod watch fires (rank 0 terminating) before the job watch delivers our status
    // write: the cached object still says Running. No second restart and no events; only
    // the replica count a user sees changes.
    let mut terminating = api_pod(0, 0)
        .with_trainer(trainer_running())
        .with_ip("10.0.0.1");
    terminating.metadata.deletion_timestamp = Some(Time(t(100)));
    pod_cache.apply_watcher_event(&watcher::Event::Apply(terminating));
    let calls = vec![status_call(&dt, "102", |s| {
        assert_eq!(s.phase, Phase::Restarting);
        assert_eq!((s.attempt, s.restarts), (0, 1));
        assert_eq!(s.running_replicas, 0);
    })];
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(102), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(8)));

    // Again, still from the stale cache and with nothing new: not a single call.
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(103), vec![]).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(7)));

    // Backoff over (10s after t=100): attempt 1 waits while attempt 0's pods exist (rank 0
    // may still be saving a checkpoint); the exited one is deleted too.
    let calls = vec![
        call(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/mt-0-1"),
            Answer::Deleted,
            |_| {},
        ),
        status_call(&dt, "103", |s| {
            assert_eq!(s.phase, Phase::Pending);
            assert_eq!((s.attempt, s.restarts), (1, 1));
            assert!(!s.is_true(condition::RESTARTING));
            let c = s.condition(condition::CREATED).unwrap();
            assert_eq!(c.reason, "PreviousAttemptTerminating");
            assert!(
                c.message.contains("waiting for 2 pods of attempt 0"),
                "{}",
                c.message
            );
        }),
    ];
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(110), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));

    // Both gone: attempt 1 is launched under new names.
    for rank in 0..2 {
        pod_cache.apply_watcher_event(&watcher::Event::Delete(
            api_pod(0, rank).with_trainer(trainer_running()).with_ip(""),
        ));
    }
    // (The cached object is still the stale one, so the status is written again.)
    let mut calls = vec![status_call(&dt, "104", |s| {
        assert_eq!((s.phase, s.attempt), (Phase::Pending, 1));
    })];
    calls.extend(any_order(vec![
        get_absent(&service_path()),
        call(
            Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/services/{NAME}"),
            Answer::Echo,
            |_| {},
        ),
        get_absent(&config_map_path()),
        call(
            Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/configmaps/{NAME}-config"),
            Answer::Echo,
            |_| {},
        ),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            Answer::Error(409, "AlreadyExists"),
            |_| {},
        ),
        get_existing(
            &format!("/api/v1/namespaces/{NS}/secrets/{NAME}-rdzv"),
            "Secret",
            Some(UID),
        ),
        get_existing(&policy_path(), "NetworkPolicy", Some(UID)),
        call(Method::PATCH, &policy_path(), Answer::Echo, |_| {}),
    ]));
    calls.extend([
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            |body| {
                assert_eq!(body["metadata"]["name"], "mt-1-0");
                let env = body["spec"]["containers"][0]["env"].as_array().unwrap();
                let master = env.iter().find(|e| e["name"] == "MASTER_ADDR").unwrap();
                assert_eq!(master["value"], "mt-1-0.mt.ml.svc");
                let count = env
                    .iter()
                    .find(|e| e["name"] == "TORCHELASTIC_RESTART_COUNT")
                    .unwrap();
                assert_eq!(count["value"], "1");
            },
        ),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            |body| {
                assert_eq!(body["metadata"]["name"], "mt-1-1");
            },
        ),
        event_call("Created"),
    ]);
    let (action, _) = reconcile_expecting(&ctx, handle, dt, t(112), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

/// Rank 1's pod of a running in-place job is gone and attempt 0's gang objects were applied
/// (at t(90)): the context, the job (resourceVersion 100) and what was noted.
fn rank_1_gone() -> (Arc<Context>, Handle, Arc<DistributedTraining>, GangApplied) {
    let pods = vec![api_pod(0, 0).with_trainer(trainer_running())];
    let (ctx, handle, _) = Context::test(pods, Settings::default());
    let mut dt = job().with_status(running_status(0, 0));
    dt.spec.restart_policy.in_place = true;
    dt.metadata.resource_version = Some("100".into());
    let applied = GangApplied {
        uid: UID.into(),
        attempt: 0,
        generation: Some(1),
    };
    ctx.note_gang_applied(applied.clone(), t(90));
    (ctx, handle, Arc::new(dt), applied)
}

/// The calls of rank 1's replacement: the status (`check`ed), the pod alone, the event.
fn replacing_rank_1(
    dt: &Arc<DistributedTraining>,
    check: impl FnOnce(DistributedTrainingStatus) + Send + 'static,
) -> Vec<Call> {
    vec![
        status_call(dt, "101", check),
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            |body| assert_eq!(body["metadata"]["name"], "mt-0-1"),
        ),
        event_call("PodReplaced"),
    ]
}

#[tokio::test]
async fn a_pod_replaced_in_the_same_attempt_is_created_alone() {
    // Attempt 0's launch applied the gang's Service, ConfigMap, Secret and NetworkPolicy: the
    // pod that replaces a lost one is the only create (a drain's hundreds of replacements had
    // cost 8 calls more each on the API server). A new generation of the spec applies them
    // again, and so does another process (a new leader knows nothing of them).
    let (ctx, handle, dt, applied) = rank_1_gone();
    let calls = replacing_rank_1(&dt, |s| {
        assert_eq!((s.phase, s.attempt, s.restarts), (Phase::Starting, 0, 0));
    });
    reconcile_expecting(&ctx, handle, dt, t(100), calls).await;
    assert!(ctx.gang_applied(&applied));
    let newer = GangApplied {
        generation: Some(2),
        ..applied.clone()
    };
    assert!(!ctx.gang_applied(&newer));
    // Forgotten an hour later, with whatever else was noted then.
    ctx.note_gang_applied(newer.clone(), t(100 + 3600));
    assert!(ctx.gang_applied(&newer));
    ctx.note_gang_applied(
        GangApplied {
            uid: "other".into(),
            ..applied
        },
        t(100 + 2 * 3600),
    );
    assert!(!ctx.gang_applied(&newer));
}

#[tokio::test]
async fn a_pod_created_by_the_last_reconcile_is_not_created_again_before_the_cache_shows_it() {
    // The drain on the fleet bench: another pod's event woke the job between the create of a
    // replacement and the watch event that brought it; the second reconcile saw it missing and
    // created it again (409, and a GET).
    let (ctx, handle, dt, _) = rank_1_gone();
    let calls = replacing_rank_1(&dt, |s| assert_eq!(s.replicas, 1));
    let (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(100), calls).await;
    // The cache still lacks mt-0-1 (and shows the job as it was before the status write):
    // no pod is created; the status counts the pod created.
    let calls = vec![status_call(&dt, "102", |s| {
        assert_eq!((s.phase, s.replicas), (Phase::Starting, 2));
    })];
    reconcile_expecting(&ctx, handle, dt, t(101), calls).await;
}

#[tokio::test]
async fn a_permanent_exit_code_fails_the_job_with_the_ranks_message() {
    let pods = vec![
        api_pod(0, 0)
            .with_trainer(trainer_running())
            .with_ip("10.0.0.1"),
        api_pod(0, 1)
            .with_trainer(trainer_exited(
                3,
                "data/train.de: no such file or directory",
            ))
            .with_ip("10.0.0.2"),
    ];
    let (ctx, handle, _) = Context::test(pods, Settings::default());
    let dt = Arc::new(job().with_status(running_status(0, 0)));
    let calls = vec![
        call(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/mt-0-0"),
            Answer::Deleted,
            |_| {},
        ),
        status_call(&dt, "101", |s| {
            assert_eq!(s.phase, Phase::Failed);
            assert_eq!(s.restarts, 0);
            let failed = s.condition(condition::FAILED).unwrap();
            assert_eq!(failed.reason, "PermanentFailure");
            assert_eq!(
                failed.message,
                "rank 1 (pod mt-0-1) exited with code 3: data/train.de: no such file or directory"
            );
            assert_eq!(s.completion_time, Some(Time(t(100))));
        }),
        event_call("RankFailed"),
        event_call("Failed"),
    ];
    let (action, _) = reconcile_expecting(&ctx, handle, dt, t(100), calls).await;
    assert_eq!(action, Action::await_change());
}

/// Serves one `/progress` report on 127.0.0.1 for each connection, until dropped.
async fn progress_server(report: Progress) -> (u16, tokio::task::JoinHandle<()>) {
    progress_server_of(Arc::new(std::sync::Mutex::new(report))).await
}

/// Serves whatever `report` holds at each connection (a test changes it between polls).
async fn progress_server_of(
    report: Arc<std::sync::Mutex<Progress>>,
) -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let body = serde_json::to_string(&*report.lock().unwrap()).unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    (port, task)
}

/// A report as the trainer sends it: more digits than the status shows.
fn unrounded_report(step: u64) -> Progress {
    Progress {
        steps_per_second: Some(4.00321),
        learning_rate: Some(0.00123456),
        world_size: 2,
        eta_seconds: Some((1000 - step.min(1000)) as f64 / 4.00321),
        ..report(step, 3.217654)
    }
}

#[tokio::test]
async fn progress_is_polled_from_rank_0_and_written_once() {
    let (port, server) = progress_server(unrounded_report(120)).await;
    let settings = Settings {
        trainer_metrics_port: port,
        ..Settings::default()
    };
    let (ctx, handle, _) = Context::test(running_pods(), settings);
    let dt = Arc::new(job().with_status(running_status(0, 0)));
    let calls = vec![status_call(&dt, "101", |s| {
        assert_eq!(s.phase, Phase::Running);
        let p = s.progress.clone().unwrap();
        assert_eq!(p.report.step, 120);
        assert_eq!(p.report.steps_per_second, Some(4.0));
        assert_eq!(p.report.loss, Some(3.218));
        assert_eq!(p.report.learning_rate, Some(0.00123));
        assert_eq!(p.eta.as_deref(), Some("3m"));
        assert_eq!(p.estimated_completion_time, Some(Time(t(100 + 220))));
        assert_eq!(p.updated_at, Some(Time(t(100))));
        assert!(s.is_true(condition::PROGRESS_AVAILABLE));
    })];
    let (action, _) = reconcile_expecting(&ctx, handle, dt, t(100), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    server.abort();
}

#[tokio::test]
async fn an_unchanged_progress_report_causes_no_write() {
    let (port, server) = progress_server(unrounded_report(120)).await;
    let settings = Settings {
        trainer_metrics_port: port,
        ..Settings::default()
    };
    let (ctx, handle, _) = Context::test(running_pods(), settings);
    let mut status = running_status(0, 0);
    status.progress = Some(TrainingProgress {
        report: crate::report::rounded(&unrounded_report(120)),
        eta: Some("3m".into()),
        estimated_completion_time: Some(Time(t(320))),
        updated_at: Some(Time(t(100))),
    });
    status.conditions.push(Condition {
        reason: "Reported".into(),
        message: "rank 0 serves /progress".into(),
        ..cond(condition::PROGRESS_AVAILABLE, true, 100)
    });
    let dt = Arc::new(job().with_status(status));
    // Five seconds later the trainer reports the same thing (its unrounded rate wobbles below
    // the shown precision): not a single call.
    let (action, _) = reconcile_expecting(&ctx, handle, dt, t(105), vec![]).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let polls = ctx
        .metrics
        .progress_polls
        .get_or_create(&ResultLabels {
            result: ReconcileResult::Ok,
        })
        .get();
    assert_eq!(polls, 1, "the report was fetched");
    server.abort();
}

/// Both ranks running, rank 0 serving /progress on 127.0.0.1.
fn running_pods() -> Vec<Pod> {
    vec![
        api_pod(0, 0)
            .with_trainer(trainer_running())
            .with_ip("127.0.0.1"),
        api_pod(0, 1)
            .with_trainer(trainer_running())
            .with_ip("127.0.0.2"),
    ]
}

/// A job with `status` that a first reconcile at t(100) wrote (with rank 0's report):
/// the job as the cache then shows it (resourceVersion 101).
async fn written_at_100(
    ctx: &Arc<Context>,
    handle: Handle,
    status: DistributedTrainingStatus,
) -> (Arc<DistributedTraining>, Handle) {
    let first = Arc::new(job().with_status(status));
    let written = Arc::new(std::sync::Mutex::new(None));
    let keep = written.clone();
    let calls = vec![status_call(&first, "101", move |s| {
        *keep.lock().unwrap() = Some(s);
    })];
    let (_, handle) = reconcile_expecting(ctx, handle, first.clone(), t(100), calls).await;
    let mut dt = (*first).clone();
    dt.status = written.lock().unwrap().clone();
    dt.metadata.resource_version = Some("101".into());
    (Arc::new(dt), handle)
}

#[tokio::test]
async fn identical_polls_write_nothing_and_a_new_step_writes_once() {
    // Rank 0's resources are read at request time: CPU seconds tick and RSS wobbles at every
    // poll. Five polls of step 120 write nothing; step 121 writes once; polling it again, not.
    use ferrotrain_api::ResourceUsage;
    let with_resources = |step: u64, poll: u64| Progress {
        resources: Some(ResourceUsage {
            cpu_seconds: 300.0 + 9.7 * poll as f64,
            cpu_utilization: Some(1.9 + 0.01 * (poll % 3) as f64),
            rss_bytes: 512_000_000 + 4096 * poll,
            peak_rss_bytes: 530_000_000,
            threads: 12,
            gpu: None,
        }),
        ..unrounded_report(step)
    };
    let served = Arc::new(std::sync::Mutex::new(with_resources(120, 0)));
    let (port, server) = progress_server_of(served.clone()).await;
    let settings = Settings {
        trainer_metrics_port: port,
        ..Settings::default()
    };
    let (ctx, handle, _) = Context::test(running_pods(), settings);
    let (dt, mut handle) = written_at_100(&ctx, handle, running_status(0, 0)).await;
    for poll in 1..=5 {
        *served.lock().unwrap() = with_resources(120, poll);
        let now = t(100 + 5 * poll as i64);
        (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), now, vec![]).await;
    }
    *served.lock().unwrap() = with_resources(121, 6);
    let calls = vec![status_call(&dt, "102", |s| {
        let p = s.progress.unwrap();
        assert_eq!(p.report.step, 121);
        assert_eq!(p.updated_at, Some(Time(t(130))));
        assert_eq!(p.report.resources.unwrap().cpu_seconds, 358.0);
    })];
    (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(130), calls).await;
    let _ = handle;
    server.abort();
}

#[tokio::test]
async fn a_new_step_is_written_at_most_every_progress_write_interval() {
    // Written at 100; step 121 polled at 105 waits (progress and ledger numbers only, 5 s <
    // 15 s); at 115 it is written. A new operator (another process: a leader change) writes its first at once.
    let served = Arc::new(std::sync::Mutex::new(unrounded_report(120)));
    let (port, server) = progress_server_of(served.clone()).await;
    let settings = Settings {
        trainer_metrics_port: port,
        ..Settings::default()
    };
    assert_eq!(settings.progress_write_interval, Duration::from_secs(15));
    // With a recovery ledger, as every job has: each poll moves its running numbers too.
    let mut recovery = ferrotrain_api::Recovery::default();
    recovery.start(0, t(10));
    let running = DistributedTrainingStatus {
        recovery: Some(recovery),
        ..running_status(0, 0)
    };
    let (ctx, handle, _) = Context::test(running_pods(), settings.clone());
    let (dt, mut handle) = written_at_100(&ctx, handle, running).await;
    *served.lock().unwrap() = unrounded_report(121);
    (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(105), vec![]).await;
    let calls = vec![status_call(&dt, "102", |s| {
        assert_eq!(s.progress.unwrap().report.step, 121);
    })];
    (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(115), calls).await;
    let _ = handle;
    let (fresh, handle, _) = Context::test(running_pods(), settings);
    let calls = vec![status_call(&dt, "102", |s| {
        assert_eq!(s.progress.unwrap().report.step, 121);
    })];
    let _ = reconcile_expecting(&fresh, handle, dt.clone(), t(105), calls).await;
    server.abort();
}

#[tokio::test]
async fn no_reconcile_before_the_caches_are_synced() {
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    ctx.caches_ready.store(false, Ordering::Relaxed);
    let (action, _) = reconcile_expecting(
        &ctx,
        handle,
        Arc::new(job().with_status(running_status(0, 0))),
        t(100),
        vec![],
    )
    .await;
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
}

#[tokio::test]
async fn an_api_error_is_reported_and_backs_off() {
    let pods = vec![
        api_pod(0, 0)
            .with_trainer(trainer_running())
            .with_ip("10.0.0.1"),
    ];
    let (ctx, handle, _) = Context::test(pods, Settings::default());
    let dt = Arc::new(job().with_status(running_status(0, 0)));
    let calls = vec![call(
        Method::DELETE,
        &format!("/api/v1/namespaces/{NS}/pods/mt-0-0"),
        Answer::Error(403, "Forbidden"),
        |_| {},
    )];
    let server = tokio::spawn(serve(handle, calls));
    let err = reconcile_at(dt.clone(), &ctx, t(100)).await.unwrap_err();
    server.await.unwrap();
    assert_eq!(err.kind(), "delete_pod");
    assert!(err.to_string().contains("delete Pod mt-0-0"), "{err}");
    let first = error_policy(dt.clone(), &err, ctx.clone());
    let second = error_policy(dt, &err, ctx);
    assert_eq!(first, Action::requeue(Duration::from_secs(5)));
    assert_eq!(second, Action::requeue(Duration::from_secs(10)));
}

#[test]
fn node_events_map_to_the_jobs_with_pods_there() {
    let (pod_store, mut writer) = pod_cache();
    let running = |rank: i32, node: &str| {
        api_pod(0, rank)
            .with_trainer(trainer_running())
            .on_node(node)
    };
    let (a, b, mut c) = (running(0, "n1"), running(1, "n1"), running(1, "n2"));
    c.metadata.name = Some("other".into());
    for p in [a, b, c] {
        writer.apply_watcher_event(&watcher::Event::Apply(p));
    }
    let node = Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let jobs = jobs_on_node(&pod_store, &node);
    assert_eq!(jobs, vec![ObjectRef::new(NAME).within(NS)]);
}

mod store;
