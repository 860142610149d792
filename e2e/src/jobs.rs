//! The jobs the tests run: the real trainer on the synthetic copy task, as
//! examples/copy-dt.yaml ships it (small enough for a laptop's kind cluster), and the jobs
//! that fail on purpose; the DistributedTraining object around a spec, and the printer
//! columns' paths into it.

use ferrotrain_api::crd::DistributedTraining;
use serde_json::{Value, json};

/// `spec.trainer.checkpoint.everySteps` of the test jobs: the most steps a resume may lose.
pub const CHECKPOINT_EVERY: u64 = 50;

/// The trainer image of the test jobs, when $FERROTRAIN_E2E_IMAGE names one.
pub fn trainer_image() -> Option<String> {
    std::env::var("FERROTRAIN_E2E_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
}

/// The image of the spec.pytorch jobs: $FERROTRAIN_E2E_PYTORCH_IMAGE, which scripts/e2e.sh
/// builds and loads (`ferrotrain/pytorch:e2e-<digest of what goes into it>`).
pub fn pytorch_image() -> String {
    std::env::var("FERROTRAIN_E2E_PYTORCH_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .expect(
            "set FERROTRAIN_E2E_PYTORCH_IMAGE to a ferrotrain/pytorch image the nodes hold \
             (scripts/e2e.sh builds and loads one)",
        )
}

/// The spec of examples/pytorch-dt.yaml's job, as users get it (its gpt.py on 2 pods of one
/// rank, gloo on the CPU, its resources, restart policy and timeouts), in
/// [`pytorch_image`], for `steps` steps. Tests change only what they are about.
pub fn pytorch_job(steps: u64) -> Value {
    pytorch_spec(&pytorch_image(), steps)
}

fn pytorch_spec(image: &str, steps: u64) -> Value {
    let mut spec = spec_of(include_str!("../../examples/pytorch-dt.yaml"));
    spec["image"] = json!(image);
    let command = spec["pytorch"]["command"]
        .as_array_mut()
        .expect("spec.pytorch.command");
    let at = command
        .iter()
        .position(|w| w.as_str().is_some_and(|w| w.starts_with("--steps=")))
        .expect("the example names its --steps");
    command[at] = json!(format!("--steps={steps}"));
    spec
}

/// A DistributedTraining object.
pub fn distributed_training(name: &str, ns: &str, spec: Value) -> DistributedTraining {
    serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap_or_else(|e| panic!("not a valid DistributedTraining spec: {e}"))
}

/// The spec of examples/copy-dt.yaml's job, as users get it: the copy task on CPU pods of one
/// rank each (25-60 steps/s with one thread per rank on this project's 2-core machine), with
/// the example's checkpoints ([`CHECKPOINT_EVERY`]), restart policy, elastic world size,
/// timeouts and the Kubernetes defaults it leaves alone (the pods' termination grace), on
/// `replicas` pods, for `max_steps`, its checkpoints on `claim` (when given; else the pod's
/// own disk). Tests change only what they are about.
pub fn copy_job(replicas: i32, max_steps: u64, claim: Option<&str>) -> Value {
    let mut spec = example_spec();
    spec["replicas"] = json!(replicas);
    spec["trainer"]["maxSteps"] = json!(max_steps);
    spec["checkpoint"] = json!({});
    if let Some(claim) = claim {
        spec["checkpoint"]["claimName"] = json!(claim);
    }
    if let Some(image) = trainer_image() {
        spec["image"] = json!(image);
    }
    spec
}

/// The spec of the DistributedTraining in examples/copy-dt.yaml.
fn example_spec() -> Value {
    spec_of(include_str!("../../examples/copy-dt.yaml"))
}

/// The spec of the DistributedTraining in an example manifest's `text`.
fn spec_of(text: &str) -> Value {
    let job = text
        .split("\n---\n")
        .find(|doc| doc.contains("kind: DistributedTraining"))
        .expect("the example has a DistributedTraining");
    let object: Value = serde_saphyr::from_str(job).expect("the example parses");
    object["spec"].clone()
}

/// A copy job the schema and the operator accept but the trainer refuses at start with exit
/// code 2 (invalid config): `device: cuda` on CPU pods.
pub fn config_error_job() -> Value {
    let mut spec = copy_job(2, 100, None);
    spec["trainer"]["device"] = json!("cuda");
    spec
}

/// A translation job whose training files do not exist: the trainer exits 3 (invalid data)
/// before the rendezvous, naming `data.train.source`.
pub fn missing_data_job() -> Value {
    let mut spec = copy_job(2, 100, None);
    spec["trainer"]["task"] = json!("translation");
    spec["trainer"]["data"] = json!({
        "train": {"source": "missing/train.en", "target": "missing/train.de"},
        // Sentences must fit the model's 32 positions.
        "maxSentenceTokens": 30
    });
    spec
}

/// The value at a printer column's JSONPath (`.status.progress.step`) of the object.
pub fn at_json_path<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(object, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_jobs_are_the_example_as_shipped_but_for_their_length_and_claim() {
        let spec = copy_job(2, 123, Some("claim"));
        let mut example = example_spec();
        example["trainer"]["maxSteps"] = json!(123);
        example["checkpoint"] = json!({"claimName": "claim"});
        if let Some(image) = trainer_image() {
            example["image"] = json!(image);
        }
        assert_eq!(spec, example);
        // No tuned grace, backoff or heartbeat: what users get.
        assert!(spec.get("podTemplate").is_none(), "{spec}");
        assert_eq!(
            spec["restartPolicy"],
            json!({"maxRestarts": 5, "backoffSeconds": 5})
        );
    }

    /// The jobs the tests run get past the schema's types and the trainer's own validation
    /// (which the operator applies before creating pods): the config-error tests must fail
    /// in the trainer, not earlier.
    #[test]
    fn the_test_jobs_pass_the_trainers_validation() {
        let plain = copy_job(2, 2000, Some("claim"));
        for spec in [plain, config_error_job(), missing_data_job()] {
            let dt = distributed_training("job", "ns", spec.clone());
            let config = dt.spec.trainer.clone().expect("a trainer config");
            assert_eq!(config.validate(), Vec::new(), "{spec}");
            assert_eq!(config.checkpoint.every_steps, CHECKPOINT_EVERY);
        }
    }

    #[test]
    fn the_pytorch_job_is_the_example_as_shipped_but_for_its_length_and_image() {
        let spec = pytorch_spec("ferrotrain/pytorch:t", 77);
        let mut example = spec_of(include_str!("../../examples/pytorch-dt.yaml"));
        let steps = example["pytorch"]["command"]
            .as_array()
            .unwrap()
            .iter()
            .position(|w| w == "--steps=1200")
            .expect("the example's --steps");
        example["pytorch"]["command"][steps] = json!("--steps=77");
        example["image"] = json!("ferrotrain/pytorch:t");
        assert_eq!(spec, example);
        let dt = distributed_training("gpt", "ns", spec);
        assert_eq!(
            dt.spec.pytorch.expect("spec.pytorch").command[..2],
            ["python3", "/opt/ferrotrain/examples/gpt.py"]
        );
    }

    #[test]
    fn printer_column_paths_resolve_only_when_set() {
        let object =
            json!({"status": {"phase": "Running", "restarts": 0, "progress": {"step": 5}}});
        assert_eq!(
            at_json_path(&object, ".status.phase"),
            Some(&json!("Running"))
        );
        assert_eq!(at_json_path(&object, ".status.restarts"), Some(&json!(0)));
        assert_eq!(
            at_json_path(&object, ".status.progress.step"),
            Some(&json!(5))
        );
        assert_eq!(at_json_path(&object, ".status.progress.loss"), None);
        assert_eq!(
            at_json_path(
                &json!({"status": {"progress": {"loss": null}}}),
                ".status.progress.loss"
            ),
            None
        );
    }
}
