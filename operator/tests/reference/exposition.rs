//! docs/reference/metrics.md: every metric family of the operator's /metrics (its registry,
//! every labelled family given a series) and of rank 0's (the trainer's exposition of a report
//! with every field set), read back from the OpenMetrics text they serve: name, type, labels,
//! help.

use ferrotrain_api::reference::markdown::{Table, cell, code, prose};

/// One family of an exposition.
#[derive(Debug, Default, PartialEq)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: String,
    /// Label names in the order the series show them (`le` of histogram buckets left out).
    pub labels: Vec<String>,
}

pub fn page() -> String {
    let mut out = String::from("# Metrics\n\n");
    out.push_str(&prose(
        "Generated from the operator's metric registry (operator/src/metrics.rs) and the pod's \
         exposition (launch/src/endpoint/prometheus.rs) by scripts/gen-reference.sh: do not \
         edit. Both are OpenMetrics text; a counter's series end in `_total`, a histogram's \
         in `_bucket`, `_sum` and `_count`. docs/observability.md shows how to use them.",
    ));
    let sections = [
        (
            "The operator",
            "`ferrotrain-operator run` serves them on /metrics at `--http-addr`.",
            crate::metric_names::operator_exposition(),
        ),
        (
            "Rank 0",
            "Each job's node 0 serves them on /metrics at `FERROTRAIN_METRICS_PORT`, from rank 0's \
             progress report; a value the report does not have yet (no evaluation so far, no \
             checkpoint) is left out rather than exported as 0.",
            crate::metrics::full_exposition(),
        ),
    ];
    for (title, intro, text) in sections {
        out.push_str(&format!("\n## {title}\n\n"));
        out.push_str(&prose(intro));
        out.push('\n');
        out.push_str(&table(&families(&text)));
    }
    out
}

fn table(families: &[Family]) -> String {
    let mut table = Table::new(&["Metric", "Type", "Labels", "Description"]);
    for f in families {
        let name = match f.kind.as_str() {
            "counter" => format!("{}_total", f.name),
            _ => f.name.clone(),
        };
        let labels: Vec<String> = f.labels.iter().map(|l| code(l)).collect();
        table.row(vec![
            code(&name),
            f.kind.clone(),
            labels.join(", "),
            cell(&f.help),
        ]);
    }
    table.render()
}

/// The families of an OpenMetrics text, in its order.
pub fn families(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            family(&mut out, name).kind = kind.to_string();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            family(&mut out, name).help = unescape(help);
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split([' ', '{']).next().unwrap_or_default();
            let of_family = |f: &&mut Family| {
                series.strip_prefix(f.name.as_str()).is_some_and(|suffix| {
                    [
                        "", "_total", "_bucket", "_sum", "_count", "_created", "_info",
                    ]
                    .contains(&suffix)
                })
            };
            let Some(f) = out.iter_mut().find(|f| of_family(f)) else {
                continue;
            };
            for label in label_names(line) {
                if label != "le" && !f.labels.contains(&label) {
                    f.labels.push(label);
                }
            }
        }
    }
    out
}

fn family<'a>(families: &'a mut Vec<Family>, name: &str) -> &'a mut Family {
    if let Some(i) = families.iter().position(|f| f.name == name) {
        return &mut families[i];
    }
    families.push(Family {
        name: name.to_string(),
        ..Family::default()
    });
    families.last_mut().unwrap()
}

/// The label names of a series line: `name{a="x",b="y \"z\""} 1` gives `a`, `b`.
fn label_names(line: &str) -> Vec<String> {
    let Some(open) = line.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = &line[open + 1..];
    while let Some((name, after)) = rest.split_once("=\"") {
        names.push(name.trim_start_matches(',').trim().to_string());
        // The value ends at the first quote no backslash escapes.
        let mut escaped = false;
        let end = after.char_indices().find(|&(_, c)| {
            let closes = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            closes
        });
        let Some((end, _)) = end else { break };
        rest = &after[end + 1..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// A HELP text as written: `\\`, `\n` and `\"` unescaped.
fn unescape(help: &str) -> String {
    help.replace("\\n", "\n")
        .replace("\\\"", "\"")
        .replace("\\\\", "\\")
}

#[test]
fn families_are_read_with_their_labels() {
    let text = "# HELP x_seconds Time \\\"spent\\\".\n# TYPE x_seconds histogram\n# UNIT x_seconds seconds\n\
                x_seconds_bucket{result=\"ok\",le=\"1.0\"} 1\nx_seconds_sum{result=\"ok\"} 1\n\
                # HELP x_jobs Jobs.\n# TYPE x_jobs counter\nx_jobs_total{a=\"q,\\\"r\",b=\"s\"} 2\n# EOF\n";
    assert_eq!(
        families(text),
        [
            Family {
                name: "x_seconds".into(),
                kind: "histogram".into(),
                help: "Time \"spent\".".into(),
                labels: vec!["result".into()],
            },
            Family {
                name: "x_jobs".into(),
                kind: "counter".into(),
                help: "Jobs.".into(),
                labels: vec!["a".into(), "b".into()],
            },
        ]
    );
}
