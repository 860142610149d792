//! The job's headless Service: the pods' DNS names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

use super::owner::Owner;
use super::settings::BuildSettings;
use crate::labels;

/// The headless Service giving each pod the DNS name `<pod>.<job>.<ns>.svc`. Not-ready
/// addresses are published: rendezvous happens before any readiness.
pub fn service(owner: &Owner, s: &BuildSettings) -> Service {
    Service {
        metadata: owner.meta(labels::service_name(&owner.name), BTreeMap::new()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(BTreeMap::from([(
                labels::JOB.to_string(),
                owner.name.clone(),
            )])),
            ports: Some(vec![
                ServicePort {
                    name: Some("rendezvous".into()),
                    port: s.master_port.into(),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                },
                ServicePort {
                    name: Some("metrics".into()),
                    port: s.trainer_metrics_port.into(),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                },
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}
