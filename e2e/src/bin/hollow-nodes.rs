//! `hollow-nodes`: N simulated kubelet nodes on the cluster $KUBECONFIG names (see
//! `ferrotrain_e2e::hollow`), until SIGTERM or SIGINT; then it deletes them. Prints
//! `hollow-nodes: control http://ADDR` once its nodes are registered (`/snapshot`, `/polls`).
//! A process of its own, so that a bench can tell its cost from the operator's.

use std::time::Duration;

use clap::Parser;
use ferrotrain_e2e::hollow::{Config, Pace, Simulator};
use tokio::signal::unix::{SignalKind, signal};

/// Simulated kubelet nodes with GPUs for ferrotrain's pods.
#[derive(Parser, Debug)]
#[command(name = "hollow-nodes")]
struct Args {
    /// Node name prefix, label and taint value (`ferrotrain.dev/hollow=<name>`).
    #[arg(long, default_value = "hollow")]
    name: String,
    #[arg(long, default_value_t = 20)]
    nodes: usize,
    #[arg(long, default_value = "96")]
    cpu: String,
    #[arg(long, default_value = "1Ti")]
    memory: String,
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Pod IPs are 127.<block>.x.y, node IPs 127.<block + 1>.x.y.
    #[arg(long, default_value_t = 43)]
    ip_block: u8,
    #[arg(long, default_value_t = 40)]
    lease_seconds: u64,
    #[arg(long, default_value_t = 10)]
    renew_seconds: u64,
    #[arg(long, default_value_t = 300)]
    status_seconds: u64,
    #[arg(long, default_value_t = 0)]
    start_delay_ms: u64,
    #[arg(long, default_value_t = 1000)]
    stop_delay_ms: u64,
    /// Pace of jobs whose pods do not set hollow.ferrotrain.dev/steps-per-second.
    #[arg(long, default_value_t = 1.0)]
    steps_per_second: f64,
    #[arg(long, default_value_t = 1_000_000)]
    total_steps: u64,
    #[arg(long, default_value_t = 16)]
    write_concurrency: usize,
    /// Where to serve /snapshot and /polls.
    #[arg(long, default_value = "127.0.0.1:0")]
    control: std::net::SocketAddr,
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let config = Config {
        name: a.name.clone(),
        nodes: a.nodes,
        cpu: a.cpu,
        memory: a.memory,
        gpus: a.gpus,
        max_pods: a.max_pods,
        ip_block: a.ip_block,
        lease_duration: Duration::from_secs(a.lease_seconds),
        renew_interval: Duration::from_secs(a.renew_seconds.max(1)),
        status_interval: Duration::from_secs(a.status_seconds.max(1)),
        start_delay: Duration::from_millis(a.start_delay_ms),
        stop_delay: Duration::from_millis(a.stop_delay_ms),
        pace: Pace {
            steps_per_second: a.steps_per_second,
            total_steps: a.total_steps,
        },
        write_concurrency: a.write_concurrency,
    };
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let client = kube::Client::try_default()
        .await
        .expect("a cluster: set KUBECONFIG");
    let listener = tokio::net::TcpListener::bind(a.control)
        .await
        .expect("binding the control address");
    let started = std::time::Instant::now();
    let mut sim = match Simulator::start(client, config).await {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("hollow-nodes: {e}");
            std::process::exit(1);
        }
    };
    let addr = sim.serve_control(listener);
    println!(
        "hollow-nodes: {} nodes registered in {:.1} s",
        a.nodes,
        started.elapsed().as_secs_f64()
    );
    println!("hollow-nodes: control http://{addr}");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    let deleted = sim.shutdown().await;
    println!("hollow-nodes: deleted {deleted} nodes");
}
