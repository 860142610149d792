//! The store's credentials in the pods that write checkpoints, and where its endpoint is.

use super::*;
use crate::fixtures::{JobExt, build_settings, job};
use crate::objects::{Owner, pod};
use k8s_openapi::api::core::v1::{Pod, Volume};

/// The store's variables of a pod: (name, secret/key or value, optional).
fn store_vars(pod: &Pod) -> Vec<(String, String, bool)> {
    let env = pod.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    env.into_iter()
        .filter(|e| e.name.starts_with("AWS_") || e.name == env::FERROTRAIN_STORE_SECRET)
        .map(|e| match e.value_from.and_then(|f| f.secret_key_ref) {
            Some(r) => (
                e.name,
                format!("{}/{}", r.name, r.key),
                r.optional == Some(true),
            ),
            None => (e.name, e.value.unwrap_or_default(), false),
        })
        .collect()
}

fn pods_of(spec: serde_json::Value) -> Vec<Pod> {
    let dt = job().with_spec(spec);
    let owner = Owner::of(&dt).unwrap();
    (0..dt.spec.replicas)
        .map(|rank| pod(&owner, &dt.spec, 0, rank, &build_settings()))
        .collect()
}

fn with_store(extra: serde_json::Value) -> serde_json::Value {
    let mut spec = serde_json::json!({"replicas": 2, "checkpoint": {"storeSecretName": "creds"},
        "trainer": {"task": "copy", "maxSteps": 10,
            "checkpoint": {"store": {"url": "s3://ckpt/runs", "endpoint": "http://minio:9000"}}}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

#[test]
fn the_pod_that_writes_checkpoints_gets_the_secrets_credentials_and_no_other_pod_does() {
    let pods = pods_of(with_store(serde_json::json!({})));
    assert_eq!(
        store_vars(&pods[0]),
        [
            (
                "AWS_ACCESS_KEY_ID".into(),
                "creds/AWS_ACCESS_KEY_ID".into(),
                false
            ),
            (
                "AWS_SECRET_ACCESS_KEY".into(),
                "creds/AWS_SECRET_ACCESS_KEY".into(),
                false
            ),
            (
                "AWS_SESSION_TOKEN".into(),
                "creds/AWS_SESSION_TOKEN".into(),
                true
            ),
            ("FERROTRAIN_STORE_SECRET".into(), "creds".into(), false),
        ]
    );
    assert_eq!(store_vars(&pods[1]), []);
    // Without a claim or volume the checkpoint directory is an emptyDir: the bucket's cache.
    let volumes = pods[0].spec.as_ref().unwrap().volumes.clone().unwrap();
    let checkpoints: Vec<&Volume> = volumes.iter().filter(|v| v.name == "checkpoints").collect();
    assert!(checkpoints[0].empty_dir.is_some(), "{checkpoints:?}");
}

#[test]
fn with_a_custom_command_every_pod_gets_them_and_without_a_secret_none_does() {
    let byo = pods_of(with_store(
        serde_json::json!({"command": ["torchrun", "train.py"]}),
    ));
    assert!(byo.iter().all(|p| store_vars(p).len() == 4));
    let mut no_secret = with_store(serde_json::json!({}));
    no_secret["checkpoint"] = serde_json::json!({"claimName": "ckpt"});
    assert!(pods_of(no_secret).iter().all(|p| store_vars(p).is_empty()));
}

#[test]
fn the_endpoint_host_is_an_address_a_service_or_elsewhere() {
    let address = |endpoint: Option<&str>| {
        let mut store = serde_json::json!({"url": "s3://ckpt"});
        if let Some(e) = endpoint {
            store["endpoint"] = e.into();
        }
        let dt = job().with_spec(serde_json::json!({"replicas": 1,
            "trainer": {"task": "copy", "maxSteps": 10, "checkpoint": {"store": store}}}));
        store_address(&dt.spec, "ml")
    };
    let service = |name: &str, namespace: &str| StoreHost::Service {
        name: name.into(),
        namespace: namespace.into(),
    };
    for (endpoint, host, port) in [
        (
            Some("http://10.1.2.3:9000"),
            StoreHost::Ip("10.1.2.3".parse().unwrap()),
            9000,
        ),
        (
            Some("http://minio.store.svc.cluster.local"),
            service("minio", "store"),
            80,
        ),
        (
            Some("https://rgw.ceph.svc.k8s.example."),
            service("rgw", "ceph"),
            443,
        ),
        (Some("http://minio:9000"), service("minio", "ml"), 9000),
        (Some("https://minio.store:9000"), StoreHost::Elsewhere, 9000),
        (Some("https://s3.amazonaws.com"), StoreHost::Elsewhere, 443),
        (None, StoreHost::Elsewhere, 443),
    ] {
        assert_eq!(
            address(endpoint),
            Some(StoreAddress { host, port }),
            "{endpoint:?}"
        );
    }
    assert_eq!(address(Some("http://h:port")), None, "a spec problem");
    let no_store = job().with_spec(serde_json::json!({"replicas": 1,
        "trainer": {"task": "copy", "maxSteps": 10}}));
    assert_eq!(store_address(&no_store.spec, "ml"), None);
}

#[test]
fn the_operator_reads_the_stores_service_only_for_restricted_egress() {
    let spec = |np: serde_json::Value| {
        job()
            .with_spec(with_store(serde_json::json!({"networkPolicy": np})))
            .spec
    };
    assert_eq!(
        service_to_read(&spec(serde_json::json!({"restrictEgress": true})), "ml"),
        Some(("minio".into(), "ml".into()))
    );
    assert_eq!(service_to_read(&spec(serde_json::json!({})), "ml"), None);
    let off = serde_json::json!({"enabled": false, "restrictEgress": true});
    assert_eq!(service_to_read(&spec(off), "ml"), None);
}
