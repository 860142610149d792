//! The fleet bench's disruptions: a drain of the busiest nodes (cordon + the Eviction API,
//! as `kubectl drain` does) and a leader failover (SIGTERM to the leader).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ferrotrain_api::crd::Phase;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, EvictParams, Patch, PatchParams};
use serde_json::json;

use super::bench::Bench;
use super::jobs::{p50_p99_max, poll, quantile};
use super::phases::{Row, row, say, server_row, sim_snapshot, wait_holder};
use super::window::Counters;

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

async fn cordon(b: &Bench, nodes: &[String], on: bool) {
    let api: Api<Node> = Api::all(b.client.clone());
    let body = json!({"spec": {"unschedulable": on}});
    futures::stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            let body = body.clone();
            async move {
                api.patch(n, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .is_ok()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<bool>>()
        .await;
}

pub async fn drain(b: &mut Bench, rows: &mut Vec<Row>) -> Result<(), String> {
    let (nodes, pods) = busiest_nodes(b, b.settings.drain_nodes);
    let jobs: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.rsplitn(3, '-').nth(2).map(str::to_string))
        .collect();
    say(
        b,
        &format!(
            "drain: {} nodes, {} pods of {} jobs",
            nodes.len(),
            pods.len(),
            jobs.len()
        ),
    );
    let before = Counters::read(b).await?;
    let t0 = Instant::now();
    let t0_ms = Timestamp::now().as_millisecond();
    cordon(b, &nodes, true).await;
    let api: Api<Pod> = Api::namespaced(b.client.clone(), &b.ns);
    let evicted: Vec<bool> = futures::stream::iter(&pods)
        .map(|p| {
            let api = api.clone();
            async move { api.evict(p, &EvictParams::default()).await.is_ok() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let evict_seconds = t0.elapsed().as_secs_f64();
    let evicted = evicted.iter().filter(|e| **e).count();
    let wanted: BTreeSet<String> = pods.iter().cloned().collect();
    let (b, wanted, jobs): (&Bench, &BTreeSet<String>, &BTreeSet<String>) = (b, &wanted, &jobs);
    let replaced = poll(
        "every drained pod replaced",
        Duration::from_secs(600),
        Duration::from_millis(200),
        || async move {
            let adds: Vec<Instant> = b.tracker.with(|s| {
                s.pod_adds
                    .iter()
                    .filter(|(at, name, _)| *at > t0 && wanted.contains(name))
                    .map(|(at, _, _)| *at)
                    .collect()
            });
            (
                (adds.len() >= wanted.len()).then(|| adds.clone()),
                format!("{} of {}", adds.len(), wanted.len()),
            )
        },
    )
    .await?;
    let replacing = before.to(&Counters::read(b).await?);
    let reaction = replacement_latencies(b, wanted, t0);
    let stepping = stepping_again(b, jobs, t0_ms).await?;
    let running_again = running_again(b, jobs, t0).await?;
    cordon(b, &nodes, false).await;
    let at = |t: &Instant| (*t - t0).as_secs_f64();
    let first = replaced.iter().min().map_or(0.0, at);
    let last = replaced.iter().max().map_or(0.0, at);
    let n = replaced.len() as f64;
    rows.push(row(
        format!(
            "drain of {} nodes: {evicted} pods of {} jobs evicted (cordon + Eviction API; \
             the hollow kubelet stops each 1 s later)",
            nodes.len(),
            jobs.len()
        ),
        format!(
            "evicted in {evict_seconds:.1} s; replacements created {first:.1}-{last:.1} s \
             after: {:.0} pods/s from the eviction's start, {:.0} pods/s first to last, \
             peak {:.0} in a second",
            n / last.max(1e-3),
            n / (last - first).max(1e-3),
            peak_rate(&replaced)
        ),
        ">= 300 pods/s",
    ));
    rows.push(row(
        format!(
            "drain: a pod gone from the API -> its replacement created (the operator's part), {} pods: p50 / p99 / max",
            reaction.len()
        ),
        p50_p99_max(&reaction, 2),
        "",
    ));
    rows.push(server_row(
        "the drain, until every pod was replaced",
        &replacing,
    ));
    rows.push(row(
        "drain: every affected job steps again (simulator) / is Running in its status: p50 / max",
        format!(
            "{:.1} / {:.1} s; {:.1} / {:.1} s",
            quantile(&stepping, 0.5),
            quantile(&stepping, 1.0),
            quantile(&running_again, 0.5),
            quantile(&running_again, 1.0)
        ),
        "",
    ));
    Ok(())
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

pub async fn failover(b: &mut Bench, rows: &mut Vec<Row>) -> Result<(), String> {
    say(b, "failover: SIGTERM to the leader");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let t0 = Instant::now();
    let leader = b.operator("fleet-a").ok_or("no fleet-a")?;
    leader.proc.terminate();
    let held = wait_holder(b, "fleet-b", Duration::from_secs(120)).await?;
    let stepping: BTreeSet<String> = b.tracker.with(|s| {
        s.jobs
            .iter()
            // The silent job's status may have nothing new to write.
            .filter(|(n, j)| n.starts_with("run-") && j.phase == Phase::Running)
            .map(|(n, _)| n.clone())
            .collect()
    });
    let (view, stepping): (&Bench, &BTreeSet<String>) = (&*b, &stepping);
    let first = poll(
        "the new leader's first status write",
        Duration::from_secs(180),
        Duration::from_millis(20),
        || async move {
            let at = view.tracker.with(|s| {
                s.job_writes
                    .iter()
                    .find(|(at, _)| *at > held)
                    .map(|(at, _)| *at)
            });
            (at, "none yet".to_string())
        },
    )
    .await?;
    let all = poll(
        "the new leader writing every running job",
        Duration::from_secs(300),
        Duration::from_millis(200),
        || async move {
            let (written, last) = view.tracker.with(|s| {
                let mut seen = BTreeSet::new();
                let mut last = held;
                for (at, job) in s.job_writes.iter().filter(|(at, _)| *at > held) {
                    if stepping.contains(job) && seen.insert(job.clone()) {
                        last = *at;
                    }
                }
                (seen.len(), last)
            });
            (
                (written >= stepping.len()).then_some(last),
                format!("{written} of {}", stepping.len()),
            )
        },
    )
    .await?;
    let exited = b
        .operator("fleet-a")
        .is_some_and(|o| o.proc.wait_exit(Duration::from_secs(30)));
    let secs = |at: Instant| (at - t0).as_secs_f64();
    rows.push(row(
        format!("failover with {} running jobs: SIGTERM -> standby holds the Lease / its first status write", stepping.len()),
        format!("{:.2} s / {:.2} s", secs(held), secs(first)),
        "< 5 s",
    ));
    rows.push(row(
        "failover: SIGTERM -> the new leader has written every running job's status",
        format!("{:.1} s (old leader exited: {exited})", secs(all)),
        "",
    ));
    Ok(())
}
