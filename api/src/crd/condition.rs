//! Condition types the operator maintains in `status.conditions`; their reasons are in
//! [`crate::reason`] (docs/reasons.md).

/// The current attempt's pods were all created.
pub const CREATED: &str = "Created";
/// Every pod of the current attempt runs. While it is False during start-up, its reason
/// is the reason a pod waits (Unschedulable, ImagePullBackOff, CreateContainerConfigError,
/// ...) and its message the scheduler's or kubelet's own words.
pub const RUNNING: &str = "Running";
/// A gang restart is in progress.
pub const RESTARTING: &str = "Restarting";
/// The trainer's progress stopped changing for stallTimeoutSeconds.
pub const STALLED: &str = "Stalled";
/// Every rank exited 0.
pub const SUCCEEDED: &str = "Succeeded";
/// The job failed for good.
pub const FAILED: &str = "Failed";
/// spec.suspend holds the job.
pub const SUSPENDED: &str = "Suspended";
/// Rank 0 serves /progress: Unknown while polls fail within the operator's grace period,
/// False after it (or for images without the endpoint).
pub const PROGRESS_AVAILABLE: &str = "ProgressAvailable";
/// The gang is scheduled all-or-nothing: True with the mechanism (NativePodGroup, Kueue,
/// Volcano, Coscheduling), False when it is not (spec.scheduling.gangScheduler none, or
/// the API server does not serve the native API), with why.
pub const GANG_SCHEDULING: &str = "GangScheduling";
/// True while scheduling gates hold pods of the current attempt (a queue has not admitted
/// it); False (reason Admitted) from its admission, which restarts the start-up clock.
pub const QUEUED: &str = "Queued";
/// False while rank 0's checkpoint saves fail (`status.progress.checkpointError`), with the
/// disk's words; True once one completes again. Absent while every save completed.
pub const CHECKPOINTS_SAVED: &str = "CheckpointsSaved";
/// True while the job trains on fewer ranks than its gang (elastic.minReplicas), with
/// which pods are missing and why; False once the whole gang trains again.
pub const RESIZED: &str = "Resized";
