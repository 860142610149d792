//! Hollow nodes: a kubelet simulator for measuring the operator at fleet scale on one machine
//! (kwok, Kubernetes WithOut Kubelet, is the model: its node-heartbeat-with-lease,
//! pod-ready, pod-complete and pod-delete stages are what this does, in Rust, for ferrotrain's
//! pods). It registers N Node objects with CPU, memory and `nvidia.com/gpu` capacity on a real
//! API server, keeps them Ready (Lease renewals, status refreshes), and plays the kubelet for
//! the pods the real scheduler binds to them: Running with a pod IP on the loopback
//! (127.<block>.x.y), then Succeeded or Failed when told, and deleted when deleted. Rank 0 of a
//! ferrotrain gang serves `/progress` and `/metrics` at its pod IP on the trainer's metrics
//! port, with steps advancing while the whole gang runs, so the operator's status path is
//! exercised as for real pods. No containers run.
//!
//! Hollow nodes carry the label and the NoSchedule taint `ferrotrain.dev/hollow=<name>`: only
//! pods that tolerate it (and select it) land there, so real kubelet nodes and hollow ones
//! coexist. Pods of a hollow job are steered by its pod template's annotations:
//! - `hollow.ferrotrain.dev/steps-per-second`, `hollow.ferrotrain.dev/total-steps`: the pace
//!   (default: the simulator's); at the total every pod exits 0, rank 0 with the final report
//!   as its termination message, as the trainer does;
//! - `hollow.ferrotrain.dev/progress: silent`: rank 0 accepts /progress requests and never
//!   answers;
//! - `hollow.ferrotrain.dev/exit: "<code>[:<reason>[:<message>]]"` on a running pod (set it
//!   with `kubectl annotate`): its containers exit so, now.

mod config;
mod kubelet;
mod labels;
pub mod nodes;
pub mod pods;
mod serve;
mod shared;
mod simulator;
pub mod training;

pub use config::Config;
pub use labels::{
    ANNOTATION_EXIT, ANNOTATION_PROGRESS, ANNOTATION_STEPS_PER_SECOND, ANNOTATION_TOTAL_STEPS,
    HOLLOW_LABEL, JOB_LABEL,
};
pub use pods::{Exit, JobView};
pub use shared::{PollLog, Stats};
pub use simulator::{Simulator, Snapshot};
pub use training::Pace;
