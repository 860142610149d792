//! The generated CustomResourceDefinition: committed copies never drift, its shape is what
//! kubectl needs, and its schema refuses bad objects with messages naming the field.
//!
//! The schema checks run the generated openAPIV3Schema through a small structural validator
//! (types, required, ranges, enums, lengths: the apiserver's OpenAPI checks) and through
//! kube-cel for the `x-kubernetes-validations` rules, with schema defaults applied first as
//! the apiserver does. The e2e suite repeats the rejections against a real API server.

mod support;

use ferrotrain_api::crd::{custom_resource_definition, custom_resource_definition_yaml};
use serde_json::{Value, json};
use support::repo_root;

#[test]
fn committed_crds_match_the_generated_one() {
    let generated = custom_resource_definition_yaml();
    for path in [
        "crds/distributedtrainings.yaml",
        "charts/ferrotrain/crds/distributedtrainings.yaml",
    ] {
        let committed = std::fs::read_to_string(repo_root().join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}; run scripts/gen-crds.sh"));
        assert!(
            committed == generated,
            "{path} is out of date with the Rust types: run scripts/gen-crds.sh and commit the result"
        );
    }
}

#[test]
fn committed_yaml_parses_back_to_the_same_definition() {
    let text = custom_resource_definition_yaml();
    let parsed: Value = serde_saphyr::from_str(&text).unwrap();
    let expected = serde_json::to_value(custom_resource_definition()).unwrap();
    assert_eq!(parsed, expected);
}

fn crd_json() -> Value {
    serde_json::to_value(custom_resource_definition()).unwrap()
}

fn schema() -> Value {
    crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Client-side `kubectl apply` stores the object in an annotation of at most 256 KiB.
#[test]
fn the_crd_fits_a_client_side_apply() {
    let json = serde_json::to_string(&custom_resource_definition()).unwrap();
    assert!(
        json.len() < 240 * 1024,
        "CRD is {} bytes of JSON",
        json.len()
    );
    let volumes =
        &schema()["properties"]["spec"]["properties"]["podTemplate"]["properties"]["volumes"];
    assert!(volumes["items"]["properties"]["nfs"]["description"].is_string());
    assert!(
        volumes["description"]
            .as_str()
            .unwrap()
            .contains("kubectl explain pod.spec.volumes")
    );
}

#[test]
fn names_scope_columns_and_subresources() {
    let crd = crd_json();
    assert_eq!(
        crd["metadata"]["name"],
        "distributedtrainings.ferrotrain.dev"
    );
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "ferrotrain.dev");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "DistributedTraining");
    assert_eq!(spec["names"]["plural"], "distributedtrainings");
    assert_eq!(spec["names"]["shortNames"], json!(["dt"]));
    assert_eq!(spec["names"]["categories"], json!(["ferrotrain"]));
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["served"], true);
    assert_eq!(version["storage"], true);
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<(&str, &str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["jsonPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Phase", "string", ".status.phase"),
            ("Step", "integer", ".status.progress.step"),
            ("Steps/s", "number", ".status.progress.stepsPerSecond"),
            ("Loss", "number", ".status.progress.loss"),
            ("ETA", "string", ".status.progress.eta"),
            ("Restarts", "integer", ".status.restarts"),
            // -o wide only (priority 1).
            ("Goodput", "number", ".status.recovery.goodputPercent"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn conditions_are_a_list_map_keyed_by_type() {
    let conditions = &schema()["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    assert_eq!(
        conditions["items"]["required"],
        json!(["lastTransitionTime", "message", "reason", "status", "type"])
    );
}

#[test]
fn status_carries_progress_fields() {
    let progress = &schema()["properties"]["status"]["properties"]["progress"]["properties"];
    for field in [
        "step",
        "totalSteps",
        "stepsPerSecond",
        "samplesPerSecond",
        "tokensPerSecond",
        "stepTimeSeconds",
        "commFraction",
        "loss",
        "evalLoss",
        "evalBleu",
        "learningRate",
        "etaSeconds",
        "eta",
        "estimatedCompletionTime",
        "lastCheckpoint",
        "resumedFromStep",
        "updatedAt",
    ] {
        assert!(
            progress.get(field).is_some(),
            "status.progress.{field} missing"
        );
    }
}

/// Every property in the spec has a description, so `kubectl explain` explains it.
#[test]
fn every_spec_field_is_described() {
    fn walk(schema: &Value, path: &str, missing: &mut Vec<String>) {
        if let Some(props) = schema["properties"].as_object() {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                // Inside a volume source the fields are documented by `kubectl explain
                // pod.spec.volumes` (the CRD must stay under 256 KiB).
                if path.starts_with("spec.podTemplate.volumes[].") {
                    continue;
                }
                // Likewise NetworkPolicy peers and rules: `kubectl explain networkpolicy.spec`.
                if path.starts_with("spec.networkPolicy.metricsFrom[]")
                    || path.starts_with("spec.networkPolicy.egressTo[]")
                {
                    continue;
                }
                if sub["description"]
                    .as_str()
                    .is_none_or(|d| d.trim().is_empty())
                {
                    missing.push(p.clone());
                }
                walk(sub, &p, missing);
            }
        }
        if schema["items"].is_object() {
            walk(&schema["items"], &format!("{path}[]"), missing);
        }
    }
    let mut missing = Vec::new();
    let spec = &schema()["properties"]["spec"];
    // Our own types; the embedded Kubernetes types (volumes, affinity, ...) carry upstream
    // descriptions and are checked too.
    walk(spec, "spec", &mut missing);
    walk(&schema()["properties"]["status"], "status", &mut missing);
    assert!(missing.is_empty(), "undescribed fields: {missing:#?}");
}

// ---------------------------------------------------------------------------------------
// A structural validator with the apiserver's OpenAPI checks and message shapes.

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != true && schema.get("type").is_some() {
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema["type"].as_str().unwrap_or("?")
            ));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            errors.push(format!(
                "{path}: Invalid value: must be an integer or a string"
            ));
        }
        return;
    }
    if let Some(ty) = schema["type"].as_str() {
        let got = type_name(value);
        let ok = got == ty || (ty == "number" && got == "integer");
        if !ok {
            errors.push(format!(
                "{path}: Invalid value: \"{got}\": {path} in body must be of type {ty}: \"{got}\""
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
        errors.push(format!(
            "{path}: Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema["minimum"].as_f64()
            && n < min
        {
            errors.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be greater than or equal to {min}"
            ));
        }
        if let Some(max) = schema["maximum"].as_f64()
            && n > max
        {
            errors.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be less than or equal to {max}"
            ));
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema["minLength"].as_u64()
            && len < min
        {
            errors.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be at least {min} chars long"
            ));
        }
        if let Some(max) = schema["maxLength"].as_u64()
            && len > max
        {
            errors.push(format!(
                "{path}: Too long: may not be more than {max} bytes"
            ));
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(max) = schema["maxItems"].as_u64()
            && items.len() as u64 > max
        {
            errors.push(format!(
                "{path}: Too many: {}: must have at most {max} items",
                items.len()
            ));
        }
        if let Some(min) = schema["minItems"].as_u64()
            && (items.len() as u64) < min
        {
            errors.push(format!(
                "{path}: Invalid value: {path} in body should have at least {min} items"
            ));
        }
        for (i, item) in items.iter().enumerate() {
            check(&schema["items"], item, &format!("{path}[{i}]"), errors);
        }
    }
    if let Some(object) = value.as_object() {
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap();
            if !object.contains_key(key) {
                errors.push(format!("{path}.{key}: Required value"));
            }
        }
        let props = schema["properties"].as_object();
        for (key, sub) in object {
            let p = format!("{path}.{key}");
            match props.and_then(|props| props.get(key)) {
                Some(s) => check(s, sub, &p, errors),
                None if schema["additionalProperties"].is_object() => {
                    check(&schema["additionalProperties"], sub, &p, errors)
                }
                None if props.is_some()
                    && schema["x-kubernetes-preserve-unknown-fields"] != true =>
                {
                    // kubectl's default strict field validation.
                    errors.push(format!("{p}: unknown field \"{key}\""));
                }
                None => {}
            }
        }
    }
}

/// What the apiserver would say about `object` (empty = accepted).
fn validate(object: Value) -> Vec<String> {
    let schema = schema();
    let mut errors = Vec::new();
    let mut body = object.clone();
    // The apiserver validates the object after defaulting; CEL sees defaults too.
    body.as_object_mut().unwrap().remove("apiVersion");
    body.as_object_mut().unwrap().remove("kind");
    for (key, sub) in body.as_object().unwrap() {
        if key == "metadata" {
            continue;
        }
        check(&schema["properties"][key], sub, key, &mut errors);
    }
    if errors.is_empty()
        && let Err(cel) = kube::core::cel::Validator::new().validate(&schema, &object, None)
    {
        for e in cel.into_vec() {
            errors.push(e.to_string());
        }
    }
    errors
}

fn object(spec: Value) -> Value {
    json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": "mt", "namespace": "ml"},
        "spec": spec,
    })
}

fn valid_spec() -> Value {
    json!({
        "replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 100, "model": {"dModel": 64, "heads": 4}},
    })
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let mut target = &mut base;
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        if target.get(part).is_none() {
            target[part] = json!({});
        }
        target = &mut target[part];
    }
    target[key] = value;
    base
}

/// (what, object, a substring every message must name) — one row per rejection.
fn rejections() -> Vec<(&'static str, Value, &'static str)> {
    let v = valid_spec;
    vec![
        (
            "replicas 0",
            object(with(v(), "/replicas", json!(0))),
            "spec.replicas",
        ),
        (
            "replicas missing",
            object(json!({"trainer": {"task": "copy", "maxSteps": 1}})),
            "spec.replicas",
        ),
        (
            "negative maxRestarts",
            object(with(v(), "/restartPolicy/maxRestarts", json!(-1))),
            "spec.restartPolicy.maxRestarts",
        ),
        (
            "unknown task",
            object(with(v(), "/trainer/task", json!("summarize"))),
            "spec.trainer.task",
        ),
        (
            "dModel not divisible by heads",
            object(with(
                v(),
                "/trainer/model",
                json!({"dModel": 250, "heads": 4}),
            )),
            "model.dModel must be divisible by model.heads",
        ),
        (
            "dModel default (256) not divisible by heads 3",
            object(with(v(), "/trainer/model", json!({"heads": 3}))),
            "model.dModel must be divisible by model.heads",
        ),
        (
            "maxSteps 0",
            object(with(v(), "/trainer/maxSteps", json!(0))),
            "spec.trainer.maxSteps",
        ),
        (
            "negative gpusPerReplica",
            object(with(v(), "/gpusPerReplica", json!(-1))),
            "spec.gpusPerReplica",
        ),
        (
            "more ranks than GPUs",
            object(with(
                with(v(), "/gpusPerReplica", json!(2)),
                "/procsPerReplica",
                json!(4),
            )),
            "spec.procsPerReplica",
        ),
        (
            "neither trainer nor command",
            object(json!({"replicas": 1})),
            "spec.trainer is required unless spec.pytorch or spec.command",
        ),
        (
            "pytorch with a command",
            object(
                json!({"replicas": 1, "image": "img", "pytorch": {"command": ["python3", "t.py"]}, "command": ["torchrun", "t.py"]}),
            ),
            "spec.pytorch excludes spec.command, spec.args and spec.trainer",
        ),
        (
            "pytorch with a trainer config",
            object(with(
                with(v(), "/pytorch", json!({"command": ["python3", "t.py"]})),
                "/image",
                json!("img"),
            )),
            "spec.pytorch excludes spec.command, spec.args and spec.trainer",
        ),
        (
            "pytorch without an image",
            object(json!({"replicas": 1, "pytorch": {"command": ["python3", "t.py"]}})),
            "spec.pytorch needs spec.image",
        ),
        (
            "pytorch with no command",
            object(json!({"replicas": 1, "image": "img", "pytorch": {"command": []}})),
            "spec.pytorch.command",
        ),
        (
            "two checkpoint volumes",
            object(with(
                v(),
                "/checkpoint",
                json!({"claimName": "a", "volumeName": "b"}),
            )),
            "spec.checkpoint.claimName and spec.checkpoint.volumeName",
        ),
        (
            "a store Secret without a store",
            object(with(
                v(),
                "/checkpoint",
                json!({"storeSecretName": "creds"}),
            )),
            "spec.checkpoint.storeSecretName needs spec.trainer.checkpoint.store",
        ),
        (
            "data without a volume",
            object(with(v(), "/data", json!({"mountPath": "/data"}))),
            "spec.data.claimName and spec.data.volumeName",
        ),
        (
            "max backoff below backoff",
            object(with(
                v(),
                "/restartPolicy",
                json!({"backoffSeconds": 60, "maxBackoffSeconds": 10}),
            )),
            "spec.restartPolicy.maxBackoffSeconds",
        ),
        (
            "bad pull policy",
            object(with(v(), "/imagePullPolicy", json!("Sometimes"))),
            "spec.imagePullPolicy",
        ),
        (
            "name too long for pod hostnames",
            {
                let mut o = object(v());
                o["metadata"]["name"] = json!("a".repeat(48));
                o
            },
            "metadata.name must be a DNS label of at most 47",
        ),
        (
            "unknown trainer field",
            object(with(v(), "/trainer/learningRate", json!(0.1))),
            "spec.trainer.learningRate",
        ),
    ]
}

#[test]
fn the_schema_rejects_bad_objects_naming_the_field() {
    let mut failures = Vec::new();
    for (what, object, needle) in rejections() {
        let errors = validate(object);
        eprintln!("{what}: {errors:?}");
        if errors.is_empty() {
            failures.push(format!("{what}: accepted"));
        } else if !errors.iter().any(|e| e.contains(needle)) {
            failures.push(format!("{what}: no message names {needle:?}: {errors:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_schema_accepts_good_objects() {
    assert_eq!(validate(object(valid_spec())), Vec::<String>::new());
    let byo = json!({"replicas": 2, "image": "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime", "command": ["torchrun", "train.py"], "gpusPerReplica": 8});
    assert_eq!(validate(object(byo)), Vec::<String>::new());
    let pytorch = json!({"replicas": 2, "image": "ferrotrain/pytorch:dev", "pytorch": {"command": ["python3", "train.py", "--epochs", "3"], "preImport": ["numpy"]}});
    assert_eq!(validate(object(pytorch)), Vec::<String>::new());
    // A store with its Secret, and one without (the node's or the pod's own credentials).
    let store = json!({"url": "s3://ckpt/runs", "endpoint": "http://minio.store.svc:9000"});
    let with_store = with(valid_spec(), "/trainer/checkpoint/store", store);
    let with_secret = with(
        with_store.clone(),
        "/checkpoint",
        json!({"storeSecretName": "creds"}),
    );
    assert_eq!(validate(object(with_secret)), Vec::<String>::new());
    assert_eq!(validate(object(with_store)), Vec::<String>::new());
}

/// Every DistributedTraining in the example manifests of examples/ passes the schema and
/// parses into the Rust type (a manifest may also hold other objects, say its claim); each
/// `*-dt.yaml` holds one at least, and the examples named here are among them.
#[test]
fn examples_are_valid() {
    let dir = repo_root().join("examples");
    let mut seen = 0;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with("-dt.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let before = seen;
        for object in documents {
            if object["kind"] != "DistributedTraining" {
                continue;
            }
            assert_eq!(validate(object.clone()), Vec::<String>::new(), "{name}");
            let dt: ferrotrain_api::crd::DistributedTraining =
                serde_json::from_value(object).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                ferrotrain_operator::observe::spec_problems(&dt.spec),
                Vec::<String>::new(),
                "{name}"
            );
            seen += 1;
        }
        assert!(seen > before, "{name} holds no DistributedTraining");
        files.push(name);
    }
    files.sort();
    for example in [
        "copy-dt.yaml",
        "pytorch-dt.yaml",
        "torchrun-byo-dt.yaml",
        "translation-gpu-dt.yaml",
    ] {
        assert!(
            files.iter().any(|f| f == example),
            "{example} not among {files:?} in {}",
            dir.display()
        );
    }
}

/// The validator itself: a row that must be accepted is, and each check fires.
#[test]
fn the_validator_is_not_vacuous() {
    let s = json!({"type": "object", "required": ["a"], "properties": {
        "a": {"type": "integer", "minimum": 1, "maximum": 3},
        "b": {"type": "string", "enum": ["x"]},
        "c": {"type": "array", "maxItems": 1, "items": {"type": "string"}}
    }});
    let mut e = Vec::new();
    check(&s, &json!({"a": 2, "b": "x", "c": ["q"]}), "o", &mut e);
    assert!(e.is_empty(), "{e:?}");
    check(
        &s,
        &json!({"a": 0, "b": "y", "c": ["q", "r"], "d": 1}),
        "o",
        &mut e,
    );
    assert_eq!(e.len(), 4, "{e:?}");
    let mut e = Vec::new();
    check(&s, &json!({"b": 1}), "o", &mut e);
    assert_eq!(e.len(), 2, "{e:?}");
}

/// Kubernetes knows int32/int64 (and float/double) only; unsigned Rust types are mapped with
/// their bounds, so e.g. a u32 field refuses 2^32 instead of overflowing the trainer.
#[test]
fn integer_formats_are_the_ones_kubernetes_knows() {
    fn walk(v: &Value, path: &str, bad: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if let Some(f) = map.get("format").and_then(Value::as_str)
                    && f.starts_with("uint")
                {
                    bad.push(format!("{path}: {f}"));
                }
                for (k, sub) in map {
                    walk(sub, &format!("{path}.{k}"), bad);
                }
            }
            Value::Array(items) => items.iter().for_each(|i| walk(i, path, bad)),
            _ => {}
        }
    }
    let mut bad = Vec::new();
    walk(&schema(), "", &mut bad);
    assert!(bad.is_empty(), "{bad:?}");
    let vocab = &schema()["properties"]["spec"]["properties"]["trainer"]["properties"]["data"]["properties"]
        ["tokenizer"]["properties"]["vocabSize"];
    assert_eq!(vocab["format"], "int64");
    assert_eq!(vocab["maximum"], 1000000.0);
    let errors = validate(object(with(valid_spec(), "/trainer/seed", json!(-1))));
    assert!(
        errors.iter().any(|e| e.contains("spec.trainer.seed")),
        "{errors:?}"
    );
}
