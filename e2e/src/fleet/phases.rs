//! The fleet bench's phases, in order: nodes, operators, suspended jobs, running jobs (with the
//! apply -> pods latency of a burst), a steady window, isolation, a drain, a failover. Each
//! adds rows to the table; later phases read what earlier ones remembered.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ferrotrain_api::crd::Phase;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

use super::bench::Bench;
use super::disrupt;
use super::jobs::{create_many, hollow_job, p50_p99_max, poll, quantile};
use super::lost;
use super::observe::{hollow_nodes, ready, sim_polls, wait_holder};
use super::report::{Row, row, say, server_row};
use super::window::{Counters, Window};
use crate::hollow::{ANNOTATION_PROGRESS, HOLLOW_LABEL};

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

/// What later phases need of earlier ones.
#[derive(Default)]
pub struct Memo {
    rss_no_jobs: u64,
    rss_suspended: u64,
    steady_polls: (f64, f64),
}

/// Runs the phases; the rows so far, and the error that stopped them, if any.
pub async fn run(b: &mut Bench) -> (Vec<Row>, Option<String>) {
    let mut rows = Vec::new();
    let mut memo = Memo::default();
    let result = phases(b, &mut rows, &mut memo).await;
    (rows, result.err())
}

async fn phases(b: &mut Bench, rows: &mut Vec<Row>, memo: &mut Memo) -> Result<(), String> {
    nodes(b, rows).await?;
    operators(b, rows, memo).await?;
    suspended(b, rows, memo).await?;
    running(b, rows).await?;
    steady(b, rows, memo).await?;
    isolation(b, rows, memo).await?;
    disrupt::drain(b, rows).await?;
    lost::nodes_lost(b, rows).await?;
    disrupt::failover(b, rows).await
}

async fn nodes(b: &mut Bench, rows: &mut Vec<Row>) -> Result<(), String> {
    say(b, &format!("registering {} hollow nodes", b.settings.nodes));
    let seconds = b.start_hollow_nodes()?;
    let api: Api<Node> = Api::all(b.client.clone());
    let selector = format!("{HOLLOW_LABEL}={}", b.prefix);
    let want = b.settings.nodes;
    let started = Instant::now();
    let (api, selector) = (&api, &selector);
    poll(
        "every hollow node Ready and schedulable",
        Duration::from_secs(300),
        Duration::from_secs(2),
        || async move {
            let list = hollow_nodes(api, selector).await;
            let ready = list.iter().filter(|n| schedulable(n)).count();
            ((ready == want).then_some(()), format!("{ready} of {want}"))
        },
    )
    .await?;
    rows.push(row(
        format!(
            "{} hollow nodes ({} GPUs each) registered / Ready",
            want, b.settings.gpus_per_node
        ),
        format!("{seconds:.1} s / +{:.1} s", started.elapsed().as_secs_f64()),
        "",
    ));
    Ok(())
}

/// Ready, and without the node lifecycle controller's not-ready/unreachable taints.
fn schedulable(n: &Node) -> bool {
    let ready = ready(n);
    let tainted = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
    ready && !tainted
}

async fn operators(b: &mut Bench, rows: &mut Vec<Row>, memo: &mut Memo) -> Result<(), String> {
    say(b, "starting the operators (fleet-a, then fleet-b)");
    b.start_operator("fleet-a")?;
    wait_holder(b, "fleet-a", Duration::from_secs(120)).await?;
    b.start_operator("fleet-b")?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let start = Counters::read(b).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let w = start.to(&Counters::read(b).await?);
    memo.rss_no_jobs = w.usage_of("fleet-a").rss;
    rows.push(row(
        "operator RSS, no jobs: leader / standby",
        format!(
            "{} / {}",
            mb(memo.rss_no_jobs as f64),
            mb(w.usage_of("fleet-b").rss as f64)
        ),
        "",
    ));
    Ok(())
}

fn job_spec(b: &Bench, annotations: serde_json::Value) -> serde_json::Value {
    let s = &b.settings;
    hollow_job(
        &b.prefix,
        s.pods_per_job,
        s.gpus_per_pod,
        1.0,
        1_000_000,
        annotations,
    )
}

async fn suspended(b: &mut Bench, rows: &mut Vec<Row>, memo: &mut Memo) -> Result<(), String> {
    let n = b.settings.suspended_jobs;
    say(b, &format!("{n} suspended jobs"));
    let mut spec = job_spec(b, json!({}));
    spec["suspend"] = json!(true);
    let names = (0..n).map(|i| format!("queued-{i:04}")).collect();
    let api = Api::namespaced(b.client.clone(), &b.ns);
    create_many(&api, &b.ns, names, &spec, b.settings.create_concurrency).await;
    let b: &Bench = b;
    poll(
        "the jobs Suspended",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async move {
            let k = b.tracker.with(|s| s.in_phase(Phase::Suspended));
            ((k >= n).then_some(()), format!("{k} of {n}"))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let start = Counters::read(b).await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let w = start.to(&Counters::read(b).await?);
    let leader = w.usage_of("fleet-a");
    memo.rss_suspended = leader.rss;
    let per_job = (leader.rss as f64 - memo.rss_no_jobs as f64) / n.max(1) as f64;
    rows.push(row(
        format!("operator RSS with {n} suspended jobs (per suspended job)"),
        format!("{} ({:.1} KB)", mb(leader.rss as f64), per_job / 1e3),
        "",
    ));
    rows.push(row(
        format!("operator CPU with {n} suspended jobs, idle"),
        format!("{:.1}% of a core", 100.0 * leader.cores),
        "",
    ));
    Ok(())
}

async fn running(b: &mut Bench, rows: &mut Vec<Row>) -> Result<(), String> {
    let s = b.settings.clone();
    let first = s.running_jobs.saturating_sub(s.latency_jobs);
    let api = Api::namespaced(b.client.clone(), &b.ns);
    let spec = job_spec(b, json!({}));
    say(
        b,
        &format!("{first} running jobs of {} pods", s.pods_per_job),
    );
    let started = Instant::now();
    let names = (0..first).map(|i| format!("run-{i:04}")).collect();
    let created = create_many(&api, &b.ns, names, &spec, s.create_concurrency).await;
    let created_in = started.elapsed().as_secs_f64();
    let pods = first * s.pods_per_job as usize;
    let view: &Bench = b;
    poll(
        "the jobs' pods Running",
        Duration::from_secs(1800),
        Duration::from_millis(500),
        || async move {
            let k = view.tracker.with(|seen| seen.running_pods());
            (
                (k >= pods).then_some(()),
                format!("{k} of {pods} pods running"),
            )
        },
    )
    .await?;
    let running_in = started.elapsed().as_secs_f64();
    wait_stepping(b, first, Duration::from_secs(1800)).await?;
    let failed = created.iter().filter(|(_, at)| at.is_none()).count();
    rows.push(row(
        format!("{first} jobs x {} pods: created ({} at a time) / every pod Running / every job stepping in its status", s.pods_per_job, s.create_concurrency),
        format!(
            "{created_in:.0} s / {running_in:.0} s ({:.0} pods/s) / {:.0} s{}",
            pods as f64 / running_in,
            started.elapsed().as_secs_f64(),
            if failed > 0 { format!(" ({failed} creates failed)") } else { String::new() }
        ),
        "",
    ));

    say(b, &format!("{} jobs submitted at once", s.latency_jobs));
    let names: Vec<String> = (first..s.running_jobs)
        .map(|i| format!("run-{i:04}"))
        .collect();
    let before = Counters::read(b).await?;
    let created = create_many(&api, &b.ns, names, &spec, s.latency_jobs).await;
    let want = s.pods_per_job as usize;
    let (b, created): (&Bench, &Vec<(String, Option<Instant>)>) = (b, &created);
    let latencies = poll(
        "every pod of the burst created",
        Duration::from_secs(300),
        Duration::from_millis(200),
        || async move {
            let adds = b.tracker.with(|seen| {
                let mut by_job: HashMap<String, Vec<Instant>> = HashMap::new();
                for (at, _, job) in &seen.pod_adds {
                    by_job.entry(job.clone()).or_default().push(*at);
                }
                by_job
            });
            let mut latencies = Vec::new();
            for (job, answered) in created {
                let (Some(answered), Some(times)) = (answered, adds.get(job)) else {
                    continue;
                };
                if times.len() >= want {
                    let last = times.iter().max().expect("times");
                    latencies.push(last.saturating_duration_since(*answered).as_secs_f64());
                }
            }
            (
                (latencies.len() == created.len()).then(|| latencies.clone()),
                format!("{} of {}", latencies.len(), created.len()),
            )
        },
    )
    .await?;
    let burst = before.to(&Counters::read(b).await?);
    rows.push(row(
        format!(
            "apply -> all {want} pods created, {} jobs at once: p50 / p99 / max",
            s.latency_jobs
        ),
        p50_p99_max(&latencies, 3),
        "p99 < 1 s",
    ));
    rows.push(server_row("the burst", &burst));
    wait_stepping(b, s.running_jobs, Duration::from_secs(900)).await?;
    Ok(())
}

/// Waits until `n` jobs are Running with steps in their status.
async fn wait_stepping(b: &Bench, n: usize, limit: Duration) -> Result<(), String> {
    let mut last_say = Instant::now();
    poll(
        "the jobs Running with steps",
        limit,
        Duration::from_secs(1),
        || {
            let (k, pods) = b.tracker.with(|s| (s.stepping(), s.running_pods()));
            if last_say.elapsed() > Duration::from_secs(30) {
                last_say = Instant::now();
                say(b, &format!("{k} of {n} jobs stepping, {pods} pods running"));
            }
            async move {
                (
                    (k >= n).then_some(()),
                    format!("{k} of {n} stepping, {pods} pods running"),
                )
            }
        },
    )
    .await
}

/// p50 and p99 of the intervals between the polls of the jobs `keep` accepts.
fn poll_quantiles(
    polls: &BTreeMap<String, Vec<f64>>,
    keep: impl Fn(&str) -> bool,
) -> (f64, f64, usize) {
    let all: Vec<f64> = polls
        .iter()
        .filter(|(k, _)| keep(k))
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    (quantile(&all, 0.5), quantile(&all, 0.99), all.len())
}

async fn steady(b: &mut Bench, rows: &mut Vec<Row>, memo: &mut Memo) -> Result<(), String> {
    let (r, s) = (b.settings.running_jobs, b.settings.suspended_jobs);
    say(
        b,
        &format!("steady window of {} s", b.settings.window.as_secs()),
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    sim_polls(b).await?;
    let start = Counters::read(b).await?;
    tokio::time::sleep(b.settings.window).await;
    let w = start.to(&Counters::read(b).await?);
    let polls = sim_polls(b).await?;
    let (p50, p99, n) = poll_quantiles(&polls, |_| true);
    memo.steady_polls = (p50, p99);
    steady_rows(b, rows, memo, &w, r, s);
    rows.push(row(
        format!(
            "interval between a job's /progress polls (its reconciles), {n} intervals: p50 / p99"
        ),
        format!("{p50:.2} / {p99:.2} s"),
        "the poll interval (5 s)",
    ));
    Ok(())
}

fn steady_rows(b: &Bench, rows: &mut Vec<Row>, memo: &Memo, w: &Window, r: usize, s: usize) {
    let leader = w.usage_of("fleet-a");
    let per_running = (leader.rss as f64 - memo.rss_suspended as f64) / r.max(1) as f64;
    rows.push(row(
        format!(
            "operator RSS with {r} running ({} pods) + {s} suspended jobs: leader / standby",
            r * b.settings.pods_per_job as usize
        ),
        format!(
            "{} / {}",
            mb(leader.rss as f64),
            mb(w.usage_of("fleet-b").rss as f64)
        ),
        "",
    ));
    rows.push(row(
        "operator RSS per running job (above the suspended jobs' RSS) / per job of all",
        format!(
            "{:.1} KB / {:.1} KB",
            per_running / 1e3,
            leader.rss as f64 / (r + s).max(1) as f64 / 1e3
        ),
        "< 100 KB",
    ));
    rows.push(row(
        "operator CPU (leader) / per running job",
        format!(
            "{:.1}% of a core / {:.2} millicores",
            100.0 * leader.cores,
            1000.0 * leader.cores / r.max(1) as f64
        ),
        "",
    ));
    let minutes = w.seconds / 60.0;
    rows.push(row(
        format!(
            "API writes per running job per minute ({:.0} s window)",
            w.seconds
        ),
        format!(
            "{:.2} ({})",
            w.operator_writes() / r.max(1) as f64 / minutes,
            w.operator_writes_by_kind()
        ),
        "<= 6",
    ));
    rows.push(row(
        "operators' reads (get/list/watch) per second",
        format!(
            "{:.2}",
            w.operator.get("reads").copied().unwrap_or(0.0) / w.seconds
        ),
        "",
    ));
    rows.push(row(
        "API server: requests/s (every client) by verb; its CPU; write p99",
        format!(
            "{:.0}/s ({}); {:.2} cores; {}",
            w.api_total_rate(),
            w.api_rates_by_verb(),
            w.api_cpu_cores,
            w.api_write_p99.map_or("-".into(), |p| format!("<= {p} s"))
        ),
        "",
    ));
    let hollow = w.usage_of("hollow-nodes");
    let hw = |k: &str| w.hollow.get(k).copied().unwrap_or(0.0) / w.seconds;
    rows.push(row(
        "hollow nodes (the simulator's own cost): CPU; RSS; its API writes/s, reads/s",
        format!(
            "{:.1}% of a core; {}; {:.1}/s, {:.2}/s",
            100.0 * hollow.cores,
            mb(hollow.rss as f64),
            hw("writes"),
            hw("reads")
        ),
        "",
    ));
    rows.push(row(
        "the machine: busy cores (of 2); by process",
        format!("{:.2}; {}", w.machine_cores, w.cores_by_process()),
        "",
    ));
}

async fn isolation(b: &mut Bench, rows: &mut Vec<Row>, memo: &Memo) -> Result<(), String> {
    say(
        b,
        "isolation: a job whose /progress never answers, a job whose pods admission refuses",
    );
    let api = Api::namespaced(b.client.clone(), &b.ns);
    let silent = job_spec(b, json!({ANNOTATION_PROGRESS: "silent"}));
    create_many(&api, &b.ns, vec!["silent".into()], &silent, 1).await;
    let plain = job_spec(b, json!({}));
    create_many(&api, &b.ns, vec!["refused".into()], &plain, 1).await;
    let pods = b.settings.pods_per_job as usize;
    let b: &Bench = b;
    poll(
        "the silent job's pods running and the refused job refused",
        Duration::from_secs(300),
        Duration::from_secs(1),
        || async move {
            let (running, refused) = b.tracker.with(|s| {
                let running = s
                    .pods
                    .values()
                    .filter(|p| p.job == "silent" && p.running)
                    .count();
                (
                    running,
                    s.jobs.get("refused").is_some_and(|j| j.create_refused),
                )
            });
            (
                (running >= pods && refused).then_some(()),
                format!("silent: {running} pods running, refused: {refused}"),
            )
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    sim_polls(b).await?;
    let start = Counters::read(b).await?;
    tokio::time::sleep(b.settings.window).await;
    let w = start.to(&Counters::read(b).await?);
    let polls = sim_polls(b).await?;
    let ns = b.ns.clone();
    let (p50, p99, _) = poll_quantiles(&polls, |k| k != format!("{ns}/silent"));
    let silent_polls = polls.get(&format!("{ns}/silent")).map_or(0, Vec::len);
    rows.push(row(
        "isolation: other jobs' poll interval p50 / p99 (steady -> with a silent and a refused job)",
        format!("{:.2} / {:.2} s -> {p50:.2} / {p99:.2} s (silent job polled {silent_polls} times)", memo.steady_polls.0, memo.steady_polls.1),
        "p99 unchanged",
    ));
    let r = b.settings.running_jobs;
    rows.push(row(
        "isolation: API writes per running job per minute",
        format!(
            "{:.2} ({})",
            w.operator_writes() / r as f64 / (w.seconds / 60.0),
            w.operator_writes_by_kind()
        ),
        "",
    ));
    Ok(())
}
