//! bench/restart-speed.sh's cluster half: failures of every kind that leave a rank alive, N
//! of each, injected into a running 2-pod job of examples/copy-dt.yaml as shipped (its grace,
//! backoff and elastic world size; only the length, the claim and the restart budget set),
//! at the example's model size and at the Multi30k recipe's (d 256, 3+3 layers, ffn 512, an
//! 8,000-symbol vocabulary: 6 M parameters, a 72 MB state with the optimizer's moments).
//! For each failure: the time from it to the next step rank 0 completed (its own report), and
//! the steps trained twice (the ledger's lostSteps of the round it ended, counted from the
//! ranks' own record). Prints a Markdown table: p50, p95 and max of each kind, and the steps.
//!
//!   restart-speed [FAILURES] [SIZE...]   (SIZE: example, multi30k; default both)

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::crd::Phase;
use ferrotrain_api::recovery::{HealedFrom, Timestamp};
use ferrotrain_e2e::rounds::{RoundStart, ended_round, round_started};
use ferrotrain_e2e::{
    TRAIN_WAIT, TestNamespace, WAIT, copy_job, kill_launcher_from_host, pods_of, rank0_progress,
    signal_trainer, wait_for, wait_spare, wait_status,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use serde_json::{Value, json};

/// A failure that leaves a rank alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// kill -9 of rank 1's trainer (a crash, the OOM killer in the container).
    KillRank1,
    /// kill -9 of rank 0's trainer.
    KillRank0,
    /// kill -9 of rank 1's launcher, the pod's first process: the pod fails.
    KillLauncher,
    /// rank 1's pod deleted.
    DeletePod,
    /// rank 1's pod evicted through the Eviction API (a drain).
    EvictPod,
    /// node 0's pod deleted: it hosts the gang's store, so its replacement must start.
    DeleteNode0,
}

const KINDS: [Kind; 6] = [
    Kind::KillRank1,
    Kind::KillRank0,
    Kind::KillLauncher,
    Kind::DeletePod,
    Kind::EvictPod,
    Kind::DeleteNode0,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::KillRank1 => "kill -9 of rank 1's trainer",
            Kind::KillRank0 => "kill -9 of rank 0's trainer",
            Kind::KillLauncher => "kill -9 of rank 1's launcher (pod fails)",
            Kind::DeletePod => "rank 1's pod deleted",
            Kind::EvictPod => "rank 1's pod evicted",
            Kind::DeleteNode0 => "node 0's pod deleted",
        }
    }

    /// Whether the failure takes a pod away: the other trains on alone, then grows back.
    fn takes_a_pod(self) -> bool {
        matches!(self, Kind::KillLauncher | Kind::DeletePod | Kind::EvictPod)
    }
}

/// (model size, kind, seconds to the next step, steps trained twice) of each failure.
type Row = (String, Kind, Vec<f64>, Vec<u64>);

/// One failure's outcome.
struct Outcome {
    seconds: f64,
    /// Steps trained twice: of the round it ended (and of the smaller round after it, for a
    /// failure that takes a pod away).
    lost: u64,
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let failures: usize = args
        .next()
        .map(|n| n.parse().expect("the number of failures of each kind"))
        .unwrap_or(10);
    let sizes: Vec<String> = args.collect();
    let sizes = if sizes.is_empty() {
        vec!["example".to_string(), "multi30k".to_string()]
    } else {
        sizes
    };
    let mut rows = Vec::new();
    for size in &sizes {
        rows.extend(run_size(size, failures).await);
    }
    println!(
        "\n| model | failure | n | next step after it: p50 | p95 | max | steps trained twice: total | max |\n|---|---|---|---|---|---|---|---|"
    );
    for (size, kind, mut seconds, lost) in rows {
        seconds.sort_by(f64::total_cmp);
        let pick = |q: f64| seconds[((seconds.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {size} | {} | {} | {:.2} s | {:.2} s | {:.2} s | {} | {} |",
            kind.name(),
            seconds.len(),
            pick(0.5),
            pick(0.95),
            seconds[seconds.len() - 1],
            lost.iter().sum::<u64>(),
            lost.iter().max().copied().unwrap_or(0),
        );
    }
}

/// The job's spec at `size`.
fn spec(size: &str, failures: usize) -> Value {
    let mut spec = copy_job(2, 100_000_000, Some("speed-checkpoints"));
    // Failures (kills) spend the budget; disruptions do not.
    spec["restartPolicy"]["maxRestarts"] = json!(KINDS.len() * failures + 5);
    if size == "multi30k" {
        spec["trainer"]["copy"]["symbols"] = json!(7996);
        spec["trainer"]["model"] = json!({
            "dModel": 256, "heads": 4, "encoderLayers": 3, "decoderLayers": 3,
            "ffnDim": 512, "dropout": 0.0, "maxPositions": 32
        });
        spec["resources"] =
            json!({"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}});
    }
    spec
}

/// Every kind, `failures` times each, in one job of `size`: rows (size, kind, seconds, lost).
async fn run_size(size: &str, failures: usize) -> Vec<Row> {
    let ns = TestNamespace::create(&format!("speed-{size}")).await;
    ns.create_checkpoint_claim("speed-checkpoints").await;
    ns.create_job("speed", spec(size, failures)).await;
    wait_status(&ns.jobs(), "speed", "Running", TRAIN_WAIT, |s| {
        s.phase == Phase::Running && s.progress.as_ref().is_some_and(|p| p.report.step > 0)
    })
    .await;
    let mut outcomes: BTreeMap<Kind, Vec<Outcome>> = BTreeMap::new();
    for n in 0..failures {
        for kind in KINDS {
            let outcome = fail_once(&ns, kind).await;
            eprintln!(
                "{size}: {} #{}: next step {:.2} s later, {} step(s) trained twice",
                kind.name(),
                n + 1,
                outcome.seconds,
                outcome.lost
            );
            outcomes.entry(kind).or_default().push(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|(kind, list)| {
            let seconds = list.iter().map(|o| o.seconds).collect();
            let lost = list.iter().map(|o| o.lost).collect();
            (size.to_string(), kind, seconds, lost)
        })
        .collect()
}

/// Rank 0's report: its round and world size.
async fn rank0_round(ns: &TestNamespace) -> (u64, u32) {
    wait_for("rank 0 stepping", WAIT, || async {
        match rank0_progress(&ns.client, &ns.name, "speed-0-0").await {
            Ok(p) => (
                p.attempt_first_step_time.map(|_| (p.round, p.world_size)),
                format!("round {} world {}", p.round, p.world_size),
            ),
            Err(e) => (None, e),
        }
    })
    .await
}

/// Injects one failure of `kind` into the whole gang, once it trains; returns the time to
/// the next step and the round the failure ended. Leaves the gang whole again.
async fn fail_once(ns: &TestNamespace, kind: Kind) -> Outcome {
    let (round, _) = wait_for("the whole gang stepping", WAIT, || async {
        let (round, world) = rank0_round(ns).await;
        (
            (world == 2).then_some((round, world)),
            format!("round {round} world {world}"),
        )
    })
    .await;
    let pods: Api<Pod> = ns.pods();
    let victim = if kind == Kind::KillRank0 || kind == Kind::DeleteNode0 {
        "speed-0-0"
    } else {
        "speed-0-1"
    };
    if matches!(kind, Kind::KillRank0 | Kind::KillRank1) {
        // The killed rank's agent has its spare for the next round (as in a round that
        // trained for a while).
        wait_spare(&pods, victim).await;
    } else {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let at = Timestamp::now();
    inject(ns, kind, victim).await;
    let next: RoundStart = round_started(ns, "speed-0-0", round + 1).await;
    // The ledger keeps the last 10 records: each failure's are read while they are there.
    let mut lost = lost_in(ns, round, &next).await;
    if kind.takes_a_pod() && next.world_size < 2 {
        // Trains on alone, then grows back with the replacement.
        let whole = round_started(ns, "speed-0-0", next.round + 1).await;
        lost += lost_in(ns, next.round, &whole).await;
    }
    Outcome {
        seconds: next.seconds_after(at),
        lost,
    }
}

/// The steps rounds `from`.. trained that were trained again once `next` (the first round
/// after them that stepped) resumed; a round that lost more than the step in flight is
/// printed with its record.
async fn lost_in(ns: &TestNamespace, from: u64, next: &RoundStart) -> u64 {
    let mut total = 0;
    for round in from..next.round {
        let (record, _) = ended_round(ns, "speed", round).await;
        let lost = record.lost_steps.unwrap_or(0);
        if lost > 1 || next.healed_from != Some(HealedFrom::Peers) {
            eprintln!(
                "  round {round} lost {lost} steps: round {} resumed from {:?} ({:?}); {record:?}",
                next.round, next.resumed_from, next.healed_from
            );
        }
        total += lost;
    }
    total
}

async fn inject(ns: &TestNamespace, kind: Kind, victim: &str) {
    let pods: Api<Pod> = ns.pods();
    match kind {
        Kind::KillRank0 | Kind::KillRank1 => {
            signal_trainer(&pods, victim, "KILL").await;
        }
        Kind::KillLauncher => {
            let uid = pods_of(&pods, "speed")
                .await
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some(victim))
                .and_then(|p| p.metadata.uid)
                .expect("rank 1's pod");
            kill_launcher_from_host(&uid);
        }
        Kind::DeletePod | Kind::DeleteNode0 => {
            pods.delete(victim, &Default::default())
                .await
                .expect("delete");
        }
        Kind::EvictPod => {
            pods.evict(victim, &EvictParams::default())
                .await
                .expect("evict");
        }
    }
}
