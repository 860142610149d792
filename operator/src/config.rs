//! The operator's configuration: one clap `Args` struct, every flag with an environment twin
//! (the Helm chart sets the `FERROTRAIN_OPERATOR_*` variables from its values).

use ferrotrain_api::crd::GangScheduler;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::gang::Timing;
use crate::objects::OperatorPods;

/// ferrotrain's Kubernetes operator.
#[derive(Debug, Parser)]
#[command(name = "ferrotrain-operator", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller.
    Run(Box<Args>),
    /// Print the DistributedTraining CustomResourceDefinition as YAML.
    Crd,
    /// Print the objects the operator would create for the first attempt of each
    /// DistributedTraining in a file (a dry run; the same flags as `run` set the trainer
    /// image, ports and the operator's own pods).
    Render(Box<RenderArgs>),
}

/// Flags of `ferrotrain-operator render`.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// A YAML file with one or more DistributedTrainings ("-": standard input), and the
    /// Services their checkpoint stores' endpoints name, if any (for the NetworkPolicy's
    /// egress rule to the store, which the operator builds from the Service it reads).
    #[arg(long, short = 'f')]
    pub file: std::path::PathBuf,
    #[command(flatten)]
    pub run: Args,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The trainer image `scripts/images.sh` builds for this version (the chart passes its own).
pub const DEFAULT_TRAINER_IMAGE: &str = concat!("ferrotrain/trainer:", env!("CARGO_PKG_VERSION"));

/// Every default of the reconciler's settings, written once: the flags, [`Settings::default`]
/// and the state machine's [`Timing`] read them from here.
pub mod defaults {
    pub const MASTER_PORT: u16 = 29500;
    pub const TRAINER_METRICS_PORT: u16 = 9090;
    pub const PROGRESS_INTERVAL_SECONDS: u64 = 5;
    pub const PROGRESS_TIMEOUT_MS: u64 = 2000;
    pub const PROGRESS_GRACE_SECONDS: u64 = 120;
    pub const PROGRESS_WRITE_INTERVAL_SECONDS: u64 = 15;
    pub const NODE_LOST_GRACE_SECONDS: u64 = 60;
    pub const FORCE_DELETE_GRACE_SECONDS: u64 = 60;
}

/// Flags of `ferrotrain-operator run`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Watch DistributedTrainings in this namespace only (default: all namespaces).
    #[arg(long, env = "FERROTRAIN_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,

    /// Image of jobs that do not set spec.image.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_TRAINER_IMAGE",
        default_value = DEFAULT_TRAINER_IMAGE
    )]
    pub trainer_image: String,

    /// Port of rank 0's rendezvous store (MASTER_PORT).
    #[arg(long, env = "FERROTRAIN_OPERATOR_MASTER_PORT", default_value_t = defaults::MASTER_PORT)]
    pub master_port: u16,

    /// Port of rank 0's HTTP server (/progress, /metrics): FERROTRAIN_METRICS_PORT.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_TRAINER_METRICS_PORT",
        default_value_t = defaults::TRAINER_METRICS_PORT
    )]
    pub trainer_metrics_port: u16,

    /// Labels of the operator's own pods, `key=value,...`: each job's NetworkPolicy lets these
    /// pods (in --pod-namespace) reach rank 0's progress port. Empty: the operator's
    /// pods are not known (it runs outside the cluster) and the progress port stays open.
    #[arg(long, env = "FERROTRAIN_OPERATOR_POD_LABELS", value_parser = parse_labels, default_value = "")]
    pub pod_labels: std::collections::BTreeMap<String, String>,

    /// Namespace of the operator's own pods (the Helm chart sets it from the downward API).
    #[arg(long, env = "FERROTRAIN_OPERATOR_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,

    /// Seconds between polls of rank 0's /progress while a job runs.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_PROGRESS_INTERVAL_SECONDS",
        default_value_t = defaults::PROGRESS_INTERVAL_SECONDS
    )]
    pub progress_interval_seconds: u64,

    /// Timeout of one /progress request, in milliseconds.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_PROGRESS_TIMEOUT_MS",
        default_value_t = defaults::PROGRESS_TIMEOUT_MS
    )]
    pub progress_timeout_ms: u64,

    /// Seconds rank 0 may run without serving /progress before the job is reported as having no
    /// progress endpoint (bring-your-own images).
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_PROGRESS_GRACE_SECONDS",
        default_value_t = defaults::PROGRESS_GRACE_SECONDS
    )]
    pub progress_grace_seconds: u64,

    /// Seconds between status writes that only refresh the progress (step, loss, rates): a
    /// running job costs the API server ~4 writes a minute, not one per poll. Every other
    /// change (phase, conditions, a restart) is written at once.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_PROGRESS_WRITE_INTERVAL_SECONDS",
        default_value_t = defaults::PROGRESS_WRITE_INTERVAL_SECONDS
    )]
    pub progress_write_interval_seconds: u64,

    /// Seconds a node may be NotReady before its pods count as lost: in place a pod other than
    /// node 0's is then replaced alone (force-deleted at once: its launcher is fenced); node
    /// 0's pod, or any pod without in-place restarts, restarts the gang.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_NODE_LOST_GRACE_SECONDS",
        default_value_t = defaults::NODE_LOST_GRACE_SECONDS
    )]
    pub node_lost_grace_seconds: u64,

    /// Seconds a pod may stay terminating on a lost node before it is force-deleted.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_FORCE_DELETE_GRACE_SECONDS",
        default_value_t = defaults::FORCE_DELETE_GRACE_SECONDS
    )]
    pub force_delete_grace_seconds: u64,

    /// The gang scheduler of jobs whose spec.scheduling.gangScheduler is unset: kubernetes,
    /// kueue, volcano, coscheduling or none (unset: kueue for jobs naming a queue, else
    /// Kubernetes' own where the API server serves it).
    #[arg(long, env = "FERROTRAIN_OPERATOR_DEFAULT_GANG_SCHEDULER", value_parser = parse_gang_scheduler)]
    pub default_gang_scheduler: Option<GangScheduler>,

    /// Listen address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_HTTP_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub http_addr: SocketAddr,

    /// Elect a leader on a Lease so that only one replica acts.
    #[arg(long, env = "FERROTRAIN_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_LEASE_NAME",
        default_value = "ferrotrain-operator"
    )]
    pub lease_name: String,

    /// Namespace of the Lease (default: the operator pod's namespace, from POD_NAMESPACE).
    #[arg(long, env = "FERROTRAIN_OPERATOR_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Lease duration in seconds: how long a dead leader blocks the others.
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    pub lease_duration_seconds: u64,

    /// This replica's identity in the Lease (default: the pod name, from POD_NAME, or the host
    /// name).
    #[arg(long, env = "FERROTRAIN_OPERATOR_IDENTITY")]
    pub identity: Option<String>,

    /// Log format.
    #[arg(long, env = "FERROTRAIN_OPERATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing-subscriber EnvFilter syntax).
    #[arg(
        long,
        env = "FERROTRAIN_OPERATOR_LOG",
        default_value = "info,kube=warn"
    )]
    pub log: String,
}

/// The settings the reconciler reads, derived from [`Args`].
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// spec.scheduling.gangScheduler of jobs that leave it unset.
    pub default_gang_scheduler: Option<GangScheduler>,
    pub trainer_image: String,
    pub master_port: u16,
    pub trainer_metrics_port: u16,
    pub progress_interval: Duration,
    pub progress_timeout: Duration,
    pub progress_grace: Duration,
    pub progress_write_interval: Duration,
    pub node_lost_grace: Duration,
    pub force_delete_grace: Duration,
    /// The operator's own pods, for the jobs' NetworkPolicies (None: not known).
    pub operator_pods: Option<OperatorPods>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_gang_scheduler: None,
            trainer_image: DEFAULT_TRAINER_IMAGE.into(),
            master_port: defaults::MASTER_PORT,
            trainer_metrics_port: defaults::TRAINER_METRICS_PORT,
            progress_interval: Duration::from_secs(defaults::PROGRESS_INTERVAL_SECONDS),
            progress_timeout: Duration::from_millis(defaults::PROGRESS_TIMEOUT_MS),
            progress_grace: Duration::from_secs(defaults::PROGRESS_GRACE_SECONDS),
            progress_write_interval: Duration::from_secs(defaults::PROGRESS_WRITE_INTERVAL_SECONDS),
            node_lost_grace: Duration::from_secs(defaults::NODE_LOST_GRACE_SECONDS),
            force_delete_grace: Duration::from_secs(defaults::FORCE_DELETE_GRACE_SECONDS),
            operator_pods: None,
        }
    }
}

/// The state machine's knobs are settings too: their defaults are the operator's
/// ([`defaults`], their one home), so the state machine reads no configuration itself.
impl Default for Timing {
    fn default() -> Self {
        Timing::from(&Settings::default())
    }
}

impl From<&Settings> for Timing {
    fn from(s: &Settings) -> Self {
        Timing {
            progress_interval: s.progress_interval,
            progress_grace: s.progress_grace,
            node_lost_grace: s.node_lost_grace,
            force_delete_grace: s.force_delete_grace,
        }
    }
}

/// `kubernetes`, `kueue`, `volcano`, `coscheduling` or `none`, as in the CRD.
fn parse_gang_scheduler(s: &str) -> Result<GangScheduler, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
        format!("unknown gang scheduler {s:?}: kubernetes, kueue, volcano, coscheduling or none")
    })
}

impl From<&Args> for Settings {
    fn from(a: &Args) -> Self {
        Settings {
            default_gang_scheduler: a.default_gang_scheduler,
            trainer_image: a.trainer_image.clone(),
            master_port: a.master_port,
            trainer_metrics_port: a.trainer_metrics_port,
            progress_interval: Duration::from_secs(a.progress_interval_seconds.max(1)),
            progress_timeout: Duration::from_millis(a.progress_timeout_ms.max(1)),
            progress_grace: Duration::from_secs(a.progress_grace_seconds),
            progress_write_interval: Duration::from_secs(a.progress_write_interval_seconds),
            node_lost_grace: Duration::from_secs(a.node_lost_grace_seconds),
            force_delete_grace: Duration::from_secs(a.force_delete_grace_seconds),
            operator_pods: operator_pods(a),
        }
    }
}

/// The operator's pods when both their labels and namespace are known.
fn operator_pods(a: &Args) -> Option<OperatorPods> {
    let namespace = a.pod_namespace.clone().filter(|n| !n.is_empty())?;
    (!a.pod_labels.is_empty()).then(|| OperatorPods {
        namespace,
        labels: a.pod_labels.clone(),
    })
}

/// `key=value,key=value` (empty: none).
fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("{pair:?} is not key=value")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_match_settings_default() {
        let cli = Cli::try_parse_from(["ferrotrain-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(Settings::from(args.as_ref()), Settings::default());
        assert_eq!(Timing::from(&Settings::default()), Timing::default());
        assert!(args.leader_election);
    }

    #[test]
    fn every_flag_has_an_env_twin() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let run = cmd.find_subcommand("run").unwrap();
        for arg in run.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let env = arg
                .get_env()
                .unwrap_or_else(|| panic!("--{id} has no env twin"));
            let expected = format!(
                "FERROTRAIN_OPERATOR_{}",
                id.to_uppercase().replace('-', "_")
            );
            assert_eq!(env.to_str().unwrap(), expected, "--{id}");
        }
    }

    #[test]
    fn leader_election_can_be_switched_off() {
        let cli = Cli::try_parse_from(["ferrotrain-operator", "run", "--leader-election", "false"])
            .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert!(!args.leader_election);
    }
}
