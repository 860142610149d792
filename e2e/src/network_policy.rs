//! A NetworkPolicy's egress rules read as a network plugin would (the cluster kit enforces
//! none): whether a rule lets a pod's connection out to a destination, by port (number, range
//! or name) and peer (namespace and pod selectors, IP blocks).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A pod a connection may go to, as a NetworkPolicy sees it.
#[derive(Clone, Debug)]
pub struct Destination {
    pub namespace_labels: BTreeMap<String, String>,
    pub pod_labels: BTreeMap<String, String>,
    pub ip: Ipv4Addr,
    pub port: u16,
    /// The name of the pod's port, for rules that name ports.
    pub port_name: Option<String>,
    pub protocol: String,
}

/// Whether egress rules of a policy selecting pods of namespace `from_namespace` let a
/// connection to `to` out (a connection any rule allows is allowed).
pub fn egress_allows(
    rules: &[NetworkPolicyEgressRule],
    from_namespace: &str,
    to: &Destination,
) -> bool {
    rules.iter().any(|rule| {
        let ports_ok = match rule.ports.as_deref() {
            None | Some([]) => true,
            Some(ports) => ports.iter().any(|p| {
                let protocol = p.protocol.as_deref().unwrap_or("TCP");
                protocol == to.protocol
                    && match &p.port {
                        None => true,
                        Some(IntOrString::Int(n)) => {
                            let last = p.end_port.unwrap_or(*n);
                            (*n..=last).contains(&i32::from(to.port))
                        }
                        Some(IntOrString::String(name)) => to.port_name.as_ref() == Some(name),
                    }
            }),
        };
        let peers_ok = match rule.to.as_deref() {
            None | Some([]) => true,
            Some(peers) => peers
                .iter()
                .any(|peer| peer_matches(peer, from_namespace, to)),
        };
        ports_ok && peers_ok
    })
}

fn peer_matches(peer: &NetworkPolicyPeer, from_namespace: &str, to: &Destination) -> bool {
    if let Some(block) = &peer.ip_block {
        let inside = |cidr: &str| {
            let Some((net, bits)) = cidr.split_once('/') else {
                return false;
            };
            let (Ok(net), Ok(bits)) = (net.parse::<Ipv4Addr>(), bits.parse::<u32>()) else {
                return false;
            };
            let mask = u32::MAX.checked_shl(32 - bits.min(32)).unwrap_or(0);
            u32::from(net) & mask == u32::from(to.ip) & mask
        };
        return inside(&block.cidr) && !block.except.iter().flatten().any(|c| inside(c));
    }
    let namespace_ok = match &peer.namespace_selector {
        // No namespace selector: the policy's own namespace.
        None => {
            to.namespace_labels.get("kubernetes.io/metadata.name")
                == Some(&from_namespace.to_string())
        }
        Some(selector) => selects(selector, &to.namespace_labels),
    };
    let pod_ok = peer
        .pod_selector
        .as_ref()
        .is_none_or(|selector| selects(selector, &to.pod_labels));
    namespace_ok && pod_ok
}

/// Whether a label selector selects an object with `labels` (an empty selector selects all).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values: BTreeSet<&str> = e.values.iter().flatten().map(String::as_str).collect();
        let value = labels.get(&e.key).map(String::as_str);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::s3::{APP, PORT};

    fn store_pod() -> Destination {
        Destination {
            namespace_labels: BTreeMap::from([("kubernetes.io/metadata.name".into(), "ns".into())]),
            pod_labels: BTreeMap::from([("app.kubernetes.io/name".into(), APP.into())]),
            ip: Ipv4Addr::new(10, 201, 0, 60),
            port: PORT,
            port_name: Some("s3".into()),
            protocol: "TCP".into(),
        }
    }

    fn rule(value: Value) -> NetworkPolicyEgressRule {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn egress_rules_are_read_as_a_network_plugin_would() {
        let to = store_pod();
        let by_selector = rule(json!({
            "to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": APP}}
            }],
            "ports": [{"port": 9000, "protocol": "TCP"}]
        }));
        assert!(egress_allows(std::slice::from_ref(&by_selector), "ns", &to));
        let mut elsewhere = to.clone();
        elsewhere.namespace_labels =
            BTreeMap::from([("kubernetes.io/metadata.name".into(), "other".into())]);
        assert!(!egress_allows(
            std::slice::from_ref(&by_selector),
            "ns",
            &elsewhere
        ));
        let mut other_port = to.clone();
        other_port.port = 9001;
        assert!(!egress_allows(
            std::slice::from_ref(&by_selector),
            "ns",
            &other_port
        ));
        let dns = rule(
            json!({"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}),
        );
        assert!(!egress_allows(std::slice::from_ref(&dns), "ns", &to));
        let own_pods =
            rule(json!({"to": [{"podSelector": {"matchLabels": {"ferrotrain.dev/job": "j"}}}]}));
        assert!(!egress_allows(std::slice::from_ref(&own_pods), "ns", &to));
        let by_ip = rule(
            json!({"to": [{"ipBlock": {"cidr": "10.201.0.60/32"}}], "ports": [{"port": 9000}]}),
        );
        assert!(egress_allows(std::slice::from_ref(&by_ip), "ns", &to));
        let except = rule(
            json!({"to": [{"ipBlock": {"cidr": "10.201.0.0/24", "except": ["10.201.0.60/32"]}}]}),
        );
        assert!(!egress_allows(std::slice::from_ref(&except), "ns", &to));
        let named = rule(json!({"to": [{"podSelector": {"matchExpressions": [
            {"key": "app.kubernetes.io/name", "operator": "In", "values": [APP]}]}}],
            "ports": [{"port": "s3"}]}));
        assert!(egress_allows(std::slice::from_ref(&named), "ns", &to));
        assert!(!egress_allows(std::slice::from_ref(&named), "other", &to));
        let range = rule(json!({"ports": [{"port": 8000, "endPort": 9999}]}));
        assert!(egress_allows(std::slice::from_ref(&range), "ns", &to));
        assert!(egress_allows(&[dns, by_selector], "ns", &to));
    }
}
