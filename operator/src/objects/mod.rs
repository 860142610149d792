//! Build: the objects of a job, from its spec and the operator's settings. Pure functions:
//! same input, same object (so server-side apply is a no-op when nothing changed).

use std::collections::BTreeMap;

use ferrotrain_api::crd::DistributedTrainingSpec;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::Resource;

use crate::labels;
use crate::scheduling::{self, GroupObject};

mod config_map;
mod container;
mod environment;
mod network;
mod owner;
mod pod;
mod pod_group;
mod secret;
mod security;
mod service;
mod settings;
mod storage;
mod store;

pub use config_map::config_map;
pub use container::{DEFAULT_COMMAND, GPU_RESOURCE};
pub use environment::contract_env;
pub use network::OperatorPods;
pub use owner::{Error, Owner, common_labels};
pub use pod::pod;
use pod_group::group_object;
pub use secret::{new_token, secret};
pub use security::{PORT_RANGE_SYSCTL, RUN_AS};
pub use service::service;
pub use settings::{BuildSettings, termination_grace};
pub use storage::{RESERVED_VOLUMES, mounts_checkpoint_volume};
pub use store::{StoreAddress, StoreHost, StoreService, service_to_read, store_address};

/// Every object of one attempt's launch, in the order they are applied.
#[derive(Clone, Debug, PartialEq)]
pub struct GangObjects {
    pub service: Service,
    /// None when the job runs its own command without a trainer config.
    pub config_map: Option<ConfigMap>,
    pub secret: Secret,
    /// Who may reach the pods (spec.networkPolicy), applied before any pod exists.
    pub network_policy: Option<k8s_openapi::api::networking::v1::NetworkPolicy>,
    /// The attempt's PodGroup (or Workload), created before its pods.
    pub group: Option<GroupObject>,
    pub pods: Vec<Pod>,
    /// Pod spec fields the typed Pod cannot hold (Kubernetes' own gang API), merged into
    /// every pod's JSON at create.
    pub pod_fields: Option<serde_json::Value>,
}

/// The objects of attempt `attempt` for the node ranks `node_ranks` (the missing ones). `token`
/// is the rendezvous token for a Secret that does not exist yet ([`new_token`]).
pub fn gang(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    attempt: i32,
    node_ranks: &[i32],
    settings: &BuildSettings,
    token: &str,
) -> GangObjects {
    let group = scheduling::group_name(&owner.name, attempt);
    GangObjects {
        service: service(owner, settings),
        config_map: config_map(owner, spec),
        secret: secret(owner, token),
        network_policy: network_policy(owner, spec, settings),
        group: group_object(owner, spec, &settings.gang, attempt),
        pods: node_ranks
            .iter()
            .map(|&rank| pod(owner, spec, attempt, rank, settings))
            .collect(),
        pod_fields: scheduling::native_pod_fields(&settings.gang, &group),
    }
}

/// Who may reach the job's pods (docs/security.md); None when spec.networkPolicy is off.
pub fn network_policy(
    owner: &Owner,
    spec: &DistributedTrainingSpec,
    s: &BuildSettings,
) -> Option<k8s_openapi::api::networking::v1::NetworkPolicy> {
    let meta = owner.meta(labels::network_policy_name(&owner.name), BTreeMap::new());
    let ports = network::GangPorts {
        rendezvous: s.master_port,
        progress: s.trainer_metrics_port,
    };
    let store = store::egress(spec, &owner.namespace, s.store_service.as_ref());
    network::policy(
        &owner.name,
        meta,
        &spec.network_policy,
        ports,
        s.operator_pods.as_ref(),
        store,
    )
}

/// The kind/apiVersion of a built object, for server-side apply bodies.
pub fn type_meta<K: Resource<DynamicType = ()>>() -> (String, String) {
    (K::api_version(&()).into_owned(), K::kind(&()).into_owned())
}

#[cfg(test)]
mod tests;
