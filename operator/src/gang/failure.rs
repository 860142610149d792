//! Failure classification: what ended an attempt (an exit code, a deleted pod, a lost node, a
//! disruption, a pod that never started), whether a restart can help, and which of several
//! failures is the root cause.

use ferrotrain_api::crd::FailureInfo;
use ferrotrain_api::reason;
use ferrotrain_api::recovery::EndCause;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::draft::{Draft, first_line};
use super::observed::{Disruption, PodView, Termination};

/// Why an attempt ended (a retryable failure or a permanent one).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Failure {
    pub(super) info: FailureInfo,
    pub(super) permanent: bool,
    /// Eviction, preemption, drain, node shutdown: restarts without spending maxRestarts.
    pub(super) disruption: bool,
    /// When it happened (exit, deletion, node loss, pod creation for a pod that never
    /// started); None for a pod that vanished (it went first: nothing else deletes a pod).
    pub(super) at: Option<Timestamp>,
    /// Killed from outside (signal, OOM, eviction, lost node) rather than exiting on its own
    /// error: at the same second, the likelier root cause.
    pub(super) killed: bool,
    /// Not a failure on its own, only a candidate cause of another (see [`root_cause`]).
    pub(super) suspect: bool,
}

impl Failure {
    /// What users read (conditions, events): `rank 1 (pod mt-0-1) exited with code 3: ...`.
    pub(super) fn describe(&self) -> String {
        let i = &self.info;
        let who = match (&i.pod, i.node_rank) {
            (Some(pod), Some(rank)) => format!("rank {rank} (pod {pod})"),
            (Some(pod), None) => format!("pod {pod}"),
            _ => return format!("{}: {}", i.reason, i.message),
        };
        let what = match i.exit_code {
            Some(code) => format!("{who} exited with code {code}"),
            None => format!("{who}: {}", i.reason),
        };
        let what = if i.message.is_empty() {
            what
        } else {
            format!("{what}: {}", i.message)
        };
        match i.secondary_failures {
            0 => what,
            1 => format!("{what} (1 other pod failed after it)"),
            n => format!("{what} ({n} other pods failed after it)"),
        }
    }
}

/// Marks a failure as a disruption: nothing the training did, so no restart is spent.
pub(super) fn disrupted(f: &mut Failure, d: &Disruption) {
    f.disruption = true;
    f.killed = true;
    f.info.reason = reason::DISRUPTED.into();
    f.info.message = match d.message.as_str() {
        "" => d.reason.clone(),
        m => format!("{}: {}", d.reason, first_line(m)),
    };
}

/// The root cause of an attempt's end, with the other failures counted. Permanent failures
/// win (no restart can fix them); otherwise the earliest is the cause and the rest collateral
/// (their peer died), a kill before an error at the same second (exit times have second
/// resolution: the rank that was SIGKILLed and the rank whose all-reduce then broke often share
/// one). `suspects` (a node lost within its grace, a pod that cannot start) end nothing on
/// their own, but when something else failed they are candidates for its cause.
pub(super) fn root_cause(failures: Vec<Failure>, suspects: Vec<Failure>) -> Option<Failure> {
    if failures.is_empty() {
        return None;
    }
    let failed = failures.len() as i32;
    let mut candidates: Vec<Failure> = failures.into_iter().chain(suspects).collect();
    candidates.sort_by(|a, b| {
        b.permanent
            .cmp(&a.permanent)
            // None (vanished) sorts first.
            .then_with(|| a.at.cmp(&b.at))
            .then_with(|| b.killed.cmp(&a.killed))
            .then_with(|| a.info.node_rank.cmp(&b.info.node_rank))
    });
    let mut root = candidates.into_iter().next()?;
    root.info.secondary_failures = if root.suspect { failed } else { failed - 1 };
    Some(root)
}

/// The ledger's cause of an attempt that ended for `reason` (FailureInfo.reason).
pub(super) fn ended_by(reason: &str) -> EndCause {
    match reason {
        reason::STALLED => EndCause::Stall,
        reason::DISRUPTED => EndCause::Disruption,
        reason::DEADLINE_EXCEEDED | reason::SUSPENDED => EndCause::Stopped,
        _ => EndCause::Failure,
    }
}

/// A failure of rank `rank` of the current attempt; `pod` defaults to the rank's name.
pub(super) fn failure(
    d: &Draft<'_, '_>,
    rank: i32,
    pod: Option<&str>,
    reason: &str,
    message: String,
) -> Failure {
    Failure {
        info: FailureInfo {
            attempt: d.status.attempt,
            node_rank: Some(rank),
            // A pod of one rank: its rank is the pod's.
            rank: (d.o.spec.procs_per_replica() == 1).then_some(rank),
            pod: Some(
                pod.map(str::to_string)
                    .unwrap_or_else(|| crate::labels::pod_name(d.o.job, d.status.attempt, rank)),
            ),
            exit_code: None,
            node: d.node_of(rank),
            reason: reason.into(),
            message,
            last_lines: Vec::new(),
            time: Time(d.now()),
            secondary_failures: 0,
        },
        permanent: false,
        disruption: false,
        at: None,
        killed: false,
        suspect: false,
    }
}

/// A failure of the job as a whole (no pod to blame).
pub(super) fn job_failure(d: &Draft<'_, '_>, reason: &str, message: String) -> Failure {
    let mut f = failure(d, 0, None, reason, message);
    (f.info.node_rank, f.info.pod) = (None, None);
    f
}

/// A pod whose trainer exited non-zero or that failed without it exiting.
pub(super) fn exited(d: &Draft<'_, '_>, pod: &PodView, t: &Termination) -> Failure {
    let reason = if t.exit_code.is_some() {
        reason::EXIT_CODE
    } else {
        reason::POD_FAILED
    };
    let message = first_line(if t.message.is_empty() {
        &t.reason
    } else {
        &t.message
    });
    let mut f = failure(d, pod.node_rank, Some(&pod.name), reason, message);
    f.info.exit_code = t.exit_code;
    f.at = t.finished_at;
    f.killed = t.exit_code.is_none_or(|c| c >= 128) || t.reason == "OOMKilled";
    let permanent_codes = &d.o.spec.restart_policy.permanent_exit_codes;
    if let Some(code) = t.exit_code
        && permanent_codes.contains(&code)
    {
        f.permanent = true;
        f.info.reason = reason::PERMANENT_EXIT_CODE.into();
    } else if let Some(d) = &pod.disruption {
        disrupted(&mut f, d);
    }
    f
}

// The table of every decision (`gang::tests`) runs these tests' rows too.
#[cfg(test)]
pub(super) mod tests;
