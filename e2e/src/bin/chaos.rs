//! bench/chaos.sh's binary: the long chaos soak on the cluster $KUBECONFIG names (the cluster
//! kit, with the operator installed: scripts/e2e.sh --setup-only). For each shape, a seeded
//! schedule of real faults (kill -9 and SIGSTOP of trainers, a launcher killed, pods deleted,
//! evicted through the API and by their kubelet, a pod cut off, the operator's pod deleted, the
//! kit's API server and DNS server down; some overlapping) is injected into the copy job of
//! examples/copy-dt.yaml, which must Succeed with the ledger telling each fault right, no step
//! trained twice beyond the one in flight (but where a checkpoint is read), its final
//! checkpoint kept and, for the fixed shapes, the very bytes of the same job run without
//! faults. Prints the report (Markdown) on stdout, each fault as it goes on stderr; exits 1 on
//! any finding.
//!
//!   chaos [--seed N] [--faults N] [--shapes 2x1,2x2,1x2,3x1] [--kinds kill-trainer,...]
//!         [--overlaps N]

use clap::Parser;
use ferrotrain_e2e::chaos::fault::Kind;
use ferrotrain_e2e::chaos::report::{faults_list, report};
use ferrotrain_e2e::chaos::schedule::Mix;
use ferrotrain_e2e::chaos::shape::Shape;
use ferrotrain_e2e::chaos::soak::{commit, soak_shape};

#[derive(Parser)]
#[command(about = "The chaos soak: seeded real faults in every job shape, checked")]
struct Args {
    /// Seeds the schedule: the same seed, the same faults in the same order on the same targets.
    #[arg(long, env = "CHAOS_SEED", default_value_t = 57)]
    seed: u64,
    /// Faults in all, spread over the shapes.
    #[arg(long, env = "CHAOS_FAULTS", default_value_t = 64)]
    faults: usize,
    /// The shapes: 2x1, 2x2, 1x2 (fixed), 3x1 (elastic, minReplicas 2).
    #[arg(
        long,
        env = "CHAOS_SHAPES",
        value_delimiter = ',',
        default_value = "2x1,2x2,1x2,3x1"
    )]
    shapes: Vec<String>,
    /// The fault kinds (default every kind).
    #[arg(long, env = "CHAOS_KINDS", value_delimiter = ',')]
    kinds: Vec<String>,
    /// Overlapping pairs in each shape's schedule.
    #[arg(long, env = "CHAOS_OVERLAPS", default_value_t = 2)]
    overlaps: usize,
    /// Skip the runs without faults (and the byte comparison): a quicker look at the faults.
    #[arg(long, env = "CHAOS_NO_REFERENCE")]
    no_reference: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let shapes: Vec<Shape> = args
        .shapes
        .iter()
        .map(|s| Shape::parse(s).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let kinds: Vec<Kind> = if args.kinds.is_empty() {
        Kind::ALL.to_vec()
    } else {
        args.kinds
            .iter()
            .map(|k| Kind::parse(k).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    };
    let commit = commit();
    let each = args.faults.div_ceil(shapes.len().max(1));
    let mut runs = Vec::new();
    for shape in shapes {
        let mix = Mix {
            kinds: kinds.clone(),
            faults: each,
            overlaps: args.overlaps,
            gap_seconds: (5, 10),
        };
        runs.push(soak_shape(args.seed, shape, &mix, !args.no_reference).await);
    }
    println!("{}", report(&runs, args.seed, &commit));
    println!("{}", faults_list(&runs));
    if runs.iter().any(|r| !r.findings.is_empty()) {
        std::process::exit(1);
    }
}
