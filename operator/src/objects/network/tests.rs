//! The job's NetworkPolicy: who may reach which port, owned by the job, off when asked.

use super::*;
use crate::fixtures::{JobExt, build_settings, job};
use crate::objects::{BuildSettings, Owner, StoreService, network_policy};

/// A rule's ports: (port, endPort, protocol).
type Ports = Vec<(i32, Option<i32>, String)>;

fn ports(rule_ports: &Option<Vec<NetworkPolicyPort>>) -> Ports {
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

/// The egress rules of a job with restrictEgress, a checkpoint store at `endpoint` (AWS
/// without one) and one egressTo rule, its store's Service read as `service`.
fn egress_with_store(
    endpoint: Option<&str>,
    service: Option<StoreService>,
) -> Vec<NetworkPolicyEgressRule> {
    let mut store = serde_json::json!({"url": "s3://ckpt/runs"});
    if let Some(endpoint) = endpoint {
        store["endpoint"] = endpoint.into();
    }
    let dt = job().with_spec(serde_json::json!({"replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 10, "checkpoint": {"store": store}},
        "networkPolicy": {"restrictEgress": true, "egressTo": [{"ports": [{"port": 8443}]}]}}));
    let owner = Owner::of(&dt).unwrap();
    let s = BuildSettings {
        store_service: service,
        ..build_settings()
    };
    let egress = network_policy(&owner, &dt.spec, &s)
        .and_then(|p| p.spec)
        .and_then(|p| p.egress)
        .unwrap();
    // The gang, DNS, the store, then egressTo.
    assert_eq!(egress.len(), 4, "{egress:?}");
    assert_eq!(ports(&egress[3].ports), [(8443, None, String::new())]);
    egress
}

/// The store's rule: its one peer (None: any destination) and its ports.
fn store_rule(egress: &[NetworkPolicyEgressRule]) -> (Option<NetworkPolicyPeer>, Ports) {
    let rule = &egress[2];
    let peers = rule.to.clone();
    assert!(peers.as_ref().is_none_or(|p| p.len() == 1), "{peers:?}");
    (peers.map(|mut p| p.remove(0)), ports(&rule.ports))
}

fn namespace_of(peer: &NetworkPolicyPeer) -> String {
    peer.namespace_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap()["kubernetes.io/metadata.name"]
        .clone()
}

fn minio() -> StoreService {
    StoreService {
        selector: BTreeMap::from([("app".into(), "minio".into())]),
        ports: vec![(80, Some(IntOrString::Int(9000))), (9001, None)],
    }
}

#[test]
fn a_store_at_an_ip_address_is_reached_at_that_address_and_port_alone() {
    let (peer, ports) = store_rule(&egress_with_store(Some("http://10.0.0.5:9000"), None));
    assert_eq!(peer.unwrap().ip_block.unwrap().cidr, "10.0.0.5/32");
    assert_eq!(ports, [(9000, None, "TCP".into())]);
    let (peer, ports) = store_rule(&egress_with_store(Some("https://[fd00::5]"), None));
    assert_eq!(peer.unwrap().ip_block.unwrap().cidr, "fd00::5/128");
    assert_eq!(ports, [(443, None, "TCP".into())]);
}

#[test]
fn a_store_behind_a_service_is_reached_at_its_pods_on_the_port_behind_the_endpoints() {
    // Port 80 (http's) of the Service goes to its pods' 9000: a policy sees the connection
    // after the Service's translation.
    for endpoint in [
        "http://minio.store.svc",
        "http://minio.store.svc.cluster.local/",
    ] {
        let (peer, ports) = store_rule(&egress_with_store(Some(endpoint), Some(minio())));
        let peer = peer.unwrap();
        assert_eq!(namespace_of(&peer), "store", "{endpoint}");
        assert_eq!(
            peer.pod_selector.unwrap().match_labels,
            Some(minio().selector)
        );
        assert_eq!(ports, [(9000, None, "TCP".into())], "{endpoint}");
    }
    // No targetPort: the port itself. A name alone is a Service of the job's namespace.
    let (peer, ports) = store_rule(&egress_with_store(Some("http://minio:9001"), Some(minio())));
    assert_eq!(namespace_of(&peer.unwrap()), "ml");
    assert_eq!(ports, [(9001, None, "TCP".into())]);
    // A named targetPort stays a name: the pods' port of that name.
    let named = StoreService {
        ports: vec![(9000, Some(IntOrString::String("s3".into())))],
        ..minio()
    };
    let egress = egress_with_store(Some("http://minio.store.svc:9000"), Some(named));
    let port = egress[2].ports.as_ref().unwrap()[0].port.clone();
    assert_eq!(port, Some(IntOrString::String("s3".into())));
}

#[test]
fn a_service_the_operator_could_not_read_opens_its_namespace_on_the_endpoints_port() {
    let (peer, ports) = store_rule(&egress_with_store(
        Some("http://minio.store.svc:9000"),
        None,
    ));
    let peer = peer.unwrap();
    assert_eq!(namespace_of(&peer), "store");
    assert!(peer.pod_selector.is_none(), "every pod of the namespace");
    assert_eq!(ports, [(9000, None, "TCP".into())]);
    // A Service without a selector has no pods to name: its port, to anywhere.
    let external = StoreService {
        selector: BTreeMap::new(),
        ..minio()
    };
    let egress = egress_with_store(Some("http://minio.store.svc:9000"), Some(external));
    assert_eq!(
        store_rule(&egress),
        (None, vec![(9000, None, "TCP".into())])
    );
}

#[test]
fn a_store_named_by_another_host_or_on_aws_is_its_port_to_anywhere() {
    for (endpoint, port) in [
        (Some("https://s3.eu-central-1.amazonaws.com"), 443),
        (Some("http://minio.example.com:9000"), 9000),
        (Some("http://minio.store:9000"), 9000),
        (None, 443),
    ] {
        let (peer, ports) = store_rule(&egress_with_store(endpoint, None));
        assert_eq!(peer, None, "{endpoint:?}");
        assert_eq!(ports, [(port, None, "TCP".into())], "{endpoint:?}");
    }
}

#[test]
fn without_restricted_egress_the_store_adds_nothing() {
    let store = serde_json::json!({"url": "s3://ckpt", "endpoint": "http://10.0.0.5:9000"});
    let spec = |np: serde_json::Value| {
        serde_json::json!({"replicas": 2, "networkPolicy": np,
            "trainer": {"task": "copy", "maxSteps": 10, "checkpoint": {"store": store}}})
    };
    let p = policy_of(spec(serde_json::json!({})), Some(operator())).unwrap();
    assert!(p.spec.unwrap().egress.is_none());
    assert!(policy_of(spec(serde_json::json!({"enabled": false})), None).is_none());
}

#[test]
fn an_egress_to_rule_with_peers_on_the_stores_port_stands_for_the_port_to_anywhere() {
    let spec = |store: serde_json::Value, egress_to: serde_json::Value| {
        serde_json::json!({"replicas": 2,
            "trainer": {"task": "copy", "maxSteps": 10, "checkpoint": {"store": store}},
            "networkPolicy": {"restrictEgress": true, "egressTo": egress_to}})
    };
    let egress = |spec: serde_json::Value| {
        let p = policy_of(spec, Some(operator())).unwrap();
        p.spec.unwrap().egress.unwrap()
    };
    let aws = serde_json::json!({"url": "s3://ckpt"});
    let s3_addresses = serde_json::json!([{"to": [{"ipBlock": {"cidr": "52.95.128.0/21"}}],
        "ports": [{"port": 443, "protocol": "TCP"}]}]);
    // The user's addresses alone: no rule of the operator's voids them.
    let rules = egress(spec(aws.clone(), s3_addresses));
    assert_eq!(rules.len(), 3, "{rules:?}");
    assert_eq!(
        rules[2].to.as_ref().unwrap()[0]
            .ip_block
            .as_ref()
            .unwrap()
            .cidr,
        "52.95.128.0/21"
    );
    // Peers on other ports, or a port without peers, leave the store's rule in place.
    for other in [
        serde_json::json!([{"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 8443}]}]),
        serde_json::json!([{"ports": [{"port": 443}]}]),
    ] {
        let rules = egress(spec(aws.clone(), other));
        assert_eq!(rules.len(), 4, "{rules:?}");
        assert!(rules[2].to.is_none());
    }
    // A store the rule can name precisely keeps its rule.
    let ip = serde_json::json!({"url": "s3://ckpt", "endpoint": "https://10.0.0.5"});
    let listed = serde_json::json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]);
    assert_eq!(egress(spec(ip, listed)).len(), 4);
}
