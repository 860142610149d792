//! The reference generated from the code (docs/reference/): each page is made here from the
//! registry that holds its truth, and its test fails when the committed page differs, naming
//! scripts/gen-reference.sh, which runs these tests with `FERROTRAIN_REGENERATE=1` to write
//! them (as scripts/gen-chart-readme.sh does the chart's values table).
//!
//! - crd.md: the CRD's openAPIV3Schema, as `ferrotrain-operator crd` prints it;
//! - cli-ferrotrain-operator.md: the operator's clap `Command` (`ferrotrain`'s own page comes
//!   from the binary: trainer/tests/reference.rs);
//! - metrics.md: the operator's registry and rank 0's exposition (the trainer's own code);
//! - reasons.md, environment.md: the tables of api/src/reason.rs and api/src/env.rs.
//!
//! The docs checks (tests/docs.rs) read these pages too.

mod support;

#[path = "reference/constants.rs"]
mod constants;
#[path = "reference/crd.rs"]
mod crd;
#[path = "reference/exposition.rs"]
mod exposition;

// The pod's exposition, from the launcher's own code and its own test fixture, and the
// operator's with every family in it: what the docs checks read too.
#[allow(dead_code)]
#[path = "docs/metric_names.rs"]
mod metric_names;
#[allow(dead_code)]
#[path = "docs/trainer_metrics.rs"]
mod metrics;

use clap::CommandFactory;
use ferrotrain_api::reference::generated::current_or_regenerated;
use support::repo_root;

/// Fails when the committed `path` is not `page` (or writes it, regenerating).
fn committed(path: &str, page: &str) {
    current_or_regenerated(&repo_root(), path, page).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_crd_reference_is_current() {
    committed("docs/reference/crd.md", &crd::page());
}

#[test]
fn the_operator_command_line_reference_is_current() {
    let page = ferrotrain_api::reference::cli::page(
        &ferrotrain_operator::config::Cli::command(),
        "Generated from the clap definition of the `ferrotrain-operator` binary \
         (operator/src/config.rs) by scripts/gen-reference.sh: do not edit. The Helm chart sets \
         the `FERROTRAIN_OPERATOR_*` variables from its values (charts/ferrotrain/README.md).",
    );
    committed("docs/reference/cli-ferrotrain-operator.md", &page);
}

#[test]
fn the_metrics_reference_is_current() {
    committed("docs/reference/metrics.md", &exposition::page());
}

#[test]
fn the_reasons_reference_is_current() {
    committed("docs/reference/reasons.md", &constants::reasons_page());
}

#[test]
fn the_environment_reference_is_current() {
    committed(
        "docs/reference/environment.md",
        &constants::environment_page(),
    );
}

/// docs/reference/README.md, the index, links every page of the reference.
#[test]
fn the_index_links_every_page() {
    let dir = repo_root().join("docs/reference");
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "README.md" {
            pages += 1;
            assert!(
                index.contains(&format!("]({name})")),
                "docs/reference/README.md does not link {name}"
            );
        }
    }
    assert!(pages >= 6, "{pages} pages");
}

/// The walk reaches every field of ferrotrain's own types and stops at Kubernetes' own.
#[test]
fn the_crd_page_lists_every_field_and_no_field_of_kubernetes_types() {
    let page = crd::page();
    for field in [
        "spec.restartPolicy.maxRestarts",
        "spec.trainer.model.dModel",
        "spec.podTemplate.affinity",
        "status.progress.etaSeconds",
        "status.recovery.attempts[].attempt",
        "status.placement[].node",
    ] {
        assert!(page.contains(&format!("| `{field}` |")), "{field}");
    }
    assert!(!page.contains("spec.podTemplate.affinity.nodeAffinity"));
    assert!(!page.contains("status.conditions[].type"));
    let schema = crd::schema();
    for path in crd::KUBERNETES_TYPES {
        assert!(
            crd::node(&schema, path).is_some(),
            "{path} is not in the schema"
        );
    }
}

/// A page that differs from the code fails, naming the line and the command.
#[test]
fn a_stale_page_fails_naming_the_command() {
    let page = constants::reasons_page();
    let stale = page.replacen("PodsCreated", "PodsCreatd", 1);
    let e = ferrotrain_api::reference::generated::drift("docs/reference/reasons.md", &stale, &page)
        .unwrap_err();
    assert!(e.contains("scripts/gen-reference.sh"), "{e}");
    assert!(e.contains("PodsCreatd"), "{e}");
}
