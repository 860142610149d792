//! docs/reference/crd.md: the DistributedTraining resource, walked from the openAPIV3Schema of
//! the CRD as installed (`ferrotrain_api::crd::custom_resource_definition`, which
//! `ferrotrain-operator crd` prints): a section per object of the spec and status with a row
//! per field (path, type, default, bounds, required, description), its validation rules, and
//! the printer columns. Fields of Kubernetes' own types are listed, not walked.

use ferrotrain_api::reference::markdown::{Table, cell, code, prose};
use serde_json::Value;

/// Fields whose type is Kubernetes' own (a Pod's, a NetworkPolicy's, a Condition): their
/// insides are Kubernetes' to document, and `kubectl explain` does.
pub const KUBERNETES_TYPES: &[&str] = &[
    "spec.resources",
    "spec.podTemplate.affinity",
    "spec.podTemplate.env",
    "spec.podTemplate.imagePullSecrets",
    "spec.podTemplate.securityContext",
    "spec.podTemplate.tolerations",
    "spec.podTemplate.volumeMounts",
    "spec.podTemplate.volumes",
    "spec.networkPolicy.egressTo",
    "spec.networkPolicy.metricsFrom",
    "status.conditions",
];

/// The CRD's openAPIV3Schema.
pub fn schema() -> Value {
    let mut crd = crd();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].take()
}

fn crd() -> Value {
    serde_json::to_value(ferrotrain_api::crd::custom_resource_definition()).unwrap()
}

/// The schema of the field at `path` (`spec.podTemplate.volumes`).
pub fn node<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(schema, |n, key| n["properties"].get(key))
}

pub fn page() -> String {
    let crd = crd();
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut out = header(&crd, schema);
    out.push_str("\n## Printer columns\n\n`kubectl get dt` shows these columns; those of priority 1 only with `-o wide`.\n\n");
    out.push_str(&printer_columns(version));
    let mut sections = Vec::new();
    for top in ["spec", "status"] {
        object(top, &schema["properties"][top], &mut sections);
    }
    out.push_str("\n## Objects\n\n");
    for (path, _) in &sections {
        let depth = path.matches('.').count();
        out.push_str(&format!(
            "{}- [{}](#{})\n",
            "  ".repeat(depth),
            code(path),
            anchor(path)
        ));
    }
    for (_, section) in sections {
        out.push('\n');
        out.push_str(&section);
    }
    out
}

fn header(crd: &Value, schema: &Value) -> String {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let short: Vec<String> = strings(&names["shortNames"])
        .iter()
        .map(|s| code(s))
        .collect();
    let categories: Vec<String> = strings(&names["categories"])
        .iter()
        .map(|s| code(s))
        .collect();
    let mut out = String::from("# `DistributedTraining` reference\n\n");
    out.push_str(&prose(
        "Generated from the CRD's schema (api/src/crd/, as `ferrotrain-operator crd` prints it) \
         by scripts/gen-reference.sh: do not edit. Every field of the spec and the status, \
         with its type, default, bounds and description; `kubectl explain dt.spec` prints the \
         same descriptions.",
    ));
    out.push('\n');
    out.push_str(&prose(&format!(
        "Group {}, version {}, kind {}, {}; plural {}, short name {}, category {}.",
        code(str_of(&spec["group"])),
        code(str_of(&spec["versions"][0]["name"])),
        code(str_of(&names["kind"])),
        str_of(&spec["scope"]).to_lowercase(),
        code(str_of(&names["plural"])),
        short.join(", "),
        categories.join(", "),
    )));
    out.push('\n');
    out.push_str(&prose(str_of(&schema["description"])));
    out.push_str(&rules(schema));
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn printer_columns(version: &Value) -> String {
    let mut table = Table::new(&["Column", "Type", "JSON path", "Priority", "Description"]);
    for c in version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
    {
        table.row(vec![
            str_of(&c["name"]).to_string(),
            str_of(&c["type"]).to_string(),
            code(str_of(&c["jsonPath"])),
            c["priority"].as_i64().unwrap_or(0).to_string(),
            cell(str_of(&c["description"])),
        ]);
    }
    table.render()
}

/// The object's validation rules (their messages) as a list, after a blank line.
fn rules(node: &Value) -> String {
    let messages: Vec<String> = node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "- {}",
                prose(str_of(&r["message"]))
                    .trim_end()
                    .replace('\n', "\n  ")
            )
        })
        .collect();
    if messages.is_empty() {
        return String::new();
    }
    format!(
        "\nRules the API server checks:\n\n{}\n",
        messages.join("\n")
    )
}

/// The section of the object at `path` (and, after it, those of the objects below), into
/// `sections` with their paths.
fn object(path: &str, node: &Value, sections: &mut Vec<(String, String)>) {
    let mut out = format!("## `{path}`\n\n");
    if let Some(d) = node["description"].as_str() {
        out.push_str(&prose(d));
    }
    out.push_str(&rules(node));
    out.push('\n');
    let required = strings(&node["required"]);
    let mut table = Table::new(&[
        "Field",
        "Type",
        "Default",
        "Bounds",
        "Required",
        "Description",
    ]);
    let mut below = Vec::new();
    let properties = node["properties"].as_object().into_iter().flatten();
    for (key, field) in properties {
        let field_path = format!("{path}.{key}");
        let nested = nested(&field_path, field);
        let description = match &nested {
            Some((p, _)) => format!("See [{}](#{}).", code(p), anchor(p)),
            None if KUBERNETES_TYPES.contains(&field_path.as_str()) => format!(
                "{} Kubernetes' own type: `kubectl explain dt.{field_path}`.",
                cell(str_of(&field["description"]))
            ),
            None => cell(str_of(&field["description"])),
        };
        table.row(vec![
            code(&field_path),
            type_of(field),
            default_of(field),
            bounds_of(field),
            String::from(if required.contains(key) { "yes" } else { "" }),
            description,
        ]);
        below.extend(nested);
    }
    out.push_str(&table.render());
    sections.push((path.to_string(), out));
    for (p, n) in below {
        object(&p, n, sections);
    }
}

/// The section a field's own fields get: an object of ferrotrain's own types, or a list of
/// them (`status.placement[]`).
fn nested<'a>(path: &str, field: &'a Value) -> Option<(String, &'a Value)> {
    if KUBERNETES_TYPES.contains(&path) {
        return None;
    }
    if field["properties"].is_object() {
        return Some((path.to_string(), field));
    }
    let items = &field["items"];
    items["properties"]
        .is_object()
        .then(|| (format!("{path}[]"), items))
}

/// GitHub's anchor of the heading `` `path` ``.
fn anchor(path: &str) -> String {
    path.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// `integer (int32)`, `[]string`, `map[string]integer (int64)`, `int or string`, `object`.
fn type_of(n: &Value) -> String {
    if n["x-kubernetes-int-or-string"] == true {
        return "int or string".into();
    }
    match str_of(&n["type"]) {
        "array" => format!("[]{}", type_of(&n["items"])),
        "object" if n["additionalProperties"].is_object() => {
            format!("map[string]{}", type_of(&n["additionalProperties"]))
        }
        t => match n["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
    }
}

/// A scalar's or a list's default as written; an object's default is its fields'.
fn default_of(n: &Value) -> String {
    match &n["default"] {
        Value::Null => String::new(),
        Value::Object(_) => "its fields'".into(),
        Value::String(s) => code(s),
        v => code(&v.to_string()),
    }
}

/// The schema's bounds of a value, and of a list's items or a map's values.
fn bounds_of(n: &Value) -> String {
    let mut parts = own_bounds(n);
    if n["type"] == "array" {
        parts.extend(
            own_bounds(&n["items"])
                .into_iter()
                .map(|b| format!("each {b}")),
        );
    }
    if n["additionalProperties"].is_object() {
        let values = own_bounds(&n["additionalProperties"]);
        parts.extend(values.into_iter().map(|b| format!("each value {b}")));
    }
    parts.join("; ")
}

fn own_bounds(n: &Value) -> Vec<String> {
    let mut parts = Vec::new();
    let range = |low: &str, high: &str, unit: &str| match (number(&n[low]), number(&n[high])) {
        (None, None) => None,
        (Some(l), None) => Some(format!("≥ {l}{unit}")),
        (None, Some(h)) => Some(format!("≤ {h}{unit}")),
        (Some(l), Some(h)) => Some(format!("{l} to {h}{unit}")),
    };
    parts.extend(range("minimum", "maximum", ""));
    parts.extend(range("minLength", "maxLength", " characters"));
    parts.extend(range("minItems", "maxItems", " items"));
    if let Some(values) = n["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| code(v.as_str().map_or(v.to_string(), str::to_string).as_str()))
            .collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    if let Some(p) = n["pattern"].as_str() {
        parts.push(format!("matches {}", code(p)));
    }
    parts
}

/// A bound as written: `1`, not the `1.0` the schema's f64 bounds serialize to.
fn number(v: &Value) -> Option<String> {
    let f = v.as_f64()?;
    Some(if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        v.to_string()
    })
}
