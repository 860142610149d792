//! The names that steer hollow nodes and their pods: the label and taint of the simulator's
//! nodes, the annotations of a hollow job's pods (see the module's documentation), and the
//! operator's label naming a pod's job.

/// Label and taint key of hollow nodes (value: the simulator's name).
pub const HOLLOW_LABEL: &str = "ferrotrain.dev/hollow";
/// Pod annotation: steps per second of the job's simulated run.
pub const ANNOTATION_STEPS_PER_SECOND: &str = "hollow.ferrotrain.dev/steps-per-second";
/// Pod annotation: the run's total steps (it finishes there).
pub const ANNOTATION_TOTAL_STEPS: &str = "hollow.ferrotrain.dev/total-steps";
/// Pod annotation: `silent` makes rank 0's /progress hang.
pub const ANNOTATION_PROGRESS: &str = "hollow.ferrotrain.dev/progress";
/// Pod annotation: `<code>[:<reason>[:<message>]]` stops the pod's containers so.
pub const ANNOTATION_EXIT: &str = "hollow.ferrotrain.dev/exit";
/// The operator's label naming a pod's job.
pub const JOB_LABEL: &str = "ferrotrain.dev/job";
