//! The soak's report: per shape (faults, time, goodput, steps trained twice, the bytes, the
//! findings) and per fault kind (how many, the time from each to the next step rank 0
//! completed: p50 and max, the steps trained twice), as Markdown tables.

use std::collections::BTreeMap;

use crate::chaos::checks::Finding;
use crate::chaos::fault::Kind;
use crate::chaos::ledger::Key;
use crate::chaos::run::{ChaosRun, EventOutcome, Reference};
use crate::chaos::schedule::Plan;

/// One shape's soak: the plan, both runs, the findings.
pub struct ShapeRun {
    pub plan: Plan,
    pub chaos: ChaosRun,
    pub reference: Option<Reference>,
    pub findings: Vec<Finding>,
    /// The kit's control-plane processes that died during the run and were started again.
    pub kit_restarts: Vec<String>,
}

impl ShapeRun {
    /// Whether the final bytes matched the reference's: None without a reference.
    pub fn same_bytes(&self) -> Option<bool> {
        let reference = self.reference.as_ref()?;
        let (Ok(a), Ok(b)) = (&reference.state, &self.chaos.state) else {
            return Some(false);
        };
        Some(a.last == b.last && a.model == b.model && a.optimizer == b.optimizer)
    }
}

/// The steps trained twice by the rounds an event ended (the ledger's lostSteps).
fn lost_in(run: &ChaosRun, e: &EventOutcome) -> u64 {
    let to: Key = e.after.unwrap_or((i64::MAX, u64::MAX));
    run.ledger
        .ends_between(e.before, to)
        .iter()
        .map(|r| r.lost_steps.unwrap_or(0))
        .sum()
}

/// The rounds after an event's ends that resumed from the checkpoint.
fn from_checkpoint_in(run: &ChaosRun, e: &EventOutcome) -> usize {
    let to: Key = e.after.unwrap_or((i64::MAX, u64::MAX));
    run.ledger
        .records
        .range((
            std::ops::Bound::Excluded(e.before),
            std::ops::Bound::Included(to),
        ))
        .filter(|(_, r)| r.healed_from == Some(ferrotrain_api::recovery::HealedFrom::Checkpoint))
        .count()
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

fn seconds(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{s:.2} s"))
}

/// A kind's row: faults, their next-step times, steps trained twice, checkpoint reads.
#[derive(Default)]
struct Row {
    faults: usize,
    paired: usize,
    next: Vec<f64>,
    lost: u64,
    from_checkpoint: usize,
}

/// A shape's row: faults, time, goodput, steps trained twice, the bytes, findings.
fn shape_row(run: &ShapeRun) -> String {
    let chaos = &run.chaos;
    let all = chaos.events.iter().flat_map(|e| &e.faults);
    let missed = all.clone().filter(|f| f.at.is_none()).count();
    let injected = all.clone().count() - missed;
    let overlapping = chaos.events.iter().filter(|e| e.faults.len() > 1).count();
    let recovery = chaos.status.recovery.as_ref();
    let reference = run
        .reference
        .as_ref()
        .map_or(String::new(), |r| format!(" ({:.0} s)", r.seconds));
    let goodput = recovery
        .and_then(|r| r.goodput_percent)
        .map_or("-".into(), |g| format!("{g:.1} %"));
    let by_log = chaos
        .state
        .as_ref()
        .map_or("?".into(), |s| s.steps_twice().to_string());
    let by_ledger = recovery.map_or(0, |r| r.lost_steps);
    let bytes = match run.same_bytes() {
        None if run.plan.shape.is_fixed() => "not compared",
        None => "(elastic: not compared)",
        Some(true) => "yes",
        Some(false) => "NO",
    };
    format!(
        "| {} | {injected} ({missed}) | {overlapping} | {} | {:.0} s{reference} | {goodput} | \
         {by_ledger} by the ledger, {by_log} by the step log | {bytes} | {} |\n",
        run.plan.shape.name(),
        chaos.skipped,
        chaos.seconds,
        run.findings.len()
    )
}

/// Each kind's row, and the overlapping pairs'.
fn tally(runs: &[ShapeRun]) -> (BTreeMap<Kind, Row>, Row) {
    let mut kinds: BTreeMap<Kind, Row> = BTreeMap::new();
    let mut pairs = Row::default();
    for chaos in runs.iter().map(|r| &r.chaos) {
        for e in &chaos.events {
            let (lost, reads) = (lost_in(chaos, e), from_checkpoint_in(chaos, e));
            for f in e.faults.iter().filter(|f| f.at.is_some()) {
                let row = kinds.entry(f.fault.kind).or_default();
                row.faults += 1;
                row.paired += usize::from(e.faults.len() > 1);
                row.next.extend(f.next_step_seconds);
                if e.faults.len() == 1 {
                    row.lost += lost;
                    row.from_checkpoint += reads;
                }
            }
            if e.faults.len() > 1 {
                pairs.faults += 1;
                pairs.lost += lost;
                pairs.from_checkpoint += reads;
                pairs
                    .next
                    .extend(e.faults.last().and_then(|f| f.next_step_seconds));
            }
        }
    }
    (kinds, pairs)
}

/// The report of a soak of seed `seed` at `commit`.
pub fn report(runs: &[ShapeRun], seed: u64, commit: &str) -> String {
    let mut out = format!("chaos soak: seed {seed}, commit {commit}\n\n");
    out += "| shape | faults (missed) | overlapping pairs | skipped | wall time (reference) | \
            goodput | steps trained twice | final bytes = no-fault run | findings |\n\
            |---|---|---|---|---|---|---|---|---|\n";
    for run in runs {
        out += &shape_row(run);
    }
    let (mut kinds, mut pairs) = tally(runs);
    out += "\n| fault | n (in pairs) | next step after it: p50 | max | steps trained twice | \
            rounds from the checkpoint |\n|---|---|---|---|---|---|\n";
    let rows = kinds
        .iter_mut()
        .map(|(k, r)| (k.key(), r))
        .chain([("overlapping pair", &mut pairs)]);
    for (kind, row) in rows {
        row.next.sort_by(f64::total_cmp);
        out += &format!(
            "| {kind} | {} ({}) | {} | {} | {} | {} |\n",
            row.faults,
            row.paired,
            seconds(quantile(&row.next, 0.5)),
            seconds(row.next.last().copied()),
            row.lost,
            row.from_checkpoint
        );
    }
    out += "\n(a fault in a pair: its steps and checkpoint reads are on the pair's row, whose next \
            step is the one after its second fault)\n";
    let findings: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            r.findings.iter().map(move |f| {
                let event = f
                    .event
                    .map_or(String::new(), |e| format!(" event {}", e + 1));
                format!(
                    "- [{}{event}, {:?}] {}",
                    r.plan.shape.key(),
                    f.class,
                    f.text
                )
            })
        })
        .collect();
    out += &format!("\nfindings: {}\n{}\n", findings.len(), findings.join("\n"));
    let restarts: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            r.kit_restarts
                .iter()
                .map(move |n| format!("- [{}] {n}", r.plan.shape.key()))
        })
        .collect();
    if !restarts.is_empty() {
        out += &format!(
            "\nthe kit's control plane (not ferrotrain) restarted: {}\n{}\n",
            restarts.len(),
            restarts.join("\n")
        );
    }
    out
}

/// Every fault as it went, one line each.
pub fn faults_list(runs: &[ShapeRun]) -> String {
    let mut out = String::from(
        "| shape | event | step | round | fault | done | next step |\n|---|---|---|---|---|---|---|\n",
    );
    for run in runs {
        for e in &run.chaos.events {
            for f in &e.faults {
                out += &format!(
                    "| {} | {} | {} | {:?} | {} | {} | {} |\n",
                    run.plan.shape.key(),
                    e.index + 1,
                    e.step,
                    f.hit,
                    f.fault.describe(&run.plan.shape),
                    f.missed
                        .as_deref()
                        .map_or(f.detail.clone(), |m| format!("missed: {m}")),
                    seconds(f.next_step_seconds)
                );
            }
        }
    }
    out
}
