//! `logs`: the output of the current attempt's ranks. A round's lines come from the rank's
//! file in its pod (`round-<r>/rank-<n>.log`, read with exec while the pod runs: they outlive
//! the round and a rotated container log), else from the pod's container log, where the
//! launcher labels every line with its round and rank. Lines are merged in time order
//! (src/logs/lines.rs).

pub mod lines;

use std::path::Path;
use std::time::Duration;

use ferrotrain_api::crd::DistributedTraining;
use ferrotrain_api::crd::labels::{ATTEMPT, JOB, NODE_RANK, TRAINER_CONTAINER};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, ListParams, LogParams};
use tokio::io::AsyncReadExt;

use crate::cli::LogsArgs;
use crate::connect::Cluster;
use crate::error::{Error, Result};
use lines::{Filter, Line, container_log, merge, round_file, tail};

/// Where a pod's launcher keeps its ranks' files, in the pod's shell (launch/src/output.rs:
/// FERROTRAIN_OUTPUT_DIR, else `ferrotrain-output` in the temporary directory).
fn output_dir_in_shell() -> String {
    format!(
        "${{{}:-${{TMPDIR:-/tmp}}/{}}}",
        ferrotrain_api::env::FERROTRAIN_OUTPUT_DIR,
        ferrotrain_api::output::DEFAULT_DIR_NAME
    )
}
/// What the exec script prints before a file and for a file it does not find.
const FILE_MARK: &str = "@@ferrotrain-rank ";
const MISSING_MARK: &str = "@@ferrotrain-missing";

/// One pod of the attempt and the ranks it runs.
struct RankPod {
    name: String,
    node: i32,
    running: bool,
    ranks: Vec<usize>,
}

/// Prints the lines `args` asks for.
pub async fn logs(cluster: &Cluster, args: &LogsArgs) -> Result<()> {
    let dt = cluster.job(&args.name).await?;
    let status = dt.status.clone().unwrap_or_default();
    let filter = Filter {
        round: round_wanted(args, status.round as u64)?,
        rank: args.rank,
    };
    let pods = rank_pods(cluster, &dt, status.attempt, filter.rank).await?;
    if pods.is_empty() {
        return Err(Error::Usage(format!(
            "no pod of attempt {} of {} runs rank {}",
            status.attempt,
            args.name,
            filter.rank.map_or("any".into(), |r| r.to_string())
        )));
    }
    let current = filter.round.is_none_or(|r| r == status.round as u64);
    if args.follow && current {
        return follow(cluster, &pods, filter, args.tail).await;
    }
    let mut sources = Vec::new();
    for pod in &pods {
        sources.push(pod_lines(cluster, pod, filter).await?);
    }
    for line in tail(merge(sources), args.tail) {
        println!("{}", line.render());
    }
    Ok(())
}

/// The round `--round` or `--previous` names, if any.
fn round_wanted(args: &LogsArgs, current: u64) -> Result<Option<u64>> {
    if !args.previous {
        return Ok(args.round);
    }
    current.checked_sub(1).map(Some).ok_or_else(|| {
        Error::Usage(format!(
            "{} is in round 0 of its attempt: no round was replaced yet",
            args.name
        ))
    })
}

/// The attempt's pods, by node rank, that run `rank` (every pod without one).
async fn rank_pods(
    cluster: &Cluster,
    dt: &DistributedTraining,
    attempt: i32,
    rank: Option<usize>,
) -> Result<Vec<RankPod>> {
    let name = dt.metadata.name.clone().unwrap_or_default();
    let procs = dt.spec.procs_per_replica().max(1) as usize;
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let selector = format!("{JOB}={name},{ATTEMPT}={attempt}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::api(format!("listing the pods of {name}")))?;
    let mut pods: Vec<RankPod> = list
        .items
        .into_iter()
        .filter_map(|p| {
            let node: i32 = p.metadata.labels.as_ref()?.get(NODE_RANK)?.parse().ok()?;
            let ranks: Vec<usize> = (0..procs).map(|l| node as usize * procs + l).collect();
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Some(RankPod {
                name: p.metadata.name?,
                node,
                running,
                ranks: ranks
                    .into_iter()
                    .filter(|r| rank.is_none_or(|want| want == *r))
                    .collect(),
            })
        })
        .filter(|p| !p.ranks.is_empty())
        .collect();
    pods.sort_by_key(|p| p.node);
    Ok(pods)
}

/// A pod's lines that `filter` keeps: a round's from its files while the pod runs, else from
/// its container log.
async fn pod_lines(cluster: &Cluster, pod: &RankPod, filter: Filter) -> Result<Vec<Line>> {
    if let (Some(round), true) = (filter.round, pod.running)
        && let Some(lines) = round_files(cluster, pod, round).await
    {
        return Ok(lines);
    }
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let params = LogParams {
        container: Some(TRAINER_CONTAINER.to_string()),
        timestamps: true,
        ..LogParams::default()
    };
    let text = api
        .logs(&pod.name, &params)
        .await
        .map_err(Error::api(format!("reading the log of pod {}", pod.name)))?;
    Ok(container_log(pod.node, &text)
        .into_iter()
        .filter(|l| filter.keeps(l))
        .collect())
}

/// The pod's files of `round` for its ranks, read with exec; None when exec is refused or a
/// file is missing (the container log has what is left).
async fn round_files(cluster: &Cluster, pod: &RankPod, round: u64) -> Option<Vec<Line>> {
    let script = files_script(round, &pod.ranks);
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let params = AttachParams::default()
        .container(TRAINER_CONTAINER)
        .stderr(false);
    let mut process = api
        .exec(&pod.name, ["sh", "-c", script.as_str()], &params)
        .await
        .ok()?;
    let mut out = String::new();
    process.stdout()?.read_to_string(&mut out).await.ok()?;
    let _ = process.join().await;
    parse_files(round, &out)
}

/// The shell script that prints each rank's file of `round`, after a mark naming the rank.
fn files_script(round: u64, ranks: &[usize]) -> String {
    let mut script = format!("D=\"{}\"; ", output_dir_in_shell());
    for rank in ranks {
        let file = ferrotrain_launch::output::file_of(Path::new("$D"), Some(round), *rank);
        script += &format!(
            "echo '{FILE_MARK}{rank}'; cat \"{}\" 2>/dev/null || echo '{MISSING_MARK}'; ",
            file.display()
        );
    }
    script
}

/// The lines of what [`files_script`] printed; None when a file was missing.
fn parse_files(round: u64, out: &str) -> Option<Vec<Line>> {
    let mut sources = Vec::new();
    for part in out.split(FILE_MARK).skip(1) {
        let (rank, text) = part.split_once('\n').unwrap_or((part, ""));
        if text.contains(MISSING_MARK) {
            return None;
        }
        sources.push(round_file(round, rank.trim().parse().ok()?, text));
    }
    (!sources.is_empty()).then(|| merge(sources))
}

/// Prints the pods' lines as they come: every pod's container log, followed, in batches sorted
/// by time (the backlog first, cut to `tail`).
async fn follow(
    cluster: &Cluster,
    pods: &[RankPod],
    filter: Filter,
    tail_lines: Option<usize>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let params = LogParams {
        container: Some(TRAINER_CONTAINER.to_string()),
        follow: true,
        timestamps: true,
        ..LogParams::default()
    };
    let mut streams = Vec::new();
    for pod in pods {
        let stream = api
            .log_stream(&pod.name, &params)
            .await
            .map_err(Error::api(format!("following the log of pod {}", pod.name)))?;
        let node = pod.node;
        streams.push(
            stream
                .lines()
                .filter_map(move |l| async move { l.ok().map(|l| container_log(node, &l)) })
                .boxed(),
        );
    }
    let mut all = futures::stream::select_all(streams);
    let mut window = Duration::from_secs(1);
    let mut first = true;
    loop {
        let mut batch = Vec::new();
        let deadline = tokio::time::sleep(window);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = all.next() => match next {
                    Some(lines) => batch.extend(lines.into_iter().filter(|l| filter.keeps(l))),
                    None => break,
                },
                _ = &mut deadline => break,
            }
        }
        let ended = batch.is_empty() && all.is_empty();
        let batch = merge(vec![batch]);
        let batch = if first {
            tail(batch, tail_lines)
        } else {
            batch
        };
        for line in batch {
            println!("{}", line.render());
        }
        if ended {
            return Ok(());
        }
        (first, window) = (false, Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_script_reads_each_rank_s_file_of_the_round() {
        let script = files_script(0, &[1]);
        assert!(
            script.starts_with("D=\"${FERROTRAIN_OUTPUT_DIR:-"),
            "{script}"
        );
        assert!(
            script.contains("cat \"$D/round-0/rank-1.log\" 2>/dev/null"),
            "{script}"
        );
    }

    #[test]
    fn what_the_script_printed_is_each_rank_s_lines() {
        let out = "@@ferrotrain-rank 2\n2026-12-01T12:00:02Z b\n\
                   @@ferrotrain-rank 3\n2026-12-01T12:00:01Z a\n";
        let lines = parse_files(4, out).unwrap();
        let rendered: Vec<String> = lines.iter().map(Line::render).collect();
        assert_eq!(
            rendered,
            [
                "[4.3] 2026-12-01T12:00:01Z a",
                "[4.2] 2026-12-01T12:00:02Z b"
            ]
        );
        assert_eq!(
            parse_files(4, "@@ferrotrain-rank 2\n@@ferrotrain-missing\n"),
            None
        );
        assert_eq!(parse_files(4, ""), None);
    }
}
