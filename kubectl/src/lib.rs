//! `kubectl ferrotrain`: a kubectl plugin for DistributedTraining jobs. What it shows is
//! computed by pure functions of the objects it reads, tested without a cluster: the watch
//! view (`screen`), the recovery table (`ledger`), the merged logs (`logs::lines`), the job
//! built from a file and its checks (`submit::manifest`, `submit::schema`), the job table
//! (`list`). The rest talks to the API server through one client whose requests are counted
//! (`requests`, `connect`).

pub mod cli;
pub mod connect;
pub mod error;
pub mod format;
pub mod generate;
pub mod ledger;
pub mod lifecycle;
pub mod list;
pub mod logs;
pub mod problem;
pub mod recovery;
pub mod requests;
pub mod screen;
pub mod submit;
pub mod table;
pub mod terminal;
pub mod watch;

#[cfg(test)]
mod fixtures;

use std::io::Write;

use ferrotrain_api::crd::Phase;

use cli::{Cli, Command};
use connect::Cluster;
use error::Result;

/// Exit code of `watch` when the job Failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of an error (the API server, a job not found, an object refused); clap's is 2.
pub const EXIT_ERROR: u8 = 3;

/// Runs the command; its exit code.
pub async fn run(cli: Cli) -> Result<u8> {
    match &cli.command {
        Command::Completion(args) => {
            let _ = std::io::stdout().write_all(&generate::completion(args.shell));
            return Ok(0);
        }
        Command::Man(args) => {
            match &args.dir {
                Some(dir) => generate::write_man_pages(dir)?,
                None => {
                    let _ = std::io::stdout().write_all(&generate::man());
                }
            }
            return Ok(0);
        }
        _ => {}
    }
    let cluster = Cluster::connect(&cli.connection).await?;
    let mut changes = None;
    let code = match &cli.command {
        Command::Submit(args) => match submit::submit(&cluster, args).await? {
            Some(name) if args.watch => {
                let watched = watch::watch(&cluster, &name).await?;
                changes = Some(watched.changes);
                exit_code(watched.phase)
            }
            _ => 0,
        },
        Command::Watch(args) => {
            let watched = watch::watch(&cluster, &args.name).await?;
            changes = Some(watched.changes);
            exit_code(watched.phase)
        }
        Command::Logs(args) => logs::logs(&cluster, args).await.map(|()| 0)?,
        Command::Recovery(args) => recovery::recovery(&cluster, args).await.map(|()| 0)?,
        Command::List(args) => list::list(&cluster, args).await.map(|()| 0)?,
        Command::Suspend(job) => lifecycle::set_suspend(&cluster, &job.name, true)
            .await
            .map(|()| 0)?,
        Command::Resume(job) => lifecycle::set_suspend(&cluster, &job.name, false)
            .await
            .map(|()| 0)?,
        Command::Delete(job) => lifecycle::delete(&cluster, &job.name).await.map(|()| 0)?,
        Command::Completion(_) | Command::Man(_) => 0,
    };
    if cli.stats {
        let mut line = cluster.counts.summary();
        if let Some(n) = changes {
            line += &format!("; {n} changes of the job received");
        }
        eprintln!("kubectl-ferrotrain: {line}");
    }
    Ok(code)
}

/// 0 for a job that Succeeded, [`EXIT_FAILED`] for one that Failed.
pub fn exit_code(phase: Phase) -> u8 {
    match phase {
        Phase::Succeeded => 0,
        _ => EXIT_FAILED,
    }
}
