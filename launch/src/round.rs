//! The pod agent's rounds as pure decisions, the operator's `gang::decide` being the model:
//! the agent (agent.rs) feeds what happened to it ([`Event`]) and where it stands
//! ([`Rounds`]) to [`decide`], and does what comes back ([`Next`]): start a round, back off
//! first, wait for a round that takes it in, wait for node 0's (new) store, or exit with which
//! code and message. No store, no process, no clock: every decision is a table row
//! (round/tests.rs), the races found on the cluster among them.
//!
//! What else the agent decides between a round's end and the next is pure too: what its node
//! saw ([`crate::blame::NodeReport::after`]), how long it tries to reach the store with it
//! ([`patience`]), which ranks node 0 blames ([`crate::blame::verdict`]), when node 0 stops
//! waiting for reports ([`crate::gather`]), and how a poll of the local ranks ends
//! ([`crate::group::poll`]).

use std::time::Duration;

use ferrotrain_api::{RestartBudget, exit};

use crate::blame::{self, Verdict};
use crate::error::AgentError;
use crate::group::GroupOutcome;
use ferrotrain_api::reason;

/// What an agent knows of its gang for its whole life.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// This agent's node.
    pub node: usize,
    /// In-place restarts this agent may spend (`--max-restarts`): failed rounds and the
    /// losses of node 0's store.
    pub max_restarts: u32,
    /// `--restart-backoff-seconds` and `--restart-backoff-max-seconds`.
    pub backoff: (Duration, Duration),
}

impl Policy {
    /// The restart budget after `r.restarts` restarts (ferrotrain_api::budget).
    fn budget(&self, r: &Rounds) -> RestartBudget {
        RestartBudget {
            max: self.max_restarts,
            spent: r.restarts,
        }
    }
}

/// Where the agent stands between rounds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rounds {
    /// The round it runs or will run.
    pub round: u64,
    /// In-place restarts spent so far.
    pub restarts: u32,
    /// The last end (or break) decided, and what was decided: the same one seen again (a
    /// verdict read twice) decides nothing new.
    pub decided: Option<(Key, Next)>,
}

/// Which end of which round an event is: a round ends once, and breaks off once per stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub round: u64,
    /// None: the round ended; else the stage it broke off in.
    pub stage: Option<Stage>,
}

/// What happened to the agent.
#[derive(Debug)]
pub enum Event {
    /// It joined the gang at this round: at start, after node 0's store came back, or after
    /// a round it was not admitted to.
    Joined(u64),
    /// Its part in this round ended.
    Ended { round: u64, end: End },
    /// It could not get through a stage of the round (the store, what it held, the wait).
    Broke {
        round: u64,
        stage: Stage,
        error: AgentError,
    },
    /// A signal came while it waited before a round.
    Interrupted(i32),
}

/// How a round ended for this agent.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Every rank of the gang finished.
    Finished,
    /// The agent was signalled (its pod is going away).
    Signalled(i32),
    /// Node 0 started the round without this node (it came late).
    NotAdmitted,
    /// Another agent (a replacement pod, pod UID `owner`) holds this node now: this one was
    /// cut off.
    Replaced { owner: String },
    /// Node 0 ruled why the round ended.
    Ruled(Verdict),
}

/// Where an agent broke off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Joining the gang at start.
    Joining,
    /// Running a round (its store may have gone with node 0).
    Round,
    /// Waiting for node 0's replacement and joining it.
    Rejoining,
    /// Waiting for a round that takes it in.
    Waiting,
}

/// What the agent does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Runs this round now.
    Run(u64),
    /// Runs this round after `wait` (the backoff): the last one failed, as `why` says.
    Restart {
        round: u64,
        wait: Duration,
        why: String,
    },
    /// Waits for the first round node 0 starts after this one, then joins it.
    WaitForRound(u64),
    /// Round `after` ended with node 0's store (`why`): waits for a store at node 0's address
    /// (not the one it joined when `lost`: node 0 said it leaves) and joins its next round.
    Rejoin { after: u64, why: String, lost: bool },
    /// Leaves the gang.
    Exit(Exit),
}

/// How the agent leaves the gang.
#[derive(Clone, Debug, PartialEq)]
pub struct Exit {
    /// The pod's exit code.
    pub code: i32,
    /// Logged as an error and written as the pod's termination message (none on success and
    /// when signalled).
    pub message: Option<String>,
    /// Success: rank 0's final progress report becomes the pod's termination message.
    pub final_report: bool,
    /// Another node's permanent failure ended the gang: this pod ends a moment after the
    /// blamed one, so the operator reads the root cause first.
    pub collateral: bool,
}

impl Exit {
    fn code(code: i32) -> Self {
        Exit {
            code,
            message: None,
            final_report: false,
            collateral: false,
        }
    }

    fn failed(code: i32, message: String) -> Self {
        Exit {
            message: Some(message),
            ..Exit::code(code)
        }
    }
}

/// How long a survivor tries to reach node 0's store after its ranks stopped before it takes
/// the store for gone with node 0 (a connection to a vanished address would hang).
pub const STORE_GONE_AFTER: Duration = Duration::from_secs(2);

/// How long a node whose own rank ended the round tries to reach the store with its report:
/// its report carries the blame, and node 0 waits for it (the stop grace and this) rather than
/// call the node lost. Also what node 0 waits beyond the stop grace for every report.
pub const REPORT_SLACK: Duration = Duration::from_secs(5);

/// Decides what the agent does after `event`, from where it stands. See the module
/// documentation.
pub fn decide(policy: &Policy, rounds: &Rounds, event: &Event) -> (Rounds, Next) {
    let key = match event {
        Event::Ended { round, .. } => Some(Key {
            round: *round,
            stage: None,
        }),
        Event::Broke { round, stage, .. } => Some(Key {
            round: *round,
            stage: Some(*stage),
        }),
        Event::Joined(_) | Event::Interrupted(_) => None,
    };
    if let (Some(key), Some((decided, next))) = (key, &rounds.decided)
        && key == *decided
    {
        return (rounds.clone(), next.clone());
    }
    let mut after = rounds.clone();
    let next = match event {
        Event::Joined(round) => {
            after.round = *round;
            Next::Run(*round)
        }
        Event::Interrupted(signal) => Next::Exit(Exit::code(128 + signal)),
        Event::Broke {
            round,
            stage,
            error,
        } => broke(policy, &mut after, *round, *stage, error),
        Event::Ended { round, end } => ended_with(policy, &mut after, *round, end),
    };
    if let Some(key) = key {
        after.decided = Some((key, next.clone()));
    }
    (after, next)
}

/// A stage broke off with `error`: a survivor of node 0's loss waits for its replacement
/// while restarts are left; anything else ends the agent.
fn broke(policy: &Policy, r: &mut Rounds, round: u64, stage: Stage, error: &AgentError) -> Next {
    let message = match stage {
        Stage::Joining => format!("agent: joining: {error}"),
        Stage::Round if policy.node != 0 && policy.budget(r).allows_another() => {
            r.restarts += 1;
            return Next::Rejoin {
                after: round,
                why: error.to_string(),
                lost: false,
            };
        }
        Stage::Round => format!("agent: round {round}: {error}"),
        Stage::Rejoining => format!("agent: {error}"),
        Stage::Waiting => format!("agent: waiting to join: {error}"),
    };
    Next::Exit(Exit::failed(error.exit_code(), message))
}

fn ended_with(policy: &Policy, r: &mut Rounds, round: u64, end: &End) -> Next {
    match end {
        End::Finished => Next::Exit(Exit {
            final_report: true,
            ..Exit::code(exit::SUCCESS)
        }),
        End::Signalled(signal) => Next::Exit(Exit::code(128 + signal)),
        End::Replaced { owner } => Next::Exit(Exit::failed(
            exit::RETRYABLE,
            format!(
                "node {} is held by another pod's launcher now (pod UID {owner}): this pod was \
                 cut off and replaced, so it leaves the gang",
                policy.node
            ),
        )),
        End::NotAdmitted => Next::WaitForRound(round),
        End::Ruled(verdict) => ruled(policy, r, round, verdict),
    }
}

/// Node 0 ruled why round `round` ended: grow, give up, follow node 0 to its replacement, or
/// restart after the backoff.
fn ruled(policy: &Policy, r: &mut Rounds, round: u64, verdict: &Verdict) -> Next {
    if verdict.reason == reason::RESIZED {
        r.round = round + 1;
        return Next::Run(round + 1);
    }
    let own = verdict.node == Some(policy.node);
    let own_code = verdict.code.filter(|_| own).unwrap_or(exit::RETRYABLE);
    if verdict.permanent {
        // Every node exits with the permanent code: whichever pod the operator sees end
        // first, no restart follows.
        let message = format!(
            "round {round}: {}: {}; permanent, not restarting",
            who(verdict),
            verdict.message
        );
        return Next::Exit(Exit {
            collateral: !own,
            ..Exit::failed(verdict.code.unwrap_or(own_code), message)
        });
    }
    // A pod taken away (deleted, evicted, drained) is a disruption: nothing the training did,
    // so it spends no restart and waits no backoff, as for the operator's gang restarts.
    let disruption = blame::is_disruption(verdict);
    if !disruption && !policy.budget(r).allows_another() {
        let message = format!(
            "round {round}: {}: {}; giving up after {} in-place restart(s) (--max-restarts)",
            who(verdict),
            verdict.message,
            r.restarts
        );
        return Next::Exit(Exit::failed(own_code, message));
    }
    if !disruption {
        r.restarts += 1;
    }
    if verdict.node == Some(0) && verdict.reason == reason::POD_LEAVING && policy.node != 0 {
        // Node 0's pod goes away, and its store with it.
        return Next::Rejoin {
            after: round,
            why: verdict.message.clone(),
            lost: true,
        };
    }
    let wait = if disruption {
        Duration::ZERO
    } else {
        backoff(policy, verdict.in_a_row)
    };
    r.round = round + 1;
    Next::Restart {
        round: round + 1,
        wait,
        why: format!(
            "round {round} ended: {}: {}; restarting in place in {:.1} s (failure {} in a row)",
            who(verdict),
            verdict.message,
            wait.as_secs_f64(),
            verdict.in_a_row
        ),
    }
}

/// The wait before the round after a failure that was the `in_a_row`-th in a row: none for
/// the first (a gang that trained well restarts at once), then the restart backoff, doubling;
/// a gang that keeps failing before it trains a step is backed off.
pub fn backoff(policy: &Policy, in_a_row: u32) -> Duration {
    let (initial, max) = policy.backoff;
    match in_a_row {
        0 | 1 => Duration::ZERO,
        n => ferrotrain_api::recovery::restart_wait(initial, max, n - 1),
    }
}

/// How long this agent tries to reach the store after its ranks stopped with `outcome`: a
/// node whose own rank failed or froze carries the blame, and node 0 waits for its report
/// ([`REPORT_SLACK`]); a node that only followed a peer takes a silent store for gone with
/// node 0 sooner ([`STORE_GONE_AFTER`]).
pub fn patience(outcome: &GroupOutcome) -> Duration {
    if owns_the_failure(outcome) {
        REPORT_SLACK
    } else {
        STORE_GONE_AFTER
    }
}

/// Whether the round ended here: a local rank failed or froze (the agent marks the round
/// failed, unless another node did first).
pub fn owns_the_failure(outcome: &GroupOutcome) -> bool {
    matches!(
        outcome,
        GroupOutcome::Failed(_) | GroupOutcome::Frozen { .. }
    )
}

/// "rank 1 (Killed)" or the reason alone.
pub fn who(verdict: &Verdict) -> String {
    match verdict.rank {
        Some(rank) => format!("rank {rank} ({})", verdict.reason),
        None => verdict.reason.clone(),
    }
}

#[cfg(test)]
mod tests;
