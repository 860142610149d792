//! The API client, as kubectl would connect: the kubeconfig of `--kubeconfig`, else
//! $KUBECONFIG or ~/.kube/config (in a pod: its service account), its current context or
//! `--context`, and the namespace of `--namespace`, else the context's, else `default`.
//! Every request goes through the counting layer (src/requests.rs).

use ferrotrain_api::crd::DistributedTraining;
use kube::client::ClientBuilder;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::cli::Connection;
use crate::error::{Error, Result};
use crate::requests::{CountLayer, RequestCounts};

/// A client of the cluster and the namespace the command acts in.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    /// `--namespace`, else the context's.
    pub namespace: String,
    /// Whether `--namespace` named it.
    pub namespace_given: bool,
    /// The requests made through `client`.
    pub counts: RequestCounts,
}

impl Cluster {
    /// Connects as `connection` says.
    pub async fn connect(connection: &Connection) -> Result<Cluster> {
        let config = config(connection).await?;
        let counts = RequestCounts::default();
        let namespace = connection
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = ClientBuilder::try_from(config)
            .map_err(Error::Client)?
            .with_layer(&CountLayer(counts.clone()))
            .build();
        Ok(Cluster {
            client,
            namespace,
            namespace_given: connection.namespace.is_some(),
            counts,
        })
    }

    /// Job `name` of the namespace.
    pub async fn job(&self, name: &str) -> Result<DistributedTraining> {
        let jobs: Api<DistributedTraining> = Api::namespaced(self.client.clone(), &self.namespace);
        jobs.get_opt(name)
            .await
            .map_err(Error::api(format!("reading {name}")))?
            .ok_or_else(|| Error::NotFound {
                name: name.to_string(),
                namespace: self.namespace.clone(),
            })
    }
}

async fn config(connection: &Connection) -> Result<Config> {
    let options = KubeConfigOptions {
        context: connection.context.clone(),
        cluster: connection.cluster.clone(),
        user: connection.user.clone(),
    };
    let named =
        connection.context.is_some() || connection.cluster.is_some() || connection.user.is_some();
    match &connection.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(Error::Kubeconfig)
        }
        // A context, cluster or user can only come from a kubeconfig.
        None if named => Config::from_kubeconfig(&options)
            .await
            .map_err(Error::Kubeconfig),
        None => Config::infer().await.map_err(Error::NoCluster),
    }
}
