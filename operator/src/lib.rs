//! ferrotrain's Kubernetes operator: runs `DistributedTraining` jobs as gangs of pods.
//!
//! A reconcile is a pipeline of named steps:
//! [`observe`] (pods, nodes, rank 0's /progress) -> [`gang::decide`] (pure state machine) ->
//! [`build`] (pure: every object of the gang) -> [`apply`] (the only module that writes:
//! status, server-side apply, creates, deletes, events). [`context`] and [`error`] are shared
//! by [`controller`] and [`apply`], which do not import each other.
//! Everything the operator knows lives in the object's status and its pods' labels, so a
//! restarted operator converges without duplicate pods or lost restarts.

pub mod app;
pub mod apply;
pub mod cache_fields;
pub mod caches;
pub mod carry_out;
pub mod client;
pub mod config;
pub mod context;
pub mod controller;
pub mod error;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod gang;
pub mod labels;
pub mod lease;
pub mod metrics;
pub mod objects;
pub mod observe;
pub mod pod_cache;
pub mod prerequisites;
pub mod progress;
pub mod readiness;
pub mod render;
pub mod report;
pub mod scheduling;
pub mod server;
pub mod unseen;

pub use ferrotrain_api::crd::{
    DistributedTraining, DistributedTrainingSpec, DistributedTrainingStatus,
};
