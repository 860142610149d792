//! `watch`: one watch of the one object (a list with `fieldSelector=metadata.name=NAME`, then
//! a long watch from its resourceVersion, renewed when the API server closes it), a redraw per
//! change, until the job Succeeded or Failed. The API server sends a change when the status
//! changes (the operator's progress polls, a failure, a phase), so the plugin asks for nothing
//! more often than that; between changes a terminal's view is redrawn from what it has (the
//! age, how fresh the report is), without a request.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::time::Duration;

use ferrotrain_api::crd::{DistributedTraining, Phase};
use futures::StreamExt;
use jiff::Timestamp;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::connect::Cluster;
use crate::error::{Error, Result};
use crate::format::clock;
use crate::screen::{closing_line, view};
use crate::terminal::Frames;

/// How a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched {
    /// The job's last phase: Succeeded or Failed.
    pub phase: Phase,
    /// Changes of the object the API server sent.
    pub changes: u64,
}

/// Where the view goes: a terminal redrawn in place, or a line per change.
enum Output {
    Terminal(Frames),
    Lines(BTreeSet<String>),
}

impl Output {
    fn show(&mut self, dt: &DistributedTraining, now: Timestamp) -> Result<()> {
        let v = view(dt, now);
        match self {
            Output::Terminal(frames) => frames.draw(&v.lines()).map_err(Error::Terminal),
            Output::Lines(printed) => {
                let parts = v.parts();
                for part in parts.iter().filter(|p| !printed.contains(*p)) {
                    println!("{} {part}", clock(now));
                }
                *printed = parts.into_iter().collect();
                Ok(())
            }
        }
    }
}

/// Watches job `name` until it ends; its view on stdout.
pub async fn watch(cluster: &Cluster, name: &str) -> Result<Watched> {
    let api: Api<DistributedTraining> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut output = if std::io::stdout().is_terminal() {
        Output::Terminal(Frames::default())
    } else {
        Output::Lines(BTreeSet::new())
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last: Option<DistributedTraining> = None;
    let mut listed = false;
    let mut changes = 0;
    loop {
        tokio::select! {
            event = events.next() => {
                let event = match event.ok_or_else(|| Error::Deleted(name.to_string()))? {
                    Ok(event) => event,
                    // Before the first list the cluster or the job cannot be read: say so;
                    // later the watcher starts again after its backoff (a dropped connection).
                    Err(source) if last.is_none() => {
                        return Err(Error::Watch { name: name.to_string(), source });
                    }
                    Err(e) => {
                        eprintln!("kubectl-ferrotrain: the watch of {name} failed, retrying: {e}");
                        continue;
                    }
                };
                match event {
                    Event::Init => listed = false,
                    Event::InitDone if !listed => return Err(not_found(cluster, name)),
                    Event::InitDone => {}
                    Event::Delete(_) => return Err(Error::Deleted(name.to_string())),
                    Event::Apply(dt) | Event::InitApply(dt) => {
                        listed = true;
                        changes += 1;
                        output.show(&dt, Timestamp::now())?;
                        if let Some(phase) = finished(&dt) {
                            println!("{}", closing_line(&dt));
                            return Ok(Watched { phase, changes });
                        }
                        last = Some(dt);
                    }
                }
            }
            _ = tick.tick(), if matches!(output, Output::Terminal(_)) => {
                if let Some(dt) = &last {
                    output.show(dt, Timestamp::now())?;
                }
            }
        }
    }
}

fn not_found(cluster: &Cluster, name: &str) -> Error {
    Error::NotFound {
        name: name.to_string(),
        namespace: cluster.namespace.clone(),
    }
}

/// The phase of a job that ended.
fn finished(dt: &DistributedTraining) -> Option<Phase> {
    dt.status
        .as_ref()
        .map(|s| s.phase)
        .filter(|p| p.is_finished())
}

#[cfg(test)]
mod tests;
