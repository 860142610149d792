//! `ferrotrain-operator run` (the controller) and `ferrotrain-operator crd` (the CRD YAML).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use clap::Parser;
use ferrotrain_operator::config::{Args, Cli, Command, LogFormat, Settings};
use ferrotrain_operator::controller;
use ferrotrain_operator::metrics::Metrics;
use ferrotrain_operator::server::{self, ServerState};
use kube_lease_manager::LeaseManagerBuilder;
use tracing::{error, info};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ferrotrain_api::crd::custom_resource_definition_yaml());
            Ok(())
        }
        Command::Run(args) => run(*args).await,
    }
}

fn init_logging(args: &Args) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    init_logging(&args);
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or $KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));

    let jobs = Arc::new(std::sync::OnceLock::new());
    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding {}", args.http_addr))?;
    info!(addr = %args.http_addr, "serving /metrics, /healthz, /readyz");
    let state = ServerState {
        metrics: metrics.clone(),
        ready: ready.clone(),
        jobs: jobs.clone(),
    };
    // Followers serve health too.
    let server = tokio::spawn(async move {
        if let Err(e) = server::serve(listener, state, std::future::pending()).await {
            error!(error = %e, "HTTP server failed");
        }
    });

    let settings = Settings::from(&args);

    // Why the controller stops; the shutdown future only waits on a oneshot (Send + Sync).
    let stop_reason = Arc::new(Mutex::new("interrupted"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stop_rx.await;
    };

    if !args.leader_election {
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop_tx.send(());
        });
        ready.store(false, Ordering::Relaxed);
        controller::run(
            client,
            settings,
            args.namespace.clone(),
            metrics,
            ready,
            jobs,
            shutdown,
        )
        .await;
        server.abort();
        info!("stopped");
        return Ok(());
    }

    let lease_namespace = args
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into());
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("ferrotrain-operator-{}", std::process::id()));
    let duration = args.lease_duration_seconds.max(2);
    let manager = LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(&lease_namespace)
        .with_identity(&identity)
        .with_duration(duration)
        .with_grace((duration / 3).max(1))
        .with_field_manager(ferrotrain_operator::labels::FIELD_MANAGER)
        .build()
        .await
        .context("setting up leader election")?;
    let (mut leader, lease_task) = manager.watch().await;
    // A follower is healthy and ready: it only waits.
    ready.store(true, Ordering::Relaxed);
    info!(lease = %args.lease_name, namespace = %lease_namespace, %identity, "waiting to lead");
    while !*leader.borrow_and_update() {
        tokio::select! {
            changed = leader.changed() => changed.context("leader election stopped")?,
            _ = tokio::signal::ctrl_c() => {
                info!("interrupted before leading");
                return Ok(());
            }
        }
    }
    info!(%identity, "leading");
    ready.store(false, Ordering::Relaxed);

    // Lose the lease => stop acting at once and exit, so the pod restarts as a follower.
    let mut lost = leader.clone();
    let reason = stop_reason.clone();
    tokio::spawn(async move {
        let why = tokio::select! {
            _ = async {
                loop {
                    if lost.changed().await.is_err() || !*lost.borrow_and_update() {
                        return;
                    }
                }
            } => "lost the leader lease",
            _ = tokio::signal::ctrl_c() => "interrupted",
        };
        *reason.lock().expect("lock") = why;
        let _ = stop_tx.send(());
    });
    controller::run(
        client,
        settings,
        args.namespace.clone(),
        metrics,
        ready,
        jobs,
        shutdown,
    )
    .await;
    let why = *stop_reason.lock().expect("lock");
    drop(leader);
    let _ = lease_task.await;
    server.abort();
    if why == "interrupted" {
        info!("stopped");
        Ok(())
    } else {
        anyhow::bail!("{why}; exiting so that another replica leads")
    }
}
