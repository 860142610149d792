//! Who owns a job's objects: its name, namespace and controller reference, and the metadata
//! every child carries.

use std::collections::BTreeMap;

use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::labels;

/// Why an object could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the DistributedTraining has no {0}")]
    MissingMetadata(&'static str),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// Name, namespace and controller owner reference of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub reference: OwnerReference,
}

impl Owner {
    /// Reads them from the object.
    pub fn of(dt: &DistributedTraining) -> Result<Self> {
        Ok(Owner {
            name: dt
                .metadata
                .name
                .clone()
                .ok_or(Error::MissingMetadata("name"))?,
            namespace: dt.namespace().ok_or(Error::MissingMetadata("namespace"))?,
            reference: dt
                .controller_owner_ref(&())
                .ok_or(Error::MissingMetadata("uid"))?,
        })
    }

    /// True when `meta` names this job as its controller (by uid: a re-created job of the same
    /// name does not adopt its predecessor's objects, and a user's object is never ours).
    pub fn controls(&self, meta: &ObjectMeta) -> bool {
        meta.owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == self.reference.uid)
    }

    pub(super) fn meta(&self, name: String, extra_labels: BTreeMap<String, String>) -> ObjectMeta {
        // The operator's labels win: they are how it finds its pods.
        let mut labels = extra_labels;
        labels.extend(common_labels(&self.name));
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![self.reference.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// Labels every child carries.
pub fn common_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::APP_NAME.to_string(), "ferrotrain".to_string()),
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (labels::JOB.to_string(), job.to_string()),
    ])
}
