//! The object `submit` sends, from what it was given: a DistributedTraining manifest (the one
//! of a multi-document file; the file's other objects are left to `kubectl apply`), or a
//! trainer config, which becomes the spec's `trainer` of a job named after the file; then the
//! flags' fields on top.

use ferrotrain_api::crd::{GROUP, VERSION};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The kind `submit` sends.
const KIND: &str = "DistributedTraining";

/// What the file held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A DistributedTraining.
    Job,
    /// A trainer config: the job's `spec.trainer`.
    TrainerConfig,
}

/// The object to send, where it came from, and the objects of the file it leaves alone.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub object: Value,
    pub source: Source,
    /// `PersistentVolumeClaim copy-checkpoints`, ...
    pub skipped: Vec<String>,
}

/// The spec fields the flags set, and the flag of each (for messages).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    pub name: Option<String>,
    pub replicas: Option<i64>,
    pub procs: Option<i64>,
    pub gpus: Option<i64>,
    pub claim: Option<String>,
    pub image: Option<String>,
}

/// Each flag and the field it sets.
pub const FLAG_FIELDS: [(&str, &str); 6] = [
    ("--name", "metadata.name"),
    ("--replicas", "spec.replicas"),
    ("--procs", "spec.procsPerReplica"),
    ("--gpus", "spec.gpusPerReplica"),
    ("--claim", "spec.checkpoint.claimName"),
    ("--image", "spec.image"),
];

/// The YAML documents of `text` (separated by `---` lines).
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("at least one");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs
}

/// The manifest of `text` (from `origin`; `stem`: the file's name without its extension,
/// which names a trainer config's job).
pub fn read(text: &str, origin: &str, stem: Option<&str>) -> Result<Manifest> {
    let mut jobs = Vec::new();
    let mut configs = Vec::new();
    let mut skipped = Vec::new();
    for doc in documents(text) {
        let content = doc
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if !content {
            continue;
        }
        let value: Value = serde_saphyr::from_str(&doc).map_err(|e| Error::Yaml {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        match value.get("kind").and_then(Value::as_str) {
            _ if value.is_null() => {}
            Some(KIND) => jobs.push(value),
            Some(kind) => skipped.push(format!(
                "{kind} {}",
                value
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            )),
            None => configs.push(value),
        }
    }
    let manifest = |object, source| Manifest {
        object,
        source,
        skipped: skipped.clone(),
    };
    let problem = |message: String| Error::Manifest {
        origin: origin.to_string(),
        message,
    };
    match (jobs.len(), configs.len()) {
        (1, 0) => Ok(manifest(jobs.remove(0), Source::Job)),
        (0, 1) => Ok(manifest(
            job_of(configs.remove(0), stem),
            Source::TrainerConfig,
        )),
        (0, 0) => Err(problem(
            "holds no DistributedTraining and no trainer config".into(),
        )),
        (j, c) => Err(problem(format!(
            "holds {j} DistributedTraining(s) and {c} trainer config(s): submit one job at a time"
        ))),
    }
}

/// A job of one pod training `config`, named after `stem`.
fn job_of(config: Value, stem: Option<&str>) -> Value {
    let mut job = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {},
        "spec": {"replicas": 1, "trainer": config},
    });
    if let Some(name) = stem.map(dns_label).filter(|n| !n.is_empty()) {
        job["metadata"]["name"] = json!(name);
    }
    job
}

/// `Multi30k_de.en` -> `multi30k-de-en`.
fn dns_label(stem: &str) -> String {
    let lowered: String = stem
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    lowered.trim_matches('-').to_string()
}

/// `object` with the fields of `overrides` set.
pub fn apply(mut object: Value, overrides: &Overrides) -> Value {
    let sets = [
        ("/metadata/name", overrides.name.clone().map(Value::from)),
        ("/spec/replicas", overrides.replicas.map(Value::from)),
        ("/spec/procsPerReplica", overrides.procs.map(Value::from)),
        ("/spec/gpusPerReplica", overrides.gpus.map(Value::from)),
        (
            "/spec/checkpoint/claimName",
            overrides.claim.clone().map(Value::from),
        ),
        ("/spec/image", overrides.image.clone().map(Value::from)),
    ];
    for (pointer, value) in sets {
        if let Some(value) = value {
            set(&mut object, pointer, value);
        }
    }
    object
}

/// Sets the value at `pointer`, creating the objects on the way.
fn set(object: &mut Value, pointer: &str, value: Value) {
    let mut at = object;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for part in &parts[..parts.len() - 1] {
        if !at.get(*part).is_some_and(Value::is_object) {
            at[*part] = json!({});
        }
        at = &mut at[*part];
    }
    at[parts[parts.len() - 1]] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/copy-dt.yaml");
    const CONFIG: &str = include_str!("../../../examples/copy.yaml");

    #[test]
    fn the_job_of_a_multi_document_file_and_what_it_leaves_to_kubectl_apply() {
        let m = read(EXAMPLE, "examples/copy-dt.yaml", Some("copy-dt")).unwrap();
        assert_eq!(m.source, Source::Job);
        assert_eq!(m.object["metadata"]["name"], "copy");
        assert_eq!(m.object["spec"]["replicas"], 2);
        assert_eq!(m.skipped, ["PersistentVolumeClaim copy-checkpoints"]);
    }

    #[test]
    fn a_trainer_config_becomes_a_one_pod_job_named_after_its_file() {
        let m = read(CONFIG, "examples/copy.yaml", Some("copy")).unwrap();
        assert_eq!(m.source, Source::TrainerConfig);
        assert_eq!(m.object["kind"], "DistributedTraining");
        assert_eq!(m.object["apiVersion"], "ferrotrain.dev/v1alpha1");
        assert_eq!(m.object["metadata"]["name"], "copy");
        assert_eq!(m.object["spec"]["replicas"], 1);
        assert_eq!(m.object["spec"]["trainer"]["task"], "copy");
        assert_eq!(dns_label("Multi30k_de.en"), "multi30k-de-en");
    }

    #[test]
    fn the_flags_set_their_fields() {
        let m = read(CONFIG, "c", None).unwrap();
        assert!(m.object["metadata"].get("name").is_none());
        let overrides = Overrides {
            name: Some("big".into()),
            replicas: Some(4),
            procs: Some(2),
            gpus: Some(2),
            claim: Some("ckpt".into()),
            image: Some("registry/trainer:1".into()),
        };
        let object = apply(m.object, &overrides);
        assert_eq!(object["metadata"]["name"], "big");
        let spec = &object["spec"];
        assert_eq!(
            (
                &spec["replicas"],
                &spec["procsPerReplica"],
                &spec["gpusPerReplica"]
            ),
            (&json!(4), &json!(2), &json!(2))
        );
        assert_eq!(spec["checkpoint"]["claimName"], "ckpt");
        assert_eq!(spec["image"], "registry/trainer:1");
        for (_, field) in FLAG_FIELDS {
            let pointer = format!("/{}", field.replace('.', "/"));
            assert!(object.pointer(&pointer).is_some(), "{field}");
        }
    }

    #[test]
    fn a_file_with_nothing_or_two_jobs_is_refused() {
        let none = read("---\n", "f", None).unwrap_err().to_string();
        assert_eq!(
            none,
            "f: holds no DistributedTraining and no trainer config"
        );
        let job = EXAMPLE.split("\n---\n").nth(1).unwrap();
        let two = format!("{job}\n---\n{job}");
        let error = read(&two, "f", None).unwrap_err().to_string();
        assert!(error.contains("2 DistributedTraining(s)"), "{error}");
        let bad = read("a: [", "f", None).unwrap_err().to_string();
        assert!(bad.starts_with("f is not YAML"), "{bad}");
    }
}
