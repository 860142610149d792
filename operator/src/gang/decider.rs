//! The conductor: the order of every decision of a reconcile, top to bottom. Each step is a
//! function of the policy file it belongs to; those files never call one another, only the
//! leaves below them (`draft.rs`, `failure.rs`, `departure.rs`, `conditions.rs`), and
//! whatever one step's outcome means for the next is decided here.

use std::time::Duration;

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{Phase, condition};
use ferrotrain_api::reason;

use super::census::{self, Census};
use super::decision::{Action, Decision};
use super::draft::Draft;
use super::failure::root_cause;
use super::launch::{self, Launched};
use super::observed::{Observed, PodState, PodView, ProgressObservation};
use super::{in_place, lifecycle, progress, queue, running};

/// The decision for what `o` observed.
pub(super) fn run(o: &Observed<'_>) -> Decision {
    let mut d = Draft::new(o);
    census::record_placement(&mut d);
    // Pods of a newer attempt than the status knows: the status we read predates our own
    // write. Acting on it would double-count a restart; wait for the fresh status.
    if o.pods.iter().any(|p| p.attempt > o.status.attempt) {
        return Decision {
            status: o.status.clone(),
            actions: Vec::new(),
            events: Vec::new(),
            requeue_after: Some(Duration::from_secs(1)),
            restarts_left: d.budget().left(),
        };
    }
    match d.status.phase {
        Phase::Failed if lifecycle::invalid_spec_changed(&d) => {
            lifecycle::reopen(&mut d);
            if o.spec.suspend {
                lifecycle::suspend(&mut d);
            } else {
                active(&mut d);
            }
        }
        Phase::Succeeded | Phase::Failed => lifecycle::finished(&mut d),
        _ if o.spec.suspend => lifecycle::suspend(&mut d),
        Phase::Suspended => {
            lifecycle::resume(&mut d);
            active(&mut d);
        }
        _ => active(&mut d),
    }
    if !matches!(d.status.phase, Phase::Succeeded | Phase::Failed) {
        queue::gang_condition(&mut d);
    }
    queue::admission_seen(&mut d);
    census::record_placement(&mut d);
    launch::clean_up_old_attempts(&mut d);
    launch::force_delete_stuck(&mut d);
    census::count_replicas(&mut d);
    d.into_decision()
}

/// Pending, Starting, Running or Restarting: the deadline, then the backoff, then the launch,
/// then what the census of the attempt's ranks says.
fn active(d: &mut Draft<'_, '_>) {
    if lifecycle::deadline_passed(d) {
        return;
    }
    if d.status.phase == Phase::Restarting && !lifecycle::backoff_over(d) {
        d.stop_current_pods();
        return;
    }
    if d.status.phase == Phase::Pending && !launch(d) {
        return;
    }
    evaluate(d);
}

/// Creates what the attempt lacks; true when every pod exists.
fn launch(d: &mut Draft<'_, '_>) -> bool {
    match launch::launch(d) {
        Launched::All => return true,
        Launched::NotYet { new_attempt } => {
            // What the Running condition said of the last attempt is history (a fresh job
            // has none, and its first status stays as small as before).
            if new_attempt && d.status.condition(condition::RUNNING).is_some() {
                running::pods_starting(d);
            }
        }
        Launched::Fails {
            failure,
            reason,
            event,
        } => lifecycle::fail(d, *failure, reason, event),
        Launched::Node0Waits(message) => match census::node_0_failed_to_start(d) {
            Some(failure) => lifecycle::end_attempt(d, failure),
            None => d.set_condition(condition::CREATED, false, reason::NODE_0_FIRST, message),
        },
    }
    false
}

/// Starting or Running: the census of every rank of the current attempt, and what follows
/// from it: success, the end of the attempt, pods replaced alone, training, or pods starting.
fn evaluate(d: &mut Draft<'_, '_>) {
    let mut c = census::take(d);
    let replicas = d.o.spec.pod_count();
    if c.succeeded == replicas || census::elastic_finished(d, c.rank0) {
        succeed(d, c.rank0, c.succeeded);
        return;
    }
    if d.elastic() && c.rank0.is_some_and(|p| p.state == PodState::Succeeded) {
        // The gang finished; its other pods are ending by themselves.
        return;
    }
    let (failures, suspects) = (
        std::mem::take(&mut c.failures),
        std::mem::take(&mut c.suspects),
    );
    if let Some(failure) = root_cause(failures, suspects) {
        lifecycle::end_attempt(d, failure);
        return;
    }
    // Elastic: enough pods run for the gang to train without the others (their launchers
    // decided so after elastic.waitSeconds); the missing ones wait for capacity.
    let trains_without_some = census::elastic_quorum(d) && !c.replacing.contains(&0);
    if !c.replacing.is_empty() && !trains_without_some {
        in_place::replace_pods(d, &c.replacing, c.gone, c.node0_failed);
    } else if c.running + c.succeeded == replicas || trains_without_some {
        trains(d, &c);
    } else {
        starting(d, &c.waiting);
    }
}

/// The gang trains (every pod, or enough of an elastic gang's): pods gone meanwhile are
/// created again, Running says so, and rank 0's progress is taken in.
fn trains(d: &mut Draft<'_, '_>, c: &Census<'_>) {
    if !c.gone.is_empty() {
        d.actions.push(Action::Launch {
            attempt: d.status.attempt,
            node_ranks: c.gone.clone(),
        });
    }
    running::all_running(d, c.running + c.succeeded);
    track_progress(d, c.rank0);
    d.requeue_in(d.o.timing.progress_interval);
}

/// Some pods do not run yet: held by a queue, or waiting for a reason the status shows.
fn starting(d: &mut Draft<'_, '_>, waiting: &[&PodView]) {
    running::starting(d);
    if !queue::queued(d, waiting) {
        running::waiting(d, waiting);
    }
}

/// Training finished: rank 0's final report taken in, then the job Succeeded.
fn succeed(d: &mut Draft<'_, '_>, rank0: Option<&PodView>, succeeded: i32) {
    let last = rank0.and_then(|p| p.final_report.as_deref());
    if let Some(report) = last {
        count_rounds(d, report);
    }
    progress::finished(d, last);
    lifecycle::succeed(d, succeeded);
}

/// Rank 0's report (or why there is none) into the status, and a stalled gang restarted.
fn track_progress(d: &mut Draft<'_, '_>, rank0: Option<&PodView>) {
    match &d.o.progress {
        ProgressObservation::Report(report) => {
            count_rounds(d, report);
            progress::reported(d, report);
        }
        ProgressObservation::Unavailable(why) => progress::unavailable(d, why, rank0),
        ProgressObservation::NotPolled => {}
    }
    if let Some(failure) = progress::stalled(d) {
        lifecycle::restart_or_fail(d, failure);
    }
}

/// The rounds `report` says ended (each an in-place restart) and the world size it trains at.
fn count_rounds(d: &mut Draft<'_, '_>, report: &Progress) {
    in_place::count_rounds(d, report);
    in_place::world_size(d, report);
}
