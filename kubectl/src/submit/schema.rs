//! An object checked against the CRD's own openAPIV3Schema (the one `ferrotrain-operator crd`
//! installs, built by the same function) as the API server would check it: unknown fields
//! (kubectl's strict field validation; with the field it was probably meant to be), types,
//! required fields, enums, ranges and lengths, each problem naming its field. The schema's CEL
//! rules are kube-cel's to evaluate (src/submit.rs).

use serde_json::{Map, Value};

use crate::problem::Problem;

/// The installed CRD's schema of its (only) version.
pub fn crd_schema() -> Value {
    let crd = ferrotrain_api::crd::custom_resource_definition();
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the CRD has a schema");
    serde_json::to_value(schema).expect("the schema serializes")
}

/// Every problem of `object` against `schema` (empty: it passes), by path.
pub fn check(object: &Value, schema: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let Some(fields) = object.as_object() else {
        return vec![Problem::new("", "must be an object")];
    };
    for (key, value) in fields {
        match key.as_str() {
            // The API server's own (apiVersion, kind: checked by the caller; metadata: its
            // ObjectMeta); status is not the submitter's.
            "apiVersion" | "kind" | "metadata" | "status" => {}
            _ => walk(&schema["properties"], key, value, key, &mut problems),
        }
    }
    problems.sort_by(|a, b| a.path.cmp(&b.path));
    problems
}

/// Checks `value`, the field `key` of an object whose `properties` are `siblings`.
fn walk(siblings: &Value, key: &str, value: &Value, path: &str, out: &mut Vec<Problem>) {
    match siblings.get(key) {
        Some(schema) => value_against(schema, value, path, out),
        None => out.push(Problem::new(path, &unknown(key, siblings))),
    }
}

fn unknown(key: &str, siblings: &Value) -> String {
    let known: Vec<&str> = siblings
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    match closest(key, &known) {
        Some(near) => format!("unknown field (did you mean {near}?)"),
        None => "unknown field".to_string(),
    }
}

/// The known name nearest `key` (at most two edits, or the same but for case).
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (distance(&key.to_lowercase(), &k.to_lowercase()), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let replaced = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = replaced.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

fn value_against(schema: &Value, value: &Value, path: &str, out: &mut Vec<Problem>) {
    if value.is_null() {
        // The API server drops a null of a field that is not nullable, or defaults it.
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            out.push(Problem::new(
                path,
                &format!("must be an integer or a string, got {value}"),
            ));
        }
        return;
    }
    let problem = match schema["type"].as_str() {
        Some("object") => return object_against(schema, value, path, out),
        Some("array") => return array_against(schema, value, path, out),
        Some("string") => string_problem(schema, value),
        Some("integer") => number_problem(schema, value, true),
        Some("number") => number_problem(schema, value, false),
        Some("boolean") => {
            (!value.is_boolean()).then(|| format!("must be true or false, got {value}"))
        }
        _ => None,
    };
    if let Some(p) = problem {
        out.push(Problem::new(path, &p));
    }
}

fn object_against(schema: &Value, value: &Value, path: &str, out: &mut Vec<Problem>) {
    let Some(fields) = value.as_object() else {
        out.push(Problem::new(
            path,
            &format!("must be an object, got {value}"),
        ));
        return;
    };
    let properties = &schema["properties"];
    let open = schema["x-kubernetes-preserve-unknown-fields"] == true;
    for (key, sub) in fields {
        let sub_path = format!("{path}.{key}");
        if properties.get(key).is_some() {
            value_against(&properties[key], sub, &sub_path, out);
        } else if schema["additionalProperties"].is_object() {
            value_against(&schema["additionalProperties"], sub, &sub_path, out);
        } else if properties.is_object() && !open && schema["additionalProperties"] != true {
            walk(properties, key, sub, &sub_path, out);
        }
    }
    required(schema, fields, path, out);
}

/// The schema's required fields that `fields` lacks (a field with a default is the API
/// server's to fill).
fn required(schema: &Value, fields: &Map<String, Value>, path: &str, out: &mut Vec<Problem>) {
    for key in schema["required"].as_array().into_iter().flatten() {
        let Some(key) = key.as_str() else { continue };
        let defaulted = schema["properties"][key].get("default").is_some();
        if !fields.contains_key(key) && !defaulted {
            out.push(Problem::new(&format!("{path}.{key}"), "is required"));
        }
    }
}

fn array_against(schema: &Value, value: &Value, path: &str, out: &mut Vec<Problem>) {
    let Some(items) = value.as_array() else {
        out.push(Problem::new(path, &format!("must be a list, got {value}")));
        return;
    };
    if let Some(min) = schema["minItems"]
        .as_u64()
        .filter(|m| (items.len() as u64) < *m)
    {
        out.push(Problem::new(
            path,
            &format!("must have at least {min} item(s)"),
        ));
    }
    if let Some(max) = schema["maxItems"]
        .as_u64()
        .filter(|m| (items.len() as u64) > *m)
    {
        out.push(Problem::new(
            path,
            &format!("must have at most {max} items"),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        value_against(&schema["items"], item, &format!("{path}[{i}]"), out);
    }
}

fn string_problem(schema: &Value, value: &Value) -> Option<String> {
    let Some(s) = value.as_str() else {
        return Some(format!("must be a string, got {value}"));
    };
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.iter().any(|a| a == value)
    {
        let names: Vec<String> = allowed
            .iter()
            .map(|a| a.as_str().unwrap_or("").to_string())
            .collect();
        return Some(format!("must be one of {}, got {s:?}", names.join(", ")));
    }
    let length = s.chars().count() as u64;
    if let Some(min) = schema["minLength"].as_u64().filter(|m| length < *m) {
        return Some(format!("must be at least {min} character(s) long"));
    }
    if let Some(max) = schema["maxLength"].as_u64().filter(|m| length > *m) {
        return Some(format!(
            "must be at most {max} characters long, got {length}"
        ));
    }
    None
}

fn number_problem(schema: &Value, value: &Value, integer: bool) -> Option<String> {
    let Some(n) = value.as_f64() else {
        let what = if integer { "an integer" } else { "a number" };
        return Some(format!("must be {what}, got {value}"));
    };
    if integer && !(value.is_i64() || value.is_u64()) {
        return Some(format!("must be an integer, got {value}"));
    }
    if let Some(min) = schema["minimum"].as_f64().filter(|m| n < *m) {
        return Some(format!("must be at least {min}, got {value}"));
    }
    if let Some(max) = schema["maximum"].as_f64().filter(|m| n > *m) {
        return Some(format!("must be at most {max}, got {value}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(spec: Value) -> Vec<String> {
        let object = json!({
            "apiVersion": "ferrotrain.dev/v1alpha1", "kind": "DistributedTraining",
            "metadata": {"name": "x"}, "spec": spec,
        });
        check(&object, &crd_schema())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn valid() -> Value {
        json!({"replicas": 2, "trainer": {"task": "copy", "maxSteps": 100}})
    }

    #[test]
    fn a_valid_spec_passes() {
        assert_eq!(problems(valid()), Vec::<String>::new());
    }

    #[test]
    fn an_unknown_field_is_named_with_the_one_it_was_probably_meant_to_be() {
        let mut spec = valid();
        spec["trainer"]["optimzer"] = json!({"lr": 0.1});
        spec["replica"] = json!(2);
        spec["zzz"] = json!(1);
        assert_eq!(
            problems(spec),
            [
                "spec.replica: unknown field (did you mean replicas?)",
                "spec.trainer.optimzer: unknown field (did you mean optimizer?)",
                "spec.zzz: unknown field",
            ]
        );
    }

    #[test]
    fn types_ranges_enums_and_required_fields_name_their_field() {
        let spec = json!({
            "replicas": 0,
            "gpusPerReplica": "two",
            "imagePullPolicy": "Sometimes",
            "trainer": {"task": "copy", "maxSteps": 1.5},
            "resources": {"limits": {"memory": "1Gi", "cpu": 2}},
        });
        assert_eq!(
            problems(spec),
            [
                "spec.gpusPerReplica: must be an integer, got \"two\"",
                "spec.imagePullPolicy: must be one of Always, IfNotPresent, Never, got \"Sometimes\"",
                "spec.replicas: must be at least 1, got 0",
                "spec.trainer.maxSteps: must be an integer, got 1.5",
            ]
        );
        let missing = problems(json!({"trainer": {"maxSteps": 10}}));
        assert_eq!(
            missing,
            [
                "spec.replicas: is required",
                "spec.trainer.task: is required"
            ]
        );
    }

    #[test]
    fn lists_are_checked_item_by_item() {
        let mut spec = valid();
        spec["command"] = json!([]);
        spec["args"] = json!(["ok", 3]);
        assert_eq!(
            problems(spec),
            [
                "spec.args[1]: must be a string, got 3",
                "spec.command: must have at least 1 item(s)",
            ]
        );
    }

    #[test]
    fn edit_distance() {
        assert_eq!(distance("optimzer", "optimizer"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(closest("MAXSTEPS", &["maxSteps", "seed"]), Some("maxSteps"));
    }
}
