//! The crate's test fixtures: the copy example's job as the API server returns it, training in
//! round 1 after rank 1 was killed in round 0, and its ledger.

use ferrotrain_api::Recovery;
use ferrotrain_api::crd::DistributedTraining;
use serde_json::{Value, json};

/// The ledger of a job whose rank 1 was killed at step 303 of round 0; round 1 resumed from
/// the survivors' state and finished.
pub fn recovered_ledger() -> Recovery {
    serde_json::from_value(recovered_ledger_json()).unwrap()
}

fn recovered_ledger_json() -> Value {
    json!({
        "attempts": [
            {
                "attempt": 0,
                "startedAt": "2026-12-01T12:00:00Z",
                "runningAt": "2026-12-01T12:00:01Z",
                "firstStepAt": "2026-12-01T12:00:02Z",
                "resumedFromStep": 0,
                "lastStep": 303,
                "checkpointStep": 300,
                "end": {
                    "cause": "Failure", "reason": "Killed", "rank": 1, "nodeRank": 1,
                    "exitCode": 137, "node": "node-b",
                    "failedAt": "2026-12-01T12:00:29.950Z",
                    "detectedAt": "2026-12-01T12:00:30Z"
                },
                "lostSteps": 0,
                "productiveSeconds": 27.9,
                "worldSize": 2
            },
            {
                "attempt": 0,
                "round": 1,
                "startedAt": "2026-12-01T12:00:30Z",
                "runningAt": "2026-12-01T12:00:30Z",
                "firstStepAt": "2026-12-01T12:00:30.450Z",
                "resumedFromStep": 303,
                "healedFrom": "peers",
                "lastStep": 600,
                "end": {
                    "cause": "Succeeded", "reason": "Succeeded", "exitCode": 0,
                    "failedAt": "2026-12-01T12:00:41.200Z",
                    "detectedAt": "2026-12-01T12:00:41.200Z"
                },
                "productiveSeconds": 12.1,
                "worldSize": 2
            }
        ],
        "startedAt": "2026-12-01T12:00:00Z",
        "totalSeconds": 41.2,
        "productiveSeconds": 40.0,
        "goodputPercent": 97.1,
        "lostSteps": 0,
        "secondsByWorldSize": {"2": 40.0},
        "endsByCause": {"Failure": 1, "Succeeded": 1},
        "meanDetectSeconds": 0.05,
        "meanRecoverySeconds": 0.5
    })
}

/// The copy example (2 pods of 1 rank) at step 1450 of 3000 in round 1, its ledger's round 1
/// still running.
pub fn training_job() -> DistributedTraining {
    let mut ledger = recovered_ledger_json();
    let round_1 = &mut ledger["attempts"][1];
    round_1.as_object_mut().unwrap().remove("end");
    round_1["lastStep"] = json!(1450);
    serde_json::from_value(json!({
        "apiVersion": "ferrotrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {
            "name": "copy", "namespace": "ml",
            "creationTimestamp": "2026-12-01T11:59:55Z"
        },
        "spec": {
            "replicas": 2,
            "procsPerReplica": 1,
            "trainer": {"task": "copy", "maxSteps": 3000},
            "restartPolicy": {"maxRestarts": 5}
        },
        "status": {
            "phase": "Running",
            "attempt": 0,
            "round": 1,
            "restarts": 1,
            "replicas": 2,
            "runningReplicas": 2,
            "startTime": "2026-12-01T12:00:00Z",
            "lastFailure": {
                "attempt": 0, "nodeRank": 1, "rank": 1, "pod": "copy-0-1",
                "exitCode": 137, "node": "node-b", "reason": "Killed",
                "message": "rank 1 was killed by signal 9 (SIGKILL)",
                "lastLines": [
                    "2026-12-01T12:00:29.100000Z  INFO ferrotrain::train: step 300 loss 0.0213",
                    "2026-12-01T12:00:29.500000Z  INFO ferrotrain::checkpoint: saved step 300"
                ],
                "time": "2026-12-01T12:00:30Z"
            },
            "progress": {
                "phase": "training", "step": 1450, "totalSteps": 3000, "epoch": 1,
                "samples": 46400, "worldSize": 2, "stepsPerSecond": 35.9,
                "tokensPerSecond": 41234.0, "commFraction": 0.12, "loss": 0.0118,
                "evalLoss": 0.0031, "evalBleu": 98.2, "evalStep": 1000,
                "etaSeconds": 43.0, "eta": "43s", "round": 1,
                "updatedAt": "2026-12-01T12:01:00Z"
            },
            "recovery": ledger
        }
    }))
    .unwrap()
}

/// The same job once it succeeded.
pub fn succeeded_job() -> DistributedTraining {
    let mut dt = training_job();
    let status = dt.status.as_mut().unwrap();
    status.phase = ferrotrain_api::crd::Phase::Succeeded;
    status.completion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-12-01T12:01:37Z".parse().unwrap(),
    ));
    let progress = status.progress.as_mut().unwrap();
    progress.report.step = 3000;
    progress.report.steps_per_second = None;
    progress.report.tokens_per_second = None;
    progress.report.eta_seconds = None;
    progress.eta = None;
    status.recovery = Some(recovered_ledger());
    dt
}
