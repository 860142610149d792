//! bench/restart-speed.sh's cluster half: failures of every kind, N of each, injected into a
//! running copy job of examples/copy-dt.yaml as shipped (its grace, backoff and elastic
//! world size; only the length, the claim, the restart budget and the shape set), in several
//! shapes: 2 pods of 1 rank (the example), 1 pod of 2 ranks (one node of GPUs), 2 pods of 2
//! ranks, 3 pods of 1 rank; and the example's shape at the Multi30k recipe's model size (d 256,
//! 3+3 layers, ffn 512, an 8,000-symbol vocabulary: 6 M parameters, a 72 MB state with the
//! optimizer's moments). For each failure: the time from it to the next step rank 0 completed
//! (its own report), and the steps trained twice (the ledger's lostSteps of the rounds it
//! ended, counted from the ranks' own record), and where the next round's state came from.
//! Prints a Markdown table: p50, p95 and max of each kind, and the steps.
//!
//!   restart-speed [FAILURES] [--only KIND] [SHAPE...]
//!     SHAPE: 2x1, 1x2, 2x2, 3x1, 2x1-multi30k (default every shape at the example's size)
//!     KIND: kill, stop, launcher, delete, evict (default every kind of the shape)

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::crd::Phase;
use ferrotrain_api::recovery::{HealedFrom, Timestamp};
use ferrotrain_e2e::rounds::{RoundStart, ended_round, round_started};
use ferrotrain_e2e::{
    TRAIN_WAIT, TestNamespace, WAIT, copy_job, kill_launcher_from_host, pods_of, rank0_progress,
    signal_local_rank, wait_for, wait_spare, wait_status,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use serde_json::{Value, json};

/// A failure, of pod `node` (and its local rank `local`, for a trainer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// kill -9 of a trainer (a crash, the OOM killer in the container).
    Kill { node: i32, local: usize },
    /// SIGSTOP of a trainer: its launcher sees it frozen.
    Stop { node: i32, local: usize },
    /// kill -9 of the pod's launcher, its first process: the pod fails.
    KillLauncher { node: i32 },
    /// The pod deleted.
    DeletePod { node: i32 },
    /// The pod evicted through the Eviction API (a drain).
    EvictPod { node: i32 },
}

impl Kind {
    fn name(self, procs: i32) -> String {
        let rank = |node: i32, local: usize| node * procs + local as i32;
        match self {
            Kind::Kill { node, local } => format!(
                "kill -9 of rank {}'s trainer (pod {node}, local rank {local})",
                rank(node, local)
            ),
            Kind::Stop { node, local } => format!(
                "SIGSTOP of rank {}'s trainer (pod {node}, local rank {local})",
                rank(node, local)
            ),
            Kind::KillLauncher { node } => format!("kill -9 of pod {node}'s launcher"),
            Kind::DeletePod { node } => format!("pod {node} deleted"),
            Kind::EvictPod { node } => format!("pod {node} evicted"),
        }
    }

    /// The name `--only` takes.
    fn key(self) -> &'static str {
        match self {
            Kind::Kill { .. } => "kill",
            Kind::Stop { .. } => "stop",
            Kind::KillLauncher { .. } => "launcher",
            Kind::DeletePod { .. } => "delete",
            Kind::EvictPod { .. } => "evict",
        }
    }

    fn node(self) -> i32 {
        match self {
            Kind::Kill { node, .. }
            | Kind::Stop { node, .. }
            | Kind::KillLauncher { node }
            | Kind::DeletePod { node }
            | Kind::EvictPod { node } => node,
        }
    }

    /// Whether the failure takes a pod away: the others train on without it, then grow back.
    fn takes_a_pod(self) -> bool {
        matches!(
            self,
            Kind::KillLauncher { .. } | Kind::DeletePod { .. } | Kind::EvictPod { .. }
        )
    }
}

/// A job shape and the failures it is measured with.
struct Shape {
    /// As given on the command line (2x1, ...).
    key: String,
    name: &'static str,
    replicas: i32,
    procs: i32,
    multi30k: bool,
    kinds: Vec<Kind>,
}

fn shape(name: &str) -> Shape {
    use Kind::*;
    let (replicas, procs, multi30k) = match name {
        "2x1" => (2, 1, false),
        "1x2" => (1, 2, false),
        "2x2" => (2, 2, false),
        "3x1" => (3, 1, false),
        "2x1-multi30k" => (2, 1, true),
        other => panic!("unknown shape {other} (2x1, 1x2, 2x2, 3x1, 2x1-multi30k)"),
    };
    let kill = |node, local| Kill { node, local };
    let kinds = match (replicas, procs) {
        (2, 1) => vec![
            kill(1, 0),
            kill(0, 0),
            Stop { node: 1, local: 0 },
            KillLauncher { node: 1 },
            DeletePod { node: 1 },
            EvictPod { node: 1 },
            DeletePod { node: 0 },
        ],
        // One pod: no survivor when it goes; its launcher killed or the pod deleted starts
        // again from the checkpoint.
        (1, 2) => vec![
            kill(0, 1),
            kill(0, 0),
            Stop { node: 0, local: 1 },
            KillLauncher { node: 0 },
            DeletePod { node: 0 },
        ],
        (2, 2) => vec![
            kill(1, 1),
            kill(1, 0),
            kill(0, 1),
            kill(0, 0),
            Stop { node: 1, local: 1 },
            KillLauncher { node: 1 },
            DeletePod { node: 1 },
            DeletePod { node: 0 },
        ],
        _ => vec![
            kill(2, 0),
            kill(0, 0),
            Stop { node: 1, local: 0 },
            KillLauncher { node: 2 },
            DeletePod { node: 2 },
        ],
    };
    Shape {
        key: name.to_string(),
        name: shape_name(name),
        replicas,
        procs,
        multi30k,
        kinds,
    }
}

fn shape_name(name: &str) -> &'static str {
    match name {
        "2x1" => "2 pods x 1 rank",
        "1x2" => "1 pod x 2 ranks",
        "2x2" => "2 pods x 2 ranks",
        "3x1" => "3 pods x 1 rank",
        _ => "2 pods x 1 rank, Multi30k-sized model",
    }
}

/// One failure's outcome.
struct Outcome {
    seconds: f64,
    /// Steps trained twice: of the round it ended (and of the smaller round after it, for a
    /// failure that takes a pod away).
    lost: u64,
    healed_from: Option<HealedFrom>,
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let failures: usize = args
        .next()
        .map(|n| n.parse().expect("the number of failures of each kind"))
        .unwrap_or(10);
    let mut only = None;
    let mut names = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--only" {
            only = Some(args.next().expect("--only KIND"));
        } else {
            names.push(arg);
        }
    }
    let names = if names.is_empty() {
        ["2x1", "1x2", "2x2", "3x1"].map(String::from).to_vec()
    } else {
        names
    };
    let mut rows = Vec::new();
    for name in &names {
        let mut shape = shape(name);
        if let Some(kind) = &only {
            shape.kinds.retain(|k| k.key() == kind);
        }
        let outcomes = run_shape(&shape, failures).await;
        rows.extend(
            outcomes
                .into_iter()
                .map(|(kind, list)| (shape.name, kind.name(shape.procs), list)),
        );
    }
    println!(
        "\n| shape | failure | n | next step after it: p50 | p95 | max | state from | steps trained twice: total | max |\n|---|---|---|---|---|---|---|---|---|"
    );
    for (shape, kind, list) in rows {
        let mut seconds: Vec<f64> = list.iter().map(|o| o.seconds).collect();
        seconds.sort_by(f64::total_cmp);
        let pick = |q: f64| seconds[((seconds.len() - 1) as f64 * q).round() as usize];
        let from: std::collections::BTreeSet<String> = list
            .iter()
            .map(|o| o.healed_from.map_or("-".into(), |h| format!("{h:?}")))
            .collect();
        let lost: Vec<u64> = list.iter().map(|o| o.lost).collect();
        println!(
            "| {shape} | {kind} | {} | {:.2} s | {:.2} s | {:.2} s | {} | {} | {} |",
            seconds.len(),
            pick(0.5),
            pick(0.95),
            seconds[seconds.len() - 1],
            from.into_iter().collect::<Vec<_>>().join(", "),
            lost.iter().sum::<u64>(),
            lost.iter().max().copied().unwrap_or(0),
        );
    }
}

/// The job's spec for `shape`.
fn spec(shape: &Shape, failures: usize) -> Value {
    let mut spec = copy_job(shape.replicas, 100_000_000, Some("speed-checkpoints"));
    spec["procsPerReplica"] = json!(shape.procs);
    // Failures (kills) spend the budget; disruptions do not.
    spec["restartPolicy"]["maxRestarts"] = json!(shape.kinds.len() * failures + 5);
    if shape.multi30k {
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

/// Every kind of `shape`, `failures` times each, in one job: the outcomes by kind.
async fn run_shape(shape: &Shape, failures: usize) -> BTreeMap<Kind, Vec<Outcome>> {
    let ns = TestNamespace::create(&format!("speed-{}", shape.key)).await;
    ns.create_checkpoint_claim("speed-checkpoints").await;
    ns.create_job("speed", spec(shape, failures)).await;
    wait_status(&ns.jobs(), "speed", "Running", TRAIN_WAIT, |s| {
        s.phase == Phase::Running && s.progress.as_ref().is_some_and(|p| p.report.step > 0)
    })
    .await;
    let mut outcomes: BTreeMap<Kind, Vec<Outcome>> = BTreeMap::new();
    for n in 0..failures {
        for &kind in &shape.kinds {
            let outcome = fail_once(&ns, shape, kind).await;
            eprintln!(
                "{}: {} #{}: next step {:.2} s later from {:?}, {} step(s) trained twice",
                shape.name,
                kind.name(shape.procs),
                n + 1,
                outcome.seconds,
                outcome.healed_from,
                outcome.lost
            );
            outcomes.entry(kind).or_default().push(outcome);
        }
    }
    let _ = ns.jobs().delete("speed", &Default::default()).await;
    outcomes
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
/// the next step and the steps trained twice. Leaves the gang whole again.
async fn fail_once(ns: &TestNamespace, shape: &Shape, kind: Kind) -> Outcome {
    let whole = (shape.replicas * shape.procs) as u32;
    let (round, _) = wait_for("the whole gang stepping", WAIT, || async {
        let (round, world) = rank0_round(ns).await;
        (
            (world == whole).then_some((round, world)),
            format!("round {round} world {world}"),
        )
    })
    .await;
    let pods: Api<Pod> = ns.pods();
    let victim = format!("speed-0-{}", kind.node());
    if matches!(kind, Kind::Kill { .. } | Kind::Stop { .. }) {
        // The killed rank's agent has its spare for the next round (as in a round that
        // trained for a while).
        wait_spare(&pods, &victim).await;
    } else {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let at = Timestamp::now();
    inject(ns, kind, &victim).await;
    let next: RoundStart = round_started(ns, "speed-0-0", round + 1).await;
    // The ledger keeps the last 10 records: each failure's are read while they are there.
    let mut lost = lost_in(ns, round, &next).await;
    if kind.takes_a_pod() && next.world_size < whole {
        // Trains on without it, then grows back with the replacement.
        let grown = round_started(ns, "speed-0-0", next.round + 1).await;
        lost += lost_in(ns, next.round, &grown).await;
    }
    Outcome {
        seconds: next.seconds_after(at),
        lost,
        healed_from: next.healed_from,
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
        if record.first_step_at.is_none() {
            eprintln!(
                "  round {round} ended before its first step: {:?}",
                record.end
            );
        }
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
        Kind::Kill { local, .. } => {
            signal_local_rank(&pods, victim, Some(local), "KILL").await;
        }
        Kind::Stop { local, .. } => {
            signal_local_rank(&pods, victim, Some(local), "STOP").await;
        }
        Kind::KillLauncher { .. } => {
            let uid = pods_of(&pods, "speed")
                .await
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some(victim))
                .and_then(|p| p.metadata.uid)
                .expect("the victim's pod");
            kill_launcher_from_host(&uid);
        }
        Kind::DeletePod { .. } => {
            pods.delete(victim, &Default::default())
                .await
                .expect("delete");
        }
        Kind::EvictPod { .. } => {
            pods.evict(victim, &EvictParams::default())
                .await
                .expect("evict");
        }
    }
}
