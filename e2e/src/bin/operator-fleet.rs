//! bench/operator-fleet.sh: the operator at fleet scale on hollow nodes (see
//! `ferrotrain_e2e::fleet` and `ferrotrain_e2e::hollow`). Prints a Markdown table of what it
//! measured; everything it creates (a namespace, its nodes, ServiceAccounts, roles,
//! FlowSchemas, an admission policy) is deleted at the end, also when a phase fails.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ferrotrain_e2e::fleet::bench::{Bench, Settings};
use ferrotrain_e2e::fleet::phases;

/// The operator with N hollow GPU nodes, running and suspended jobs, a leader and a standby.
#[derive(Parser, Debug)]
#[command(name = "operator-fleet")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Jobs that run (the last --latency-jobs of them are submitted at once).
    #[arg(long, default_value_t = 500)]
    running_jobs: usize,
    #[arg(long, default_value_t = 8)]
    pods_per_job: i32,
    #[arg(long, default_value_t = 1)]
    gpus_per_pod: i32,
    #[arg(long, default_value_t = 1000)]
    suspended_jobs: usize,
    #[arg(long, default_value_t = 100)]
    latency_jobs: usize,
    /// Seconds of each measurement window (steady, isolation).
    #[arg(long, default_value_t = 60)]
    window_seconds: u64,
    #[arg(long, default_value_t = 100)]
    drain_nodes: usize,
    /// Nodes that report NotReady at once (0: none), after the drain.
    #[arg(long, default_value_t = 100)]
    lost_nodes: usize,
    /// How often each hollow node renews its Lease.
    #[arg(long, default_value_t = 10)]
    renew_seconds: u64,
    /// Job creations in flight at once (outside the burst).
    #[arg(long, default_value_t = 8)]
    create_concurrency: usize,
    /// The operator binary (default: beside this one).
    #[arg(long)]
    operator: Option<PathBuf>,
    /// The hollow-nodes binary (default: beside this one).
    #[arg(long)]
    hollow: Option<PathBuf>,
    /// A flag for both operators (repeatable), e.g. --operator-flag=--progress-interval-seconds=5.
    #[arg(long = "operator-flag", allow_hyphen_values = true)]
    operator_flags: Vec<String>,
}

fn beside_me(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("this binary's path");
    me.with_file_name(name)
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let settings = Settings {
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        running_jobs: a.running_jobs,
        pods_per_job: a.pods_per_job,
        gpus_per_pod: a.gpus_per_pod,
        suspended_jobs: a.suspended_jobs,
        latency_jobs: a.latency_jobs.min(a.running_jobs),
        window: Duration::from_secs(a.window_seconds),
        drain_nodes: a.drain_nodes,
        lost_nodes: a.lost_nodes,
        renew_seconds: a.renew_seconds,
        create_concurrency: a.create_concurrency,
        operator_bin: a
            .operator
            .unwrap_or_else(|| beside_me("ferrotrain-operator")),
        hollow_bin: a.hollow.unwrap_or_else(|| beside_me("hollow-nodes")),
        operator_flags: a.operator_flags,
    };
    let mut bench = match Bench::set_up(settings).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("operator-fleet: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "operator-fleet: namespace {}, logs in {}",
        bench.ns,
        bench.dir.display()
    );
    // Interrupted (^C, SIGTERM), the bench still tears down what it made.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let (rows, error) = tokio::select! {
        done = phases::run(&mut bench) => done,
        _ = tokio::signal::ctrl_c() => (Vec::new(), Some("interrupted".to_string())),
        _ = terminate.recv() => (Vec::new(), Some("terminated".to_string())),
    };
    eprintln!("operator-fleet: tearing down");
    bench.tear_down().await;
    println!("\n| measurement | value | goal |\n|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} |", r.what, r.value, r.goal);
    }
    if let Some(e) = error {
        eprintln!("operator-fleet: stopped: {e}");
        std::process::exit(1);
    }
}
