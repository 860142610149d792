//! `watch` against a fake API server: what it asks for (one list, one watch: no GETs) and how
//! it ends.

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower::Layer;

use super::*;
use crate::fixtures;
use crate::requests::{CountLayer, RequestCounts};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn cluster() -> (Cluster, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let counts = RequestCounts::default();
    let client = kube::Client::new(CountLayer(counts.clone()).layer(service), "ml");
    let cluster = Cluster {
        client,
        namespace: "ml".into(),
        namespace_given: false,
        counts,
    };
    (cluster, handle)
}

fn with_version(dt: &DistributedTraining, version: &str) -> Value {
    let mut value = serde_json::to_value(dt).unwrap();
    value["metadata"]["resourceVersion"] = json!(version);
    value
}

fn answer(body: String) -> Response<Body> {
    Response::new(Body::from(body.into_bytes()))
}

/// Answers the list with `items`, then the watch with `changes` (MODIFIED events).
async fn serve(mut handle: Handle, items: Vec<Value>, changes: Vec<Value>) -> Vec<String> {
    let mut seen = Vec::new();
    let (list, reply) = handle.next_request().await.expect("a list");
    seen.push(list.uri().to_string());
    let body = json!({
        "apiVersion": "ferrotrain.dev/v1alpha1", "kind": "DistributedTrainingList",
        "metadata": {"resourceVersion": "10"}, "items": items,
    });
    reply.send_response(answer(body.to_string()));
    if changes.is_empty() {
        return seen;
    }
    let (watch, reply) = handle.next_request().await.expect("a watch");
    seen.push(watch.uri().to_string());
    let events: Vec<String> = changes
        .into_iter()
        .map(|object| json!({"type": "MODIFIED", "object": object}).to_string() + "\n")
        .collect();
    reply.send_response(answer(events.concat()));
    seen
}

#[tokio::test]
async fn a_watch_lists_the_object_once_then_follows_its_changes_until_it_ends() {
    let (cluster, handle) = cluster();
    let running = fixtures::training_job();
    let server = tokio::spawn(serve(
        handle,
        vec![with_version(&running, "10")],
        vec![
            with_version(&running, "11"),
            with_version(&fixtures::succeeded_job(), "12"),
        ],
    ));
    let watched = watch(&cluster, "copy").await.unwrap();
    assert_eq!(
        watched,
        Watched {
            phase: Phase::Succeeded,
            changes: 3
        }
    );
    let uris = server.await.unwrap();
    assert!(
        uris[0].contains("fieldSelector=metadata.name%3Dcopy"),
        "{uris:?}"
    );
    assert!(
        uris[1].contains("watch=true") && uris[1].contains("resourceVersion=10"),
        "{uris:?}"
    );
    let kinds = cluster.counts.by_kind();
    assert_eq!(
        kinds,
        [("list".to_string(), 1), ("watch".to_string(), 1)].into(),
        "one list and one watch, no GETs"
    );
}

#[tokio::test]
async fn a_job_that_does_not_exist_is_not_found() {
    let (cluster, handle) = cluster();
    let server = tokio::spawn(serve(handle, Vec::new(), Vec::new()));
    let error = watch(&cluster, "copy").await.unwrap_err();
    server.await.unwrap();
    assert_eq!(
        error.to_string(),
        "distributedtrainings.ferrotrain.dev \"copy\" not found in namespace ml"
    );
}
