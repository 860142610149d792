//! `ferrotrain-operator render -f job.yaml`: the objects the operator would create for the
//! first attempt of each DistributedTraining in a file (as `helm template` shows a chart's), with
//! the same builders and settings as `run`. For reviewing a job before applying it, and for
//! scanning what the operator creates (scripts/scan.sh). The Secret's token is a placeholder
//! (the operator draws a random one at launch) and the objects carry a placeholder owner UID.

use ferrotrain_api::crd::DistributedTraining;
use kube::ResourceExt;
use serde::Serialize;

use crate::build::{self, BuildSettings, Owner};
use crate::config::Settings;
use crate::scheduling;

/// The token written into the rendered Secret.
pub const TOKEN_PLACEHOLDER: &str = "rendered-by-ferrotrain-operator-render";
/// The owner UID of the rendered objects.
const UID_PLACEHOLDER: &str = "00000000-0000-0000-0000-000000000000";

/// Every DistributedTraining of the (multi-document) YAML `text`, rendered as multi-document
/// YAML; documents of other kinds are skipped. An error names the document that failed.
pub fn render(text: &str, settings: &Settings) -> Result<String, String> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not YAML: {e}"))?;
    let mut out = String::new();
    let mut found = 0;
    for (i, doc) in documents.into_iter().enumerate() {
        if doc["kind"] != "DistributedTraining" {
            continue;
        }
        found += 1;
        let dt: DistributedTraining = serde_json::from_value(doc)
            .map_err(|e| format!("document {}: not a DistributedTraining: {e}", i + 1))?;
        for object in objects(dt, settings)? {
            out += "---\n";
            out += &serde_saphyr::to_string(&object).map_err(|e| e.to_string())?;
        }
    }
    if found == 0 {
        return Err("no DistributedTraining in the input".into());
    }
    Ok(out)
}

/// The objects of `dt`'s first attempt, in the order the operator applies them.
fn objects(
    mut dt: DistributedTraining,
    settings: &Settings,
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
    };
    let ranks: Vec<i32> = (0..dt.spec.replicas.max(1)).collect();
    let g = build::gang(
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
    let (api_version, kind) = build::type_meta::<K>();
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
