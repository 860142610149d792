//! `ferrotrain-operator run` (the controller), `ferrotrain-operator crd` (the CRD YAML) and
//! `ferrotrain-operator render` (the objects of a job, without a cluster).

use anyhow::Context as _;
use clap::Parser;
use ferrotrain_operator::app;
use ferrotrain_operator::config::{Args, Cli, Command, LogFormat};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

/// jemalloc, not glibc's allocator: after a burst of launches glibc kept two thirds of what
/// the leader had allocated (at 100 running jobs: 80 MB taken from the system, 26 MB in use;
/// `malloc_trim` gave 40 MB back), so its resident size grew with every burst it survived.
/// jemalloc returns pages freed for 10 s (its default decay) to the system.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ferrotrain_api::crd::custom_resource_definition_yaml());
            Ok(())
        }
        Command::Run(args) => run(*args).await,
        Command::Render(args) => {
            let text = if args.file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                std::fs::read_to_string(&args.file)
                    .with_context(|| format!("reading {}", args.file.display()))?
            };
            let settings = ferrotrain_operator::config::Settings::from(&args.run);
            let yaml = ferrotrain_operator::render::render(&text, &settings)
                .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
            print!("{yaml}");
            Ok(())
        }
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
    let clients = ferrotrain_operator::client::connect()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or $KUBECONFIG)")?;
    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding {}", args.http_addr))?;
    info!(addr = %args.http_addr, "serving /metrics, /healthz, /readyz");
    // Kubernetes stops a pod with SIGTERM: stop cleanly and release the lease.
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("interrupted"),
            _ = terminate.recv() => info!("terminated"),
        }
    };
    app::run(clients, args, listener, shutdown).await?;
    Ok(())
}
