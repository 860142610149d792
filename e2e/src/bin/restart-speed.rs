//! bench/restart-speed.sh's cluster half: kill -9 of the trainer process of rank 1 in a 2-pod
//! copy job, N times, and the time from each kill to the next completed training step (rank
//! 0's own report: the first step of the new round or attempt), with in-place restarts
//! (restartPolicy.inPlace: true, the default; with the spare trainers of launch/spare.rs and
//! without them) and without (the whole gang recreated). Prints
//! a Markdown table with the median and the max of each.

use std::time::Duration;

use ferrotrain_api::crd::Phase;
use ferrotrain_api::recovery::Timestamp;
use ferrotrain_e2e::{
    TRAIN_WAIT, TestNamespace, WAIT, copy_job, rank0_progress, signal_trainer, wait_for,
    wait_spare, wait_status,
};
use serde_json::json;

/// How the job restarts.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// In place, the next round's ranks the spares that waited (the default).
    InPlace,
    /// In place, every round's ranks new processes (FERROTRAIN_SPARE_RANKS=false).
    NoSpares,
    /// The whole gang recreated (restartPolicy.inPlace: false).
    WholeGang,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::InPlace => "in place (same pods, spare trainers)",
            Mode::NoSpares => "in place, no spares (new processes)",
            Mode::WholeGang => "whole gang (new pods)",
        }
    }

    fn in_place(self) -> bool {
        self != Mode::WholeGang
    }
}

#[tokio::main]
async fn main() {
    let repeats: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("the number of kills"))
        .unwrap_or(5);
    let mut rows = Vec::new();
    for mode in [Mode::InPlace, Mode::NoSpares, Mode::WholeGang] {
        rows.push((mode, kills(mode, repeats).await));
    }
    println!(
        "\n| restart | kills | next step after the kill: median | max | each |\n|---|---|---|---|---|"
    );
    for (mode, mut s) in rows {
        s.sort_by(f64::total_cmp);
        let each: Vec<String> = s.iter().map(|v| format!("{v:.2}")).collect();
        println!(
            "| {} | {} | {:.2} s | {:.2} s | {} |",
            mode.name(),
            s.len(),
            s[s.len() / 2],
            s[s.len() - 1],
            each.join(", ")
        );
    }
}

/// Seconds from each kill to the next step, `repeats` kills in one job.
async fn kills(mode: Mode, repeats: usize) -> Vec<f64> {
    let in_place = mode.in_place();
    let ns = TestNamespace::create(match mode {
        Mode::InPlace => "speed-inplace",
        Mode::NoSpares => "speed-nospare",
        Mode::WholeGang => "speed-gang",
    })
    .await;
    ns.create_checkpoint_claim("speed-checkpoints").await;
    let mut spec = copy_job(2, 10_000_000, Some("speed-checkpoints"));
    spec["restartPolicy"] = json!({"maxRestarts": repeats + 2, "backoffSeconds": 0, "maxBackoffSeconds": 0, "inPlace": in_place});
    if mode == Mode::NoSpares {
        spec["podTemplate"]["env"] = json!([{"name": "FERROTRAIN_SPARE_RANKS", "value": "false"}]);
    }
    ns.create_job("speed", spec).await;
    let mut seconds = Vec::new();
    for kill in 0..repeats {
        let attempt_and_round =
            |s: &ferrotrain_api::crd::DistributedTrainingStatus| (s.attempt, s.round);
        let settled = wait_status(&ns.jobs(), "speed", "Running, stepping", TRAIN_WAIT, |s| {
            s.phase == Phase::Running && s.restarts == kill as i32
        })
        .await;
        let before = attempt_and_round(&settled);
        let rank0 = format!("speed-{}-0", before.0);
        // Past the current round's first step, so the next first step is the restart's.
        wait_for("rank 0 stepping", WAIT, || async {
            let p = rank0_progress(&ns.client, &ns.name, &rank0).await;
            let ok = p
                .as_ref()
                .is_ok_and(|p| p.attempt_first_step_time.is_some());
            (ok.then_some(()), format!("{p:?}"))
        })
        .await;
        let victim = format!("speed-{}-1", before.0);
        if mode == Mode::InPlace {
            // A failure past a round's first seconds: the next round's spare trainers wait.
            wait_spare(&ns.pods(), &victim).await;
        } else {
            // As long into the round as a spare would take.
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        let killed_at = Timestamp::now();
        signal_trainer(&ns.pods(), &victim, "KILL").await;
        let first = wait_for("the next step after the kill", TRAIN_WAIT, || async {
            let status = ns.jobs().get("speed").await.ok().and_then(|d| d.status);
            let attempt = status.as_ref().map_or(before.0, |s| s.attempt);
            let pod = format!("speed-{attempt}-0");
            match rank0_progress(&ns.client, &ns.name, &pod).await {
                Ok(p) => {
                    let next = p
                        .attempt_first_step_time
                        .filter(|t| *t > killed_at)
                        .filter(|_| attempt > before.0 || p.round > before.1 as u64);
                    (next, format!("attempt {attempt} round {}", p.round))
                }
                Err(e) => (None, e),
            }
        })
        .await;
        let took = first.duration_since(killed_at).as_secs_f64();
        eprintln!(
            "{}: kill {} -> next step after {took:.2} s",
            mode.name(),
            kill + 1
        );
        seconds.push(took);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    seconds
}
