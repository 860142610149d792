//! Many jobs at once: twenty 2-pod jobs created together all run to Succeeded on the first
//! attempt, none starved. A test binary of its own (scripts/e2e.sh runs it alone: it loads the
//! whole cluster).

use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTraining, Phase};
use ferrotrain_e2e::{TRAIN_WAIT, TestNamespace, copy_job};
use kube::api::ListParams;
use serde_json::json;

const JOBS: usize = 20;

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn twenty_jobs_at_once_all_succeed_on_their_first_attempt() {
    let ns = TestNamespace::create("many").await;
    let started = Instant::now();
    for i in 0..JOBS {
        // 20 steps: this is about starting and finishing jobs, not training them (at 100 steps
        // the 40 ranks' training took most of the test's five minutes on the kit's 2 cores).
        let mut spec = copy_job(2, 20, None);
        // Small requests, so that all 40 pods fit on the cluster at once: this is about the
        // operator keeping up, not about the scheduler's queue.
        spec["resources"] = json!({
            "requests": {"cpu": "25m", "memory": "128Mi"},
            "limits": {"memory": "1Gi"}
        });
        spec["trainer"]["checkpoint"]["everySteps"] = json!(20);
        ns.create_job(&format!("many-{i:02}"), spec).await;
    }
    let created = started.elapsed();
    let mut running_at: Vec<Option<Duration>> = vec![None; JOBS];
    let done = loop {
        let jobs: Vec<DistributedTraining> = ns
            .jobs()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for dt in &jobs {
            let i: usize = dt.metadata.name.as_deref().unwrap()[5..].parse().unwrap();
            let phase = dt.status.as_ref().map(|s| s.phase).unwrap_or_default();
            if running_at[i].is_none() && matches!(phase, Phase::Running | Phase::Succeeded) {
                running_at[i] = Some(started.elapsed());
            }
        }
        let succeeded = jobs
            .iter()
            .filter(|d| {
                d.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Phase::Succeeded)
            })
            .count();
        if succeeded == JOBS {
            break jobs;
        }
        let phases: Vec<String> = jobs
            .iter()
            .map(|d| {
                d.status
                    .as_ref()
                    .map(|s| s.phase.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert!(
            started.elapsed() < TRAIN_WAIT,
            "timed out after {TRAIN_WAIT:?} waiting for all {JOBS} jobs to succeed: {phases:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for dt in &done {
        let s = dt.status.as_ref().unwrap();
        assert_eq!(
            (s.attempt, s.restarts, s.succeeded_replicas),
            (0, 0, 2),
            "{}: {s:?}",
            dt.metadata.name.as_deref().unwrap()
        );
    }
    let mut seen: Vec<f64> = running_at
        .iter()
        .map(|t| t.map_or(f64::NAN, |t| t.as_secs_f64()))
        .collect();
    seen.sort_by(f64::total_cmp);
    eprintln!(
        "{JOBS} jobs created in {:.1} s; all Running or done: first {:.0} s, median {:.0} s, last {:.0} s; all Succeeded at {:.0} s",
        created.as_secs_f64(),
        seen[0],
        seen[JOBS / 2],
        seen[JOBS - 1],
        started.elapsed().as_secs_f64()
    );
}
