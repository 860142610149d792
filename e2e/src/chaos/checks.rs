//! The soak's checks of one job, on what the run kept (plain data in, findings out): it
//! Succeeded; each fault ended the rounds it should, for the right cause and blaming the right
//! rank and pod (overlapping faults may end one round between them), and nothing else ended a
//! round; no step was trained twice beyond the one in flight, unless the fault is one where a
//! checkpoint is read; the final checkpoint is there; and a fixed shape ends in the very bytes
//! of the run without faults.

use ferrotrain_api::crd::Phase;
use ferrotrain_api::reason;
use ferrotrain_api::recovery::{AttemptRecord, HealedFrom};

use crate::chaos::fault::ExpectedEnd;
use crate::chaos::final_state::{FinalState, first_divergence};
use crate::chaos::ledger::{Key, key_of};
use crate::chaos::run::{ChaosRun, EventOutcome, Reference};
use crate::jobs::CHECKPOINT_EVERY;

/// Something the product did wrong (or the run could not show), with its evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The event (0-based) it is about, if one.
    pub event: Option<usize>,
    pub class: Class,
    pub text: String,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// How the job came through: its end, its rounds, its steps, its checkpoints, its bytes.
    Handling,
    /// What the ledger says it cost (lastStep, lostSteps, productive time, goodput) against
    /// what rank 0's own record shows.
    Accounting,
    /// What people are told (the job's events).
    Telling,
}

fn finding(event: Option<usize>, text: String) -> Finding {
    Finding {
        event,
        class: Class::Handling,
        text,
    }
}

fn accounting(event: Option<usize>, text: String) -> Finding {
    Finding {
        event,
        class: Class::Accounting,
        text,
    }
}

/// Every check of the job under faults (and, for a fixed shape, against its reference).
pub fn check(run: &ChaosRun, reference: Option<&Reference>) -> Vec<Finding> {
    let mut found = Vec::new();
    if run.status.phase != Phase::Succeeded {
        found.push(finding(
            None,
            format!(
                "the job ended {:?}, not Succeeded; lastFailure {:?}",
                run.status.phase, run.status.last_failure
            ),
        ));
    }
    for event in &run.events {
        found.extend(check_event(run, event));
    }
    found.extend(unexplained_ends(run));
    found.extend(trained_twice_by_the_log(run));
    found.extend(stale_rounds(run));
    found.extend(collapsed_events(run));
    found.extend(final_checkpoint(run));
    if let Some(reference) = reference {
        found.extend(same_bytes(run, reference));
    }
    found
}

/// Whether a ledger end is what the fault should have ended its round with.
fn matches(record: &AttemptRecord, expected: &ExpectedEnd) -> bool {
    let Some(end) = &record.end else {
        return false;
    };
    end.reason == expected.reason
        && end.cause == expected.cause
        && end.node_rank == Some(expected.node_rank)
        && (expected.rank.is_none() || end.rank == expected.rank)
}

/// The ends that count for a fault: a round a pod's return ended (`Resized`, an elastic gang
/// growing back) is the recovery, not the fault.
fn fault_ends(run: &ChaosRun, from: Key, to: Key) -> Vec<&AttemptRecord> {
    run.ledger
        .ends_between(from, to)
        .into_iter()
        .filter(|r| r.end.as_ref().is_some_and(|e| e.reason != reason::RESIZED))
        .collect()
}

/// One event's checks: its round ends, the words Kubernetes gave, where the next rounds'
/// state came from and the steps trained twice, and the attempt kept.
fn check_event(run: &ChaosRun, e: &EventOutcome) -> Vec<Finding> {
    let shape = &run.plan.shape;
    let at = Some(e.index);
    let what: Vec<String> = e
        .faults
        .iter()
        .filter(|f| f.at.is_some())
        .map(|f| f.fault.describe(shape))
        .collect();
    let what = what.join(" + ");
    let Some(after) = e.after else {
        let why = e.stuck.clone().unwrap_or_default();
        return vec![finding(
            at,
            format!("{what}: the gang did not recover: {why}"),
        )];
    };
    let mut found = Vec::new();
    let expected: Vec<ExpectedEnd> = e
        .faults
        .iter()
        .filter(|f| f.at.is_some())
        .filter_map(|f| f.fault.expected(shape).end)
        .collect();
    let ends = fault_ends(run, e.before, after);
    let told = |r: &&AttemptRecord| {
        let end = r.end.as_ref().expect("ended");
        format!(
            "round {:?}: {} ({:?}) rank {:?} pod {:?}",
            key_of(r),
            end.reason,
            end.cause,
            end.rank,
            end.node_rank
        )
    };
    let seen: Vec<String> = ends.iter().map(told).collect();
    let count_ok = match expected.len() {
        0 => ends.is_empty(),
        1 => ends.len() == 1,
        // Overlapping faults may be told as one round end.
        n => (1..=n).contains(&ends.len()),
    };
    let each_ok = ends.iter().all(|r| expected.iter().any(|x| matches(r, x)));
    if !count_ok || !each_ok {
        let want: Vec<String> = expected
            .iter()
            .map(|x| {
                format!(
                    "{} ({:?}) rank {:?} pod {}",
                    x.reason, x.cause, x.rank, x.node_rank
                )
            })
            .collect();
        found.push(finding(
            at,
            format!(
                "{what} at step {} in round {:?}: the ledger says {seen:?}; expected {}",
                e.step,
                e.before,
                if want.is_empty() {
                    "no round end".into()
                } else {
                    format!("{want:?}")
                }
            ),
        ));
    }
    found.extend(kubernetes_words(e, &expected, &ends, &what));
    found.extend(steps_trained_twice(run, e, &expected, &ends, &what));
    if after.0 != e.before.0 {
        found.push(finding(
            at,
            format!(
                "{what}: a gang restart (attempt {} -> {})",
                e.before.0, after.0
            ),
        ));
    }
    found
}

/// A disruption Kubernetes gave a reason for is told in its words (`lastFailure` or the job's
/// events).
fn kubernetes_words(
    e: &EventOutcome,
    expected: &[ExpectedEnd],
    ends: &[&AttemptRecord],
    what: &str,
) -> Vec<Finding> {
    let mut found = Vec::new();
    for x in expected {
        let Some(words) = x.words else { continue };
        if !ends.iter().any(|r| matches(r, x)) {
            continue; // absorbed into another fault's round end: told there
        }
        let in_failure = e
            .last_failure
            .as_ref()
            .is_some_and(|f| f.message.contains(words) || f.reason.contains(words));
        let in_events = e.job_events.iter().any(|j| j.note.contains(words));
        if !in_failure && !in_events {
            found.push(finding(
                Some(e.index),
                format!(
                    "{what}: Kubernetes' words {words:?} are neither in lastFailure ({:?}) nor in the \
                     job's events",
                    e.last_failure.as_ref().map(|f| &f.message)
                ),
            ));
        }
    }
    found
}

/// Each round the event ended resumed from its peers and lost at most the step in flight;
/// from the checkpoint only where a fault allows it (the only pod gone), losing at most the
/// steps since it.
fn steps_trained_twice(
    run: &ChaosRun,
    e: &EventOutcome,
    expected: &[ExpectedEnd],
    ends: &[&AttemptRecord],
    what: &str,
) -> Vec<Finding> {
    let mut found = Vec::new();
    let may_read_checkpoint = expected.iter().any(|x| x.from_checkpoint);
    for record in ends {
        let key = key_of(record);
        let lost = record.lost_steps.unwrap_or(0);
        let next = run.ledger.next_stepping(key);
        let from = next.and_then(|n| n.healed_from);
        let allowed = match from {
            Some(HealedFrom::Checkpoint) if may_read_checkpoint => CHECKPOINT_EVERY + 1,
            Some(HealedFrom::Checkpoint) => {
                found.push(finding(
                    Some(e.index),
                    format!(
                        "{what}: round {:?} resumed from the checkpoint at step {:?}, not from its \
                         peers, after round {key:?} reached step {:?}",
                        next.map(key_of),
                        next.and_then(|n| n.resumed_from_step),
                        record.last_step
                    ),
                ));
                CHECKPOINT_EVERY + 1
            }
            _ => 1,
        };
        if lost > allowed {
            found.push(finding(
                Some(e.index),
                format!(
                    "{what}: round {key:?} (last step {:?}) lost {lost} steps; the next resumed from \
                     {:?} ({from:?}): at most {allowed} may be trained twice",
                    record.last_step,
                    next.and_then(|n| n.resumed_from_step)
                ),
            ));
        }
    }
    found
}

/// Every round end in the ledger falls in the window of a fault (from the round it hit to the
/// round the gang trained whole in after it), but the job's own end.
fn unexplained_ends(run: &ChaosRun) -> Vec<Finding> {
    let windows: Vec<(Key, Key)> = run
        .events
        .iter()
        .map(|e| (e.before, e.after.unwrap_or((i64::MAX, u64::MAX))))
        .collect();
    run.ledger
        .records
        .values()
        .filter(|r| r.end.as_ref().is_some_and(|e| e.reason != reason::SUCCEEDED))
        .filter(|r| {
            let key = key_of(r);
            !windows.iter().any(|(from, to)| *from <= key && key < *to)
        })
        .map(|r| {
            let end = r.end.as_ref().expect("ended");
            finding(
                None,
                format!(
                    "round {:?} ended with no fault injected in it: {} ({:?}) rank {:?} pod {:?} at {}",
                    key_of(r),
                    end.reason,
                    end.cause,
                    end.rank,
                    end.node_rank,
                    end.failed_at
                ),
            )
        })
        .collect()
}

/// The step log (rank 0's line per step, appended to across rounds) goes back only after a
/// fault where a checkpoint may be read, by at most the steps since it; and the ledger counts
/// every step it shows trained twice.
fn trained_twice_by_the_log(run: &ChaosRun) -> Vec<Finding> {
    let Ok(state) = &run.state else {
        return Vec::new();
    };
    let shape = &run.plan.shape;
    let mut found = Vec::new();
    for &(last, next) in &state.rewinds {
        let event = run.events.iter().rev().find(|e| e.step <= last);
        let may_read_checkpoint = event.is_some_and(|e| {
            e.faults.iter().filter(|f| f.at.is_some()).any(|f| {
                f.fault
                    .expected(shape)
                    .end
                    .is_some_and(|x| x.from_checkpoint)
            })
        });
        let twice = last + 1 - next;
        if !may_read_checkpoint || twice > CHECKPOINT_EVERY + 1 {
            let after = event.map_or("before any fault".into(), |e| {
                let what: Vec<String> = e.faults.iter().map(|f| f.fault.describe(shape)).collect();
                format!(
                    "after event {} ({}) at step {}",
                    e.index + 1,
                    what.join(" + "),
                    e.step
                )
            });
            found.push(finding(
                event.map(|e| e.index),
                format!(
                    "steps {next}..={last} were trained twice ({twice}), by rank 0's step log, {after}"
                ),
            ));
        }
    }
    let ledger = run.status.recovery.as_ref().map_or(0, |r| r.lost_steps);
    if ledger < state.steps_twice() {
        found.push(accounting(
            None,
            format!(
                "status.recovery.lostSteps says {ledger} steps were trained twice; rank 0's step log \
                 shows {} (it went back at {:?})",
                state.steps_twice(),
                state.rewinds
            ),
        ));
    }
    found
}

/// A round's record reached at least the step the round after it resumed from (its peers'
/// state is that of a step the gang completed in it): a record behind it was left as last
/// written, and its productive time (goodput) and its steps trained twice are counted short.
fn stale_rounds(run: &ChaosRun) -> Vec<Finding> {
    let stale: Vec<String> = run
        .ledger
        .records
        .values()
        .filter(|r| r.end.as_ref().is_some_and(|e| e.reason != reason::SUCCEEDED))
        .filter_map(|r| {
            let last = r.last_step?;
            let next = run.ledger.next_stepping(key_of(r))?;
            let resumed = next.resumed_from_step?;
            (last < resumed && next.healed_from == Some(HealedFrom::Peers)).then(|| {
                format!(
                    "round {:?}: lastStep {last} (seen {:?}), ended {} at {}, the next resumed from \
                     its peers at step {resumed}",
                    key_of(r),
                    r.last_step_at,
                    r.end.as_ref().map_or("", |e| e.reason.as_str()),
                    r.end.as_ref().map_or(String::new(), |e| e.failed_at.to_string())
                )
            })
        })
        .collect();
    if stale.is_empty() {
        return Vec::new();
    }
    vec![accounting(
        None,
        format!(
            "the ledger left {} ended round(s) at a step older than the one the gang reached in \
             them (their productiveSeconds, goodput and lostSteps are counted from it): {stale:?}",
            stale.len()
        ),
    )]
}

/// Each restart in place and each pod replaced is told by an event of its own: one event
/// object counted several times (an events.k8s.io series) keeps only its first note, so the
/// later rounds' pod, rank and cause are told nowhere in the events.
fn collapsed_events(run: &ChaosRun) -> Vec<Finding> {
    let told = [reason::RESTARTED_IN_PLACE, reason::POD_REPLACED];
    let collapsed: Vec<String> = run
        .job_events
        .iter()
        .filter(|e| e.count > 1 && told.contains(&e.reason.as_str()))
        .map(|e| format!("{} x{}: {:?}", e.reason, e.count, e.note))
        .collect();
    let rounds = run
        .ledger
        .records
        .values()
        .filter(|r| {
            r.end
                .as_ref()
                .is_some_and(|e| e.reason != reason::SUCCEEDED)
        })
        .count();
    if collapsed.is_empty() {
        return Vec::new();
    }
    vec![Finding {
        event: None,
        class: Class::Telling,
        text: format!(
            "{rounds} rounds ended, but the job's events keep one note for several of them (a \
             series counts the repeats and shows the first one's pod, rank and cause): {collapsed:?}"
        ),
    }]
}

/// The final checkpoint (of the last step) is on the claim, whole.
fn final_checkpoint(run: &ChaosRun) -> Vec<Finding> {
    let max = run.plan.max_steps;
    match &run.state {
        Err(e) => vec![finding(
            None,
            format!("the job's claim could not be read: {e}"),
        )],
        Ok(state) if state.last != Some(max) => vec![finding(
            None,
            format!(
                "the final checkpoint (step {max}) is not on the claim: it holds {:?}",
                state.checkpoints
            ),
        )],
        Ok(state) if state.model.is_empty() || state.optimizer.is_empty() => vec![finding(
            None,
            format!(
                "the final checkpoint's model or optimizer is empty in {}",
                state.dir.display()
            ),
        )],
        Ok(_) => Vec::new(),
    }
}

/// A fixed shape's final model and optimizer are byte for byte those of the run without
/// faults; where not, the step log says where they parted, and the fault before it.
fn same_bytes(run: &ChaosRun, reference: &Reference) -> Vec<Finding> {
    let mut found = Vec::new();
    if reference.status.phase != Phase::Succeeded {
        found.push(finding(
            None,
            format!("the run without faults ended {:?}", reference.status.phase),
        ));
    }
    let (Ok(theirs), Ok(ours)) = (&reference.state, &run.state) else {
        found.push(finding(
            None,
            "the final checkpoints could not both be read".into(),
        ));
        return found;
    };
    if theirs.last != ours.last {
        found.push(finding(
            None,
            format!(
                "final checkpoints differ: {:?} without faults, {:?} with",
                theirs.last, ours.last
            ),
        ));
        return found;
    }
    let differ: Vec<&str> = [
        ("model.safetensors", theirs.model == ours.model),
        ("optimizer.safetensors", theirs.optimizer == ours.optimizer),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(name, _)| name)
    .collect();
    if !differ.is_empty() {
        found.push(finding(
            parted_at(run, theirs, ours).0,
            format!(
                "{differ:?} of step {:?} differ from the run without faults; {}",
                ours.last,
                parted_at(run, theirs, ours).1
            ),
        ));
    }
    found
}

/// Where the step logs part, and the last fault injected before that step.
fn parted_at(run: &ChaosRun, theirs: &FinalState, ours: &FinalState) -> (Option<usize>, String) {
    let Some((step, expected, got)) = first_divergence(theirs, ours) else {
        return (
            None,
            "the step logs agree on every step's loss and gradient norm".into(),
        );
    };
    let before = run.events.iter().rev().find(|e| e.step <= step);
    let fault = before.map_or("no fault before it".into(), |e| {
        let what: Vec<String> = e.faults.iter().map(|f| f.fault.describe(&run.plan.shape)).collect();
        format!(
            "the last fault before it: event {} ({}) at step {} in round {:?}, recovered into round {:?}",
            e.index + 1,
            what.join(" + "),
            e.step,
            e.before,
            e.after
        )
    });
    (
        before.map(|e| e.index),
        format!(
            "the step logs part at step {step}: without faults {expected:?}, with {got:?}; {fault}"
        ),
    )
}
