//! `ferrotrain-operator run`: the HTTP endpoints, the start-up checks, leader election and the
//! controller, wired together. The binary and the fake-API-server tests call this same function.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info};

use crate::caches::Caches;
use crate::client::Clients;
use crate::config::{Args, Settings};
use crate::controller;
use crate::lease::{self, Leadership, LeaseSettings};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::server::{self, ServerState};

/// Why the operator could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the DistributedTraining CRD (distributedtrainings.ferrotrain.dev) is not installed: \
         `kubectl apply -f crds/` or install the Helm chart, which carries it"
    )]
    CrdMissing,
    #[error(
        "RBAC denies {verb} {resource}{scope} to the operator's service account: grant it \
         (charts/ferrotrain/templates/rbac.yaml has the rules): {source}"
    )]
    Forbidden {
        verb: &'static str,
        resource: String,
        scope: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot {verb} {resource} on the API server: {source}")]
    Api {
        verb: &'static str,
        resource: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Lease(#[from] lease::Error),
    #[error("lost the leader lease; exiting so that another replica leads")]
    LostLease,
}

/// Everything the operator does until `shutdown` completes (SIGTERM, SIGINT) or it loses the
/// leader lease. `listener` serves /metrics, /healthz and /readyz.
pub async fn run(
    clients: Clients,
    args: Args,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    let jobs = Arc::new(OnceLock::new());
    let stop = Stop::on(shutdown);
    let state = ServerState {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        jobs: jobs.clone(),
    };
    let server_stop = stop.clone();
    let server = tokio::spawn(async move {
        if let Err(e) = server::serve(listener, state, server_stop.wait()).await {
            error!(error = %e, "HTTP server failed");
        }
    });
    let result = lead(clients, &args, metrics, readiness, jobs, stop).await;
    server.abort();
    match &result {
        Ok(()) => info!("stopped"),
        Err(e) => error!(error = %e, "operator stopped"),
    }
    result
}

/// Checks the API, waits for the lease (when electing), then runs the controller.
async fn lead(
    clients: Clients,
    args: &Args,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    jobs: Arc<OnceLock<kube::runtime::reflector::Store<DistributedTraining>>>,
    stop: Stop,
) -> Result<(), Error> {
    let client = clients.work;
    preflight(&client, args.namespace.as_deref()).await?;
    let settings = Settings::from(args);
    // Warm on every replica: a standby that takes over acts on what it already holds.
    let caches = Caches::start(&client, args.namespace.as_deref(), &readiness);
    if !args.leader_election {
        let _ = jobs.set(caches.jobs.clone());
        controller::run(client, settings, &caches, metrics, readiness, stop.wait()).await;
        return Ok(());
    }
    let mut leadership = Leadership::join(clients.lease, LeaseSettings::from_env(args)?).await?;
    readiness.follow();
    if !leadership.wait_to_lead(stop.wait()).await? {
        leadership.release().await;
        return Ok(());
    }
    // The jobs' series (/metrics) come from the leader alone: a standby's copies would count
    // every job twice in a sum over the operator's pods.
    let _ = jobs.set(caches.jobs.clone());
    let lost = leadership.lost();
    let (lost_tx, lost_rx) = watch::channel(false);
    let controller_stop = stop.clone();
    let until = async move {
        tokio::select! {
            _ = controller_stop.wait() => {}
            _ = lost => { let _ = lost_tx.send(true); }
        }
    };
    controller::run(client, settings, &caches, metrics, readiness, until).await;
    if *lost_rx.borrow() {
        return Err(Error::LostLease);
    }
    leadership.release().await;
    Ok(())
}

/// Lists what the controller watches once, so that a missing CRD or a missing RBAC rule stops
/// the operator with a message naming the fix, instead of a watch retrying forever.
pub async fn preflight(client: &Client, namespace: Option<&str>) -> Result<(), Error> {
    let scope = match namespace {
        Some(ns) => format!(" in namespace {ns}"),
        None => " in all namespaces".to_string(),
    };
    let (jobs, pods): (Api<DistributedTraining>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let one = ListParams::default().limit(1);
    let kind = |k: &'static str, group: &str| {
        if group.is_empty() {
            k.to_string()
        } else {
            format!("{k}.{group}")
        }
    };
    let dt_resource = kind("distributedtrainings", &DistributedTraining::group(&()));
    match jobs.list_metadata(&one).await {
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(Error::CrdMissing),
        result => check(result, "list", dt_resource, &scope)?,
    }
    check(
        pods.list_metadata(&one).await,
        "list",
        "pods".into(),
        &scope,
    )?;
    check(
        nodes.list_metadata(&one).await,
        "list",
        "nodes".into(),
        " (cluster-scoped)",
    )?;
    Ok(())
}

fn check<T>(
    result: kube::Result<T>,
    verb: &'static str,
    resource: String,
    scope: &str,
) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 403 => Err(Error::Forbidden {
            verb,
            resource,
            scope: scope.to_string(),
            source: Box::new(kube::Error::Api(s)),
        }),
        Err(source) => Err(Error::Api {
            verb,
            resource,
            source: Box::new(source),
        }),
    }
}

/// A shutdown signal every part of the operator can wait on (a future completes only once).
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    fn on(shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = tx.send(true);
            // Keep the sender until every waiter has seen it.
            tx.closed().await;
        });
        Stop(rx)
    }

    fn wait(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.0.clone();
        async move {
            // A dropped sender also means stop.
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }
}
