//! The troubleshooting pages' job in the states their `Look` blocks are about: a job `mt` in
//! the test's namespace, put in the state a block's `<!-- state: NAME -->` names (the job of
//! the previous state deleted first, its pods gone; a block of the state the job is in already
//! looks at it as it is), each cheap for the test cluster to produce:
//!
//! | state | the job |
//! |---|---|
//! | `restarted-in-place` | the copy job training, rank 1's trainer killed, round 1 training |
//! | `unschedulable` | a pod asks for 1000 CPUs: `Running False Unschedulable` |
//! | `image-pull` | `spec.image` on a registry that does not exist: `ImagePullBackOff` |
//! | `invalid-spec` | a translation job without training files: Failed `InvalidSpec` |
//! | `missing-data` | training files that do not exist: the ranks exit 3, Failed `PermanentFailure` |
//! | `store-secret-missing` | a bucket whose Secret lacks a key: `Created False StoreSecretMissing` |
//! | `deadline-exceeded` | `activeDeadlineSeconds: 5`: Failed `DeadlineExceeded` |
//! | `suspended` | the copy job trained to its first checkpoint, then suspended |

use std::sync::Mutex;
use std::time::Duration;

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::page::States;
use crate::jobs::{copy_job, missing_data_job};
use crate::namespace::TestNamespace;
use crate::pods::pods_of;
use crate::processes::signal_local_rank;
use crate::wait::{TRAIN_WAIT, WAIT, wait_for, wait_status};

/// The job's name on the troubleshooting pages.
pub const JOB: &str = "mt";

/// The states a page may name (their table above).
pub const STATES: [&str; 8] = [
    "restarted-in-place",
    "unschedulable",
    "image-pull",
    "invalid-spec",
    "missing-data",
    "store-secret-missing",
    "deadline-exceeded",
    "suspended",
];

/// The troubleshooting pages' job, in the test's namespace, and the state it was put in last.
pub struct TroubledJob<'a> {
    ns: &'a TestNamespace,
    state: Mutex<Option<String>>,
}

impl TroubledJob<'_> {
    pub fn new(ns: &TestNamespace) -> TroubledJob<'_> {
        TroubledJob {
            ns,
            state: Mutex::new(None),
        }
    }
}

impl States for TroubledJob<'_> {
    async fn enter(&self, state: &str) {
        if self.state.lock().unwrap().as_deref() == Some(state) {
            return;
        }
        self.delete().await;
        let spec = spec_of(state);
        if state == "store-secret-missing" {
            self.secret_with_one_key().await;
        }
        self.ns.create_job(JOB, spec).await;
        self.reach(state).await;
        *self.state.lock().unwrap() = Some(state.to_string());
    }
}

/// The copy job, without its elastic world size (its pods are placed as a gang), running
/// long enough to be looked at.
fn gang_job() -> Value {
    let mut spec = copy_job(2, 1_000_000, None);
    spec.as_object_mut().unwrap().remove("elastic");
    spec
}

/// The job's spec in `state`.
fn spec_of(state: &str) -> Value {
    let mut spec = gang_job();
    match state {
        "restarted-in-place" | "suspended" => {}
        "unschedulable" => spec["resources"]["requests"]["cpu"] = json!("1000"),
        "image-pull" => spec["image"] = json!("registry.invalid/ferrotrain/trainer:0.2.0"),
        "invalid-spec" => {
            let trainer = spec["trainer"].as_object_mut().unwrap();
            trainer.remove("copy");
            trainer.insert("task".into(), json!("translation"));
            // Sentences that fit the model's 32 positions: the missing files are the one problem.
            trainer.insert("data".into(), json!({"maxSentenceTokens": 30}));
        }
        "missing-data" => spec = missing_data_job(),
        "store-secret-missing" => {
            spec["trainer"]["checkpoint"]["store"] = json!({
                "url": "s3://ml-checkpoints/team-a",
                "endpoint": "http://minio.storage.svc:9000"
            });
            spec["checkpoint"]["storeSecretName"] = json!("creds");
        }
        "deadline-exceeded" => spec["activeDeadlineSeconds"] = json!(5),
        other => panic!("no state `{other}` (e2e/src/pages/states.rs: {STATES:?})"),
    }
    spec
}

/// Whether the job's condition `type_` has `reason`.
fn has(status: &DistributedTrainingStatus, type_: &str, reason: &str) -> bool {
    status.condition(type_).is_some_and(|c| c.reason == reason)
}

impl TroubledJob<'_> {
    /// Deletes the job of the previous state, if any, and waits until it and its pods are gone.
    async fn delete(&self) {
        let jobs = self.ns.jobs();
        let _ = jobs.delete(JOB, &DeleteParams::foreground()).await;
        let pods = self.ns.pods();
        wait_for("the previous job and its pods gone", WAIT, || async {
            let job = jobs.get_opt(JOB).await.ok().flatten();
            let left = pods_of(&pods, JOB).await.len();
            let gone = job.is_none() && left == 0;
            (
                gone.then_some(()),
                format!("job {}, {left} pods", job.is_some()),
            )
        })
        .await;
    }

    /// The store's Secret `creds` with its access key but not its secret key.
    async fn secret_with_one_key(&self) {
        let secrets: Api<Secret> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let _ = secrets.delete("creds", &DeleteParams::default()).await;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "creds"},
            "stringData": {"AWS_ACCESS_KEY_ID": "team-a"}
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating the Secret creds");
    }

    /// Waits until the job is in `state`.
    async fn reach(&self, state: &str) {
        type Done = fn(&DistributedTrainingStatus) -> bool;
        let (limit, done): (Duration, Done) = match state {
            "restarted-in-place" => return self.restarted_in_place().await,
            "suspended" => return self.suspended().await,
            "unschedulable" => (WAIT, |s| has(s, "Running", "Unschedulable")),
            "image-pull" => (WAIT, |s| has(s, "Running", "ImagePullBackOff")),
            "invalid-spec" => (WAIT, |s| has(s, "Failed", "InvalidSpec")),
            "missing-data" => (TRAIN_WAIT, |s| has(s, "Failed", "PermanentFailure")),
            "store-secret-missing" => (WAIT, |s| has(s, "Created", "StoreSecretMissing")),
            "deadline-exceeded" => (TRAIN_WAIT, |s| s.phase == Phase::Failed),
            other => panic!("no state `{other}`"),
        };
        wait_status(&self.ns.jobs(), JOB, state, limit, done).await;
    }

    /// Trains to a first checkpoint; rank 1's trainer killed; round 1 trains.
    async fn restarted_in_place(&self) {
        let jobs = self.ns.jobs();
        self.first_checkpoint().await;
        signal_local_rank(&self.ns.pods(), "mt-0-1", None, "KILL").await;
        // Round 1 trains, and rank 0 has sampled the gang's resources since (every
        // logEverySteps): the pages read them.
        wait_status(&jobs, JOB, "round 1 training", TRAIN_WAIT, |s| {
            s.round == 1
                && s.last_failure.is_some()
                && s.progress
                    .as_ref()
                    .is_some_and(|p| p.report.gang_resources.is_some())
                && s.recovery
                    .as_ref()
                    .and_then(|r| r.attempts.last())
                    .is_some_and(|a| a.first_step_at.is_some())
        })
        .await;
    }

    /// Trains to a first checkpoint, then suspended: its pods gone.
    async fn suspended(&self) {
        self.first_checkpoint().await;
        let patch = json!({"spec": {"suspend": true}});
        self.ns
            .jobs()
            .patch(JOB, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("suspending the job");
        wait_status(&self.ns.jobs(), JOB, "Suspended", WAIT, |s| {
            s.phase == Phase::Suspended
        })
        .await;
        let pods = self.ns.pods();
        wait_for("its pods gone", WAIT, || async {
            let left = pods_of(&pods, JOB).await.len();
            ((left == 0).then_some(()), format!("{left} pods"))
        })
        .await;
    }

    async fn first_checkpoint(&self) {
        wait_status(
            &self.ns.jobs(),
            JOB,
            "a first checkpoint",
            TRAIN_WAIT,
            |s| {
                s.phase == Phase::Running
                    && s.progress
                        .as_ref()
                        .is_some_and(|p| p.report.last_checkpoint.is_some())
            },
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_a_job_the_schema_takes() {
        for state in STATES {
            let spec = spec_of(state);
            crate::jobs::distributed_training(JOB, "ns", spec);
        }
        let unschedulable = spec_of("unschedulable");
        assert!(unschedulable.get("elastic").is_none());
    }
}
