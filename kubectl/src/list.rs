//! `list`: the jobs of a namespace (or all of them) with their phase, progress and ETA, one
//! LIST request.

use ferrotrain_api::crd::DistributedTraining;
use jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use crate::cli::ListArgs;
use crate::connect::Cluster;
use crate::error::{Error, Result};
use crate::format::{age, rate, seconds, steps};
use crate::table::table;

/// Prints the table.
pub async fn list(cluster: &Cluster, args: &ListArgs) -> Result<()> {
    let api: Api<DistributedTraining> = if args.all_namespaces {
        Api::all(cluster.client.clone())
    } else {
        Api::namespaced(cluster.client.clone(), &cluster.namespace)
    };
    let mut jobs = api
        .list(&ListParams::default())
        .await
        .map_err(Error::api("listing DistributedTrainings"))?
        .items;
    if jobs.is_empty() {
        match args.all_namespaces {
            true => eprintln!("No DistributedTrainings found"),
            false => eprintln!(
                "No DistributedTrainings found in namespace {}",
                cluster.namespace
            ),
        }
        return Ok(());
    }
    jobs.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    print!(
        "{}",
        list_table(&jobs, args.all_namespaces, Timestamp::now())
    );
    Ok(())
}

/// The jobs as a table at `now`.
pub fn list_table(jobs: &[DistributedTraining], namespaces: bool, now: Timestamp) -> String {
    let mut header = vec![
        "NAME", "PHASE", "PROGRESS", "STEPS/S", "ETA", "RESTARTS", "ROUND", "AGE",
    ];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|dt| {
            let mut row = row(dt, now);
            if namespaces {
                row.insert(0, dt.metadata.namespace.clone().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&header, &rows)
}

fn row(dt: &DistributedTraining, now: Timestamp) -> Vec<String> {
    let status = dt.status.clone().unwrap_or_default();
    let progress = status.progress.as_ref();
    let created = dt.metadata.creation_timestamp.as_ref();
    vec![
        dt.metadata.name.clone().unwrap_or_default(),
        status.phase.to_string(),
        progress.map_or_else(String::new, |p| steps(p.report.step, p.report.total_steps)),
        progress
            .and_then(|p| p.report.steps_per_second)
            .map(rate)
            .unwrap_or_default(),
        progress.and_then(|p| p.eta.clone()).unwrap_or_default(),
        status.restarts.to_string(),
        status.round.to_string(),
        created.map_or_else(String::new, |t| age(seconds(t.0, now))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn a_row_per_job_with_its_progress_and_eta() {
        let now: Timestamp = "2026-12-01T12:01:05Z".parse().unwrap();
        let jobs = [fixtures::training_job(), fixtures::succeeded_job()];
        assert_eq!(
            list_table(&jobs, true, now),
            "NAMESPACE   NAME   PHASE       PROGRESS         STEPS/S   ETA   RESTARTS   ROUND   AGE\n\
             ml          copy   Running     1450/3000 48%    35.9      43s   1          1       1m10s\n\
             ml          copy   Succeeded   3000/3000 100%                   1          1       1m10s\n"
        );
        let one = list_table(&jobs[..1], false, now);
        assert!(one.starts_with("NAME   PHASE"), "{one}");
    }
}
