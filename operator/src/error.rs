//! Why a reconcile failed (it is retried with backoff).

use crate::build;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{verb} {kind} {name}: {source}")]
    Api {
        verb: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Build(#[from] build::Error),
    #[error("publishing event {reason}: {source}")]
    Event {
        reason: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Short label for the errors metric.
    pub fn kind(&self) -> String {
        match self {
            Error::Api { verb, kind, .. } => {
                format!("{verb}_{kind}").to_lowercase().replace(' ', "_")
            }
            Error::Build(_) => "build".into(),
            Error::Event { .. } => "event".into(),
        }
    }

    /// A pod create the API refused for a reason a retry alone does not fix: a ResourceQuota
    /// or RBAC (403), a LimitRange or validation (422), an admission webhook's denial (400).
    pub fn is_refused_create(&self) -> bool {
        matches!(
            self,
            Error::Api { verb: "create", kind: "Pod", source: kube::Error::Api(s), .. }
                if matches!(s.code, 400 | 403 | 422)
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a kube error with what was being done to which object.
pub fn api_err(
    verb: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_string();
    move |source| Error::Api {
        verb,
        kind,
        name,
        source,
    }
}

/// True when the API answered with this HTTP status.
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}
