//! The gang state machine: given what the operator observed (the object's spec and status,
//! its pods, rank 0's progress report, the time), decide the next status, the actions and the
//! events. Pure: no client, no async, no clock — every test is a table row.
//!
//! Everything it needs to remember lives in the status it returns (phase, attempt, restarts,
//! condition transition times, progress with its update time) and in the pods' labels
//! (attempt, node rank), so a restarted operator decides exactly as the old one would have.
//!
//! One file per concern, in two layers. [`decide`] takes an [`Observed`] (`observed.rs`) and
//! returns a [`Decision`] (`decision.rs`); `decider.rs` is the conductor: it runs every step
//! of a reconcile in order, top to bottom, and decides what each step's outcome means for the
//! next. The steps are the functions of the policy files, which never call one another:
//! - `lifecycle.rs`: the phases: suspend, resume, a fixed spec, the restart backoff, the
//!   deadline, success, failure, restart or fail, the end of an attempt in the ledger;
//! - `launch.rs`: an attempt's pods, one checkpoint writer at a time, older attempts' pods
//!   deleted, pods stuck on a lost node force-deleted, a launch the API refused or a taken
//!   name stopped (an observation of the last carry-out, retried);
//! - `census.rs`: the current attempt's ranks sorted into running, succeeded, failed, waiting
//!   (and until when) and going away, and their placement;
//! - `in_place.rs`: the rounds the pods' launchers restarted in place, counted as restarts,
//!   and pods replaced alone;
//! - `progress.rs`: rank 0's report in the status, ProgressAvailable, stall detection;
//! - `queue.rs`: condition GangScheduling, phase Queued while a queue holds the pods;
//! - `running.rs`: what phase and condition Running say while pods start and run.
//!
//! Below them, the leaves every policy may use and which use no policy: `draft.rs` (the
//! decision in the making and the facts of the observation), `failure.rs` (what a failure
//! is, and which of several is the cause), `departure.rs` (pods taken away by a
//! disruption), `conditions.rs` (setting a condition), `observed.rs` and `decision.rs`.
//! operator/tests/call_cycles.rs keeps it so: no two files of a folder call each other.
//!
//! The files import each other directly (`super::failure::Failure`), never through this
//! one, so the re-exports below make no import cycle.

mod census;
mod conditions;
mod decider;
mod decision;
mod departure;
mod draft;
mod failure;
mod in_place;
mod launch;
mod lifecycle;
mod observed;
mod progress;
mod queue;
mod running;

pub use conditions::{set_condition, set_condition_to};
pub use decision::{Action, Decision, EventNote};
pub use launch::{LAUNCH_RETRY, launcher_stop_grace_seconds, save_grace_seconds};
pub use lifecycle::backoff;
pub use observed::{
    Disruption, LaunchStop, Observed, PodState, PodView, ProgressObservation, Termination, Timing,
    WaitCause, Waiting,
};

/// Decides the next step. See the module documentation.
pub fn decide(o: &Observed<'_>) -> Decision {
    decider::run(o)
}

#[cfg(test)]
mod tests;
