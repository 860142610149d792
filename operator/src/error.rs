//! Why a reconcile failed (it is retried with backoff).

use crate::objects;

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
    Build(#[from] objects::Error),
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

    /// The API refused to create something because its namespace is being deleted (the
    /// NamespaceLifecycle admission plugin's 403 with cause NamespaceTerminating): expected
    /// while a namespace with jobs in it goes away, and the job goes with it.
    pub fn is_namespace_terminating(&self) -> bool {
        let source = match self {
            Error::Api { source, .. } | Error::Event { source, .. } => source,
            Error::Build(_) => return false,
        };
        let kube::Error::Api(s) = source else {
            return false;
        };
        s.code == 403
            && s.details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
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

/// The fields of a write the API server refused because the installed CRD's schema does not
/// declare them (server-side apply's 500 "field not declared in schema", one line per field):
/// the CRD is older than this operator. Empty for any other error.
pub fn fields_not_in_schema(e: &kube::Error) -> Vec<String> {
    const NOT_DECLARED: &str = ": field not declared in schema";
    let kube::Error::Api(s) = e else {
        return Vec::new();
    };
    if s.code != 500 {
        return Vec::new();
    }
    let mut fields: Vec<String> = s
        .message
        .split('\n')
        .filter_map(|line| line.split_once(NOT_DECLARED))
        .filter_map(|(before, _)| before.split_whitespace().last())
        .map(str::to_string)
        .collect();
    fields.dedup();
    fields
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, body: serde_json::Value) -> Error {
        let status: kube::core::Status = serde_json::from_value(body).unwrap();
        api_err("create", "Pod", "mt-0-0")(kube::Error::Api(Box::new(status.with_code(code))))
    }

    #[test]
    fn a_create_in_a_terminating_namespace_is_told_apart_from_a_refusal() {
        // What the NamespaceLifecycle admission plugin answers (k8s.io/apiserver
        // pkg/admission/plugin/namespace/lifecycle).
        let terminating = refused(
            403,
            serde_json::json!({
                "status": "Failure", "reason": "Forbidden",
                "message": "pods \"mt-0-0\" is forbidden: unable to create new content in namespace ns because it is being terminated",
                "details": {"name": "mt-0-0", "kind": "pods", "causes": [
                    {"reason": "NamespaceTerminating", "message": "namespace ns is being terminated", "field": "metadata.namespace"}
                ]}
            }),
        );
        assert!(terminating.is_namespace_terminating());
        let quota = refused(
            403,
            serde_json::json!({
                "status": "Failure", "reason": "Forbidden",
                "message": "pods \"mt-0-0\" is forbidden: exceeded quota: gpus"
            }),
        );
        assert!(!quota.is_namespace_terminating());
        assert!(quota.is_refused_create());
    }

    #[test]
    fn the_fields_an_older_crd_lacks_are_read_from_the_api_servers_refusal() {
        // What a v1.36 API server answered an apply of this operator's status under 0.1.0's
        // CRD (two fields, then one).
        let status = |message: &str| {
            let body = serde_json::json!({"status": "Failure", "message": message});
            let status: kube::core::Status = serde_json::from_value(body).unwrap();
            kube::Error::Api(Box::new(status.with_code(500)))
        };
        let two = status(
            "failed to create typed patch object (/; ferrotrain.dev/v1alpha1, \
             Kind=DistributedTraining): errors:\n  .status.recovery.attempts[0].worldSize: \
             field not declared in schema\n  .status.recovery.secondsByWorldSize: field not \
             declared in schema",
        );
        assert_eq!(
            fields_not_in_schema(&two),
            [
                ".status.recovery.attempts[0].worldSize",
                ".status.recovery.secondsByWorldSize"
            ]
        );
        let one = status(
            "failed to create typed patch object (/; ferrotrain.dev/v1alpha1, \
             Kind=DistributedTraining): .status.recovery.secondsByWorldSize: field not \
             declared in schema",
        );
        assert_eq!(
            fields_not_in_schema(&one),
            [".status.recovery.secondsByWorldSize"]
        );
        let other = status("etcdserver: request timed out");
        assert!(fields_not_in_schema(&other).is_empty());
    }
}
