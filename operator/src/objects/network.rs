//! The job's NetworkPolicy (`spec.networkPolicy`, docs/security.md): ingress to the gang's
//! pods only from the job's own pods, on the ports the gang uses (the rendezvous store, the
//! declared port range of its other listeners, progress), and from the operator (plus
//! `metricsFrom`) on the progress/metrics port. Egress stays open unless `restrictEgress`;
//! then the gang, DNS, the checkpoint store (build/store.rs) and `egressTo`.

use std::collections::BTreeMap;

use ferrotrain_api::crd::NetworkPolicySpec as JobPolicy;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::labels;

/// Where the operator's own pods run, and their labels: the peer allowed to poll progress.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorPods {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

/// The ports the gang listens on besides `spec.networkPolicy.portRange`.
#[derive(Clone, Copy, Debug)]
pub struct GangPorts {
    pub rendezvous: u16,
    pub progress: u16,
}

/// The NetworkPolicy of job `job` (its metadata `meta`), None when `np.enabled` is false.
/// `store` is the egress rule to the checkpoint store, if the job has one.
pub fn policy(
    job: &str,
    meta: ObjectMeta,
    np: &JobPolicy,
    ports: GangPorts,
    operator: Option<&OperatorPods>,
    store: Option<NetworkPolicyEgressRule>,
) -> Option<NetworkPolicy> {
    if !np.enabled {
        return None;
    }
    let range = np.port_range;
    let gang_ports = vec![
        tcp(ports.rendezvous.into(), None),
        tcp(ports.progress.into(), None),
        tcp(range.first, Some(range.last)),
    ];
    let ingress = vec![
        NetworkPolicyIngressRule {
            from: Some(vec![gang_peer(job)]),
            ports: Some(gang_ports.clone()),
        },
        NetworkPolicyIngressRule {
            from: metrics_peers(np.metrics_from.clone(), operator),
            ports: Some(vec![tcp(ports.progress.into(), None)]),
        },
    ];
    let egress = np.restrict_egress.then(|| {
        let mut rules = vec![
            NetworkPolicyEgressRule {
                to: Some(vec![gang_peer(job)]),
                ports: Some(gang_ports),
            },
            // DNS, wherever the cluster serves it: the ranks find one another by name.
            NetworkPolicyEgressRule {
                to: None,
                ports: Some(vec![port(53, "UDP"), port(53, "TCP")]),
            },
        ];
        rules.extend(store);
        rules.extend(np.egress_to.iter().cloned());
        rules
    });
    let mut policy_types = vec!["Ingress".to_string()];
    if egress.is_some() {
        policy_types.push("Egress".into());
    }
    Some(NetworkPolicy {
        metadata: meta,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(job_selector(job)),
            policy_types: Some(policy_types),
            ingress: Some(ingress),
            egress,
        }),
    })
}

/// The operator and `extra` may poll progress; anyone may when the operator's pods are not
/// known (an operator run outside the cluster: the policy must not cut it off).
fn metrics_peers(
    mut extra: Vec<NetworkPolicyPeer>,
    operator: Option<&OperatorPods>,
) -> Option<Vec<NetworkPolicyPeer>> {
    let operator = operator?;
    extra.insert(
        0,
        NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    operator.namespace.clone(),
                )])),
                ..LabelSelector::default()
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(operator.labels.clone()),
                ..LabelSelector::default()
            }),
            ip_block: None,
        },
    );
    Some(extra)
}

/// The pods of the job (every attempt's), in the policy's own namespace.
fn gang_peer(job: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(job_selector(job)),
        ..NetworkPolicyPeer::default()
    }
}

fn job_selector(job: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(labels::JOB.to_string(), job.to_string())])),
        ..LabelSelector::default()
    }
}

fn tcp(first: i32, last: Option<i32>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(first)),
        end_port: last,
        protocol: Some("TCP".into()),
    }
}

fn port(number: i32, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(number)),
        end_port: None,
        protocol: Some(protocol.into()),
    }
}

#[cfg(test)]
mod tests;
