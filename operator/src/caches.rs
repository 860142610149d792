//! The watches and their caches, kept warm on every replica: a standby lists and watches jobs,
//! pods and nodes while it waits for the lease, so that when it takes over it acts on what it
//! already holds (the first status write follows the takeover by one reconcile, not by the
//! lists of every pod and node in the cluster). The same design as controller-runtime, whose
//! informers run on every replica and whose controllers wait for leadership.
//!
//! Each watch is driven by a task of its own that keeps its cache current and, once this
//! replica leads, forwards the objects that should wake a reconcile into the controller's
//! queue ([`Caches::controller_streams`]). A follower forwards nothing.

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use ferrotrain_api::crd::DistributedTraining;

use crate::cache_fields;
use crate::labels;
use crate::pod_cache::{PodCache, pod_cache};
use crate::readiness::Readiness;

/// The names the watches go by in logs and `/readyz`.
pub const WATCHES: [&str; 3] = ["distributedtrainings", "pods", "nodes"];

/// How many woken objects wait for the controller before a watch waits for it in turn.
const QUEUE: usize = 1024;

/// Where a watch's objects go: nowhere while this replica follows, the controller once it
/// leads.
struct Outlet<K>(Arc<Mutex<Option<mpsc::Sender<K>>>>);

impl<K> Clone for Outlet<K> {
    fn clone(&self) -> Self {
        Outlet(self.0.clone())
    }
}

impl<K: Send + 'static> Outlet<K> {
    fn closed() -> Self {
        Outlet(Arc::new(Mutex::new(None)))
    }

    async fn send(&self, object: K) {
        let sender = self.0.lock().expect("lock").clone();
        if let Some(sender) = sender {
            // The controller is gone only when this replica stops: nothing left to wake.
            let _ = sender.send(object).await;
        }
    }

    /// Opens the outlet: from now on, the watch's objects come out of the returned stream.
    fn open(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + use<K> {
        let (sender, receiver) = mpsc::channel(QUEUE);
        *self.0.lock().expect("lock") = Some(sender);
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (Ok(object), receiver))
        })
    }
}

/// The caches of jobs, their pods and the nodes, and the outlets of their watches.
pub struct Caches {
    pub jobs: Store<DistributedTraining>,
    pub pods: PodCache,
    pub nodes: Store<Node>,
    job_outlet: Outlet<DistributedTraining>,
    pod_outlet: Outlet<Pod>,
    node_outlet: Outlet<Node>,
}

/// What the controller is woken by: jobs whose spec changed (a new generation), pods that
/// changed or went, nodes that changed or went.
pub struct ControllerStreams<J, P, N> {
    pub jobs: J,
    pub pods: P,
    pub nodes: N,
}

impl Caches {
    /// Starts the three watches (jobs, pods managed by ferrotrain, nodes), cluster-wide or in
    /// `namespace`, each feeding `readiness` and its cache.
    pub fn start(client: &Client, namespace: Option<&str>, readiness: &Arc<Readiness>) -> Caches {
        let (jobs_api, pods_api): (Api<DistributedTraining>, Api<Pod>) = match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        readiness.track(&WATCHES);
        let [job_watch, pod_watch, node_watch] = WATCHES;

        let (jobs, writer) = reflector::store();
        let job_outlet = Outlet::closed();
        let health = readiness.clone();
        let outlet = job_outlet.clone();
        // Our own status writes do not bump the generation: they never wake a reconcile.
        // The caches drop managedFields (nothing here reads them): a tenth of a job's memory.
        let stream = watcher(jobs_api, watcher::Config::default())
            .default_backoff()
            .modify(|dt: &mut DistributedTraining| dt.managed_fields_mut().clear())
            .reflect(writer)
            .inspect(move |item| health.observe(job_watch, item))
            .applied_objects()
            .predicate_filter(predicates::generation, Default::default());
        drive(stream, outlet);

        let (pods, mut writer) = pod_cache();
        let pod_outlet = Outlet::closed();
        let selector = format!("{}={}", labels::MANAGED_BY, labels::MANAGER);
        let health = readiness.clone();
        let stream = watcher(pods_api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .modify(cache_fields::trim_pod)
            .inspect_ok(move |event| writer.apply_watcher_event(event))
            .inspect(move |item| health.observe(pod_watch, item))
            .touched_objects();
        drive(stream, pod_outlet.clone());

        let (nodes, writer) = reflector::store();
        let node_outlet = Outlet::closed();
        let health = readiness.clone();
        // Nodes wake their jobs only when their readiness changes, not on every heartbeat.
        let stream = cache_fields::readiness_changes(
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
                .default_backoff()
                .modify(cache_fields::trim_node)
                .reflect(writer)
                .inspect(move |item| health.observe(node_watch, item)),
        );
        drive(stream, node_outlet.clone());

        Caches {
            jobs,
            pods,
            nodes,
            job_outlet,
            pod_outlet,
            node_outlet,
        }
    }

    /// Opens the outlets: what wakes the controller from now on. Call once, when leading.
    pub fn controller_streams(
        &self,
    ) -> ControllerStreams<
        impl Stream<Item = Result<DistributedTraining, watcher::Error>> + Send + use<>,
        impl Stream<Item = Result<Pod, watcher::Error>> + Send + use<>,
        impl Stream<Item = Result<Node, watcher::Error>> + Send + use<>,
    > {
        ControllerStreams {
            jobs: self.job_outlet.open(),
            pods: self.pod_outlet.open(),
            nodes: self.node_outlet.open(),
        }
    }
}

/// Drives a watch in a task of its own: its cache stays current whether or not this replica
/// leads; its objects go out of `outlet` once it is open. Watch errors are retried with the
/// watcher's backoff (and shown by readiness), never forwarded.
fn drive<K, S>(stream: S, outlet: Outlet<K>)
where
    K: Send + 'static,
    S: Stream<Item = Result<K, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(object) = item {
                outlet.send(object).await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_outlet_drops_and_an_open_one_forwards_in_order() {
        let outlet = Outlet::<u32>::closed();
        outlet.send(1).await;
        let mut stream = Box::pin(outlet.open());
        outlet.send(2).await;
        outlet.send(3).await;
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        assert_eq!(stream.next().await.unwrap().unwrap(), 3);
    }
}
