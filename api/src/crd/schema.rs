//! The CRD as installed: the derived definition, post-processed for the API server and for
//! `kubectl explain`.

use kube::core::crd::CustomResourceExt;

use super::spec::{DistributedTraining, MAX_NAME_LENGTH};

/// The CRD as installed: the derived definition plus the object-level rule on the name (pods
/// are named `<name>-<attempt>-<nodeRank>` and the name is also the headless Service's).
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    let mut crd = DistributedTraining::crd();
    let rule = ValidationRule {
        rule: format!(
            "size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
        ),
        message: Some(format!(
            "metadata.name must be a DNS label of at most {MAX_NAME_LENGTH} characters starting with a letter: pods are named <name>-<attempt>-<nodeRank> and the name is the headless Service's"
        )),
        // No fieldPath: the schema does not declare metadata's fields, so the apiserver would
        // refuse ".metadata.name" as a path.
        ..ValidationRule::default()
    };
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(rule.clone());
            let mut value = serde_json::to_value(&*schema).expect("schema serializes");
            kubernetes_integer_formats(&mut value);
            trim_volume_descriptions(&mut value);
            trim_network_peer_descriptions(&mut value);
            readable_descriptions(&mut value);
            *schema = serde_json::from_value(value).expect("schema deserializes");
        }
        for column in version.additional_printer_columns.iter_mut().flatten() {
            if let Some(d) = &mut column.description {
                *d = unwrap_lines(d);
            }
        }
    }
    crd
}

/// The Volume schema is two fifths of the CRD: its nested descriptions would push the CRD past
/// the 256 KiB that client-side `kubectl apply` can store. Each volume source keeps its own
/// description; the fields inside it are documented by `kubectl explain pod.spec.volumes`.
fn trim_volume_descriptions(schema: &mut serde_json::Value) {
    let volumes = schema
        .pointer_mut("/properties/spec/properties/podTemplate/properties/volumes")
        .expect("spec.podTemplate.volumes is in the schema");
    if let Some(d) = volumes.get_mut("description") {
        *d = format!(
            "{} Same schema as a Pod's volumes: `kubectl explain pod.spec.volumes` documents every field.",
            d.as_str().unwrap_or_default()
        )
        .into();
    }
    if let Some(sources) = volumes
        .pointer_mut("/items/properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        for source in sources.values_mut() {
            let description = source.get("description").cloned();
            strip_descriptions(source);
            if let Some(d) = description {
                source["description"] = d;
            }
        }
    }
}

/// The NetworkPolicy peers and egress rules of spec.networkPolicy keep the descriptions of
/// their two fields only: `kubectl explain networkpolicy.spec.ingress.from` and
/// `networkpolicy.spec.egress` document what is inside (the CRD stays well under the 256 KiB
/// client-side apply can store).
fn trim_network_peer_descriptions(schema: &mut serde_json::Value) {
    for field in ["metricsFrom", "egressTo"] {
        let path = format!("/properties/spec/properties/networkPolicy/properties/{field}/items");
        if let Some(items) = schema.pointer_mut(&path) {
            strip_descriptions(items);
        }
    }
}

/// Removes every description under `v` (itself included).
fn strip_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.remove("description");
            map.values_mut().for_each(strip_descriptions);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// Kubernetes knows the integer formats int32 and int64 only (it warns "unrecognized format
/// uint32"), and the API server refuses an integer schema whose minimum or maximum is not an
/// integer of its format ("Maximum boundary value must be of type integer with format int64",
/// kube-openapi's `IsValueValidAgainstRange`), checked on every default and every object.
/// Bounds are f64 in the CRD types, so `i64::MAX` becomes 2^63, which is no int64.
///
/// So: unsigned Rust types become int64 with minimum 0 and the type's maximum where an f64
/// holds it exactly (u8 to u32); u64 gets no maximum (an int64 field cannot exceed int64
/// anyway). Every integer bound is then made an integer of its format: a fractional bound is
/// rounded inwards (the same integers pass), a bound outside the format's range is left out
/// (it constrains nothing).
fn kubernetes_integer_formats(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            let unsigned_max = match map.get("format").and_then(Value::as_str) {
                Some("uint8") => Some(Some(u64::from(u8::MAX))),
                Some("uint16") => Some(Some(u64::from(u16::MAX))),
                Some("uint32") => Some(Some(u64::from(u32::MAX))),
                Some("uint64" | "uint") => Some(None),
                _ => None,
            };
            if let Some(type_max) = unsigned_max {
                map.insert("format".into(), "int64".into());
                let min = map.get("minimum").and_then(Value::as_f64).unwrap_or(0.0);
                map.insert("minimum".into(), Value::from(min.max(0.0)));
                if let Some(type_max) = type_max {
                    let max = map.get("maximum").and_then(Value::as_f64);
                    if max.is_none_or(|m| m > type_max as f64) {
                        map.insert("maximum".into(), Value::from(type_max as f64));
                    }
                }
            }
            if map.get("type").and_then(Value::as_str) == Some("integer") {
                let (lowest, highest) = match map.get("format").and_then(Value::as_str) {
                    Some("int32") => (f64::from(i32::MIN), f64::from(i32::MAX)),
                    // 2^63 is the first f64 past i64::MAX; -2^63 is i64::MIN exactly.
                    _ => (i64::MIN as f64, 9_223_372_036_854_774_784.0),
                };
                for (key, round) in [
                    ("minimum", f64::ceil as fn(f64) -> f64),
                    ("maximum", f64::floor),
                ] {
                    let Some(bound) = map.get(key).and_then(Value::as_f64) else {
                        continue;
                    };
                    let bound = round(bound);
                    if bound.is_finite() && (lowest..=highest).contains(&bound) {
                        map.insert(key.into(), Value::from(bound as i64));
                    } else {
                        map.remove(key);
                    }
                }
            }
            for v in map.values_mut() {
                kubernetes_integer_formats(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(kubernetes_integer_formats),
        _ => {}
    }
}

/// `kubectl explain` prints a description as it is, so the line breaks of wrapped doc
/// comments would show as ragged lines. Every description becomes one line per paragraph;
/// paragraphs that are laid out on purpose (lists, indented lines, as in the embedded
/// Kubernetes descriptions) keep their line breaks.
fn readable_descriptions(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match (key.as_str(), v) {
                    ("description", Value::String(d)) => *d = unwrap_lines(d),
                    // Values, not schemas: a default or enum may hold a "description" key.
                    ("default" | "enum" | "example" | "x-kubernetes-validations", _) => {}
                    (_, v) => readable_descriptions(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(readable_descriptions),
        _ => {}
    }
}

/// Joins the wrapped lines of each paragraph of `text` with a space.
fn unwrap_lines(text: &str) -> String {
    // An indented line or a list item: "- x", "* x", "1. x", "2) x", "c) x".
    fn laid_out(line: &str) -> bool {
        let marker = |line: &str| {
            let digits = line.chars().take_while(char::is_ascii_digit).count();
            let (label, rest) = line.split_at(digits);
            let numbered =
                (1..=2).contains(&digits) && (rest.starts_with(". ") || rest.starts_with(") "));
            let lettered = label.is_empty()
                && line.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && line[1..].starts_with(") ");
            numbered || lettered
        };
        line.starts_with(char::is_whitespace)
            || line.starts_with("- ")
            || line.starts_with("* ")
            || marker(line)
    }
    let mut paragraphs = Vec::new();
    let mut lines: Vec<&str> = Vec::new();
    let mut flush = |lines: &mut Vec<&str>| {
        if lines.is_empty() {
            return;
        }
        let indented = lines.iter().any(|l| l.starts_with(char::is_whitespace));
        let paragraph = if indented || lines.iter().skip(1).any(|l| laid_out(l)) {
            lines.join("\n")
        } else {
            lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
        };
        paragraphs.push(paragraph);
        lines.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            flush(&mut lines);
        } else {
            lines.push(line.trim_end());
        }
    }
    flush(&mut lines);
    paragraphs.join("\n\n")
}

/// The CRD as YAML, exactly as committed under crds/ and the Helm chart.
pub fn custom_resource_definition_yaml() -> String {
    let body = serde_saphyr::to_string(&custom_resource_definition()).expect("CRD serializes");
    format!(
        "# Generated by `ferrotrain-operator crd` (scripts/gen-crds.sh). Do not edit.\n---\n{body}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrapped_lines_join_and_laid_out_paragraphs_stay() {
        assert_eq!(
            unwrap_lines("Save every this many steps; 0 = only\nat the end.\n\nSecond\n paragraph"),
            "Save every this many steps; 0 = only at the end.\n\nSecond\n paragraph"
        );
        let list = "Valid options are:\n  Localhost - a profile.\n  Unconfined - none.";
        assert_eq!(unwrap_lines(list), list);
        let items = "Use this if: a) one,\nb) two\n- three";
        assert_eq!(unwrap_lines(items), items);
        assert_eq!(
            unwrap_lines("uid\n65532, seccomp. No\nlist"),
            "uid 65532, seccomp. No list"
        );
        let note = "<quantity> ::= <number><suffix>\n\n\t(Note that <suffix> may be empty.)";
        assert_eq!(unwrap_lines(note), note);
    }

    #[test]
    fn integer_bounds_are_integers_of_their_format() {
        let mut schema = json!({"properties": {
            "u64": {"type": "integer", "format": "uint64", "minimum": 1.0},
            "u32": {"type": "integer", "format": "uint32"},
            "i64": {"type": "integer", "format": "int64", "maximum": 9.223372036854776e18, "minimum": -0.5},
            "i32": {"type": "integer", "format": "int32", "maximum": 4294967295.0, "minimum": 1.0},
        }});
        kubernetes_integer_formats(&mut schema);
        assert_eq!(
            schema["properties"],
            json!({
                "u64": {"type": "integer", "format": "int64", "minimum": 1},
                "u32": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295u64},
                "i64": {"type": "integer", "format": "int64", "minimum": 0},
                "i32": {"type": "integer", "format": "int32", "minimum": 1},
            })
        );
    }
}
