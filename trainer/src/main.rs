//! `ferrotrain`: train (`run`, one rank; `launch`, a local gang), check a config
//! (`validate`), translate with a checkpoint (`translate`) and score translations (`bleu`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use ferrotrain_api::config::Precision;
use ferrotrain_api::{TrainerConfig, env, exit};
use ferrotrain_launch::signals;
use ferrotrain_launch::termination::write_termination_message;
use ferrotrain_trainer::ending::{self, exit_now, leave_end_record, report_error};
use ferrotrain_trainer::error::{Result, TrainError};
use ferrotrain_trainer::{
    bleu, checkpoint, checkpoint_selection, data, decode, distributed, precision, train, translate,
};

#[derive(Parser, Debug)]
#[command(
    name = "ferrotrain",
    version,
    about = "Distributed transformer training on libtorch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one rank of a training job (a single process when started by hand).
    Run(RunArgs),
    /// Start the local ranks of a job and restart them on failure, from the state a surviving
    /// rank left (else the latest checkpoint).
    Launch(ferrotrain_launch::TrainerLaunchArgs),
    /// Check a config file: exit 0 when valid, 2 when invalid, 3 when a data file is missing.
    Validate {
        #[arg(long, env = env::FERROTRAIN_CONFIG)]
        config: PathBuf,
    },
    /// Translate sentences from stdin (one a line) with a checkpoint; write them to stdout.
    Translate(TranslateArgs),
    /// Choose the checkpoint, or the average of checkpoints, to translate with by BLEU on a
    /// validation set (never a test set): writes `<job>/selected.json` for `translate
    /// --selected`.
    Select(SelectArgs),
    /// Corpus BLEU (sacreBLEU 13a, cased) of hypotheses on stdin against a reference file.
    Bleu {
        /// Reference translations, one a line (.gz accepted).
        #[arg(long)]
        reference: PathBuf,
    },
    /// Time all-reduce between the ranks of a gang (started with the env contract: RANK,
    /// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FERROTRAIN_RDZV_TOKEN); rank 0 prints one JSON
    /// line per size. bench/collectives.sh runs it.
    BenchCollective(BenchArgs),
    /// What this machine or pod offers the trainer (libtorch, CUDA devices against those
    /// given, NCCL, NVML, PCI topology, /dev/shm, network interfaces, RDMA, port range) as a
    /// table: exit 0 when nothing found can fail a job here, 1 otherwise.
    Doctor,
    /// Print a page of the reference generated from the code (scripts/gen-reference.sh).
    #[command(hide = true)]
    Reference {
        #[arg(value_enum)]
        page: ReferencePage,
    },
}

/// The pages of docs/reference/ that only this binary can write.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ReferencePage {
    /// docs/reference/cli-ferrotrain.md: every subcommand and flag of `ferrotrain`.
    Cli,
}

/// What heads docs/reference/cli-ferrotrain.md.
const CLI_REFERENCE_SOURCE: &str = "Generated from the clap definition of the `ferrotrain` \
    binary (trainer/src/main.rs, launch/src/args.rs) by `ferrotrain reference cli`, which \
    scripts/gen-reference.sh runs: do not edit. The environment variables are described in \
    [environment.md](environment.md).";

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Buffer sizes in MB (10^6 bytes), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4,16,40,100,400")]
    sizes_mb: Vec<f64>,
    /// Untimed all-reduces before the timed ones, per size.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Timed all-reduces per size (the median is reported).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// `cpu`: the TCP ring; `cuda`: NCCL, on GPU LOCAL_RANK (modulo the visible GPUs).
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The trainer config (YAML).
    #[arg(long, env = env::FERROTRAIN_CONFIG)]
    config: PathBuf,
    /// Job name: checkpoints go to `<checkpoint-dir>/<job>/` (default: the config file's stem).
    #[arg(long, env = env::FERROTRAIN_JOB)]
    job: Option<String>,
    /// Directory holding every job's checkpoints.
    #[arg(long, env = env::FERROTRAIN_CHECKPOINT_DIR, default_value = "runs")]
    checkpoint_dir: PathBuf,
    /// Rank 0 serves /metrics, /progress and /healthz on this port (0 = any free port).
    #[arg(long, env = env::FERROTRAIN_METRICS_PORT)]
    metrics_port: Option<u16>,
}

#[derive(clap::Args, Debug)]
struct SelectArgs {
    /// The job directory (`<checkpoint-dir>/<job>`), or the job in a bucket
    /// (`s3://BUCKET/PREFIX/JOB`: mirrored into ~/.cache/ferrotrain/buckets first; the server
    /// and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    job: PathBuf,
    /// Validation source sentences, one a line (.gz accepted).
    #[arg(long)]
    source: PathBuf,
    /// Their reference translations.
    #[arg(long)]
    reference: PathBuf,
    /// Beam width to decode with (as the final translation will).
    #[arg(long, default_value_t = 4)]
    beam: usize,
    /// Length penalties to choose among (comma-separated, e.g. `0.6,0.8,1,1.2,1.6,2`; see
    /// `translate --length-penalty`): one beam search per candidate is scored under each, at
    /// no extra decoding. Default 1 only: on Multi30k a penalty chosen on val gained 0.4 val
    /// BLEU and lost 1.0 on test (docs/translate.md).
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = parse_length_penalty)]
    length_penalties: Vec<f64>,
    /// Average at most this many checkpoints (the last K and the best K by validation loss).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    max_average: u32,
    /// Source tokens per decoding batch.
    #[arg(long, default_value_t = 4000)]
    max_tokens: usize,
    /// Intra-op threads (default: all cores).
    #[arg(long)]
    threads: Option<i32>,
    /// Precision of the matrix multiplies while decoding (default: the training config's).
    #[arg(long, value_parser = parse_precision)]
    precision: Option<Precision>,
}

#[derive(clap::Args, Debug)]
struct TranslateArgs {
    /// A checkpoint directory (`.../step-00001000`) or a job directory (its newest checkpoint);
    /// either may be in a bucket (`s3://BUCKET/PREFIX/JOB[/step-00001000]`, as `select --job`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Beam width; 1 = greedy.
    #[arg(long, default_value_t = 4)]
    beam: usize,
    /// A beam's hypotheses are ranked by log p / (length + 1)^α: 1 (the default) is the mean
    /// log-probability per token, above 1 favours longer outputs, below 1 shorter ones.
    /// With --selected, the length penalty `ferrotrain select` chose.
    #[arg(long, value_parser = parse_length_penalty)]
    length_penalty: Option<f64>,
    /// Source tokens per decoding batch.
    #[arg(long, default_value_t = 4000)]
    max_tokens: usize,
    /// Intra-op threads (default: all cores).
    #[arg(long)]
    threads: Option<i32>,
    /// Translate with the average of the weights of this many checkpoints: the chosen one
    /// and the complete checkpoints before it in its job directory (as many as there are).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    average: u32,
    /// Translate with the average of the job's checkpoints at these steps (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["average", "selected"])]
    steps: Vec<u64>,
    /// Translate with what `ferrotrain select` chose (`<job>/selected.json`).
    #[arg(long, conflicts_with = "average")]
    selected: bool,
    /// Precision of the matrix multiplies while decoding: auto, fp32, bf16 or fp16 (default:
    /// the training config's).
    #[arg(long, value_parser = parse_precision)]
    precision: Option<Precision>,
}

fn parse_precision(s: &str) -> std::result::Result<Precision, String> {
    s.parse()
}

/// A length penalty α: a number from 0 to 5.
fn parse_length_penalty(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(alpha) if (0.0..=5.0).contains(&alpha) => Ok(alpha),
        _ => Err(format!(
            "{s:?} is not a length penalty (a number from 0 to 5)"
        )),
    }
}

fn init_logging(rank: usize) {
    ferrotrain_launch::logging::init(if rank == 0 { "info" } else { "warn" });
}

/// Threads per rank: the config's, else OMP_NUM_THREADS, else the cores shared by the
/// node's ranks.
fn threads_for(config: &TrainerConfig, local_world_size: usize) -> i32 {
    if let Some(t) = config.threads {
        return t as i32;
    }
    if let Some(t) = std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        return t.max(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_world_size.max(1)).max(1) as i32
}

/// Sets flush-to-zero and denormals-are-zero for this thread and every thread it starts
/// later (libtorch's OpenMP workers inherit it). Once a model is confident, softmax and its
/// gradient produce values below f32's normal range, and x86 computes on those up to 100x
/// slower. This is `torch.set_flush_denormal(True)`, which CPU training commonly sets.
fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    {
        const FTZ: u32 = 1 << 15;
        const DAZ: u32 = 1 << 6;
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr read and write this thread's SSE control register; both
        // flags only change how denormal floats are treated.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            csr |= FTZ | DAZ;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack));
        }
    }
}

fn load_config(path: &Path) -> Result<TrainerConfig> {
    TrainerConfig::load(path).map_err(TrainError::from)
}

/// Trains; returns the signal that stopped the run early (after its checkpoint), if any.
fn run(args: RunArgs) -> std::result::Result<Option<i32>, train::Failure> {
    let rank = distributed::RankEnv::from_env()?;
    init_logging(rank.rank);
    let config = load_config(&args.config)?;
    let threads = threads_for(&config, rank.local_world_size);
    // May start this rank again (same pid) with OpenMP's threads spinning: before anything
    // that an exec would undo or inherit (signal dispositions).
    ferrotrain_trainer::omp::spin_if_the_cores_are_ours(
        config.device,
        rank.local_world_size,
        threads.max(1) as usize,
    );
    // A spare (an in-place restart's next rank, launch/spare.rs) waits here, libtorch loaded,
    // for its round's environment; until then its rank is the launcher's guess.
    let rank = if ferrotrain_launch::spare::become_rank_if_spare().map_err(TrainError::from)? {
        distributed::RankEnv::from_env()?
    } else {
        rank
    };
    signals::install(signals::Mode::ExitUnlessArmed);
    flush_denormals();
    let job = match args.job {
        Some(job) => job,
        None => args
            .config
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "job".into()),
    };
    tch::set_num_threads(threads);
    tch::set_num_interop_threads(1);
    let omp_wait_policy =
        std::env::var(ferrotrain_trainer::omp::WAIT_POLICY).unwrap_or_else(|_| "default".into());
    tracing::info!(
        rank = rank.rank,
        world_size = rank.world_size,
        threads,
        omp_wait_policy = %omp_wait_policy,
        allocator = ferrotrain_trainer::allocator::c_malloc(),
        job = %job,
        "starting"
    );
    let options = train::RunOptions {
        job_dir: args.checkpoint_dir.join(&job),
        metrics_port: args.metrics_port,
        rank,
        config,
    };
    let summary = train::run(&options)?;
    if options.rank.rank == 0 {
        tracing::info!(
            step = summary.step,
            loss = summary.loss.unwrap_or(f64::NAN),
            eval_loss = summary.eval_loss.unwrap_or(f64::NAN),
            eval_bleu = summary.eval_bleu.unwrap_or(f64::NAN),
            checkpoint = summary.last_checkpoint.as_ref().map_or(0, |c| c.step),
            minutes = summary.seconds / 60.0,
            "finished"
        );
    }
    if options.rank.rank == 0 && summary.interrupted_by.is_none() {
        // The final numbers reach the operator here (a launcher adds what only it knows: the
        // rounds, its store's refusals), the refused connections with them.
        let mut report = summary.final_progress.clone();
        report.rejected_connections = ferrotrain_launch::refused::merged(
            ferrotrain_launch::refused::snapshot(),
            &report.rejected_connections,
        );
        write_termination_message(&report.to_termination_message());
    }
    if let Some(signal) = summary.interrupted_by {
        let message = format!(
            "stopped by {} at step {}; checkpoint {} is complete",
            signals::name(signal),
            summary.step,
            summary
                .last_checkpoint
                .as_ref()
                .map_or("none".to_string(), |c| format!("step {}", c.step)),
        );
        tracing::warn!("{message}");
        write_termination_message(&message);
        let end = ferrotrain_api::RankEnd {
            step: Some(summary.step),
            ..ferrotrain_api::RankEnd::new(ferrotrain_api::EndKind::Stopped, message)
        };
        leave_end_record(&end);
    }
    Ok(summary.interrupted_by)
}

fn validate(config: &Path) -> Result<()> {
    let config = load_config(config)?;
    data::preflight_data(&config)?;
    println!("config is valid (digest {})", config.digest());
    Ok(())
}

/// Logging, float settings and threads of a decoding command.
fn start_decoding(threads: Option<i32>) {
    init_logging(0);
    flush_denormals();
    if let Some(t) = threads {
        tch::set_num_threads(t);
    }
}

/// `path` itself, or for an `s3://` URL its local mirror (the job's files and complete
/// checkpoints, fetched into the cache).
fn local_copy(path: &Path) -> Result<PathBuf> {
    if checkpoint::is_bucket_url(path) {
        checkpoint::mirror(path, &[train::CONFIG_FILE, train::VOCAB_FILE])
    } else {
        Ok(path.to_path_buf())
    }
}

fn translate(args: TranslateArgs) -> Result<()> {
    start_decoding(args.threads);
    let (job_dir, dir) = translate::resolve_checkpoint(&local_copy(&args.checkpoint)?)?;
    let job = translate::Job::open(&job_dir)?;
    let chosen = if args.selected {
        Some(checkpoint_selection::read_selection(&job_dir)?.chosen)
    } else {
        None
    };
    // Asked for, else the selection's, else 1.
    let length_penalty = args
        .length_penalty
        .or(chosen.as_ref().map(|c| c.length_penalty))
        .unwrap_or(1.0);
    let (dirs, steps) = if let Some(chosen) = chosen {
        (translate::at_steps(&job, &chosen.steps)?, chosen.steps)
    } else if !args.steps.is_empty() {
        (translate::at_steps(&job, &args.steps)?, args.steps.clone())
    } else {
        translate::newest_before(&job, &dir, args.average as usize)?
    };
    let search = decode::Search {
        beam: args.beam,
        length_penalty,
    };
    let weights = job.weights(&dirs)?;
    let requested = args.precision.unwrap_or(job.config.precision);
    let translator = translate::Translator::new(&job, &weights, requested)?;
    tracing::info!("{}", precision::startup_line(&translator.precision));
    tracing::info!(?steps, job = %job_dir.display(), beam = args.beam, length_penalty, "translating");
    let lines: Vec<String> = std::io::stdin()
        .lock()
        .lines()
        .collect::<std::io::Result<_>>()?;
    let mut out = std::io::stdout().lock();
    for line in translator.translate(&job.vocab, &lines, search, args.max_tokens) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn select_checkpoint(args: SelectArgs) -> Result<()> {
    start_decoding(args.threads);
    let s = checkpoint_selection::select(&checkpoint_selection::Request {
        job_dir: &local_copy(&args.job)?,
        source: &args.source,
        reference: &args.reference,
        beam: args.beam,
        length_penalties: &args.length_penalties,
        max_average: args.max_average as usize,
        max_tokens: args.max_tokens,
        precision: args.precision,
    })?;
    for (c, bleu) in &s.scored {
        println!(
            "{bleu:6.2}  {:<22} lenpen {:<4} steps {:?}",
            c.name, c.length_penalty, c.steps
        );
    }
    println!(
        "selected: {} (steps {:?}), val BLEU {:.2} with beam {}, length penalty {}; written to {}",
        s.chosen.name,
        s.chosen.steps,
        s.val_bleu,
        s.beam,
        s.chosen.length_penalty,
        args.job.join(checkpoint_selection::SELECTED_FILE).display()
    );
    Ok(())
}

fn score_bleu(reference: &Path) -> Result<()> {
    let refs = translate::read_text_lines(reference)?;
    let hyps: Vec<String> = std::io::stdin()
        .lock()
        .lines()
        .collect::<std::io::Result<_>>()?;
    if hyps.len() != refs.len() {
        return Err(TrainError::Data(
            format!(
                "{} hypotheses on stdin but {} references in {}",
                hyps.len(),
                refs.len(),
                reference.display()
            )
            .into(),
        ));
    }
    let b = bleu::corpus_bleu(&hyps, &refs);
    println!(
        "BLEU = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {}) tok:13a case:mixed",
        b.score,
        b.precisions[0],
        b.precisions[1],
        b.precisions[2],
        b.precisions[3],
        b.brevity_penalty,
        b.hyp_len as f64 / b.ref_len.max(1) as f64,
        b.hyp_len,
        b.ref_len
    );
    Ok(())
}

fn bench_collective(args: &BenchArgs) -> Result<()> {
    init_logging(0);
    let device = match args.device.as_str() {
        "cpu" => tch::Device::Cpu,
        "cuda" => {
            let local: usize = std::env::var(env::LOCAL_RANK)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let count = tch::Cuda::device_count().max(1) as usize;
            tch::Device::Cuda(local % count)
        }
        other => {
            return Err(TrainError::Config(
                format!("--device {other}: expected cpu or cuda").into(),
            ));
        }
    };
    let sizes: Vec<u64> = args.sizes_mb.iter().map(|mb| (mb * 1e6) as u64).collect();
    let config = ferrotrain_api::config::DistributedConfig::default();
    ferrotrain_trainer::distributed::bench::run(device, &config, &sizes, args.warmup, args.iters)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => match run(args) {
            // Like a process the signal killed, but with its work saved.
            Ok(Some(signal)) => exit_now((128 + signal).clamp(0, 255) as u8),
            Ok(None) => exit_now(exit::SUCCESS as u8),
            Err(failure) => ending::fail(&failure.error, failure.step),
        },
        Command::Launch(args) => {
            init_logging(0);
            let port = ferrotrain_launch::endpoint::port_from_env();
            let launched = args
                .program()
                .map_err(ferrotrain_launch::LaunchError::io("cannot find own binary"))
                .and_then(|program| ferrotrain_launch::run(args.launch, program, port));
            match launched {
                Ok(code) => return ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    tracing::error!("launch: {e}");
                    write_termination_message(&e.to_string());
                    return ExitCode::from(e.exit_code() as u8);
                }
            }
        }
        Command::Validate { config } => validate(&config),
        Command::Translate(args) => translate(args),
        Command::Select(args) => select_checkpoint(args),
        Command::Bleu { reference } => score_bleu(&reference),
        Command::BenchCollective(args) => bench_collective(&args),
        Command::Reference {
            page: ReferencePage::Cli,
        } => {
            let page = ferrotrain_api::reference::cli::page(&Cli::command(), CLI_REFERENCE_SOURCE);
            print!("{page}");
            Ok(())
        }
        Command::Doctor => {
            let findings =
                ferrotrain_trainer::doctor::findings(&ferrotrain_trainer::doctor::Machine::here());
            print!("{}", ferrotrain_trainer::doctor::table(&findings));
            return ExitCode::from(u8::from(findings.iter().any(|f| !f.ok)));
        }
    };
    match result {
        Ok(()) => ExitCode::from(exit::SUCCESS as u8),
        Err(e) => ExitCode::from(report_error(&e)),
    }
}
