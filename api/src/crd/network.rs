//! `spec.networkPolicy`: who may reach the gang's pods (docs/security.md).

use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyPeer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who may reach the gang's pods. On by default: a NetworkPolicy the job owns lets in only
/// the job's own pods, on the ports the gang uses (rendezvous, portRange, progress), and the
/// operator (plus metricsFrom) on the progress/metrics port. Anyone who may create pods in the
/// namespace can copy the gang's labels and so match the policy: the rendezvous token stays
/// the defence against that (docs/security.md).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the job's NetworkPolicy (and pin its pods' listening ports to portRange).
    /// False leaves the pods open to every pod of the cluster, as in a namespace without
    /// NetworkPolicies. A cluster whose network plugin does not enforce NetworkPolicies
    /// ignores the object.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The ports the gang's processes may listen on besides the rendezvous and progress
    /// ports: the TCP ring's, NCCL's and Gloo's listeners. The pods' ephemeral port range
    /// (the namespaced sysctl net.ipv4.ip_local_port_range) is set to it, so every port the
    /// kernel picks for a listener falls inside it; it must not hold the rendezvous or the
    /// progress port.
    #[serde(default)]
    pub port_range: PortRange,
    /// More peers allowed to the progress/metrics port (a Prometheus, for example):
    /// NetworkPolicyPeer objects, as in a NetworkPolicy's ingress rule (`kubectl explain
    /// networkpolicy.spec.ingress.from`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics_from: Vec<NetworkPolicyPeer>,
    /// Restrict egress too: the pods may then connect only to one another, to DNS (port 53)
    /// and to egressTo. Default false: checkpoints and data may live in object storage.
    #[serde(default)]
    pub restrict_egress: bool,
    /// With restrictEgress: where else the pods may connect to, as a NetworkPolicy's egress
    /// rules (`to` peers and `ports`; `kubectl explain networkpolicy.spec.egress`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_to: Vec<NetworkPolicyEgressRule>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        NetworkPolicySpec {
            enabled: true,
            port_range: PortRange::default(),
            metrics_from: Vec::new(),
            restrict_egress: false,
            egress_to: Vec::new(),
        }
    }
}

/// A range of TCP ports, both ends included.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.first <= self.last",
        "message": "spec.networkPolicy.portRange: first must not be above last"
    }
]))]
pub struct PortRange {
    /// The first port of the range.
    #[serde(default = "first_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub first: i32,
    /// The last port of the range (at least as many ports as the pod's processes open
    /// connections and listeners at once: a few per rank and peer).
    #[serde(default = "last_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub last: i32,
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange {
            first: first_port(),
            last: last_port(),
        }
    }
}

impl PortRange {
    /// Whether `port` is in the range.
    pub fn contains(&self, port: i32) -> bool {
        (self.first..=self.last).contains(&port)
    }

    /// "41000-42999", as FERROTRAIN_PORT_RANGE carries it.
    pub fn env_value(&self) -> String {
        format!("{}-{}", self.first, self.last)
    }

    /// "41000 42999", as net.ipv4.ip_local_port_range takes it.
    pub fn sysctl_value(&self) -> String {
        format!("{} {}", self.first, self.last)
    }
}

fn enabled() -> bool {
    true
}

fn first_port() -> i32 {
    41000
}

fn last_port() -> i32 {
    42999
}
