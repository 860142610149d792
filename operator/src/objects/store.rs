//! The checkpoint store (`spec.trainer.checkpoint.store`, docs/checkpoints.md) as the pods
//! meet it: the credentials of `spec.checkpoint.storeSecretName` in the environment of the
//! pods that write checkpoints, and, when the job's NetworkPolicy restricts egress, the one
//! rule that lets them reach the store's endpoint (docs/security.md).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferrotrain_api::config::Endpoint;
use ferrotrain_api::crd::{DistributedTrainingSpec, STORE_SECRET_KEYS, STORE_SECRET_SESSION_KEY};
use ferrotrain_api::env;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector, Service};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::storage::mounts_checkpoint_volume;

/// AWS S3's port, where no endpoint is given.
const AWS_PORT: u16 = 443;

/// The store's endpoint host, as a NetworkPolicy can name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreHost {
    /// An IP address, taken as the store's own.
    Ip(IpAddr),
    /// A Service of the cluster: `<name>.<namespace>.svc[.<cluster domain>]`, or `<name>`
    /// alone (the job's namespace, the pods' first DNS search domain).
    Service { name: String, namespace: String },
    /// Another host name (AWS, a store outside the cluster), or none (AWS S3): a
    /// NetworkPolicy cannot name a DNS name.
    Elsewhere,
}

/// Where the pods connect to reach the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreAddress {
    pub host: StoreHost,
    pub port: u16,
}

/// What the operator read of the Service the store's endpoint names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreService {
    /// Its pod selector; empty when it has none (an ExternalName Service, or endpoints kept
    /// by hand: the addresses behind it are not pods a policy can select).
    pub selector: BTreeMap<String, String>,
    /// Its ports: (port, targetPort).
    pub ports: Vec<(i32, Option<IntOrString>)>,
}

impl StoreService {
    /// What the egress rule needs of `service`.
    pub fn of(service: &Service) -> StoreService {
        let spec = service.spec.clone().unwrap_or_default();
        StoreService {
            selector: spec.selector.unwrap_or_default(),
            ports: spec
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.port, p.target_port))
                .collect(),
        }
    }
}

/// The store's address; None without a store, or with an endpoint that does not parse (the
/// trainer config's validation reports that).
pub fn store_address(spec: &DistributedTrainingSpec, job_namespace: &str) -> Option<StoreAddress> {
    let store = spec.trainer.as_ref()?.checkpoint.store.as_ref()?;
    let Some(endpoint) = &store.endpoint else {
        return Some(StoreAddress {
            host: StoreHost::Elsewhere,
            port: AWS_PORT,
        });
    };
    let endpoint = Endpoint::parse(endpoint).ok()?;
    Some(StoreAddress {
        host: store_host(&endpoint.host, job_namespace),
        port: endpoint.port,
    })
}

fn store_host(host: &str, job_namespace: &str) -> StoreHost {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return StoreHost::Ip(ip);
    }
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let (name, namespace) = match labels.as_slice() {
        [name] => (*name, job_namespace),
        [name, namespace, "svc", ..] => (*name, *namespace),
        _ => return StoreHost::Elsewhere,
    };
    StoreHost::Service {
        name: name.to_string(),
        namespace: namespace.to_string(),
    }
}

/// The Service the store's endpoint names, as (name, namespace), when the job's
/// NetworkPolicy restricts egress: the operator reads it for the egress rule.
pub fn service_to_read(
    spec: &DistributedTrainingSpec,
    job_namespace: &str,
) -> Option<(String, String)> {
    let np = &spec.network_policy;
    if !(np.enabled && np.restrict_egress) {
        return None;
    }
    match store_address(spec, job_namespace)?.host {
        StoreHost::Service { name, namespace } => Some((name, namespace)),
        _ => None,
    }
}

/// The egress rule to the store: its pods (a Service with a selector, on the port behind the
/// endpoint's), its address (an IP endpoint), its Service's namespace (a Service the operator
/// could not read), else its port to anywhere, unless an `egressTo` rule names peers on that
/// port: the user's narrower rule then stands for it (a policy's rules add up, so the port
/// to anywhere would void it). None without a store.
pub(super) fn egress(
    spec: &DistributedTrainingSpec,
    job_namespace: &str,
    service: Option<&StoreService>,
) -> Option<NetworkPolicyEgressRule> {
    let address = store_address(spec, job_namespace)?;
    let endpoint_port = IntOrString::Int(address.port.into());
    let (peer, port) = match (&address.host, service) {
        (StoreHost::Ip(ip), _) => (Some(ip_peer(*ip)), endpoint_port),
        (StoreHost::Service { namespace, .. }, Some(s)) if !s.selector.is_empty() => (
            Some(pods_peer(namespace, Some(s.selector.clone()))),
            target_port(s, address.port),
        ),
        (StoreHost::Service { namespace, .. }, None) => {
            (Some(pods_peer(namespace, None)), endpoint_port)
        }
        (StoreHost::Service { .. }, Some(_)) | (StoreHost::Elsewhere, _) => {
            if listed_in_egress_to(spec, address.port) {
                return None;
            }
            (None, endpoint_port)
        }
    };
    Some(NetworkPolicyEgressRule {
        to: peer.map(|p| vec![p]),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(port),
            end_port: None,
            protocol: Some("TCP".into()),
        }]),
    })
}

/// Whether an `egressTo` rule lets the pods reach some peers (not anywhere) on TCP `port`.
fn listed_in_egress_to(spec: &DistributedTrainingSpec, port: u16) -> bool {
    let port = i32::from(port);
    let covers = |p: &NetworkPolicyPort| {
        p.protocol.as_deref().is_none_or(|proto| proto == "TCP")
            && match &p.port {
                None => true,
                Some(IntOrString::Int(first)) => {
                    (*first..=p.end_port.unwrap_or(*first)).contains(&port)
                }
                Some(IntOrString::String(_)) => false,
            }
    };
    spec.network_policy.egress_to.iter().any(|rule| {
        rule.to.as_ref().is_some_and(|to| !to.is_empty())
            && rule
                .ports
                .as_ref()
                .is_none_or(|ports| ports.is_empty() || ports.iter().any(covers))
    })
}

/// The port a connection to the Service's `port` reaches its pods on: a policy sees the
/// connection after the Service's translation, so it must name the targetPort (a number or
/// the pods' port name), which is the port itself when unset.
fn target_port(service: &StoreService, port: u16) -> IntOrString {
    service
        .ports
        .iter()
        .find(|(p, _)| *p == i32::from(port))
        .and_then(|(_, target)| target.clone())
        .unwrap_or(IntOrString::Int(port.into()))
}

fn ip_peer(ip: IpAddr) -> NetworkPolicyPeer {
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: format!("{ip}/{bits}"),
            except: None,
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// The pods `selector` selects in `namespace` (every pod there when None).
fn pods_peer(namespace: &str, selector: Option<BTreeMap<String, String>>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                namespace.to_string(),
            )])),
            ..LabelSelector::default()
        }),
        pod_selector: selector.map(|labels| LabelSelector {
            match_labels: Some(labels),
            ..LabelSelector::default()
        }),
        ip_block: None,
    }
}

/// The store's credentials for the pod of `node_rank`, when it writes checkpoints: the
/// Secret's keys as variables of the same names (the session token optional) and the
/// Secret's name, which the trainer's errors give.
pub(super) fn credentials_env(spec: &DistributedTrainingSpec, node_rank: i32) -> Vec<EnvVar> {
    let Some(secret) = spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.store_secret_name.as_deref())
    else {
        return Vec::new();
    };
    if !mounts_checkpoint_volume(spec, node_rank) {
        return Vec::new();
    }
    let from_secret = |key: &str, optional: bool| EnvVar {
        name: key.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: optional.then_some(true),
            }),
            ..EnvVarSource::default()
        }),
    };
    let mut vars: Vec<EnvVar> = STORE_SECRET_KEYS
        .iter()
        .map(|key| from_secret(key, false))
        .collect();
    vars.push(from_secret(STORE_SECRET_SESSION_KEY, true));
    vars.push(EnvVar {
        name: env::FERROTRAIN_STORE_SECRET.into(),
        value: Some(secret.to_string()),
        value_from: None,
    });
    vars
}

#[cfg(test)]
mod tests;
