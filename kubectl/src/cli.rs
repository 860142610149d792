//! The command line: one clap definition, which the completion scripts and the man page are
//! generated from too (src/generate.rs). The connection flags are kubectl's own.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// kubectl ferrotrain: submit DistributedTraining jobs, watch them train, read every rank's
/// output (the replaced rounds' too) and account for each recovery.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-ferrotrain",
    bin_name = "kubectl ferrotrain",
    version,
    after_help = "Exit codes: 0 success (watch: the job Succeeded); 1 the job Failed (watch); \
                  2 a command-line error; 3 any other error (the API server, a job not found, \
                  an object refused)."
)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,
    /// After the command, print to stderr the API requests it made, by kind, and their rate.
    #[arg(long, global = true, help_heading = "Global options")]
    pub stats: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Which cluster, as user and namespace: kubectl's flags, with kubectl's defaults
/// ($KUBECONFIG or ~/.kube/config, its current context and that context's namespace).
#[derive(Clone, Debug, Default, Args)]
#[command(next_help_heading = "Connection (as kubectl's)")]
pub struct Connection {
    /// Path to the kubeconfig file to use.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The name of the kubeconfig user to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// The namespace; default: the context's.
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a trainer config or a DistributedTraining against the CRD's schema, then create
    /// the job.
    Submit(SubmitArgs),
    /// A live view of a job until it ends: progress, rate, ETA, loss and evaluation, world
    /// size, restarts and rounds, the last failure and what its recovery cost.
    Watch(WatchArgs),
    /// Every rank's output merged in time order, `[round.rank]` before each line; or one
    /// rank's, or one round's (also a round that was replaced).
    Logs(LogsArgs),
    /// The recovery ledger: each attempt and round, what ended it, the rank blamed, the times
    /// to detect and to the next step, the steps trained twice, where the state came from.
    Recovery(RecoveryArgs),
    /// The jobs with their phase, progress and ETA.
    List(ListArgs),
    /// Stop a job: its pods are deleted (spec.suspend: true).
    Suspend(NameArg),
    /// Start a suspended job again, from its latest checkpoint (spec.suspend: false).
    Resume(NameArg),
    /// Delete a job and its pods.
    Delete(NameArg),
    /// Print a shell completion script.
    Completion(CompletionArgs),
    /// Print the man page (roff), or write one per command into a directory.
    Man(ManArgs),
}

/// The job a command acts on.
#[derive(Debug, Args)]
pub struct NameArg {
    /// The DistributedTraining's name.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// A trainer config (what `ferrotrain run --config` takes) or a DistributedTraining
    /// manifest; `-` reads stdin. Other objects in the file are left to `kubectl apply`.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    /// metadata.name; default: the manifest's, or the trainer config file's name.
    #[arg(long)]
    pub name: Option<String>,
    /// spec.replicas: pods in the gang (default for a trainer config: 1).
    #[arg(long)]
    pub replicas: Option<i64>,
    /// spec.procsPerReplica: ranks per pod.
    #[arg(long)]
    pub procs: Option<i64>,
    /// spec.gpusPerReplica: GPUs per pod.
    #[arg(long)]
    pub gpus: Option<i64>,
    /// spec.checkpoint.claimName: the PersistentVolumeClaim that keeps the checkpoints.
    #[arg(long, value_name = "CLAIM")]
    pub claim: Option<String>,
    /// spec.image: the trainer image.
    #[arg(long)]
    pub image: Option<String>,
    /// client: print the object once it passes the local checks; server: have the API server
    /// check it too (nothing is created either way).
    #[arg(long, value_enum, value_name = "WHERE")]
    pub dry_run: Option<DryRun>,
    /// Watch the job once it is created (as `watch` does).
    #[arg(long)]
    pub watch: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    Client,
    Server,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The DistributedTraining's name.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The DistributedTraining's name.
    pub name: String,
    /// Only this global rank's lines.
    #[arg(long)]
    pub rank: Option<usize>,
    /// Only this round's lines (of the current attempt), also once it was replaced.
    #[arg(long, conflicts_with = "previous")]
    pub round: Option<u64>,
    /// The round before the current one: the output of the ranks the last in-place restart
    /// replaced.
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Keep printing new lines as the ranks write them.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only the last N lines (before following).
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
}

#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// The DistributedTraining's name.
    pub name: String,
    /// The ledger as a table, or status.recovery as it is.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The jobs of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write kubectl-ferrotrain.1 and a page per command (kubectl-ferrotrain-watch.1, ...)
    /// into this directory instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn connection_flags_go_anywhere_as_kubectl_s_do() {
        let cli = Cli::try_parse_from([
            "kubectl-ferrotrain",
            "watch",
            "copy",
            "-n",
            "ml",
            "--context",
            "kind",
            "--stats",
        ])
        .unwrap();
        assert_eq!(cli.connection.namespace.as_deref(), Some("ml"));
        assert_eq!(cli.connection.context.as_deref(), Some("kind"));
        assert!(cli.stats);
        assert!(matches!(cli.command, Command::Watch(ref w) if w.name == "copy"));
    }

    #[test]
    fn a_round_and_previous_exclude_each_other() {
        let parsed =
            Cli::try_parse_from(["k", "logs", "copy", "--round", "0", "--previous"]).map(|_| ());
        assert!(parsed.is_err());
        let cli =
            Cli::try_parse_from(["k", "logs", "copy", "--round", "0", "--rank", "1"]).unwrap();
        let Command::Logs(logs) = cli.command else {
            panic!("logs")
        };
        assert_eq!((logs.round, logs.rank), (Some(0), Some(1)));
    }
}
