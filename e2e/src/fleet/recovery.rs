//! How the fleet recovers from a disruption (a drain, lost nodes): the busiest nodes and their
//! pods, each replacement's latency, the peak replacement rate, and when every affected job is
//! Running and stepping again.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::bench::Bench;
use super::jobs::poll;
use super::observe::sim_snapshot;

/// The `n` nodes holding the most of the bench's running pods, and those pods.
pub(super) fn busiest_nodes(b: &Bench, n: usize) -> (Vec<String>, Vec<String>) {
    b.tracker.with(|s| {
        let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
        for (name, p) in &s.pods {
            if let (Some(node), true) = (&p.node, p.running && p.job.starts_with("run-")) {
                by_node.entry(node.clone()).or_default().push(name.clone());
            }
        }
        let mut nodes: Vec<(String, Vec<String>)> = by_node.into_iter().collect();
        nodes.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        nodes.truncate(n);
        let pods = nodes.iter().flat_map(|(_, p)| p.iter().cloned()).collect();
        (nodes.into_iter().map(|(n, _)| n).collect(), pods)
    })
}

/// Seconds from `t0_ms` until each of `jobs` stepped again (the simulator's view); waits, for
/// 10 minutes at most, until every one has.
pub(super) async fn stepping_again(
    b: &Bench,
    jobs: &BTreeSet<String>,
    t0_ms: i64,
) -> Result<Vec<f64>, String> {
    poll(
        "every affected job stepping again",
        Duration::from_secs(600),
        Duration::from_millis(500),
        || async move {
            let snap = sim_snapshot(b).await.ok();
            let times: Vec<f64> = jobs
                .iter()
                .filter_map(|j| {
                    let v = snap.as_ref()?.jobs.get(&format!("{}/{j}", b.ns))?;
                    v.stepping_since_ms
                        .filter(|ms| *ms > t0_ms)
                        .map(|ms| (ms - t0_ms) as f64 / 1000.0)
                })
                .collect();
            (
                (times.len() == jobs.len()).then(|| times.clone()),
                format!("{} of {} jobs", times.len(), jobs.len()),
            )
        },
    )
    .await
}

/// Seconds from `t0` until each of `jobs` was Running again in its status; waits, for 5
/// minutes at most, until every one was.
pub(super) async fn running_again(
    b: &Bench,
    jobs: &BTreeSet<String>,
    t0: Instant,
) -> Result<Vec<f64>, String> {
    poll(
        "every affected job Running again in its status",
        Duration::from_secs(300),
        Duration::from_millis(500),
        || async move {
            let times: Vec<f64> = b.tracker.with(|s| {
                jobs.iter()
                    .filter_map(|j| {
                        s.jobs
                            .get(j)?
                            .running_since
                            .filter(|at| *at > t0)
                            .map(|at| (at - t0).as_secs_f64())
                    })
                    .collect()
            });
            (
                (times.len() == jobs.len()).then(|| times.clone()),
                format!("{} of {}", times.len(), jobs.len()),
            )
        },
    )
    .await
}

/// For each drained pod (by name), the seconds from its deletion's end (the tracker saw it
/// gone) to the first pod of its name created after that: what the operator's watch, decision
/// and create take, without the Eviction API's and the kubelet's time.
pub(super) fn replacement_latencies(b: &Bench, wanted: &BTreeSet<String>, t0: Instant) -> Vec<f64> {
    b.tracker.with(|s| {
        wanted
            .iter()
            .filter_map(|name| {
                let gone = s
                    .pod_deletes
                    .iter()
                    .filter(|(at, n)| *at > t0 && n == name)
                    .map(|(at, _)| *at)
                    .min()?;
                let added = s
                    .pod_adds
                    .iter()
                    .filter(|(at, n, _)| *at >= gone && n == name)
                    .map(|(at, _, _)| *at)
                    .min()?;
                Some((added - gone).as_secs_f64())
            })
            .collect()
    })
}

/// The most events in any one second.
pub(super) fn peak_rate(times: &[Instant]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mut best = 0;
    let mut j = 0;
    for i in 0..sorted.len() {
        while sorted[i] - sorted[j] > Duration::from_secs(1) {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best as f64
}
