//! The job's NetworkPolicy: who may reach which port, owned by the job, off when asked.

use super::*;
use crate::build::{BuildSettings, Owner, network_policy};
use crate::fixtures::{JobExt, build_settings, job};

fn ports(rule_ports: &Option<Vec<NetworkPolicyPort>>) -> Vec<(i32, Option<i32>, String)> {
    rule_ports
        .iter()
        .flatten()
        .map(|p| {
            let first = match &p.port {
                Some(IntOrString::Int(n)) => *n,
                other => panic!("{other:?}"),
            };
            (first, p.end_port, p.protocol.clone().unwrap_or_default())
        })
        .collect()
}

fn operator() -> OperatorPods {
    OperatorPods {
        namespace: "ferrotrain-system".into(),
        labels: BTreeMap::from([("app.kubernetes.io/name".into(), "ferrotrain".into())]),
    }
}

fn policy_of(
    spec: serde_json::Value,
    operator_pods: Option<OperatorPods>,
) -> Option<NetworkPolicy> {
    let dt = job().with_spec(spec);
    let owner = Owner::of(&dt).unwrap();
    let s = BuildSettings {
        operator_pods,
        ..build_settings()
    };
    network_policy(&owner, &dt.spec, &s)
}

#[test]
fn by_default_only_the_gang_reaches_its_ports_and_the_operator_its_progress_port() {
    let p = policy_of(serde_json::json!({"replicas": 2}), Some(operator())).unwrap();
    assert_eq!(p.metadata.name.as_deref(), Some("mt"));
    let owners = p.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners[0].controller, Some(true));
    let spec = p.spec.unwrap();
    let job = BTreeMap::from([(labels::JOB.to_string(), "mt".to_string())]);
    assert_eq!(spec.pod_selector.unwrap().match_labels, Some(job.clone()));
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    assert!(spec.egress.is_none());
    let ingress = spec.ingress.unwrap();
    assert_eq!(ingress.len(), 2);
    let from_gang = ingress[0].from.as_ref().unwrap();
    assert_eq!(from_gang.len(), 1);
    assert_eq!(
        from_gang[0].pod_selector.as_ref().unwrap().match_labels,
        Some(job)
    );
    assert!(
        from_gang[0].namespace_selector.is_none(),
        "this namespace only"
    );
    assert_eq!(
        ports(&ingress[0].ports),
        [
            (29500, None, "TCP".into()),
            (9090, None, "TCP".into()),
            (41000, Some(42999), "TCP".into())
        ]
    );
    let from_operator = ingress[1].from.as_ref().unwrap();
    assert_eq!(from_operator.len(), 1);
    let ns = from_operator[0].namespace_selector.as_ref().unwrap();
    assert_eq!(
        ns.match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"],
        "ferrotrain-system"
    );
    assert_eq!(
        from_operator[0].pod_selector.as_ref().unwrap().match_labels,
        Some(operator().labels)
    );
    assert_eq!(ports(&ingress[1].ports), [(9090, None, "TCP".into())]);
}

#[test]
fn metrics_from_peers_join_the_operator_and_an_unknown_operator_leaves_the_port_open() {
    let prometheus =
        serde_json::json!({"namespaceSelector": {"matchLabels": {"name": "monitoring"}}});
    let spec = serde_json::json!({"replicas": 2, "networkPolicy": {"metricsFrom": [prometheus]}});
    let p = policy_of(spec.clone(), Some(operator())).unwrap();
    let ingress = p.spec.unwrap().ingress.unwrap();
    assert_eq!(ingress[1].from.as_ref().unwrap().len(), 2);
    // An operator outside the cluster: no pod labels to name, so the progress port stays open
    // (the gang's other ports do not).
    let p = policy_of(spec, None).unwrap();
    let ingress = p.spec.unwrap().ingress.unwrap();
    assert!(ingress[1].from.is_none());
    assert_eq!(ports(&ingress[1].ports), [(9090, None, "TCP".into())]);
    assert!(ingress[0].from.is_some());
}

#[test]
fn restricted_egress_reaches_the_gang_dns_and_the_listed_peers_only() {
    let store =
        serde_json::json!({"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 443}]});
    let p = policy_of(
        serde_json::json!({"replicas": 2, "networkPolicy": {
            "restrictEgress": true, "egressTo": [store], "portRange": {"first": 50000, "last": 50999}
        }}),
        Some(operator()),
    )
    .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    let egress = spec.egress.unwrap();
    assert_eq!(egress.len(), 3);
    assert_eq!(
        ports(&egress[0].ports)[2],
        (50000, Some(50999), "TCP".into())
    );
    assert!(egress[1].to.is_none());
    assert_eq!(
        ports(&egress[1].ports),
        [(53, None, "UDP".into()), (53, None, "TCP".into())]
    );
    assert_eq!(
        egress[2].to.as_ref().unwrap()[0]
            .ip_block
            .as_ref()
            .unwrap()
            .cidr,
        "10.9.0.0/16"
    );
}

#[test]
fn disabled_there_is_no_policy() {
    let spec = serde_json::json!({"replicas": 2, "networkPolicy": {"enabled": false}});
    assert!(policy_of(spec, Some(operator())).is_none());
}
