//! One shape's soak: the job run without faults (the reference, fixed shapes only: their bytes
//! must match), then the same job under its schedule, each fault injected once the gang trains
//! whole and settled, and followed until the gang trains whole again; what each did is kept
//! for the checks and the report.

use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTrainingStatus, FailureInfo};
use ferrotrain_api::recovery::Timestamp;

use crate::chaos::driver::{Driver, JobEvent, watch_steps};
use crate::chaos::fault::{Fault, Kind};
use crate::chaos::final_state::{self, FinalState};
use crate::chaos::inject::inject;
use crate::chaos::ledger::{Key, Ledger};
use crate::chaos::schedule::{Event, Plan, steps_per_second};
use crate::namespace::TestNamespace;

/// The job's name, the same in both runs (in namespaces of their own).
pub const JOB: &str = "chaos";
/// Its checkpoint claim.
pub const CLAIM: &str = "chaos-checkpoints";

/// A fault as it went.
#[derive(Clone, Debug)]
pub struct FaultOutcome {
    pub fault: Fault,
    /// When it was injected; None when it could not be (see `missed`).
    pub at: Option<Timestamp>,
    /// When it took effect, when later (the kubelet's eviction).
    pub acted: Option<Timestamp>,
    pub pod: Option<String>,
    pub detail: String,
    pub missed: Option<String>,
    /// The round rank 0 trained in when it was injected.
    pub hit: Key,
    /// When rank 0 stepped past the step it was at (training went on through it).
    pub stepped_on: Option<Timestamp>,
    /// Seconds from it (from the eviction, for the kubelet's) to the next step rank 0 completed
    /// after it: the first step of a later round for a fault that ends one, else the next step.
    pub next_step_seconds: Option<f64>,
}

/// One event (a fault, or an overlapping pair) as it went.
#[derive(Clone, Debug)]
pub struct EventOutcome {
    pub index: usize,
    pub faults: Vec<FaultOutcome>,
    /// Rank 0's step and round when it came.
    pub step: u64,
    pub before: Key,
    /// Rank 0's step when the gang was found recovered (the next gap counts from it).
    pub recovered_step: Option<u64>,
    /// The round the gang trained whole in after it; None: it did not (see `stuck`).
    pub after: Option<Key>,
    pub stuck: Option<String>,
    /// `status.lastFailure` and the job's events once it recovered.
    pub last_failure: Option<FailureInfo>,
    pub job_events: Vec<JobEvent>,
}

/// The job under faults.
pub struct ChaosRun {
    pub plan: Plan,
    pub events: Vec<EventOutcome>,
    /// Events not injected: the job neared its end first, or an earlier one never recovered.
    pub skipped: usize,
    pub ledger: Ledger,
    pub status: DistributedTrainingStatus,
    /// The job's events at its end.
    pub job_events: Vec<JobEvent>,
    pub state: Result<FinalState, String>,
    pub seconds: f64,
}

/// The job without faults.
pub struct Reference {
    pub status: DistributedTrainingStatus,
    pub state: Result<FinalState, String>,
    pub seconds: f64,
}

/// How long a job may take to finish: twice its steps at the shape's rate, and 10 minutes.
fn finish_limit(plan: &Plan) -> Duration {
    Duration::from_secs(2 * plan.max_steps / steps_per_second(&plan.shape) + 600)
}

async fn start(prefix: &str, plan: &Plan) -> TestNamespace {
    let ns = TestNamespace::create(prefix).await;
    ns.create_checkpoint_claim(CLAIM).await;
    let spec = plan.shape.spec(JOB, plan.max_steps, CLAIM, plan.faults());
    ns.create_job(JOB, spec).await;
    ns
}

/// The job of `plan` without any fault, to its end.
pub async fn run_reference(plan: &Plan) -> Reference {
    let started = Instant::now();
    let ns = start(&format!("chaos-ref-{}", plan.shape.key()), plan).await;
    let mut driver = Driver::new(&ns, JOB, plan.shape, plan.max_steps);
    let status = driver.finished(finish_limit(plan)).await;
    let state = final_state::read(&ns, JOB, CLAIM).await;
    Reference {
        status,
        state,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The job of `plan` under its faults, to its end.
pub async fn run_chaos(plan: &Plan) -> ChaosRun {
    let started = Instant::now();
    let ns = start(&format!("chaos-{}", plan.shape.key()), plan).await;
    let mut driver = Driver::new(&ns, JOB, plan.shape, plan.max_steps);
    let mut events: Vec<EventOutcome> = Vec::new();
    let mut settle_step = 0;
    let mut skipped = 0;
    for (index, event) in plan.events.iter().enumerate() {
        let through = plan.steps_through(event);
        let settled = match driver.settled(settle_step + event.gap_steps, through).await {
            Ok(Some(settled)) => settled,
            Ok(None) => {
                skipped = plan.events.len() - index;
                break;
            }
            Err(e) => {
                if let Some(last) = events.last_mut() {
                    last.stuck = Some(e);
                }
                skipped = plan.events.len() - index;
                break;
            }
        };
        let outcome = run_event(&mut driver, index, event, settled).await;
        let stuck = outcome.after.is_none();
        tell(plan, &outcome);
        settle_step = outcome.recovered_step.unwrap_or(settled.1);
        events.push(outcome);
        if stuck {
            skipped = plan.events.len() - index - 1;
            break;
        }
    }
    let status = driver.finished(finish_limit(plan)).await;
    let state = final_state::read(&ns, JOB, CLAIM).await;
    let job_events = driver.events().await;
    ChaosRun {
        plan: plan.clone(),
        events,
        skipped,
        ledger: driver.ledger,
        status,
        job_events,
        state,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Injects one event's faults (the second of a pair `overlap_ms` after the first) into the
/// settled gang (round `before`, step `step`), follows it until the gang trains whole again,
/// heals a partition, and reads what the status says.
async fn run_event(
    driver: &mut Driver<'_>,
    index: usize,
    event: &Event,
    (mut before, mut step): (Key, u64),
) -> EventOutcome {
    let shape = driver.shape;
    let mut faults = Vec::new();
    let mut partitions = Vec::new();
    for (j, fault) in event.faults.iter().enumerate() {
        if j > 0 {
            tokio::time::sleep(Duration::from_millis(event.overlap_ms)).await;
        }
        // Where rank 0 is right before it (the settled gang trained on meanwhile).
        let (hit, step_now) = match driver.seen().await {
            Ok(seen) => (seen.key(), seen.progress.step),
            Err(_) => (before, step),
        };
        if j == 0 {
            (before, step) = (hit.max(before), step_now.max(step));
        }
        let watch = watch_steps(
            driver.rank0.clone(),
            driver.ns,
            step_now,
            Duration::from_secs(20),
        );
        let (mut injected, (stepped_on, firsts)) =
            tokio::join!(inject(driver.ns, &driver.job, fault), watch);
        for (key, t) in firsts {
            driver.ledger.first_step_seen(key, t);
        }
        partitions.extend(injected.partition.take());
        let mut fault = *fault;
        fault.node = injected.node_rank.unwrap_or(fault.node);
        faults.push(FaultOutcome {
            fault,
            at: injected.at,
            acted: injected.acted,
            pod: injected.pod,
            detail: injected.detail,
            missed: injected.missed,
            hit,
            stepped_on,
            next_step_seconds: None,
        });
    }
    let injected = faults.iter().filter(|f| f.at.is_some());
    let ends_round = injected
        .clone()
        .any(|f| f.fault.expected(&shape).end.is_some());
    let recovered = driver.recovered(before, step, ends_round).await;
    if !ends_round {
        // A late effect (an operator that restarts the gang once it is back) shows in the window.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let after = match &recovered {
        Ok((key, _)) => Some(driver.seen().await.map_or(*key, |s| s.key())),
        Err(_) => None,
    };
    for (mut partition, held) in partitions {
        let healed = tokio::task::spawn_blocking(move || partition.heal())
            .await
            .expect("healing the partition");
        if let Err(e) = healed {
            eprintln!("  healing the partition: {e}");
        }
        drop(held);
    }
    let status = match after {
        Some(after) => driver.caught_up(before, after).await,
        None => driver.snapshot().await,
    };
    let job_events = driver.events().await;
    for f in &mut faults {
        f.next_step_seconds = next_step_seconds(&driver.ledger, f, before, after);
    }
    EventOutcome {
        index,
        faults,
        step,
        before,
        recovered_step: recovered.as_ref().ok().map(|(_, step)| *step),
        after,
        stuck: recovered.err(),
        last_failure: status.last_failure,
        job_events,
    }
}

/// Seconds from the fault to the next step after it: for a fault that ends a round, the first
/// step of a later round (the kubelet's eviction counted from when it happened, as the ledger
/// says: the write comes a minute or two earlier); else the first step past it.
fn next_step_seconds(
    ledger: &Ledger,
    f: &FaultOutcome,
    before: Key,
    after: Option<Key>,
) -> Option<f64> {
    let at = f.at?;
    let since = if f.fault.kind == Kind::KubeletEvict {
        let to = after.unwrap_or((i64::MAX, u64::MAX));
        let evicted = ledger
            .ends_between(before, to)
            .into_iter()
            .filter_map(|r| r.end.as_ref())
            .find(|e| e.reason == ferrotrain_api::reason::DISRUPTED)
            .map(|e| e.failed_at);
        evicted.or(f.acted).unwrap_or(at)
    } else {
        at
    };
    let next = if f.fault.kind.ends_a_round() {
        ledger.next_first_step(f.hit, since)
    } else {
        f.stepped_on
            .or_else(|| ledger.next_first_step(f.hit, since))
    }?;
    Some(next.duration_since(since).as_secs_f64().max(0.0))
}

/// One line on stderr per event, as it went.
fn tell(plan: &Plan, e: &EventOutcome) {
    let shape = &plan.shape;
    let faults: Vec<String> = e
        .faults
        .iter()
        .map(|f| {
            let what = f.fault.describe(shape);
            match (&f.missed, f.next_step_seconds) {
                (Some(m), _) => format!("{what}: not injected ({m})"),
                (None, Some(s)) => format!("{what} [{}]: next step {s:.2} s after it", f.detail),
                (None, None) => format!("{what} [{}]: no next step seen", f.detail),
            }
        })
        .collect();
    let outcome = match (e.after, &e.stuck) {
        (Some(k), _) => format!("whole again in round {k:?}"),
        (None, Some(why)) => format!("STUCK: {why}"),
        (None, None) => "?".into(),
    };
    eprintln!(
        "[{}] event {}/{} at step {} in round {:?}: {} -> {outcome}",
        shape.key(),
        e.index + 1,
        plan.events.len(),
        e.step,
        e.before,
        faults.join("; then ")
    );
}
