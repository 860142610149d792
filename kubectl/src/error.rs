//! Why a command could not do what it was asked.

use crate::problem::Problem;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("no cluster to talk to: {0}")]
    NoCluster(#[source] kube::config::InferConfigError),
    #[error("cannot build the API client: {0}")]
    Client(#[source] kube::Error),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("distributedtrainings.ferrotrain.dev \"{name}\" not found in namespace {namespace}")]
    NotFound { name: String, namespace: String },
    #[error("distributedtrainings.ferrotrain.dev \"{0}\" was deleted")]
    Deleted(String),
    #[error("the watch of {name} failed: {source}")]
    Watch {
        name: String,
        #[source]
        source: kube::runtime::watcher::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin} is not YAML: {message}")]
    Yaml { origin: String, message: String },
    #[error("{origin}: {message}")]
    Manifest { origin: String, message: String },
    #[error("{origin} is not a valid DistributedTraining:\n{}", .problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        origin: String,
        problems: Vec<Problem>,
    },
    #[error("{0}")]
    Usage(String),
    #[error("the terminal: {0}")]
    Terminal(#[source] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An API call's failure, with what was being done.
    pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }
}
