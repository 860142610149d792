//! Docs that cannot drift. Every CLI flag, config field, CRD field, metric name, event reason
//! and repository path that README.md, docs/, examples/ and the chart's README name exists in
//! the code, and every event reason the operator emits is in docs/operator-events.md's table.
//! The truth comes from the code: clap's `Command` of the operator, the trainer's clap derive
//! structs, the CRD's and the trainer config's JSON schemas, the chart's values.yaml, the
//! operator's metric registry and the trainer's exposition, the operator's event calls.
//!
//! Each check has a test of its own that plants the kind of mistake it exists for (a flag
//! `launch` does not take, a field path that moved, a metric that is not exported, a link to
//! nowhere) and sees it fail.

mod support;

#[path = "docs/corpus.rs"]
mod corpus;
#[path = "docs/events.rs"]
mod events;
#[path = "docs/fields.rs"]
mod fields;
#[path = "docs/flags.rs"]
mod flags;
#[path = "docs/metric_names.rs"]
mod metric_names;
#[path = "docs/paths.rs"]
mod paths;

// The pod's exposition, from the launcher's own code and its own test fixture.
#[allow(dead_code)]
#[path = "docs/trainer_metrics.rs"]
mod metrics;

use corpus::{Doc, docs};

fn fail_on(problems: Vec<String>, what: &str) {
    assert!(
        problems.is_empty(),
        "{} {what}:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_flag_named_in_the_docs_exists() {
    let flags = flags::Flags::read();
    let problems = docs().iter().flat_map(|d| flags.check(d)).collect();
    fail_on(problems, "flags the docs name do not exist");
}

#[test]
fn every_field_named_in_the_docs_exists() {
    let fields = fields::Fields::read();
    let problems = docs().iter().flat_map(|d| fields.check(d)).collect();
    fail_on(problems, "fields the docs name do not exist");
}

#[test]
fn every_metric_named_in_the_docs_is_exported() {
    let exported = metric_names::exported();
    let problems = docs()
        .iter()
        .flat_map(|d| metric_names::check(&d.path, &d.text, &exported))
        .collect();
    fail_on(problems, "metrics the docs name are not exported");
}

#[test]
fn every_repository_path_and_link_in_the_docs_exists() {
    let tree = paths::Tree::read();
    let all = docs();
    let problems = all.iter().flat_map(|d| tree.check(d, &all)).collect();
    fail_on(problems, "paths or links of the docs lead nowhere");
}

#[test]
fn every_event_the_operator_emits_is_documented_and_no_other() {
    let emitted = events::emitted().unwrap_or_else(|e| panic!("{}", e.join("\n")));
    assert!(emitted.len() > 25, "{emitted:?}");
    let events_md =
        std::fs::read_to_string(support::repo_root().join("docs/operator-events.md")).unwrap();
    let documented = events::documented(&events_md);
    let mut problems = Vec::new();
    for reason in &emitted {
        if !documented.iter().any(|(_, d)| d == reason) {
            problems.push(format!(
                "docs/operator-events.md: the events table lacks `{reason}`, which the operator emits"
            ));
        }
    }
    for (line, reason) in &documented {
        if !emitted.contains(reason) {
            problems.push(format!(
                "docs/operator-events.md:{line}: `{reason}` is in the events table but the operator emits no such event"
            ));
        }
    }
    fail_on(
        problems,
        "event reasons are missing from the docs or made up",
    );
}

#[test]
fn every_field_of_the_spec_is_in_the_resource_table() {
    let fields = fields::Fields::read();
    let spec = fields.relative[0].top_keys();
    let operator_md =
        std::fs::read_to_string(support::repo_root().join("docs/operator.md")).unwrap();
    let section = operator_md
        .split("\n## ")
        .find(|s| s.starts_with("The resource"))
        .expect("docs/operator.md has a section `## The resource`");
    let named: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            l.split('|')
                .nth(1)
                .unwrap_or("")
                .split('`')
                .skip(1)
                .step_by(2)
        })
        .map(|s| s.split('.').next().unwrap())
        .collect();
    let problems = spec
        .iter()
        .filter(|k| !named.contains(&k.as_str()))
        .map(|k| format!("docs/operator.md: the resource table has no row for spec.{k}"))
        .collect();
    fail_on(problems, "fields of the resource are not in its table");
}

// The checks catch what they exist for.

fn planted(text: &str) -> Doc {
    corpus::doc("docs/planted.md", text)
}

#[test]
fn a_flag_of_another_subcommand_or_of_nothing_fails_the_check() {
    let flags = flags::Flags::read();
    let wrong = [
        // examples/copy.md before: `launch` takes no --checkpoint-dir (`run` does).
        "```sh\nferrotrain launch --nproc-per-node 2 --checkpoint-dir x --config c.yaml\n```\n",
        // docs/observability.md before: the flag is --progress-interval-seconds.
        "polled every `--progress-interval`, 5 s\n",
        "`ferrotrain-operator run --progress-interval 5`\n",
        "```sh\nscripts/e2e.sh --filtre 'test(x)'\n```\n",
        // `logs` takes --round, `watch` no --rank: the plugin's commands are told apart.
        "```sh\nkubectl ferrotrain logs copy --rounds 0\n```\n",
        "`kubectl ferrotrain watch copy --rank 1`\n",
    ];
    for text in wrong {
        let problems = flags.check(&planted(text));
        assert_eq!(problems.len(), 1, "{text}: {problems:?}");
    }
    let right = "```sh\nferrotrain launch --nproc-per-node 2 --config c.yaml -- --ignored\n\
                 helm install x charts/ferrotrain --set a=b --wait\n```\n\
                 `--progress-interval-seconds`, `ferrotrain run --checkpoint-dir runs`\n\
                 `kubectl ferrotrain logs copy --round 0 --rank 1 -n ml --context kind`\n\
                 `kubectl-ferrotrain man --dir man --stats`, `--previous`\n";
    assert_eq!(flags.check(&planted(right)), Vec::<String>::new());
}

#[test]
fn the_trainer_flags_are_read_completely() {
    let flags = flags::trainer_flags();
    for (sub, flag) in [
        ("launch", "--nproc-per-node"),
        ("launch", "--restart-in-place"),
        ("launch", "--recovery-file"),
        ("launch", "--rank-program"),
        ("run", "--metrics-port"),
        ("run", "--checkpoint-dir"),
        ("validate", "--config"),
        ("select", "--length-penalties"),
        ("translate", "--selected"),
        ("bleu", "--reference"),
        ("bench-collective", "--sizes-mb"),
    ] {
        assert!(flags[sub].contains(flag), "{sub} {flag}: {flags:?}");
    }
    assert!(flags["doctor"].is_empty());
    // An independent count: every `#[arg(long...)]` field of the two files is some
    // subcommand's flag.
    let root = support::repo_root();
    let launcher = flags::command_launcher_flags();
    let all: std::collections::BTreeSet<&String> =
        flags.values().flatten().chain(&launcher).collect();
    for file in ["trainer/src/main.rs", "launch/src/args.rs"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for (at, _) in text.match_indices("#[arg(") {
            let attr = &text[at..at + text[at..].find(")]").unwrap()];
            if !attr.split([',', '(']).any(|p| p.trim().starts_with("long")) {
                continue;
            }
            let after = &text[at + attr.len() + 2..];
            let field = after
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('#'))
                .unwrap();
            let name = field.trim_start_matches("pub ").split(':').next().unwrap();
            let flag = format!("--{}", name.trim().replace('_', "-"));
            assert!(all.contains(&flag), "{file}: {flag} was not read");
        }
    }
}

#[test]
fn a_field_that_is_not_there_fails_the_check() {
    let fields = fields::Fields::read();
    for wrong in [
        // docs/configuration.md before: it is status.progress.precision.
        "`status.progress.report.precision`",
        "`spec.restartPolicy.inPlaceRestarts`",
        "`restartPolicy.maxRestart`",
        "`model.dmodel`",
        "`image.digests`",
        "```yaml\nspec:\n  replicas: 2\n  restartPolicy:\n    inplace: true\n```",
        "```yaml\ntask: copy\nmodel:\n  dModel: 64\n  layers: 2\n```",
    ] {
        let problems = fields.check(&planted(wrong));
        assert_eq!(problems.len(), 1, "{wrong}: {problems:?}");
    }
    let right = "`status.progress.precision`, `restartPolicy.inPlace`, `model.dModel`, \
                 `image.digest`, `gangResources.cpuUtilization.{mean,min}`, `data.*`, \
                 `recovery.attempts[].attempt`, `model.safetensors`, `scheduling.k8s.io`\n\
                 ```yaml\nspec:\n  replicas: 2\n  elastic:\n    minReplicas: 1\n```\n";
    assert_eq!(fields.check(&planted(right)), Vec::<String>::new());
}

#[test]
fn a_metric_that_is_not_exported_fails_the_check() {
    let exported = metric_names::exported();
    for name in [
        "ferrotrain_steps_per_second",
        "ferrotrain_operator_reconciles_total",
        "ferrotrain_operator_reconcile_duration_seconds_bucket",
        "ferrotrain_gang_gpu_utilization",
        "ferrotrain_rejected_connections_total",
        "ferrotrain_operator_job_goodput_percent",
    ] {
        assert!(exported.contains(name), "{name} not in {exported:?}");
    }
    let text = "rate(ferrotrain_steps_total[5m]) and ferrotrain_step_rate, not \
                ferrotrain_api::Progress nor trainer/src/ferrotrain_x.rs";
    let problems = metric_names::check("planted", text, &exported);
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn a_path_or_link_to_nowhere_fails_the_check() {
    let tree = paths::Tree::read();
    let wrong = [
        "`launch/src/spares.rs`",
        "see docs/operater.md",
        "[x](nothing.md)",
        "[x](distributed.md#no-such-heading)",
        "`censuses.rs`",
    ];
    for text in wrong {
        let doc = planted(text);
        let problems = tree.check(&doc, &docs());
        assert_eq!(problems.len(), 1, "{text}: {problems:?}");
    }
    let right = "`launch/src/spare.rs`, `operator/src/gang/*/tests.rs`, `census.rs`, \
                 [x](in-place-restarts.md#in-place-restarts-one-node-or---restart-in-place-on-several), \
                 docs/operator.md:74, `../shared/cluster`, [r](../README.md)\n";
    assert_eq!(tree.check(&planted(right), &docs()), Vec::<String>::new());
}

/// The alert rules and the Grafana dashboards query only what the operator and rank 0
/// export, and every panel queries something.
#[test]
fn every_metric_the_alerts_and_dashboards_query_is_exported() {
    let exported = metric_names::exported();
    let root = support::repo_root().join("charts/ferrotrain/files");
    let mut problems = Vec::new();
    let mut named = 0;
    let rules = std::fs::read_to_string(root.join("prometheus-rules.yaml")).unwrap();
    named += metric_names::named(&rules).len();
    problems.extend(metric_names::check(
        "prometheus-rules.yaml",
        &rules,
        &exported,
    ));
    for name in ["ferrotrain-job.json", "ferrotrain-fleet.json"] {
        let text = std::fs::read_to_string(root.join("dashboards").join(name)).unwrap();
        let board: serde_json::Value = serde_json::from_str(&text).unwrap();
        for panel in board["panels"].as_array().unwrap() {
            if panel["type"] == "row" {
                continue;
            }
            let exprs: Vec<&str> = panel["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            let in_panel: usize = exprs.iter().map(|e| metric_names::named(e).len()).sum();
            if in_panel == 0 {
                problems.push(format!(
                    "{name}: panel {} queries no metric",
                    panel["title"]
                ));
            }
            named += in_panel;
            for expr in exprs {
                problems.extend(metric_names::check(name, expr, &exported));
            }
        }
        for var in board["templating"]["list"].as_array().unwrap() {
            if let Some(q) = var["definition"].as_str() {
                problems.extend(metric_names::check(name, q, &exported));
            }
        }
    }
    assert!(named > 60, "only {named} metric names found");
    fail_on(
        problems,
        "metrics the alerts or dashboards query are not exported",
    );
}
