//! A job with a checkpoint store: no pod before its Secret holds the keys, and the store's
//! Service read for the NetworkPolicy's egress rule.

use super::*;
use ferrotrain_api::reason;

fn secret_path() -> String {
    format!("/api/v1/namespaces/{NS}/secrets/creds")
}

fn store_service_path() -> &'static str {
    "/api/v1/namespaces/store/services/minio"
}

/// The job with a store behind Service `store/minio` (port 80), its credentials in Secret
/// `creds` when `secret`, its egress restricted when `restrict`; attempt 0 decided.
fn store_job(secret: bool, restrict: bool) -> Arc<DistributedTraining> {
    let mut spec = serde_json::json!({"replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 1000,
            "checkpoint": {"store": {"url": "s3://ckpt/runs", "endpoint": "http://minio.store.svc"}}},
        "checkpoint": {},
        "restartPolicy": {"inPlace": false},
        "networkPolicy": {"restrictEgress": restrict}});
    if secret {
        spec["checkpoint"]["storeSecretName"] = "creds".into();
    }
    Arc::new(job().with_spec(spec).with_status(pending_status()))
}

/// A GET of Secret `creds` holding `keys` (values included: what the API answers).
fn secret_with(keys: &[&str]) -> Call {
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|k| (k.to_string(), Value::from("c2VjcmV0")))
        .collect();
    let object = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": NS}, "data": data});
    call(Method::GET, &secret_path(), Answer::Json(object), |_| {})
}

/// The gang's objects and pods (node rank 0's with the store's `credentials`), the policy
/// checked by `policy`, and the Created event.
fn launch_calls(credentials: bool, policy: impl FnOnce(&Value) + Send + 'static) -> Vec<Call> {
    let mut objects = vec![
        get_absent(&service_path()),
        call(Method::PATCH, &service_path(), Answer::Echo, |_| {}),
    ];
    objects.extend(config_map_secret_and_checked_policy(policy));
    let mut calls = any_order(objects);
    let pod = |name: &'static str, with_credentials: bool| {
        call(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods"),
            Answer::Echo,
            move |body| {
                assert_eq!(body["metadata"]["name"], name);
                let env = body["spec"]["containers"][0]["env"].as_array().unwrap();
                let key = env.iter().find(|e| e["name"] == "AWS_SECRET_ACCESS_KEY");
                assert_eq!(key.is_some(), with_credentials, "{name}");
            },
        )
    };
    calls.extend([
        pod("mt-0-0", credentials),
        pod("mt-0-1", false),
        event_call("Created"),
    ]);
    calls
}

/// Checks the status write of a launch waiting for the Secret: Created=False naming `what`.
fn waiting_for_secret(dt: &Arc<DistributedTraining>, what: &'static str) -> Call {
    call(
        Method::PATCH,
        &status_path(),
        Answer::Patched(dt.clone(), "102"),
        move |body| {
            let s: DistributedTrainingStatus =
                serde_json::from_value(body["status"].clone()).unwrap();
            assert_eq!(s.phase, Phase::Pending);
            let created = s.condition(condition::CREATED).unwrap();
            assert_eq!(
                (created.status.as_str(), created.reason.as_str()),
                ("False", reason::STORE_SECRET_MISSING)
            );
            assert!(created.message.contains(what), "{}", created.message);
        },
    )
}

#[tokio::test]
async fn no_pod_is_created_until_the_store_secret_exists_and_the_wait_is_shown() {
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let dt = store_job(true, false);
    // The Secret is read before anything is applied: absent, nothing is created.
    let calls = vec![get_absent(&secret_path())];
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(101), calls).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(1)),
        "shown at once"
    );
    let shown = vec![
        waiting_for_secret(
            &dt,
            "Secret ml/creds (spec.checkpoint.storeSecretName) does not exist",
        ),
        event_call(reason::STORE_SECRET_MISSING),
    ];
    let (action, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(102), shown).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(29)));
    // 30 s after the stop the Secret is read again: now whole, the gang is launched, and
    // only node rank 0's pod gets the credentials.
    let mut calls = vec![secret_with(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])];
    calls.extend(launch_calls(true, |_| {}));
    let (action, _) = reconcile_expecting(&ctx, handle, dt, t(131), calls).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
}

#[tokio::test]
async fn a_store_secret_without_a_key_the_pods_need_stops_the_launch_naming_it() {
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let dt = store_job(true, false);
    let calls = vec![secret_with(&["AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"])];
    let (_, handle) = reconcile_expecting(&ctx, handle, dt.clone(), t(101), calls).await;
    let shown = vec![
        waiting_for_secret(&dt, "has no key AWS_SECRET_ACCESS_KEY"),
        event_call(reason::STORE_SECRET_MISSING),
    ];
    reconcile_expecting(&ctx, handle, dt, t(102), shown).await;
}

/// The egress rule to the store in the policy a launch applies, after the store's Service
/// was read as `service` answers.
async fn store_rule_after(service: Answer) -> Value {
    let (ctx, handle, _) = Context::test(vec![], Settings::default());
    let rule = Arc::new(std::sync::Mutex::new(Value::Null));
    let seen = rule.clone();
    let mut calls = vec![call(Method::GET, store_service_path(), service, |_| {})];
    calls.extend(launch_calls(false, move |body| {
        *seen.lock().unwrap() = body["spec"]["egress"][2].clone();
    }));
    reconcile_expecting(&ctx, handle, store_job(false, true), t(101), calls).await;
    rule.lock().unwrap().take()
}

#[tokio::test]
async fn restricted_egress_reaches_the_pods_behind_the_stores_service() {
    let minio = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "minio", "namespace": "store"},
        "spec": {"selector": {"app": "minio"}, "ports": [{"port": 80, "targetPort": 9000}]}});
    let rule = store_rule_after(Answer::Json(minio)).await;
    assert_eq!(rule["to"][0]["podSelector"]["matchLabels"]["app"], "minio");
    let namespace = &rule["to"][0]["namespaceSelector"]["matchLabels"];
    assert_eq!(namespace["kubernetes.io/metadata.name"], "store");
    assert_eq!(
        rule["ports"],
        serde_json::json!([{"port": 9000, "protocol": "TCP"}])
    );
    // An operator that may not read it (RBAC limited to watchNamespace): its namespace.
    let rule = store_rule_after(Answer::Error(403, "Forbidden")).await;
    assert!(rule["to"][0]["podSelector"].is_null(), "{rule}");
    let namespace = &rule["to"][0]["namespaceSelector"]["matchLabels"];
    assert_eq!(namespace["kubernetes.io/metadata.name"], "store");
    assert_eq!(
        rule["ports"],
        serde_json::json!([{"port": 80, "protocol": "TCP"}])
    );
}
