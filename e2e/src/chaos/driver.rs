//! The soak's view of one running job between and after faults: when the gang trains whole
//! and settled (the next fault may come), when it has recovered from one (trains whole in a
//! round after the one hit, or past the step it was at), and the status read meanwhile (its
//! ledger merged into one history, rank 0's round starts noted as they are seen).

use std::time::{Duration, Instant};

use ferrotrain_api::crd::{DistributedTrainingStatus, Phase};
use ferrotrain_api::recovery::Timestamp;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

use crate::chaos::ledger::{Key, Ledger};
use crate::chaos::observe::{Rank0, Seen, job_pods, job_status, patiently};
use crate::chaos::shape::Shape;
use crate::namespace::TestNamespace;

/// How long the gang may take to train whole again after a fault: a partition waits for
/// Kubernetes to call the node lost (about a minute) and for the replacement.
pub const RECOVERY_LIMIT: Duration = Duration::from_secs(400);
/// How long the gang must train whole in one round to count as recovered.
const STABLE: Duration = Duration::from_secs(3);
/// Steps before the end after which no fault is injected, beside those the fault itself may
/// train through (the job may finish meanwhile).
const END_MARGIN: u64 = 120;

/// An event about the job.
#[derive(Clone, Debug)]
pub struct JobEvent {
    pub reason: String,
    pub note: String,
    /// How many times it was recorded (a series counts the repeats of one event object).
    pub count: i32,
}

/// One job under the soak.
pub struct Driver<'a> {
    pub ns: &'a TestNamespace,
    pub job: String,
    pub shape: Shape,
    pub max_steps: u64,
    pub rank0: Rank0,
    pub ledger: Ledger,
}

impl<'a> Driver<'a> {
    pub fn new(ns: &'a TestNamespace, job: &str, shape: Shape, max_steps: u64) -> Driver<'a> {
        Driver {
            ns,
            job: job.to_string(),
            shape,
            max_steps,
            rank0: Rank0::new(job),
            ledger: Ledger::default(),
        }
    }

    /// Rank 0's report, its round's first step noted.
    pub async fn seen(&mut self) -> Result<Seen, String> {
        let seen = self.rank0.read(self.ns).await?;
        if let Some(t) = seen.progress.attempt_first_step_time {
            self.ledger.first_step_seen(seen.key(), t);
        }
        Ok(seen)
    }

    /// Whether rank 0 trains with the whole gang in its round (it has stepped in it).
    fn whole(&self, seen: &Seen) -> bool {
        seen.progress.world_size == self.shape.world()
            && seen.progress.attempt_first_step_time.is_some()
    }

    /// Waits until the whole gang trains, every pod of it running, and rank 0 reached `step`;
    /// returns the round and step then. None once the job is within `through` (the steps the
    /// next fault may train through) and [`END_MARGIN`] steps of
    /// its end (no room for a fault and its recovery) or over.
    pub async fn settled(&mut self, step: u64, through: u64) -> Result<Option<(Key, u64)>, String> {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < RECOVERY_LIMIT {
            match self.seen().await {
                Ok(seen) if seen.progress.step + through + END_MARGIN >= self.max_steps => {
                    return Ok(None);
                }
                Ok(seen) if self.whole(&seen) && seen.progress.step >= step => {
                    if self.pods_running().await {
                        return Ok(Some((seen.key(), seen.progress.step)));
                    }
                    last = "a pod of the gang is not running".into();
                }
                Ok(seen) => {
                    last = format!(
                        "round {:?} world size {} step {} (waiting for {step})",
                        seen.key(),
                        seen.progress.world_size,
                        seen.progress.step
                    );
                }
                Err(e) => {
                    let status = job_status(self.ns, &self.job).await;
                    if matches!(status.phase, Phase::Succeeded | Phase::Failed) {
                        return Ok(None);
                    }
                    last = e;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Err(format!(
            "the gang did not train whole within {RECOVERY_LIMIT:?}; last seen: {last}"
        ))
    }

    /// Every pod of the gang's newest attempt runs, none leaving, one per node rank.
    async fn pods_running(&self) -> bool {
        let pods = job_pods(self.ns, &self.job).await;
        let newest = pods.iter().map(|p| p.attempt).max().unwrap_or(0);
        let gang: Vec<_> = pods.iter().filter(|p| p.attempt == newest).collect();
        gang.len() == self.shape.replicas as usize
            && gang.iter().all(|p| p.phase == "Running" && !p.leaving)
    }

    /// Waits until the gang has recovered from a fault that hit round `before` at step `step`:
    /// it trains whole in a later round (`ends_round`), or rank 0 stepped past `step`, and
    /// still does in the same round [`STABLE`] later. Returns that round and rank 0's step.
    pub async fn recovered(
        &mut self,
        before: Key,
        step: u64,
        ends_round: bool,
    ) -> Result<(Key, u64), String> {
        let started = Instant::now();
        let mut last = String::new();
        // (the round, since when it was seen whole)
        let mut whole_since: Option<(Key, Instant)> = None;
        while started.elapsed() < RECOVERY_LIMIT {
            match self.seen().await {
                Ok(seen) => {
                    let done = if ends_round {
                        seen.key() > before && self.whole(&seen)
                    } else {
                        seen.progress.step > step || seen.key() > before
                    };
                    // A fault's effect may come a moment later (a stopped rank is seen frozen
                    // after a second; a second fault of a pair ends the round the first one's
                    // recovery began): recovered is whole in one round for STABLE.
                    match whole_since {
                        Some((key, since)) if done && key == seen.key() => {
                            if since.elapsed() >= STABLE {
                                return Ok((key, seen.progress.step));
                            }
                        }
                        _ => whole_since = done.then(|| (seen.key(), Instant::now())),
                    }
                    last = format!(
                        "round {:?} world size {} step {}",
                        seen.key(),
                        seen.progress.world_size,
                        seen.progress.step
                    );
                }
                Err(e) => {
                    // Rank 0 gone because the job is over: it trained on to its end.
                    let status = job_status(self.ns, &self.job).await;
                    if status.phase == Phase::Succeeded {
                        let key = whole_since.map_or(before, |(key, _)| key);
                        return Ok((key, self.max_steps));
                    }
                    last = e;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "the gang did not recover from the fault on round {before:?} within {RECOVERY_LIMIT:?}; \
             last seen: {last}"
        ))
    }

    /// The job's status now, its ledger merged.
    pub async fn snapshot(&mut self) -> DistributedTrainingStatus {
        let status = job_status(self.ns, &self.job).await;
        if let Some(recovery) = &status.recovery {
            self.ledger.merge(recovery);
        }
        status
    }

    /// The job's status once its ledger has caught up with rank 0 (the operator writes it
    /// every few seconds): every round from `before` up to `after` ended, `after` recorded;
    /// at most 30 s.
    pub async fn caught_up(&mut self, before: Key, after: Key) -> DistributedTrainingStatus {
        let started = Instant::now();
        loop {
            let status = self.snapshot().await;
            let records = &self.ledger.records;
            let ended = records.range(before..after).all(|(_, r)| r.end.is_some());
            if (ended && records.contains_key(&after))
                || started.elapsed() > Duration::from_secs(30)
            {
                return status;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The job's events (events.k8s.io: a repeated event is one object with a series count).
    pub async fn events(&self) -> Vec<JobEvent> {
        let events: Api<Event> = Api::namespaced(self.ns.client.clone(), &self.ns.name);
        let params = ListParams::default();
        let list = patiently("listing events", || events.list(&params))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        list.into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&self.job))
            .map(|e| JobEvent {
                reason: e.reason.unwrap_or_default(),
                note: e.note.unwrap_or_default(),
                count: e.series.map_or(1, |s| s.count),
            })
            .collect()
    }

    /// Waits (at most `limit`) until the job Succeeded or Failed, merging its ledger every few
    /// seconds (it keeps only the last ten rounds); returns its last status.
    pub async fn finished(&mut self, limit: Duration) -> DistributedTrainingStatus {
        let started = Instant::now();
        loop {
            let _ = self.seen().await;
            let status = self.snapshot().await;
            if matches!(status.phase, Phase::Succeeded | Phase::Failed) || started.elapsed() > limit
            {
                return status;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

/// Polls rank 0 (its own reader, beside a fault being injected) every 100 ms for at most
/// `limit`, until it steps past `step`: when it did, and the rounds' first steps it saw.
pub async fn watch_steps(
    mut rank0: Rank0,
    ns: &TestNamespace,
    step: u64,
    limit: Duration,
) -> (Option<Timestamp>, Vec<(Key, Timestamp)>) {
    let started = Instant::now();
    let mut firsts = Vec::new();
    while started.elapsed() < limit {
        if let Ok(seen) = rank0.read(ns).await {
            if let Some(t) = seen.progress.attempt_first_step_time {
                firsts.push((seen.key(), t));
            }
            if seen.progress.step > step {
                return (Some(Timestamp::now()), firsts);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (None, firsts)
}
