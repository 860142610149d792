//! `ferrotrain-operator render -f job.yaml`: the objects the operator would create for the
//! first attempt of each DistributedTraining in a file (as `helm template` shows a chart's), with
//! the same builders and settings as `run`. For reviewing a job before applying it, and for
//! scanning what the operator creates (scripts/scan.sh). The Secret's token is a placeholder
//! (the operator draws a random one at launch) and the objects carry a placeholder owner UID.
//! A Service in the file stands for the cluster's when a job's checkpoint store names it (the
//! NetworkPolicy's egress rule to the store, which the operator builds from the Service it
//! reads); without it the rule is the one for a Service the operator cannot read.

use std::collections::BTreeMap;

use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use serde::Serialize;

use crate::config::Settings;
use crate::objects::{self, BuildSettings, Owner};
use crate::scheduling;

/// The token written into the rendered Secret.
pub const TOKEN_PLACEHOLDER: &str = "rendered-by-ferrotrain-operator-render";
/// The owner UID of the rendered objects.
const UID_PLACEHOLDER: &str = "00000000-0000-0000-0000-000000000000";

/// Every DistributedTraining of the (multi-document) YAML `text`, rendered as multi-document
/// YAML; Services are read for the jobs' checkpoint stores, documents of other kinds are
/// skipped. An error names the document that failed.
pub fn render(text: &str, settings: &Settings) -> Result<String, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not YAML: {e}"))?;
    let services = services(&documents)?;
    let mut out = String::new();
    let mut found = 0;
    for (i, doc) in documents.into_iter().enumerate() {
        if doc["kind"] != "DistributedTraining" {
            continue;
        }
        found += 1;
        let dt: DistributedTraining = serde_json::from_value(doc)
            .map_err(|e| format!("document {}: not a DistributedTraining: {e}", i + 1))?;
        for object in objects(dt, settings, &services)? {
            out += "---\n";
            out += &serde_saphyr::to_string(&object).map_err(|e| e.to_string())?;
        }
    }
    if found == 0 {
        return Err("no DistributedTraining in the input".into());
    }
    Ok(out)
}

/// The Services of `documents`, by (name, namespace; "default" when it names none).
fn services(
    documents: &[serde_json::Value],
) -> Result<BTreeMap<(String, String), Service>, String> {
    let mut services = BTreeMap::new();
    for (i, doc) in documents.iter().enumerate() {
        if doc["kind"] != "Service" {
            continue;
        }
        let service: Service = serde_json::from_value(doc.clone())
            .map_err(|e| format!("document {}: not a Service: {e}", i + 1))?;
        let namespace = service.namespace().unwrap_or_else(|| "default".into());
        services.insert((service.name_any(), namespace), service);
    }
    Ok(services)
}

/// The objects of `dt`'s first attempt, in the order the operator applies them.
fn objects(
    mut dt: DistributedTraining,
    settings: &Settings,
    services: &BTreeMap<(String, String), Service>,
) -> Result<Vec<serde_json::Value>, String> {
    let name = dt.name_any();
    if dt.metadata.namespace.is_none() {
        dt.metadata.namespace = Some("default".into());
    }
    dt.metadata.uid = Some(UID_PLACEHOLDER.into());
    let mut problems = crate::observe::spec_problems(&dt.spec);
    problems.extend(crate::observe::port_problems(
        &dt.spec,
        &[
            ("rendezvous", settings.master_port),
            ("progress", settings.trainer_metrics_port),
        ],
    ));
    if !problems.is_empty() {
        return Err(format!("{name}: {}", problems.join("; ")));
    }
    let owner = Owner::of(&dt).map_err(|e| format!("{name}: {e}"))?;
    let gang = scheduling::mode(&dt.spec, dt.labels(), None, settings.default_gang_scheduler);
    let build_settings = BuildSettings {
        trainer_image: settings.trainer_image.clone(),
        master_port: settings.master_port,
        trainer_metrics_port: settings.trainer_metrics_port,
        termination_grace_seconds: 30,
        restarts_left: ferrotrain_api::RestartBudget::of(dt.spec.restart_policy.max_restarts, 0)
            .left(),
        round: 0,
        gang,
        operator_pods: settings.operator_pods.clone(),
        store_service: objects::service_to_read(&dt.spec, &owner.namespace)
            .and_then(|key| services.get(&key))
            .map(objects::StoreService::of),
    };
    let ranks: Vec<i32> = (0..dt.spec.pod_count()).collect();
    let g = objects::gang(
        &owner,
        &dt.spec,
        0,
        &ranks,
        &build_settings,
        TOKEN_PLACEHOLDER,
    );
    let mut out = vec![typed(&g.service), typed(&g.secret)];
    out.extend(g.config_map.as_ref().map(typed));
    out.extend(g.network_policy.as_ref().map(typed));
    out.extend(
        g.group
            .as_ref()
            .map(|group| serde_json::to_value(&group.object).expect("serializes")),
    );
    out.extend(g.pods.iter().map(typed));
    Ok(out)
}

/// The object with its apiVersion and kind, as `kubectl apply` reads it.
fn typed<K>(object: &K) -> serde_json::Value
where
    K: kube::Resource<DynamicType = ()> + Serialize,
{
    let (api_version, kind) = objects::type_meta::<K>();
    let mut value = serde_json::to_value(object).expect("an object serializes");
    value["apiVersion"] = api_version.into();
    value["kind"] = kind.into();
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_file_renders_its_objects_with_the_policy_before_the_pods() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/copy-dt.yaml"
        ))
        .unwrap();
        let yaml = render(&text, &Settings::default()).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Service",
                "Secret",
                "ConfigMap",
                "NetworkPolicy",
                "Pod",
                "Pod"
            ]
        );
        assert_eq!(docs[4]["metadata"]["name"], "copy-0-0");
        assert_eq!(docs[4]["metadata"]["namespace"], "default");
        assert_eq!(docs[1]["stringData"]["token"], TOKEN_PLACEHOLDER);
    }

    #[test]
    fn a_service_in_the_file_stands_for_the_clusters_in_the_egress_rule_to_the_store() {
        let job = "apiVersion: ferrotrain.dev/v1alpha1\nkind: DistributedTraining\nmetadata: {name: d, namespace: ml}\nspec: {replicas: 1, networkPolicy: {restrictEgress: true}, trainer: {task: copy, maxSteps: 1, checkpoint: {store: {url: 's3://ckpt', endpoint: 'http://minio.store.svc'}}}}\n";
        let service = "---\napiVersion: v1\nkind: Service\nmetadata: {name: minio, namespace: store}\nspec: {selector: {app: minio}, ports: [{port: 80, targetPort: 9000}]}\n";
        let store_rule = |text: &str| {
            let yaml = render(text, &Settings::default()).unwrap();
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
            let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
            policy["spec"]["egress"][2].clone()
        };
        let rule = store_rule(&format!("{job}{service}"));
        assert_eq!(rule["to"][0]["podSelector"]["matchLabels"]["app"], "minio");
        assert_eq!(rule["ports"][0]["port"], 9000);
        // Without it: the Service's namespace, on the endpoint's port.
        let rule = store_rule(job);
        assert!(rule["to"][0]["podSelector"].is_null(), "{rule}");
        assert_eq!(rule["ports"][0]["port"], 80);
    }

    #[test]
    fn input_without_a_job_or_with_a_bad_one_is_an_error_naming_it() {
        assert!(
            render("kind: ConfigMap\n", &Settings::default())
                .unwrap_err()
                .contains("no DistributedTraining")
        );
        let bad = "apiVersion: ferrotrain.dev/v1alpha1\nkind: DistributedTraining\nmetadata: {name: x}\nspec: {replicas: many}\n";
        let e = render(bad, &Settings::default()).unwrap_err();
        assert!(e.contains("document 1"), "{e}");
    }
}
