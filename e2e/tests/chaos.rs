//! The chaos soak's short version (bench/chaos.sh runs the long one): a 2-pod job of
//! examples/copy-dt.yaml, fixed (no `elastic`), under a seeded schedule of seven fast faults
//! of five kinds (kill -9 and SIGSTOP of a trainer, a launcher killed from the host, a pod
//! deleted, a pod evicted through the API), two of them overlapping (the second while the gang
//! recovers from the first). The job must Succeed; the ledger must tell each fault with its
//! cause and the rank and pod it hit (the pair may be told as one round end) and nothing else;
//! no step may be trained twice beyond the one in flight; the final checkpoint must be on the
//! claim, its model and optimizer byte for byte those of the same job run without faults.
//! What the ledger says the faults cost (its lastStep, lostSteps, goodput against rank 0's
//! step log) is printed in the report's findings, not asserted: bench/chaos.sh fails on it.
//! `CHAOS_SEED` draws another schedule (default 57).

use ferrotrain_e2e::chaos::checks::Class;
use ferrotrain_e2e::chaos::fault::Kind;
use ferrotrain_e2e::chaos::report::{faults_list, report};
use ferrotrain_e2e::chaos::schedule::Mix;
use ferrotrain_e2e::chaos::shape::Shape;
use ferrotrain_e2e::chaos::soak::{commit, soak_shape};

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_fixed_gang_under_seven_faults_ends_in_the_bytes_of_the_run_without_them() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(57);
    let mix = Mix {
        kinds: vec![
            Kind::KillTrainer,
            Kind::StopTrainer,
            Kind::KillLauncher,
            Kind::DeletePod,
            Kind::EvictPod,
        ],
        faults: 7,
        overlaps: 1,
        gap_seconds: (4, 7),
    };
    let run = soak_shape(seed, Shape::parse("2x1").unwrap(), &mix, true).await;
    let runs = [run];
    println!("{}", report(&runs, seed, &commit()));
    println!("{}", faults_list(&runs));
    let run = &runs[0];
    let injected = run
        .chaos
        .events
        .iter()
        .flat_map(|e| &e.faults)
        .filter(|f| f.at.is_some())
        .count();
    // The ledger's accounting (a round's lastStep as last written when node 0's pod goes:
    // its productive time and goodput counted short) is reported above, not asserted here:
    // how the job came through is.
    let handling: Vec<_> = run
        .findings
        .iter()
        .filter(|f| f.class == Class::Handling)
        .collect();
    assert!(
        handling.is_empty(),
        "{} finding(s): {handling:#?}",
        handling.len()
    );
    assert_eq!(run.chaos.skipped, 0, "every fault fit in the job");
    assert!(injected >= 6, "{injected} of 7 faults injected");
    assert_eq!(run.same_bytes(), Some(true));
}
