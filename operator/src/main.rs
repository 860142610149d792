//! `ferrotrain-operator run` (the controller) and `ferrotrain-operator crd` (the CRD YAML).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;
use clap::Parser;
use ferrotrain_operator::config::{Args, Cli, Command, LogFormat, Settings};
use ferrotrain_operator::metrics::Metrics;
use ferrotrain_operator::server::{self, ServerState};
use ferrotrain_operator::controller;
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
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };

    if !args.leader_election {
        controller::run(client, settings, args.namespace.clone(), metrics, ready, jobs.clone(), shutdown)
            .await;
        server.abort();
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

    // Lose the lease => stop acting at once and exit, so the pod restarts as a follower.
    let mut lost = leader.clone();
    let lost_lease = async move {
        loop {
            if lost.changed().await.is_err() || !*lost.borrow_and_update() {
                return;
            }
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<&'static str>();
    let stop_tx = std::sync::Mutex::new(Some(stop_tx));
    let signal = async move {
        let reason = tokio::select! {
            _ = lost_lease => "lost the leader lease",
            _ = shutdown => "interrupted",
        };
        if let Some(tx) = stop_tx.lock().expect("lock").take() {
            let _ = tx.send(reason);
        }
    };
    controller::run(client, settings, args.namespace.clone(), metrics, ready, jobs.clone(), signal).await;
    let reason = stop_rx.await.unwrap_or("controller stopped");
    drop(leader);
    let _ = lease_task.await;
    server.abort();
    if reason == "interrupted" {
        info!("stopped");
        Ok(())
    } else {
        anyhow::bail!("{reason}; exiting so that another replica leads")
    }
}
