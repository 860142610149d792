//! The metric names that exist: the operator's registry and the trainer's exposition of a
//! progress report with every field set (launch/src/endpoint/prometheus.rs and its fixture,
//! compiled into this test: the trainer crate links libtorch). And the check: every
//! `ferrotrain_*` name a page, a dashboard or an alert rule names is one of theirs.

use std::collections::BTreeSet;

/// The series names of an OpenMetrics text: each family's samples (`_total` of a counter,
/// `_bucket`/`_sum`/`_count` of a histogram) and the family name itself.
pub fn series_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap();
            names.insert(family.to_string());
            match kind {
                "counter" => {
                    names.insert(format!("{family}_total"));
                }
                "histogram" => {
                    for s in ["bucket", "sum", "count"] {
                        names.insert(format!("{family}_{s}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#')
            && let Some(series) = line.split([' ', '{']).next()
        {
            names.insert(series.to_string());
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// Every metric the operator and rank 0 export.
pub fn exported() -> BTreeSet<String> {
    let mut names = series_names(&operator_exposition());
    names.extend(series_names(&crate::metrics::full_exposition()));
    names
}

/// The operator's exposition with every family in it: a family shows in the text only once it
/// has a series, so each labelled family gets one.
pub fn operator_exposition() -> String {
    use ferrotrain_operator::metrics::{ErrorLabels, JobNumbers, Metrics, ReasonLabels};
    let operator = Metrics::new();
    let recovery = ferrotrain_api::Recovery {
        goodput_percent: Some(50.0),
        ..Default::default()
    };
    operator.set_job_numbers([JobNumbers {
        namespace: "ns".into(),
        job: "job".into(),
        phase: ferrotrain_api::crd::Phase::Running,
        restarts: 1,
        recovery: Some(&recovery),
    }]);
    let reason = ReasonLabels {
        reason: "ExitCode".into(),
    };
    operator.restarts.get_or_create(&reason).inc();
    let error = ErrorLabels {
        error: "event".into(),
    };
    operator.reconcile_errors.get_or_create(&error).inc();
    operator.encode()
}

/// Crate names that look like metrics.
const CRATES: &[&str] = &[
    "ferrotrain_api",
    "ferrotrain_trainer",
    "ferrotrain_operator",
    "ferrotrain_e2e",
];

/// The `ferrotrain_*` names in a text, each with its line; a name ending in `_*` is a prefix.
pub fn named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        let mut consumed = 0;
        while let Some(at) = rest.find("ferrotrain_") {
            let before = line[..consumed + at].chars().last();
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let after = &rest[at + name.len()..];
            let is_path = before.is_some_and(|c| c.is_alphanumeric() || "/.-_".contains(c));
            let is_rust = after.starts_with("::") || CRATES.contains(&name.as_str());
            if !is_path && !is_rust {
                let prefix = after.starts_with('*');
                out.push((
                    i + 1,
                    if prefix {
                        format!("{name}*")
                    } else {
                        name.clone()
                    },
                ));
            }
            consumed += at + name.len();
            rest = &rest[at + name.len()..];
        }
    }
    out
}

/// The problems with the names a text uses: `file:line: ...`.
pub fn check(file: &str, text: &str, exported: &BTreeSet<String>) -> Vec<String> {
    named(text)
        .into_iter()
        .filter(|(_, name)| match name.strip_suffix('*') {
            Some(prefix) => !exported.iter().any(|e| e.starts_with(prefix)),
            None => !exported.contains(name),
        })
        .map(|(line, name)| {
            format!("{file}:{line}: `{name}` is no metric of the operator or of rank 0")
        })
        .collect()
}
