//! Setting a status condition with its transition time kept. A leaf: plain functions of the
//! conditions they are given.

use ferrotrain_api::reason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets a condition, keeping its lastTransitionTime unless its status flips.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    set_condition_to(conditions, type_, status, reason, message, now, generation);
}

/// Sets a condition to True, False or Unknown, keeping its lastTransitionTime unless its
/// status changes.
pub fn set_condition_to(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = status.to_string();
    let reason = if reason.is_empty() {
        reason::UNKNOWN
    } else {
        reason
    }
    .to_string();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = Time(now);
        }
        c.status = status;
        c.reason = reason;
        c.message = message;
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason,
            message,
            last_transition_time: Time(now),
            observed_generation: generation,
        });
    }
}

#[cfg(test)]
mod tests;
