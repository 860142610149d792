//! What a job leaves on its checkpoint claim, read on this machine under the claim's
//! PersistentVolume (the kit's volumes are hostPath directories here): its checkpoints, the
//! final one's model and optimizer bytes, and rank 0's step log (`train-log.jsonl`, one line
//! per step, appended to across restarts), which says at which step two runs parted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;

use crate::chaos::kit::host_path;
use crate::chaos::observe::patiently;
use crate::namespace::TestNamespace;

/// A finished job's checkpoints and step log.
#[derive(Clone, Debug, Default)]
pub struct FinalState {
    /// The job directory on this machine.
    pub dir: PathBuf,
    /// The steps of the checkpoints there (complete or not), ascending.
    pub checkpoints: Vec<u64>,
    /// The newest checkpoint's step, and its model and optimizer bytes.
    pub last: Option<u64>,
    pub model: Vec<u8>,
    pub optimizer: Vec<u8>,
    /// Each training step's lines in the step log, in order (a step trained twice has two).
    pub steps: BTreeMap<u64, Vec<StepLine>>,
    /// Where the step log goes back: (the last step before, the step it goes on from), each
    /// a resume from an earlier state than the one reached, its steps trained twice.
    pub rewinds: Vec<(u64, u64)>,
}

impl FinalState {
    /// Steps trained twice, by the step log.
    pub fn steps_twice(&self) -> u64 {
        self.rewinds
            .iter()
            .map(|(last, next)| last + 1 - next)
            .sum()
    }
}

/// A training step's line of the step log: its loss and gradient norm, as the trainer wrote
/// them (the shortest text that reads back as the same f64: equal text, equal bits).
#[derive(Clone, Debug, PartialEq)]
pub struct StepLine {
    pub loss: String,
    pub grad_norm: String,
}

/// Reads what job `job` left on claim `claim` of `ns` (before the namespace goes: the kit
/// deletes a released volume's directory).
pub async fn read(ns: &TestNamespace, job: &str, claim: &str) -> Result<FinalState, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ns.client.clone(), &ns.name);
    let bound = patiently("reading the claim", || claims.get(claim))
        .await
        .map_err(|e| format!("claim {claim}: {e}"))?;
    let volume_name = bound
        .spec
        .and_then(|s| s.volume_name)
        .ok_or(format!("claim {claim} is not bound"))?;
    let volumes: Api<PersistentVolume> = Api::all(ns.client.clone());
    let volume = patiently("reading the volume", || volumes.get(&volume_name))
        .await
        .map_err(|e| format!("volume {volume_name}: {e}"))?;
    let root = host_path(&volume).ok_or(format!("{volume_name} is not a hostPath volume"))?;
    read_dir(&root.join(job))
}

/// Reads a job directory.
pub fn read_dir(dir: &Path) -> Result<FinalState, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut checkpoints: Vec<u64> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let digits = name.strip_prefix("step-")?;
            (digits.len() >= 8 && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())?
        })
        .collect();
    checkpoints.sort_unstable();
    let mut state = FinalState {
        dir: dir.to_path_buf(),
        checkpoints: checkpoints.clone(),
        ..FinalState::default()
    };
    if let Some(&last) = checkpoints.last() {
        let step_dir = dir.join(format!("step-{last:08}"));
        let read = |f: &str| {
            std::fs::read(step_dir.join(f)).map_err(|e| format!("{}/{f}: {e}", step_dir.display()))
        };
        state.model = read("model.safetensors")?;
        state.optimizer = read("optimizer.safetensors")?;
        state.last = Some(last);
    }
    let log = std::fs::read_to_string(dir.join("train-log.jsonl")).unwrap_or_default();
    state.steps = step_lines(&log);
    state.rewinds = rewinds(&log);
    Ok(state)
}

/// Where a step log goes back to an earlier step: (the step before, the step after).
pub fn rewinds(log: &str) -> Vec<(u64, u64)> {
    let mut found = Vec::new();
    let mut last: Option<u64> = None;
    for line in log.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(step), true) = (value["step"].as_u64(), value.get("loss").is_some()) else {
            continue;
        };
        if let Some(before) = last
            && step <= before
        {
            found.push((before, step));
        }
        last = Some(step);
    }
    found
}

/// The training steps' lines of a step log (evaluations and damaged lines left out).
pub fn step_lines(log: &str) -> BTreeMap<u64, Vec<StepLine>> {
    let mut steps: BTreeMap<u64, Vec<StepLine>> = BTreeMap::new();
    for line in log.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(step), Some(loss)) = (value["step"].as_u64(), value.get("loss")) else {
            continue;
        };
        steps.entry(step).or_default().push(StepLine {
            loss: loss.to_string(),
            grad_norm: value["gradNorm"].to_string(),
        });
    }
    steps
}

/// Where two runs' step logs first part: the first step of `run` (any of its lines, a step
/// trained again included) whose loss or gradient norm is not the reference's, with both.
pub fn first_divergence(
    reference: &FinalState,
    run: &FinalState,
) -> Option<(u64, Option<StepLine>, StepLine)> {
    for (step, lines) in &run.steps {
        let expected = reference.steps.get(step).and_then(|l| l.last());
        for line in lines {
            if expected != Some(line) {
                return Some((*step, expected.cloned(), line.clone()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_log_says_where_two_runs_part() {
        let reference = FinalState {
            steps: step_lines(
                "{\"step\":1,\"loss\":4.5,\"gradNorm\":3.0}\n\
                 {\"step\":2,\"loss\":4.25,\"gradNorm\":2.5}\n\
                 {\"evalLoss\":4.0,\"step\":2}\n\
                 {\"step\":3,\"loss\":4.0,\"gradNorm\":2.0}\n",
            ),
            ..FinalState::default()
        };
        assert_eq!(reference.steps.len(), 3);
        // Step 2 trained twice, the same both times: no parting.
        let same = FinalState {
            steps: step_lines(
                "{\"step\":1,\"loss\":4.5,\"gradNorm\":3.0}\n\
                 {\"step\":2,\"loss\":4.25,\"gradNorm\":2.5}\n\
                 {\"step\":2,\"loss\":4.25,\"gradNorm\":2.5}\n\
                 {\"step\":3,\"loss\":4.0,\"gradNorm\":2.0}\n",
            ),
            ..FinalState::default()
        };
        assert_eq!(first_divergence(&reference, &same), None);
        let parted = FinalState {
            steps: step_lines(
                "{\"step\":1,\"loss\":4.5,\"gradNorm\":3.0}\n\
                 {\"step\":2,\"loss\":4.25,\"gradNorm\":2.5}\n\
                 {\"step\":2,\"loss\":4.250000000000001,\"gradNorm\":2.5}\n",
            ),
            ..FinalState::default()
        };
        assert_eq!(
            rewinds(
                "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":1}\n{\"step\":3,\"loss\":1}\n{\"step\":2,\"loss\":1}\n{\"evalLoss\":1,\"step\":2}\n{\"step\":3,\"loss\":1}\n"
            ),
            vec![(3, 2)]
        );
        let (step, expected, got) = first_divergence(&reference, &parted).unwrap();
        assert_eq!(
            (step, expected.unwrap().loss, got.loss),
            (2, "4.25".into(), "4.250000000000001".into())
        );
    }

    #[test]
    fn a_job_directory_names_its_checkpoints_and_reads_the_newest() {
        let dir = std::env::temp_dir().join(format!("chaos-final-{}", std::process::id()));
        for step in [50, 100] {
            let d = dir.join(format!("step-{step:08}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("model.safetensors"), format!("model {step}")).unwrap();
            std::fs::write(d.join("optimizer.safetensors"), format!("opt {step}")).unwrap();
        }
        std::fs::create_dir_all(dir.join(".tmp-step-00000150-a0-1")).unwrap();
        let state = read_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((state.checkpoints, state.last), (vec![50, 100], Some(100)));
        assert_eq!(state.model, b"model 100");
    }
}
