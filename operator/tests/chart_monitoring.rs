//! The chart's monitoring objects and its PodDisruptionBudget: off by default (the PDB on);
//! when asked, a ServiceMonitor that selects the operator's metrics Service and its port, a
//! PodMonitor that selects rank 0's pod as the operator builds it (and no other pod) on its
//! `metrics` port, the PrometheusRule carrying files/prometheus-rules.yaml as it is, and the
//! dashboards' ConfigMap carrying files/dashboards/*.json, which scripts/gen-dashboards.py
//! writes (a stale file fails here).

mod support;

use serde_json::Value;
use support::helm::{documents, find, run};
use support::repo_root;

const ALL_ON: &str = "monitoring.serviceMonitor.enabled=true,monitoring.podMonitor.enabled=true,\
                      monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true";

fn render(helm: &std::path::Path, set: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "ft", "charts/ferrotrain", "--namespace", "ops"];
    for s in set {
        args.extend(["--set", s]);
    }
    documents(&run(helm, &args))
}

fn matches(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| labels[k] == *v)
}

/// The pods the operator creates for examples/copy-dt.yaml's first attempt.
fn copy_job_pods() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("examples/copy-dt.yaml")).unwrap();
    let settings = ferrotrain_operator::config::Settings::default();
    let yaml = ferrotrain_operator::render::render(&text, &settings).unwrap();
    documents(&yaml)
        .into_iter()
        .filter(|d| d["kind"] == "Pod")
        .collect()
}

#[test]
fn monitoring_objects_are_off_by_default_and_the_disruption_budget_on() {
    let helm = support::helm::helm_or_skip!();
    let docs = render(&helm, &[]);
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(!docs.iter().any(|d| d["kind"] == kind), "{kind} rendered");
    }
    assert!(
        !docs
            .iter()
            .any(|d| d["metadata"]["name"] == "ft-ferrotrain-dashboards")
    );
    let pdb = find(&docs, "PodDisruptionBudget", "ft-ferrotrain");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let deployment = find(&docs, "Deployment", "ft-ferrotrain");
    assert!(matches(
        &pdb["spec"]["selector"],
        &deployment["spec"]["template"]["metadata"]["labels"]
    ));
    let off = render(&helm, &["podDisruptionBudget.enabled=false"]);
    assert!(!off.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
}

#[test]
fn the_service_monitor_scrapes_the_operators_metrics_service() {
    let helm = support::helm::helm_or_skip!();
    let docs = render(
        &helm,
        &[ALL_ON, "monitoring.serviceMonitor.labels.release=kps"],
    );
    let monitor = find(&docs, "ServiceMonitor", "ft-ferrotrain");
    assert_eq!(monitor["metadata"]["labels"]["release"], "kps");
    let service = find(&docs, "Service", "ft-ferrotrain-metrics");
    assert!(matches(
        &monitor["spec"]["selector"],
        &service["metadata"]["labels"]
    ));
    assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"][0], "ops");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["path"], "/metrics");
    // The per-job series name their job in `namespace` and `job`: keep them.
    assert_eq!(endpoint["honorLabels"], true);
    // Without the Service there is nothing to scrape: the chart says so.
    let out = std::process::Command::new(&helm)
        .args(["template", "ft", "charts/ferrotrain", "--set", ALL_ON])
        .args(["--set", "metrics.service.enabled=false"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs metrics.service.enabled"));
}

#[test]
fn the_pod_monitor_scrapes_rank_0_of_every_job_on_its_metrics_port() {
    let helm = support::helm::helm_or_skip!();
    let docs = render(&helm, &[ALL_ON]);
    let monitor = find(&docs, "PodMonitor", "ft-ferrotrain-rank0");
    assert_eq!(monitor["spec"]["namespaceSelector"]["any"], true);
    let pods = copy_job_pods();
    assert_eq!(pods.len(), 2);
    for pod in &pods {
        let rank: i64 = pod["metadata"]["labels"]["ferrotrain.dev/node-rank"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let selected = matches(&monitor["spec"]["selector"], &pod["metadata"]["labels"]);
        assert_eq!(selected, rank == 0, "{}", pod["metadata"]["name"]);
    }
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let ports = pods[0]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap();
    let port = ports.iter().find(|p| p["name"] == endpoint["port"]);
    assert_eq!(
        port.map(|p| p["containerPort"].clone()),
        Some(9090.into()),
        "{ports:?}"
    );
    // The job's name becomes `job`, as in the operator's per-job series.
    let relabel = endpoint["relabelings"].as_array().unwrap();
    assert!(relabel.iter().any(|r| {
        r["targetLabel"] == "job"
            && r["sourceLabels"][0] == "__meta_kubernetes_pod_label_ferrotrain_dev_job"
    }));
    let only = render(
        &helm,
        &[ALL_ON, "monitoring.podMonitor.namespaces={ml,nlp}"],
    );
    let monitor = find(&only, "PodMonitor", "ft-ferrotrain-rank0");
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!(["ml", "nlp"])
    );
}

#[test]
fn the_rule_and_the_dashboards_are_the_files_as_they_are() {
    let helm = support::helm::helm_or_skip!();
    let docs = render(&helm, &[ALL_ON]);
    let rule = find(&docs, "PrometheusRule", "ft-ferrotrain");
    let file =
        std::fs::read_to_string(repo_root().join("charts/ferrotrain/files/prometheus-rules.yaml"))
            .unwrap();
    let groups: Value = serde_saphyr::from_str(&file).unwrap();
    assert_eq!(rule["spec"], groups);
    let config_map = find(&docs, "ConfigMap", "ft-ferrotrain-dashboards");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    for name in ["ferrotrain-job.json", "ferrotrain-fleet.json"] {
        let file = std::fs::read_to_string(
            repo_root()
                .join("charts/ferrotrain/files/dashboards")
                .join(name),
        )
        .unwrap();
        assert_eq!(
            config_map["data"][name].as_str().map(str::trim_end),
            Some(file.trim_end()),
            "{name}"
        );
    }
}

#[test]
fn the_dashboards_are_what_their_generator_writes() {
    let out = std::process::Command::new("python3")
        .arg("scripts/gen-dashboards.py")
        .arg("--check")
        .current_dir(repo_root())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
