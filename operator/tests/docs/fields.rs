//! The fields that exist: the CRD's OpenAPI schema (spec, status, status.progress), the
//! trainer config's JSON schema (schemars, the type the trainer parses) and the chart's
//! values.yaml. And the check: a dotted path in a code span (`spec.restartPolicy.inPlace`,
//! `model.dModel`, `image.digest`) resolves in one of them, and the keys of a YAML block that
//! is a DistributedTraining, a trainer config or chart values exist.

use serde_json::Value;

use super::corpus::{Doc, Kind, blocks, spans};
use crate::support::repo_root;

/// A place field paths resolve in.
pub struct Root {
    pub name: &'static str,
    schema: Value,
    /// The JSON schema document the `$ref`s point into.
    defs: Value,
    /// values.yaml: a map of values, not a schema.
    plain: bool,
}

impl Root {
    fn schema(name: &'static str, schema: Value, defs: Value) -> Root {
        Root {
            name,
            schema,
            defs,
            plain: false,
        }
    }

    /// The keys at the top of this root.
    pub fn top_keys(&self) -> Vec<String> {
        let map = if self.plain {
            &self.schema
        } else {
            &self.schema["properties"]
        };
        map.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The properties at the top of this root.
    fn has_top(&self, key: &str) -> bool {
        self.resolve(&[key.to_string()]).is_ok()
    }

    /// Whether `path` (segments; `[]` after a name steps into its items) names a field.
    pub fn resolve(&self, path: &[String]) -> Result<(), String> {
        if self.plain {
            return resolve_plain(&self.schema, path);
        }
        resolve(&self.defs, &self.schema, path)
    }
}

/// Every root: `spec.`/`status.` paths resolve in the object, others in any root whose top
/// has their first segment.
pub struct Fields {
    pub object: Root,
    pub relative: Vec<Root>,
}

impl Fields {
    pub fn read() -> Fields {
        let crd = serde_json::to_value(ferrotrain_api::crd::custom_resource_definition()).unwrap();
        let object = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        let config =
            serde_json::to_value(schemars::schema_for!(ferrotrain_api::TrainerConfig)).unwrap();
        let values_text =
            std::fs::read_to_string(repo_root().join("charts/ferrotrain/values.yaml")).unwrap();
        let values: Value = serde_saphyr::from_str(&values_text).unwrap();
        let props = |p: &str| object["properties"][p].clone();
        Fields {
            relative: vec![
                Root::schema("the resource's spec", props("spec"), Value::Null),
                Root::schema("the resource's status", props("status"), Value::Null),
                Root::schema(
                    "status.progress",
                    props("status")["properties"]["progress"].clone(),
                    Value::Null,
                ),
                Root::schema("the trainer config", config.clone(), config),
                Root {
                    name: "the chart's values.yaml",
                    schema: values,
                    defs: Value::Null,
                    plain: true,
                },
            ],
            object: Root::schema("the resource", object, Value::Null),
        }
    }

    /// Problems with a dotted path named in a code span; None when it is no field path.
    pub fn check_path(&self, token: &str) -> Option<String> {
        let candidates = expand_braces(token);
        let mut problem = None;
        for path in candidates {
            if let Some(p) = self.check_one(&path) {
                problem = Some(p);
            }
        }
        problem
    }

    fn check_one(&self, token: &str) -> Option<String> {
        let segments: Vec<String> = token.split('.').map(str::to_string).collect();
        if segments[0] == "spec" || segments[0] == "status" {
            return self
                .object
                .resolve(&segments)
                .err()
                .map(|e| format!("`{token}` is no field of the resource: {e}"));
        }
        let roots: Vec<&Root> = self
            .relative
            .iter()
            .filter(|r| r.has_top(&segments[0]))
            .collect();
        if roots.is_empty() {
            return None;
        }
        let mut errors = Vec::new();
        for root in &roots {
            match root.resolve(&segments) {
                Ok(()) => return None,
                Err(e) => errors.push(format!("in {}: {e}", root.name)),
            }
        }
        Some(format!("`{token}` is no field: {}", errors.join("; ")))
    }

    /// Problems with the fields a page names: `file:line: ...`.
    pub fn check(&self, doc: &Doc) -> Vec<String> {
        let mut problems = Vec::new();
        for span in spans(doc).into_iter().filter(|s| s.kind == Kind::Inline) {
            if !is_field_path(&span.text) {
                continue;
            }
            if let Some(p) = self.check_path(&span.text) {
                problems.push(format!("{}:{}: {p}", span.file, span.line));
            }
        }
        for block in blocks(doc) {
            if block.lang != "yaml" {
                continue;
            }
            for (i, text) in block.text.split("\n---").enumerate() {
                let Ok(value) = serde_saphyr::from_str::<Value>(text) else {
                    continue;
                };
                for p in self.check_yaml(&value) {
                    let line = block.line
                        + block
                            .text
                            .split("\n---")
                            .take(i)
                            .map(|t| t.lines().count())
                            .sum::<usize>();
                    problems.push(format!("{}:{}: in a YAML block: {p}", block.file, line));
                }
            }
        }
        problems
    }

    /// The unknown keys of a YAML document that is a DistributedTraining (or a piece of one
    /// from `spec:` down), a trainer config or chart values; nothing for anything else.
    pub fn check_yaml(&self, value: &Value) -> Vec<String> {
        let Some(map) = value.as_object() else {
            return Vec::new();
        };
        let api = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let is_object = api.starts_with("ferrotrain.dev/")
            || (!map.contains_key("apiVersion") && map.contains_key("spec") && map.len() == 1);
        let root = if is_object {
            Some(&self.object)
        } else if !map.contains_key("apiVersion") && !map.is_empty() {
            // A trainer config or chart values: every top key must be one of theirs.
            self.relative[3..]
                .iter()
                .find(|r| map.keys().all(|k| r.has_top(k)))
        } else {
            None
        };
        let Some(root) = root else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        // An object's apiVersion, kind and metadata are Kubernetes', not the CRD's schema's.
        let mut value = value.clone();
        if std::ptr::eq(root, &self.object) {
            for key in ["apiVersion", "kind", "metadata"] {
                value.as_object_mut().unwrap().remove(key);
            }
        }
        walk(&value, &mut Vec::new(), &mut |path| {
            if let Err(e) = root.resolve(path) {
                problems.push(format!(
                    "`{}` is no field of {}: {e}",
                    path.join("."),
                    root.name
                ));
                false
            } else {
                true
            }
        });
        problems
    }
}

/// Visits every key path of a YAML value (array items as `name[]`); `visit` returns whether
/// to go below.
fn walk(value: &Value, path: &mut Vec<String>, visit: &mut dyn FnMut(&[String]) -> bool) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                path.push(k.clone());
                if visit(path) {
                    walk(v, path, visit);
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            if let Some(last) = path.last_mut() {
                last.push_str("[]");
            }
            for item in items {
                walk(item, path, visit);
            }
            if let Some(last) = path.last_mut() {
                last.truncate(last.len() - 2);
            }
        }
        _ => {}
    }
}

/// `a.{b,c}.d` -> `a.b.d`, `a.c.d`.
fn expand_braces(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_string()];
    };
    if close < open {
        return vec![token.to_string()];
    }
    token[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{alt}{}", &token[..open], &token[close + 1..])))
        .collect()
}

/// File names and API groups look like paths too: `model.safetensors`, `scheduling.k8s.io`.
const NOT_FIELDS: &[&str] = &[
    "rs",
    "sh",
    "py",
    "yaml",
    "yml",
    "json",
    "jsonl",
    "md",
    "safetensors",
    "gz",
    "en",
    "de",
    "txt",
    "tpl",
    "toml",
    "so",
    "io",
    "dev",
    "com",
    "org",
    "env",
    "tsv",
    "png",
    "log",
    "1",
    "2",
];

/// `a.b`, `a.b.c`, `a.b[].c`, `a.*`, `a.{b,c}`: a candidate field path.
pub fn is_field_path(s: &str) -> bool {
    let segments: Vec<&str> = s.split('.').collect();
    if segments.len() < 2 || s.contains("..") || s.contains(' ') {
        return false;
    }
    if NOT_FIELDS.contains(segments.last().unwrap()) {
        return false;
    }
    let first_ok = segments[0].starts_with(|c: char| c.is_ascii_lowercase())
        && segments[0].chars().all(|c| c.is_ascii_alphanumeric());
    first_ok
        && segments[1..].iter().all(|seg| {
            !seg.is_empty()
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "[]{},*".contains(c))
        })
}

/// Resolves `path` in a JSON/OpenAPI schema (`$ref`s into `defs`).
fn resolve(defs: &Value, schema: &Value, path: &[String]) -> Result<(), String> {
    let schema = deref(defs, schema);
    let Some((head, rest)) = path.split_first() else {
        return Ok(());
    };
    if head == "*" || schema["x-kubernetes-preserve-unknown-fields"] == true {
        return Ok(());
    }
    // anyOf / oneOf / allOf: a field of any of them.
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(alternatives) = schema[key].as_array() {
            let found = alternatives
                .iter()
                .any(|alt| resolve(defs, alt, path).is_ok());
            if found {
                return Ok(());
            }
        }
    }
    let (name, items) = match head.strip_suffix("[]") {
        Some(n) => (n, true),
        None => (head.as_str(), false),
    };
    let below = if let Some(p) = schema["properties"].get(name) {
        p.clone()
    } else if schema["additionalProperties"].is_object() || schema["additionalProperties"] == true {
        schema["additionalProperties"].clone()
    } else {
        let mut known: Vec<&str> = schema["properties"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        known.sort();
        return Err(format!("no `{name}` (there: {})", known.join(", ")));
    };
    let below = if items {
        deref(defs, &below)["items"].clone()
    } else {
        below
    };
    resolve(defs, &below, rest).map_err(|e| format!("{name}.{e}"))
}

fn deref<'a>(defs: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let pointer = r.trim_start_matches('#');
            deref(defs, defs.pointer(pointer).unwrap_or(&Value::Null))
        }
        None => schema,
    }
}

/// Resolves `path` in plain values (an empty map or a list takes anything below).
fn resolve_plain(value: &Value, path: &[String]) -> Result<(), String> {
    let Some((head, rest)) = path.split_first() else {
        return Ok(());
    };
    if head == "*" || value.as_array().is_some() {
        return Ok(());
    }
    let name = head.trim_end_matches("[]");
    match value.as_object() {
        Some(map) if map.is_empty() => Ok(()),
        Some(map) => match map.get(name) {
            Some(v) => resolve_plain(v, rest).map_err(|e| format!("{name}.{e}")),
            None => Err(format!("no `{name}`")),
        },
        None => Err(format!("`{name}` below a value")),
    }
}
