//! The fleet bench's disruptions: a drain of the busiest nodes (cordon + the Eviction API,
//! as `kubectl drain` does) and a leader failover (SIGTERM to the leader).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ferrotrain_api::crd::Phase;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, EvictParams, Patch, PatchParams};
use serde_json::json;

use super::bench::Bench;
use super::jobs::{p50_p99_max, poll, quantile};
use super::observe::wait_holder;
use super::recovery::{
    busiest_nodes, peak_rate, replacement_latencies, running_again, stepping_again,
};
use super::report::{Row, row, say, server_row};
use super::window::Counters;

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
