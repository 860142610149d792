//! What the operator observed, in the state machine's terms: the input of [`super::decide`].

use std::time::Duration;

use crate::scheduling::GangMode;
use ferrotrain_api::Progress;
use ferrotrain_api::crd::{DistributedTrainingSpec, DistributedTrainingStatus};
use ferrotrain_api::reason;
use k8s_openapi::jiff::Timestamp;

/// What the trainer container of a pod is doing.
#[derive(Clone, Debug, PartialEq)]
pub enum PodState {
    /// Not scheduled yet, pulling, or containers not started.
    Pending,
    /// The trainer container runs.
    Running,
    /// The trainer container exited 0.
    Succeeded,
    /// The trainer container exited non-zero, or the pod failed (evicted, ...).
    Failed(Termination),
}

impl PodState {
    /// Succeeded or Failed: the pod holds no resources any more.
    pub fn is_terminated(&self) -> bool {
        matches!(self, PodState::Succeeded | PodState::Failed(_))
    }
}

/// How a pod failed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Termination {
    /// The trainer container's exit code (absent when the pod failed without it exiting).
    pub exit_code: Option<i32>,
    /// Kubernetes' reason (Error, OOMKilled, Evicted, ...).
    pub reason: String,
    /// The container's termination message (the trainer's one-line reason) or the pod's
    /// status message.
    pub message: String,
    /// When the container exited.
    pub finished_at: Option<Timestamp>,
}

/// The parts of a pod the state machine looks at.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView {
    pub name: String,
    pub attempt: i32,
    pub node_rank: i32,
    pub state: PodState,
    /// Set when the pod is being deleted (its deletionTimestamp).
    pub deleting_since: Option<Timestamp>,
    /// Set when the pod's node is NotReady or gone: since when.
    pub node_lost_since: Option<Timestamp>,
    /// The node the pod was scheduled on.
    pub node: Option<String>,
    /// The pod's UID.
    pub uid: Option<String>,
    /// When the trainer container started running.
    /// When its trainer container ended (exited 0 or failed), if it did.
    pub ended_at: Option<Timestamp>,
    pub running_since: Option<Timestamp>,
    /// When the pod was created (the start-up clock of `spec.startupTimeoutSeconds`).
    pub created: Option<Timestamp>,
    /// Why the pod does not run yet, when the scheduler or the kubelet said (Pending only).
    pub waiting: Option<Waiting>,
    /// Set when the pod is being disrupted or was: the DisruptionTarget condition, or a pod
    /// failed as Evicted, Preempting or Terminated (node shutdown).
    pub disruption: Option<Disruption>,
    /// The trainer's final progress report, from the termination message of a container
    /// that exited 0 (rank 0 writes it; its /progress server is gone by then).
    pub final_report: Option<Box<Progress>>,
}

/// Why a pod does not run yet, in the scheduler's or the kubelet's own words.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    pub cause: WaitCause,
    /// The pod's own reason: PodScheduled's (Unschedulable, SchedulingGated) or the trainer
    /// container's waiting reason (ErrImagePull, CreateContainerConfigError, ...).
    pub reason: String,
    /// The scheduler's or kubelet's message (for ContainerCreating, the likely cause).
    pub message: String,
}

/// What kind of wait it is: decides when it is shown and whether a restart can end it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WaitCause {
    /// InvalidImageName: no retry parses the name.
    InvalidImageName,
    /// ErrImagePull, ImagePullBackOff, ErrImageNeverPull, RegistryUnavailable, ...
    ImagePull,
    /// CreateContainerConfigError: a missing ConfigMap, Secret or key.
    ContainerConfig,
    /// PodScheduled is False (Unschedulable, SchedulingGated, SchedulerError).
    Unschedulable,
    /// Other kubelet reasons: CreateContainerError, RunContainerError, PreStartHookError, ...
    ContainerError,
    /// ContainerCreating or PodInitializing: volumes attach, the image is pulled, the sandbox
    /// is made. Normal for a while; a problem only past the start-up timeout.
    Creating,
    /// PodScheduled is False with reason SchedulingGated: a queue (Kueue) holds the pod until
    /// it admits the gang. Nothing is wrong, and the start-up timeout does not run.
    Queued,
}

impl WaitCause {
    pub const ALL: [WaitCause; 7] = [
        WaitCause::InvalidImageName,
        WaitCause::ImagePull,
        WaitCause::ContainerConfig,
        WaitCause::Unschedulable,
        WaitCause::ContainerError,
        WaitCause::Creating,
        WaitCause::Queued,
    ];

    /// The condition and event reason.
    pub fn reason(self) -> &'static str {
        match self {
            WaitCause::InvalidImageName => reason::INVALID_IMAGE_NAME,
            WaitCause::ImagePull => reason::IMAGE_PULL_BACK_OFF,
            WaitCause::ContainerConfig => reason::CREATE_CONTAINER_CONFIG_ERROR,
            WaitCause::Unschedulable => reason::UNSCHEDULABLE,
            WaitCause::ContainerError => reason::CONTAINER_ERROR,
            WaitCause::Creating => reason::CONTAINER_CREATING,
            WaitCause::Queued => reason::QUEUED,
        }
    }

    /// Shown (Running condition, Warning event) as soon as it is seen; ContainerCreating
    /// only when the start-up timeout ends the attempt; Queued is no problem at all (the job
    /// shows it as its phase).
    pub fn is_problem(self) -> bool {
        !matches!(self, WaitCause::Creating | WaitCause::Queued)
    }

    /// A new attempt may start where this one could not: new pods are scheduled afresh
    /// (and a partly scheduled gang frees what it holds, as Kueue's waitForPodsReady does),
    /// and a volume held by a lost node is released in time. An image that cannot be pulled
    /// or a missing ConfigMap or Secret stays missing.
    pub fn restart_can_help(self) -> bool {
        matches!(
            self,
            WaitCause::Unschedulable | WaitCause::ContainerError | WaitCause::Creating
        )
    }

    /// Container waiting reasons as the kubelet writes them (pkg/kubelet/images/types.go,
    /// pkg/kubelet/kuberuntime/kuberuntime_container.go, pkg/kubelet/kubelet_pods.go).
    pub fn of_container_reason(reason: &str) -> WaitCause {
        match reason {
            "InvalidImageName" => WaitCause::InvalidImageName,
            "ErrImagePull"
            | "ImagePullBackOff"
            | "ErrImageNeverPull"
            | "RegistryUnavailable"
            | "ImageInspectError"
            | "SignatureValidationFailed" => WaitCause::ImagePull,
            "CreateContainerConfigError" => WaitCause::ContainerConfig,
            "ContainerCreating" | "PodInitializing" | "" => WaitCause::Creating,
            _ => WaitCause::ContainerError,
        }
    }
}

/// Why a pod is being taken away: nothing the training did (the pod's DisruptionTarget
/// reason: PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager,
/// TerminationByKubelet; or its failed phase's reason: Evicted, Preempting, Terminated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Disruption {
    pub reason: String,
    pub message: String,
    /// When it began: the DisruptionTarget condition's transition, else (a pod the kubelet
    /// failed without one: an ephemeral-storage or emptyDir limit) its trainer container's
    /// end; None when neither is known.
    pub since: Option<Timestamp>,
}

/// What polling rank 0's /progress gave.
#[derive(Clone, Debug, PartialEq)]
pub enum ProgressObservation {
    /// Not polled (rank 0 does not run, or the job is not in an active phase).
    NotPolled,
    /// Rank 0 answered (boxed: the report is large).
    Report(Box<Progress>),
    /// Rank 0 runs but did not answer with a report (no endpoint, refused, timeout, bad JSON).
    Unavailable(String),
}

/// Operator-level knobs of the state machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Requeue interval while running (progress polling).
    pub progress_interval: Duration,
    /// How long rank 0 may run without serving /progress before it counts as unavailable.
    pub progress_grace: Duration,
    /// How long a node may be NotReady before its pods count as lost.
    pub node_lost_grace: Duration,
    /// How long a pod may be terminating on a lost node before it is force-deleted.
    pub force_delete_grace: Duration,
}

/// Why the last launch of an attempt's pods stopped before they all existed, as the controller
/// saw it carried out: the API refused a pod (a ResourceQuota, a LimitRange, an admission
/// webhook: [`reason::POD_CREATE_REFUSED`]), one of the job's names is taken by an object
/// the job does not control ([`reason::NAME_CONFLICT`]), or the checkpoint store's Secret is
/// missing or lacks a key ([`reason::STORE_SECRET_MISSING`]: nothing was created).
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchStop {
    pub attempt: i32,
    /// [`reason::POD_CREATE_REFUSED`], [`reason::NAME_CONFLICT`] or
    /// [`reason::STORE_SECRET_MISSING`].
    pub reason: &'static str,
    /// The API's words, the object that holds the name, or what the Secret lacks.
    pub message: String,
    /// When it stopped.
    pub at: Timestamp,
}

/// Everything the state machine decides from.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Now, truncated to whole seconds (status times have second resolution).
    pub now: Timestamp,
    /// The job's name (pods are `<job>-<attempt>-<nodeRank>`).
    pub job: &'a str,
    pub generation: Option<i64>,
    pub spec: &'a DistributedTrainingSpec,
    pub status: &'a DistributedTrainingStatus,
    /// Pods labelled with the job (every attempt).
    pub pods: &'a [PodView],
    pub progress: ProgressObservation,
    /// Problems that prevent launching pods (invalid trainer config, unknown volume, ...).
    pub spec_problems: &'a [String],
    pub timing: &'a Timing,
    /// How the job's pods are scheduled all-or-nothing (scheduling::mode).
    pub gang: &'a GangMode,
    /// Why the controller's last launch of the job's pods stopped, if it did.
    pub launch_stop: Option<&'a LaunchStop>,
}
