//! The jobs a fleet bench (or the hollow-node test) runs on hollow nodes: gangs of GPU pods
//! that select the simulator's nodes and tolerate their taint, steered by the hollow
//! annotations; created many at a time.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::hollow::{ANNOTATION_STEPS_PER_SECOND, ANNOTATION_TOTAL_STEPS, HOLLOW_LABEL};
use crate::jobs::{copy_job, distributed_training};

/// A job of `pods` pods of `gpus` GPUs each (one rank per GPU) on the hollow nodes of
/// simulator `sim`, stepping `steps_per_second`, finishing at `total_steps`; `annotations`
/// go on its pods too (hollow.ferrotrain.dev/progress, ...).
pub fn hollow_job(
    sim: &str,
    pods: i32,
    gpus: i32,
    steps_per_second: f64,
    total_steps: u64,
    annotations: Value,
) -> Value {
    let mut spec = copy_job(pods, total_steps, None);
    // A fixed gang (the example is elastic): the simulator steps only while every pod runs.
    spec.as_object_mut().expect("a spec").remove("elastic");
    spec["gpusPerReplica"] = json!(gpus);
    spec["procsPerReplica"] = json!(gpus.max(1));
    spec["image"] = json!("ferrotrain/trainer:hollow");
    spec["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "256Mi"}
    });
    let mut all = json!({
        ANNOTATION_STEPS_PER_SECOND: steps_per_second.to_string(),
        ANNOTATION_TOTAL_STEPS: total_steps.to_string()
    });
    all.as_object_mut()
        .expect("an object")
        .extend(annotations.as_object().cloned().unwrap_or_default());
    spec["podTemplate"] = json!({
        "terminationGracePeriodSeconds": 5,
        "nodeSelector": {HOLLOW_LABEL: sim},
        "tolerations": [{"key": HOLLOW_LABEL, "operator": "Equal", "value": sim, "effect": "NoSchedule"}],
        "annotations": all
    });
    // The example's backoff, as users get it; restarts enough for every disruption a bench
    // plays.
    spec["restartPolicy"]["maxRestarts"] = json!(1000);
    spec["stallTimeoutSeconds"] = json!(3600);
    spec
}

/// Creates jobs `names` with `spec`, `concurrency` requests at a time; the time each create
/// was answered (None: it failed, with the error printed once).
pub async fn create_many(
    api: &Api<ferrotrain_api::crd::DistributedTraining>,
    ns: &str,
    names: Vec<String>,
    spec: &Value,
    concurrency: usize,
) -> Vec<(String, Option<Instant>)> {
    futures::stream::iter(names)
        .map(|name| {
            let dt = distributed_training(&name, ns, spec.clone());
            async move {
                match api.create(&PostParams::default(), &dt).await {
                    Ok(_) => (name, Some(Instant::now())),
                    Err(e) => {
                        eprintln!("creating job {name}: {e}");
                        (name, None)
                    }
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// The q-quantile (nearest rank) of `values`; NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// "p50 / p99 / max s" of `values`, with `decimals` digits.
pub fn p50_p99_max(values: &[f64], decimals: usize) -> String {
    let [p50, p99, max] = [0.5, 0.99, 1.0].map(|q| quantile(values, q));
    format!("{p50:.decimals$} / {p99:.decimals$} / {max:.decimals$} s")
}

/// Seconds since `t`.
pub fn since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Polls `check` every `every` until it returns Some or `limit` passes (Err with the last
/// observation).
pub async fn poll<T, F, Fut>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (Option<T>, String)>,
{
    let started = Instant::now();
    loop {
        let (found, seen) = check().await;
        if let Some(v) = found {
            return Ok(v);
        }
        if started.elapsed() > limit {
            return Err(format!(
                "timed out after {limit:?} waiting for {what}; last: {seen}"
            ));
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hollow_job_is_a_valid_gpu_gang_for_the_simulators_nodes() {
        let spec = hollow_job(
            "fleet",
            8,
            1,
            2.0,
            100,
            json!({"hollow.ferrotrain.dev/progress": "silent"}),
        );
        let dt = distributed_training("j", "ns", spec.clone());
        assert_eq!((dt.spec.replicas, dt.spec.gpus_per_replica), (8, 1));
        let config = dt.spec.trainer.clone().unwrap();
        assert_eq!(config.validate(), Vec::new());
        let annotations = &spec["podTemplate"]["annotations"];
        assert_eq!(annotations[ANNOTATION_TOTAL_STEPS], "100");
        assert_eq!(annotations["hollow.ferrotrain.dev/progress"], "silent");
        assert_eq!(spec["podTemplate"]["nodeSelector"][HOLLOW_LABEL], "fleet");
        assert_eq!(dt.spec.min_replicas(), 8, "a fixed gang");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(p50_p99_max(&v, 2), "50.00 / 99.00 / 100.00 s");
    }
}
