//! The fleet bench's lost nodes: the busiest nodes report NotReady at once (as after a rack's
//! switch or power fails). After its node-lost grace the operator force-deletes their pods and
//! creates the replacements itself, so this measures the operator's own replacement rate; a
//! drain's is bound by the Eviction API's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;

use super::bench::Bench;
use super::jobs::{p50_p99_max, poll, quantile};
use super::metrics::http_get;
use super::observe::{hollow_nodes, ready};
use super::recovery::{
    busiest_nodes, peak_rate, replacement_latencies, running_again, stepping_again,
};
use super::report::{Row, row, say, server_row};
use super::window::Counters;
use crate::hollow::HOLLOW_LABEL;

/// What one lost-nodes run saw.
struct Lost {
    nodes: Vec<String>,
    pods: BTreeSet<String>,
    jobs: BTreeSet<String>,
    t0: Instant,
    /// Seconds until the API showed every node NotReady, and until the first force-delete.
    not_ready: f64,
    first_delete: f64,
    /// Pods of the affected jobs created after `t0`.
    created: Vec<Instant>,
    /// Jobs restarted whole (a new attempt: their node 0's pod was lost), not in place.
    restarted: usize,
}

pub async fn nodes_lost(b: &mut Bench, rows: &mut Vec<Row>) -> Result<(), String> {
    if b.settings.lost_nodes == 0 {
        return Ok(());
    }
    let (nodes, pods) = busiest_nodes(b, b.settings.lost_nodes);
    let (pods, jobs, attempts) = b.tracker.with(|s| {
        let jobs: BTreeSet<String> = pods
            .iter()
            .filter_map(|p| s.pods.get(p))
            .map(|p| p.job.clone())
            .collect();
        let attempts: BTreeMap<String, i32> = jobs
            .iter()
            .map(|j| (j.clone(), s.jobs.get(j).map_or(0, |v| v.attempt)))
            .collect();
        (pods.into_iter().collect::<BTreeSet<_>>(), jobs, attempts)
    });
    say(
        b,
        &format!(
            "nodes lost: {} nodes NotReady at once, {} pods of {} jobs",
            nodes.len(),
            pods.len(),
            jobs.len()
        ),
    );
    let (t0, t0_ms) = (Instant::now(), Timestamp::now().as_millisecond());
    tell_nodes(b, "not-ready", &nodes).await?;
    let not_ready = all_not_ready(b, &nodes).await?;
    // The operator waits out its grace; the window starts at its first force-delete.
    let first_delete = first_delete(b, &pods, t0).await?;
    let before = Counters::read(b).await?;
    let stepping = stepping_again(b, &jobs, t0_ms).await?;
    let replacing = before.to(&Counters::read(b).await?);
    let running = running_again(b, &jobs, t0).await?;
    let reaction = replacement_latencies(b, &pods, t0);
    tell_nodes(b, "ready", &nodes).await?;
    let (created, restarted) = b.tracker.with(|s| {
        let created = s
            .pod_adds
            .iter()
            .filter(|(at, _, job)| *at > t0 && jobs.contains(job))
            .map(|(at, _, _)| *at)
            .collect();
        let restarted = attempts
            .iter()
            .filter(|(j, a)| s.jobs.get(*j).is_some_and(|v| v.attempt > **a))
            .count();
        (created, restarted)
    });
    let lost = Lost {
        nodes,
        pods,
        jobs,
        t0,
        not_ready,
        first_delete,
        created,
        restarted,
    };
    rows.extend(lost_rows(&lost, &reaction, &stepping, &running));
    rows.push(server_row(
        "nodes lost: from the first force-delete until every job stepped again",
        &replacing,
    ));
    Ok(())
}

fn lost_rows(l: &Lost, reaction: &[f64], stepping: &[f64], running: &[f64]) -> Vec<Row> {
    let at = |t: &Instant| (*t - l.t0).as_secs_f64();
    let first = l.created.iter().min().map_or(0.0, at);
    let last = l.created.iter().max().map_or(0.0, at);
    let n = l.created.len();
    vec![
        row(
            format!(
                "nodes lost: {} nodes report NotReady at once, {} pods of {} jobs on them (the \
                 operator replaces a pod whose node is NotReady for its \
                 --node-lost-grace-seconds)",
                l.nodes.len(),
                l.pods.len(),
                l.jobs.len()
            ),
            format!(
                "NotReady in the API after {:.1} s, first force-delete {:.1} s; {n} pods \
                 created {first:.1}-{last:.1} s after: {:.0} pods/s first to last, peak {:.0} \
                 in a second ({} jobs restarted whole: their node 0's pod was lost; the others \
                 replaced in place)",
                l.not_ready,
                l.first_delete,
                n as f64 / (last - first).max(1e-3),
                peak_rate(&l.created),
                l.restarted
            ),
            ">= 300 pods/s",
        ),
        row(
            format!(
                "nodes lost: a pod force-deleted -> its replacement created (in place), {} pods: p50 / p99 / max",
                reaction.len()
            ),
            p50_p99_max(reaction, 2),
            "",
        ),
        row(
            "nodes lost: every affected job steps again (simulator) / is Running in its status, from NotReady: p50 / max",
            format!(
                "{:.1} / {:.1} s; {:.1} / {:.1} s",
                quantile(stepping, 0.5),
                quantile(stepping, 1.0),
                quantile(running, 0.5),
                quantile(running, 1.0)
            ),
            "",
        ),
    ]
}

/// Tells the simulator that `nodes` report `route` (`ready`, `not-ready`) from now on.
async fn tell_nodes(b: &Bench, route: &str, nodes: &[String]) -> Result<(), String> {
    let addr = b.sim_control.ok_or("no hollow nodes")?;
    let path = format!("/nodes/{route}?names={}", nodes.join(","));
    http_get(addr, &path).await.map(|_| ())
}

/// Seconds after the command until the API shows every one of `nodes` NotReady.
async fn all_not_ready(b: &Bench, nodes: &[String]) -> Result<f64, String> {
    let started = Instant::now();
    let api: Api<Node> = Api::all(b.client.clone());
    let selector = format!("{HOLLOW_LABEL}={}", b.prefix);
    let wanted: BTreeSet<&String> = nodes.iter().collect();
    let (api, selector, wanted) = (&api, &selector, &wanted);
    poll(
        "every lost node NotReady in the API",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async move {
            let list = hollow_nodes(api, selector).await;
            let down = list
                .iter()
                .filter(|n| n.metadata.name.as_ref().is_some_and(|m| wanted.contains(m)))
                .filter(|n| !ready(n))
                .count();
            (
                (down == wanted.len()).then_some(()),
                format!("{down} of {}", wanted.len()),
            )
        },
    )
    .await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds from `t0` to the first deletion of one of `pods` (the operator's grace, then its
/// force-delete); waits 10 minutes at most.
async fn first_delete(b: &Bench, pods: &BTreeSet<String>, t0: Instant) -> Result<f64, String> {
    poll(
        "the operator's first force-delete of a lost pod",
        Duration::from_secs(600),
        Duration::from_millis(100),
        || async move {
            let first = b.tracker.with(|s| {
                s.pod_deletes
                    .iter()
                    .filter(|(at, name)| *at > t0 && pods.contains(name))
                    .map(|(at, _)| (*at - t0).as_secs_f64())
                    .reduce(f64::min)
            });
            (first, "none yet".to_string())
        },
    )
    .await
}
