//! The operator's API client: kube's, with at most [`API_CONCURRENCY`] requests in flight.
//! Without a bound, a burst of launches (100 jobs of 8 pods submitted at once) sent every
//! request at once over HTTP/1.1, each on a TLS connection of its own: the API server paid for
//! hundreds of handshakes, and the client kept the connections afterwards (the fleet bench's
//! leader held 364 connections and 55 MB more than its standby, which has the same caches).
//! Requests past the bound wait in the client, in order; watches hold a slot only until their
//! response starts. client-go bounds its clients the same way, by a rate (controller-runtime:
//! 20 requests/s, bursts of 30); a bound on requests in flight does not slow a fast API server.

use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::limit::ConcurrencyLimitLayer;

/// Requests the operator has in flight at most (reads and writes, watches while they start).
pub const API_CONCURRENCY: usize = 32;

/// The operator's clients for the cluster the environment names (in-cluster, or $KUBECONFIG).
#[derive(Clone)]
pub struct Clients {
    /// The controller's reads, watches and writes: at most [`API_CONCURRENCY`] in flight.
    pub work: Client,
    /// The leader Lease's reads and renewals, unbounded, on connections of their own: a
    /// renewal never waits behind the controller's requests. Sharing the bounded client, the
    /// fleet bench's leader queued its renewal behind a burst of 800 pod creates, missed the
    /// renew deadline and exited (client-go's leader election has a client of its own too).
    pub lease: Client,
}

impl From<Client> for Clients {
    /// One client for both (tests against a fake API server).
    fn from(client: Client) -> Self {
        Clients {
            work: client.clone(),
            lease: client,
        }
    }
}

/// The operator's [`Clients`] for the cluster the environment names.
pub async fn connect() -> Result<Clients, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    Ok(Clients {
        work: bounded(ClientBuilder::try_from(config.clone())?, API_CONCURRENCY),
        lease: Client::try_from(config)?,
    })
}

/// The client of `builder`, with at most `limit` requests in flight.
pub fn bounded<S, B>(builder: ClientBuilder<S>, limit: usize) -> Client
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    builder
        .with_layer(&ConcurrencyLimitLayer::new(limit))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::Api;
    use kube::client::Body;
    use std::time::Duration;

    fn pod(name: &str) -> Response<Body> {
        let body =
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}});
        Response::new(Body::from(serde_json::to_vec(&body).unwrap()))
    }

    #[tokio::test]
    async fn requests_past_the_limit_wait_for_an_answer() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let pods: Api<Pod> = Api::namespaced(bounded(ClientBuilder::new(service, "ns"), 2), "ns");
        let gets: Vec<_> = (0..3)
            .map(|i| {
                let pods = pods.clone();
                tokio::spawn(async move { pods.get(&format!("p{i}")).await })
            })
            .collect();
        let (first, answer) = handle.next_request().await.unwrap();
        let (_, second) = handle.next_request().await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
        assert!(third.is_err(), "a third request left with two in flight");
        let name = first.uri().path().rsplit('/').next().unwrap().to_string();
        answer.send_response(pod(&name));
        let (third, answer) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the third request leaves once one is answered")
            .unwrap();
        answer.send_response(pod(third.uri().path().rsplit('/').next().unwrap()));
        second.send_response(pod("any"));
        for get in gets {
            get.await.unwrap().unwrap();
        }
    }
}
