//! The gang state machine: given what the operator observed (the object's spec and status,
//! its pods, rank 0's progress report, the time), decide the next status, the actions and the
//! events. Pure: no client, no async, no clock — every test is a table row.
//!
//! Everything it needs to remember lives in the status it returns (phase, attempt, restarts,
//! condition transition times, progress with its update time) and in the pods' labels
//! (attempt, node rank), so a restarted operator decides exactly as the old one would have.

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::crd::{
    DistributedTrainingSpec, DistributedTrainingStatus, FailureInfo, Phase, Placement,
    TrainingProgress, condition,
};
use ferrotrain_api::recovery::{AttemptEnd, EndCause, StepReport};
use ferrotrain_api::{Progress, Recovery, TrainerPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::report;

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
}

impl WaitCause {
    pub const ALL: [WaitCause; 6] = [
        WaitCause::InvalidImageName,
        WaitCause::ImagePull,
        WaitCause::ContainerConfig,
        WaitCause::Unschedulable,
        WaitCause::ContainerError,
        WaitCause::Creating,
    ];

    /// The condition and event reason.
    pub fn reason(self) -> &'static str {
        match self {
            WaitCause::InvalidImageName => "InvalidImageName",
            WaitCause::ImagePull => "ImagePullBackOff",
            WaitCause::ContainerConfig => "CreateContainerConfigError",
            WaitCause::Unschedulable => "Unschedulable",
            WaitCause::ContainerError => "ContainerError",
            WaitCause::Creating => "ContainerCreating",
        }
    }

    /// Shown (Running condition, Warning event) as soon as it is seen; ContainerCreating
    /// only when the start-up timeout ends the attempt.
    pub fn is_problem(self) -> bool {
        self != WaitCause::Creating
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
}

/// A change to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ensure the Service, ConfigMap and Secret exist and create these ranks' pods of `attempt`.
    Launch { attempt: i32, node_ranks: Vec<i32> },
    /// Delete a pod (graceful).
    DeletePod(String),
    /// Delete a pod stuck terminating on a lost node, with grace period 0.
    ForceDeletePod(String),
    /// Delete the DistributedTraining itself (ttlSecondsAfterFinished passed).
    DeleteJob,
}

/// A Kubernetes Event to publish on the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to write (written only when it differs from the observed one).
    pub status: DistributedTrainingStatus,
    /// In the order they must run: deletes, then (after the status write) launches.
    pub actions: Vec<Action>,
    pub events: Vec<EventNote>,
    /// Reconcile again after this long even if nothing changes.
    pub requeue_after: Option<Duration>,
}

/// Why an attempt ended (a retryable failure or a permanent one).
#[derive(Clone, Debug, PartialEq)]
struct Failure {
    info: FailureInfo,
    permanent: bool,
    /// Eviction, preemption, drain, node shutdown: restarts without spending maxRestarts.
    disruption: bool,
    /// When it happened (exit, deletion, node loss, pod creation for a pod that never
    /// started); None for a pod that vanished (it went first: nothing else deletes a pod).
    at: Option<Timestamp>,
    /// Killed from outside (signal, OOM, eviction, lost node) rather than exiting on its own
    /// error: at the same second, the likelier root cause.
    killed: bool,
    /// Not a failure on its own, only a candidate cause of another (see [`root_cause`]).
    suspect: bool,
}

impl Failure {
    fn describe(&self) -> String {
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

/// `FailureInfo.reason` and Failed condition reason of a spec no pod can be made from.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// Created condition and `FailureInfo.reason` when the API refuses the attempt's pods.
pub const POD_CREATE_REFUSED: &str = "PodCreateRefused";

/// The API refused to create a pod of the attempt (a ResourceQuota, a LimitRange, an admission
/// webhook): for the controller to call when a Launch fails with such an error, and to write
/// the status and publish the event it returns. Condition Created turns False with the API's
/// message; the event is returned once per message (not on every retry of the launch). The
/// decision after it retries the launch and, past `spec.startupTimeoutSeconds`, fails the job.
pub fn launch_refused(
    status: &DistributedTrainingStatus,
    error: &str,
    now: Timestamp,
    generation: Option<i64>,
) -> (DistributedTrainingStatus, Option<EventNote>) {
    let mut status = status.clone();
    let message = format!("attempt {}: {}", status.attempt, first_line(error));
    let known = status.condition(condition::CREATED).is_some_and(|c| {
        c.status == "False" && c.reason == POD_CREATE_REFUSED && c.message == message
    });
    let c = condition::CREATED;
    set_condition(
        &mut status.conditions,
        c,
        false,
        POD_CREATE_REFUSED,
        message.clone(),
        now,
        generation,
    );
    let event = (!known).then_some(EventNote {
        warning: true,
        reason: POD_CREATE_REFUSED,
        note: message,
    });
    (status, event)
}

/// Created=False while the next attempt waits for the pods of earlier ones to be gone.
pub const PREVIOUS_ATTEMPT_TERMINATING: &str = "PreviousAttemptTerminating";

/// The pods' `terminationGracePeriodSeconds` when the user sets none: long enough for rank 0
/// to save a checkpoint on SIGTERM. From the last save the trainer reported (the whole save,
/// else the part that blocked training): 3x it plus 10 s, at least Kubernetes' default 30 s,
/// at most 10 minutes. The launcher inside the pod gets 5 s less
/// ([`launcher_stop_grace_seconds`]) so it can still report after its ranks stop.
pub fn save_grace_seconds(status: &DistributedTrainingStatus) -> i64 {
    const DEFAULT: i64 = 30;
    const MAX: i64 = 600;
    let save = status
        .progress
        .as_ref()
        .and_then(|p| p.report.last_checkpoint.as_ref())
        .and_then(|c| c.save_seconds.or(c.blocking_seconds))
        .filter(|s| s.is_finite() && *s >= 0.0);
    match save {
        Some(seconds) => ((3.0 * seconds + 10.0).ceil() as i64).clamp(DEFAULT, MAX),
        None => DEFAULT,
    }
}

/// FERROTRAIN_STOP_GRACE_SECONDS for a pod with `pod_grace_seconds`: how long `ferrotrain
/// launch` waits between forwarding SIGTERM and SIGKILLing its ranks.
pub fn launcher_stop_grace_seconds(pod_grace_seconds: i64) -> i64 {
    (pod_grace_seconds - 5).max(1)
}

/// `FailureInfo.reason` of a disruption (it restarts without spending maxRestarts).
pub const DISRUPTED: &str = "Disrupted";

/// The current attempt's ranks, sorted by what they do.
#[derive(Default)]
struct Census<'o> {
    rank0: Option<&'o PodView>,
    running: i32,
    succeeded: i32,
    /// Failures that end the attempt.
    failures: Vec<Failure>,
    /// Candidate causes of those failures that end nothing on their own.
    suspects: Vec<Failure>,
    /// Pods not running yet.
    waiting: Vec<&'o PodView>,
}

/// Marks a failure as a disruption: nothing the training did, so no restart is spent.
fn disrupted(f: &mut Failure, d: &Disruption) {
    f.disruption = true;
    f.killed = true;
    f.info.reason = DISRUPTED.into();
    f.info.message = match d.message.as_str() {
        "" => d.reason.clone(),
        m => format!("{}: {}", d.reason, first_line(m)),
    };
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::ZERO)
}

/// Restart backoff before attempt `restarts + 1`: backoff * 2^(restarts-1), capped.
pub fn backoff(spec: &DistributedTrainingSpec, restarts: i32) -> Duration {
    let p = &spec.restart_policy;
    let initial = p.backoff_seconds.max(0) as u64;
    let max = p.max_backoff_seconds.max(0) as u64;
    let exp = (restarts.max(1) - 1).min(30) as u32;
    Duration::from_secs(initial.saturating_mul(1u64 << exp).min(max.max(initial)))
}

/// Decides the next step. See the module documentation.
pub fn decide(o: &Observed<'_>) -> Decision {
    Decider::new(o).run()
}

struct Decider<'a, 'o> {
    o: &'a Observed<'o>,
    status: DistributedTrainingStatus,
    actions: Vec<Action>,
    events: Vec<EventNote>,
    requeue: Option<Duration>,
}

impl<'a, 'o> Decider<'a, 'o> {
    fn new(o: &'a Observed<'o>) -> Self {
        let mut status = o.status.clone();
        status.observed_generation = o.generation;
        Decider {
            o,
            status,
            actions: Vec::new(),
            events: Vec::new(),
            requeue: None,
        }
    }

    fn run(mut self) -> Decision {
        let o = self.o;
        self.record_placement();
        // Pods of a newer attempt than the status knows: the status we read predates our own
        // write. Acting on it would double-count a restart; wait for the fresh status.
        if o.pods.iter().any(|p| p.attempt > o.status.attempt) {
            return Decision {
                status: o.status.clone(),
                actions: Vec::new(),
                events: Vec::new(),
                requeue_after: Some(Duration::from_secs(1)),
            };
        }

        match self.status.phase {
            Phase::Failed if self.invalid_spec_changed() => {
                self.reopen();
                if o.spec.suspend {
                    self.suspend();
                } else {
                    self.active();
                }
            }
            Phase::Succeeded | Phase::Failed => self.finished(),
            _ if o.spec.suspend => self.suspend(),
            Phase::Suspended => {
                self.resume();
                self.active();
            }
            _ => self.active(),
        }
        self.record_placement();
        self.clean_up_old_attempts();
        self.force_delete_stuck();
        self.count_replicas();
        Decision {
            status: self.status,
            actions: order(self.actions),
            events: self.events,
            requeue_after: self.requeue,
        }
    }

    fn now(&self) -> Timestamp {
        self.o.now
    }

    fn requeue_in(&mut self, after: Duration) {
        let after = after.max(Duration::from_secs(1));
        self.requeue = Some(self.requeue.map_or(after, |r| r.min(after)));
    }

    fn requeue_at(&mut self, at: Timestamp) {
        let left = at.duration_since(self.now());
        self.requeue_in(Duration::try_from(left).unwrap_or(Duration::ZERO));
    }

    fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(EventNote {
            warning,
            reason,
            note,
        });
    }

    fn set_condition(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" };
        self.set_condition_to(type_, status, reason, message);
    }

    /// `status`: True, False or Unknown.
    fn set_condition_to(&mut self, type_: &str, status: &str, reason: &str, message: String) {
        set_condition_to(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.o.now,
            self.o.generation,
        );
    }

    fn current_pods(&self) -> impl Iterator<Item = &'o PodView> + '_ {
        let attempt = self.status.attempt;
        self.o.pods.iter().filter(move |p| p.attempt == attempt)
    }

    /// Delete the current attempt's pods that still run (terminated ones stay for their logs).
    fn stop_current_pods(&mut self) {
        let doomed: Vec<String> = self
            .current_pods()
            .filter(|p| p.deleting_since.is_none() && !p.state.is_terminated())
            .map(|p| p.name.clone())
            .collect();
        self.actions
            .extend(doomed.into_iter().map(Action::DeletePod));
    }

    fn finished(&mut self) {
        self.stop_current_pods();
        if let (Some(ttl), Some(done)) = (
            self.o.spec.ttl_seconds_after_finished,
            self.status.completion_time.as_ref(),
        ) {
            let at = done.0 + SignedDuration::from_secs(ttl.max(0));
            if self.now() >= at {
                self.actions.push(Action::DeleteJob);
            } else {
                self.requeue_at(at);
            }
        }
    }

    /// Failed for an invalid spec, and the spec changed since: a job that never got to run
    /// deserves its fixed spec a try (any other failure is final, as a Job's is).
    fn invalid_spec_changed(&self) -> bool {
        self.o.status.condition(condition::FAILED).is_some_and(|c| {
            c.status == "True"
                && c.reason == INVALID_SPEC
                && c.observed_generation != self.o.generation
        })
    }

    /// Back to Pending after an invalid spec was changed; a new attempt if pods of the
    /// failed one still exist (they were made from the old spec).
    fn reopen(&mut self) {
        if self.current_pods().next().is_some() {
            self.status.attempt += 1;
        }
        self.status.phase = Phase::Pending;
        self.status.completion_time = None;
        let generation = self.o.generation.unwrap_or_default();
        self.set_condition(
            condition::FAILED,
            false,
            "SpecChanged",
            format!("generation {generation} of the spec is tried"),
        );
    }

    fn suspend(&mut self) {
        self.end_attempt_progress();
        if self.status.phase != Phase::Suspended {
            let from = self.status.phase;
            let failure = self.job_failure("Suspended", String::new());
            self.record_end(EndCause::Stopped, &failure);
            self.status.phase = Phase::Suspended;
            self.set_condition(
                condition::SUSPENDED,
                true,
                "Suspended",
                "spec.suspend is true".into(),
            );
            self.clear_running("Suspended");
            self.set_condition(condition::RESTARTING, false, "Suspended", String::new());
            self.event(
                false,
                "Suspended",
                format!(
                    "suspended in phase {from}: pods of attempt {} are deleted",
                    self.status.attempt
                ),
            );
        }
        self.stop_current_pods();
    }

    fn resume(&mut self) {
        let launched_before = self.status.condition(condition::CREATED).is_some();
        if launched_before {
            self.status.attempt += 1;
        }
        self.status.phase = Phase::Pending;
        self.status.start_time = Some(Time(self.now()));
        self.set_condition(
            condition::SUSPENDED,
            false,
            "Resumed",
            "spec.suspend is false".into(),
        );
        self.event(
            false,
            "Resumed",
            format!(
                "resumed: attempt {} starts from the latest checkpoint",
                self.status.attempt
            ),
        );
    }

    fn clear_running(&mut self, reason: &str) {
        if self.status.condition(condition::RUNNING).is_some() {
            self.set_condition(condition::RUNNING, false, reason, String::new());
        }
    }

    fn active(&mut self) {
        if self.deadline_passed() {
            return;
        }
        if self.status.phase == Phase::Restarting && !self.backoff_over() {
            self.stop_current_pods();
            return;
        }
        if self.status.phase == Phase::Pending && !self.launch() {
            return;
        }
        self.evaluate();
    }

    fn deadline_passed(&mut self) -> bool {
        let (Some(deadline), Some(start)) = (
            self.o.spec.active_deadline_seconds,
            self.status.start_time.as_ref(),
        ) else {
            return false;
        };
        let at = start.0 + SignedDuration::from_secs(deadline.max(0));
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        let message = format!("activeDeadlineSeconds {deadline} passed");
        let failure = self.job_failure("DeadlineExceeded", message);
        self.fail(failure, "DeadlineExceeded", "Failed");
        true
    }

    /// In Restarting: true (and the phase moved to Pending of the next attempt) when the
    /// backoff is over.
    fn backoff_over(&mut self) -> bool {
        let since = self
            .status
            .condition(condition::RESTARTING)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0)
            .unwrap_or(self.now());
        let at = since + signed(self.restart_backoff());
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        self.stop_current_pods();
        self.status.attempt += 1;
        self.status.phase = Phase::Pending;
        self.set_condition(
            condition::RESTARTING,
            false,
            "Relaunched",
            format!("attempt {} launched", self.status.attempt),
        );
        true
    }

    /// The API has refused the attempt's pods (see [`launch_refused`]) for the start-up
    /// timeout: the job Fails with the API's message (the next attempt's pods would be refused
    /// alike). Within it, the launch is retried.
    fn create_refused_too_long(&mut self) -> bool {
        let timeout = self.o.spec.startup_timeout_seconds;
        let Some(c) = self
            .status
            .condition(condition::CREATED)
            .filter(|c| c.status == "False" && c.reason == POD_CREATE_REFUSED)
        else {
            return false;
        };
        if timeout <= 0 {
            return false;
        }
        let at = c.last_transition_time.0 + SignedDuration::from_secs(timeout);
        if self.now() < at {
            self.requeue_at(at);
            return false;
        }
        let message = format!("pods not created within {timeout}s: {}", c.message);
        let failure = self.job_failure(POD_CREATE_REFUSED, message);
        self.fail(failure, POD_CREATE_REFUSED, "Failed");
        true
    }

    /// In Pending: creates the attempt's missing pods. True when all exist (moves to Starting).
    fn launch(&mut self) -> bool {
        let replicas = self.o.spec.replicas.max(1);
        let present: Vec<i32> = self.current_pods().map(|p| p.node_rank).collect();
        let missing: Vec<i32> = (0..replicas).filter(|r| !present.contains(r)).collect();
        if missing.is_empty() {
            self.status.phase = Phase::Starting;
            let attempt = self.status.attempt;
            self.set_condition(
                condition::CREATED,
                true,
                "PodsCreated",
                format!("attempt {attempt}: {replicas} pods created"),
            );
            return true;
        }
        if !self.o.spec_problems.is_empty() {
            let message = self.o.spec_problems.join("; ");
            let failure = self.job_failure(INVALID_SPEC, format!("no pods created: {message}"));
            self.fail(failure, INVALID_SPEC, "InvalidSpec");
            return false;
        }
        if self.create_refused_too_long() {
            return false;
        }
        if self.earlier_attempt_remains() {
            return false;
        }
        if self.status.start_time.is_none() {
            self.status.start_time = Some(Time(self.now()));
        }
        let attempt = self.status.attempt;
        if missing.len() as i32 == replicas {
            // A new attempt: what the Running condition said of the last one is history (a
            // fresh job has none, and its first status stays as small as before).
            if self.status.condition(condition::RUNNING).is_some() {
                self.pods_starting();
            }
            let now = self.now();
            self.recovery().start(i64::from(attempt), now);
            let spec = self.o.spec;
            self.event(
                false,
                "Created",
                format!(
                    "attempt {attempt}: creating {replicas} pods x {} ranks (world size {})",
                    spec.procs_per_replica(),
                    spec.world_size()
                ),
            );
        }
        self.actions.push(Action::Launch {
            attempt,
            node_ranks: missing,
        });
        self.requeue_in(Duration::from_secs(30));
        false
    }

    /// One checkpoint writer at a time: no pod of this attempt is created while a pod of an
    /// earlier one exists (its rank 0 may still be saving on SIGTERM, for up to its
    /// termination grace). [`Self::clean_up_old_attempts`] deletes them; one stuck on a lost
    /// node is force-deleted after its grace (the trainer's fence stops it writing, should
    /// it still run behind a partition). True while they remain; Created says so.
    fn earlier_attempt_remains(&mut self) -> bool {
        let attempt = self.status.attempt;
        let mut earlier: Vec<i32> = self
            .o
            .pods
            .iter()
            .filter(|p| p.attempt < attempt)
            .map(|p| p.attempt)
            .collect();
        if earlier.is_empty() {
            return false;
        }
        let count = earlier.len();
        earlier.sort_unstable();
        earlier.dedup();
        let attempts = earlier
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let of = if earlier.len() == 1 {
            format!("attempt {attempts}")
        } else {
            format!("attempts {attempts}")
        };
        let pods = if count == 1 { "pod" } else { "pods" };
        self.set_condition(
            condition::CREATED,
            false,
            PREVIOUS_ATTEMPT_TERMINATING,
            format!(
                "attempt {attempt}: waiting for {count} {pods} of {of} to terminate (one checkpoint writer at a time)"
            ),
        );
        // Their deletion wakes the controller; this is the fallback.
        self.requeue_in(Duration::from_secs(5));
        true
    }

    /// Starting or Running: look at every rank of the current attempt.
    fn evaluate(&mut self) {
        let census = self.census();
        if let Some(failure) = root_cause(census.failures, census.suspects) {
            self.end_attempt(failure);
            return;
        }
        let replicas = self.o.spec.replicas.max(1);
        if census.succeeded == replicas {
            self.succeed(census.rank0);
        } else if census.running + census.succeeded == replicas {
            self.all_running();
            self.track_progress(census.rank0);
            self.requeue_in(self.o.timing.progress_interval);
        } else {
            self.starting(&census.waiting);
        }
    }

    /// Sorts the current attempt's ranks into running, succeeded, failed and waiting.
    fn census(&mut self) -> Census<'o> {
        let replicas = self.o.spec.replicas.max(1);
        let by_rank: BTreeMap<i32, &'o PodView> = self
            .current_pods()
            .filter(|p| p.node_rank < replicas)
            .map(|p| (p.node_rank, p))
            .collect();
        let mut census = Census {
            rank0: by_rank.get(&0).copied(),
            ..Census::default()
        };
        for rank in 0..replicas {
            let Some(&pod) = by_rank.get(&rank) else {
                let mut f = self.failure(rank, None, "PodDeleted", "pod was deleted".into());
                f.killed = true;
                census.failures.push(f);
                continue;
            };
            match &pod.state {
                PodState::Succeeded => census.succeeded += 1,
                PodState::Failed(t) => census.failures.push(self.exited(pod, t)),
                PodState::Running | PodState::Pending => self.check_alive(pod, &mut census),
            }
        }
        census
    }

    /// A pod whose trainer exited non-zero or that failed without it exiting.
    fn exited(&self, pod: &PodView, t: &Termination) -> Failure {
        let reason = if t.exit_code.is_some() {
            "ExitCode"
        } else {
            "PodFailed"
        };
        let message = first_line(if t.message.is_empty() {
            &t.reason
        } else {
            &t.message
        });
        let mut f = self.failure(pod.node_rank, Some(&pod.name), reason, message);
        f.info.exit_code = t.exit_code;
        f.at = t.finished_at;
        f.killed = t.exit_code.is_none_or(|c| c >= 128) || t.reason == "OOMKilled";
        let permanent_codes = &self.o.spec.restart_policy.permanent_exit_codes;
        if let Some(code) = t.exit_code
            && permanent_codes.contains(&code)
        {
            f.permanent = true;
            f.info.reason = "PermanentExitCode".into();
        } else if let Some(d) = &pod.disruption {
            disrupted(&mut f, d);
        }
        f
    }

    /// A pod that runs or waits: deleted, on a lost node, or not starting in time?
    fn check_alive(&mut self, pod: &'o PodView, census: &mut Census<'o>) {
        let rank = pod.node_rank;
        if pod.state == PodState::Running {
            census.running += 1;
        }
        if let Some(since) = pod.deleting_since {
            let message = "pod is being deleted".to_string();
            let mut f = self.failure(rank, Some(&pod.name), "PodDeleted", message);
            (f.at, f.killed) = (Some(since), true);
            if let Some(d) = &pod.disruption {
                disrupted(&mut f, d);
            }
            census.failures.push(f);
        } else if let Some(since) = pod.node_lost_since {
            let message = "the pod's node is NotReady or gone".to_string();
            let mut f = self.failure(rank, Some(&pod.name), "NodeLost", message);
            (f.at, f.killed) = (Some(since), true);
            let at = since + signed(self.o.timing.node_lost_grace);
            if self.now() >= at {
                census.failures.push(f);
            } else {
                self.requeue_at(at);
                f.suspect = true;
                census.suspects.push(f);
            }
        } else if pod.state == PodState::Pending {
            census.waiting.push(pod);
            self.check_startup(pod, census);
        }
    }

    /// A pod not running yet: past `startupTimeoutSeconds` (or with an image name no retry
    /// parses) it ends the attempt with its own reason; before that, a pod that says why it
    /// waits is a suspect should another rank fail meanwhile.
    fn check_startup(&mut self, pod: &PodView, census: &mut Census<'o>) {
        let cause = pod.waiting.as_ref().map(|w| w.cause);
        let reason = cause.map_or("StartupTimeout", WaitCause::reason);
        let said = pod
            .waiting
            .as_ref()
            .map(|w| match w.message.as_str() {
                "" => w.reason.clone(),
                m => format!("{}: {}", w.reason, first_line(m)),
            })
            .unwrap_or_else(|| "no reason given by the scheduler or the kubelet".into());
        let timeout = self.o.spec.startup_timeout_seconds;
        let deadline = pod
            .created
            .filter(|_| timeout > 0)
            .map(|c| c + SignedDuration::from_secs(timeout));
        let mut f = self.failure(pod.node_rank, Some(&pod.name), reason, said.clone());
        f.at = pod.created;
        f.killed = true;
        f.permanent = cause.is_some_and(|c| !c.restart_can_help());
        if cause == Some(WaitCause::InvalidImageName) {
            census.failures.push(f);
        } else if deadline.is_some_and(|at| self.now() >= at) {
            f.info.message = format!("not running {timeout}s after its creation: {said}");
            census.failures.push(f);
        } else {
            if let Some(at) = deadline {
                self.requeue_at(at);
            }
            if cause.is_some_and(WaitCause::is_problem) {
                f.permanent = false;
                f.suspect = true;
                census.suspects.push(f);
            }
        }
    }

    /// The attempt is over: a permanent failure fails the job, anything else restarts it.
    fn end_attempt(&mut self, failure: Failure) {
        if failure.permanent {
            self.event(true, "RankFailed", failure.describe());
            let reason = match failure.info.reason.as_str() {
                "PermanentExitCode" => "PermanentFailure".to_string(),
                other => other.to_string(),
            };
            self.fail(failure, &reason, "Failed");
        } else {
            self.restart_or_fail(failure);
        }
    }

    fn succeed(&mut self, rank0: Option<&PodView>) {
        let (replicas, attempt) = (self.o.spec.replicas.max(1), self.status.attempt);
        self.final_progress(rank0);
        let now = self.now();
        if let Some(r) = self.status.recovery.as_mut() {
            r.end(AttemptEnd {
                cause: EndCause::Succeeded,
                reason: "Succeeded".into(),
                rank: None,
                exit_code: Some(0),
                node: None,
                failed_at: now,
                detected_at: now,
            });
        }
        self.status.phase = Phase::Succeeded;
        self.status.completion_time = Some(Time(self.now()));
        self.clear_running("Succeeded");
        let step = self
            .status
            .progress
            .as_ref()
            .map(|p| format!(" at step {}", p.report.step))
            .unwrap_or_default();
        self.set_condition(
            condition::SUCCEEDED,
            true,
            "AllRanksSucceeded",
            format!("all {replicas} pods of attempt {attempt} exited 0{step}"),
        );
        self.event(
            false,
            "Succeeded",
            format!("training finished: all {replicas} pods exited 0{step}"),
        );
        self.finished();
    }

    /// The last poll is up to an interval old when training ends: rank 0's final report
    /// (its termination message) has the final step, eval and checkpoint. Without one (an
    /// image that writes none) the last polled numbers stay. Either way the phase is
    /// Finished, and rates and ETA, which describe a running attempt, go.
    fn final_progress(&mut self, rank0: Option<&PodView>) {
        if let Some(report) = rank0.and_then(|p| p.final_report.as_deref()) {
            self.store_report(report);
        }
        if let Some(p) = self.status.progress.as_mut() {
            p.report.phase = TrainerPhase::Finished;
        }
        self.end_attempt_progress();
    }

    fn all_running(&mut self) {
        if self.status.phase == Phase::Running {
            return;
        }
        let (replicas, attempt) = (self.o.spec.replicas.max(1), self.status.attempt);
        let now = self.now();
        self.recovery().running(now);
        self.status.phase = Phase::Running;
        self.set_condition(
            condition::RUNNING,
            true,
            "AllRanksRunning",
            format!("all {replicas} pods of attempt {attempt} run"),
        );
        self.event(
            false,
            "Running",
            format!("attempt {attempt}: all {replicas} pods run"),
        );
    }

    /// Some pods do not run yet. The phase stays Starting; a pod that says why it waits
    /// (Unschedulable, ErrImagePull, ...) is named in the Running condition, and a Warning
    /// event carries its reason once per attempt and reason (each attempt's launch resets the
    /// condition to PodsStarting).
    fn starting(&mut self, waiting: &[&PodView]) {
        self.status.phase = Phase::Starting;
        self.requeue_in(Duration::from_secs(30));
        let mut problems: Vec<(&PodView, &Waiting)> = waiting
            .iter()
            .filter_map(|p| p.waiting.as_ref().map(|w| (*p, w)))
            .filter(|(_, w)| w.cause.is_problem())
            .collect();
        problems.sort_by_key(|(p, w)| (w.cause, p.node_rank));
        let Some(&(pod, w)) = problems.first() else {
            let shows_problem = self.status.condition(condition::RUNNING).is_some_and(|c| {
                c.status == "False" && WaitCause::ALL.iter().any(|w| w.reason() == c.reason)
            });
            if shows_problem {
                self.pods_starting();
            }
            return;
        };
        let reason = w.cause.reason();
        let mut message = format!(
            "pod {} (rank {}) waits: {}",
            pod.name, pod.node_rank, w.reason
        );
        if !w.message.is_empty() {
            message = format!("{message}: {}", first_line(&w.message));
        }
        match problems.len() - 1 {
            0 => {}
            1 => message.push_str(" (and 1 more pod waits)"),
            n => message.push_str(&format!(" (and {n} more pods wait)")),
        }
        let known = self
            .status
            .condition(condition::RUNNING)
            .is_some_and(|c| c.status == "False" && c.reason == reason);
        if !known {
            self.event(true, reason, message.clone());
        }
        self.set_condition(condition::RUNNING, false, reason, message);
    }

    /// Running=False/PodsStarting: the attempt's pods are on their way, nothing is wrong.
    fn pods_starting(&mut self) {
        let (replicas, attempt) = (self.o.spec.replicas.max(1), self.status.attempt);
        self.set_condition(
            condition::RUNNING,
            false,
            "PodsStarting",
            format!("attempt {attempt}: waiting for its {replicas} pods to run"),
        );
    }

    /// A failure of rank `rank` of the current attempt; `pod` defaults to the rank's name.
    fn failure(&self, rank: i32, pod: Option<&str>, reason: &str, message: String) -> Failure {
        Failure {
            info: FailureInfo {
                attempt: self.status.attempt,
                node_rank: Some(rank),
                pod: Some(pod.map(str::to_string).unwrap_or_else(|| {
                    crate::labels::pod_name(self.o.job, self.status.attempt, rank)
                })),
                exit_code: None,
                node: self.node_of(rank),
                reason: reason.into(),
                message,
                time: Time(self.now()),
                secondary_failures: 0,
            },
            permanent: false,
            disruption: false,
            at: None,
            killed: false,
            suspect: false,
        }
    }

    /// The node rank `rank` of the current attempt runs (or ran) on: its pod's, else the one
    /// recorded in status.placement when the pod was first seen bound (the pod may be gone
    /// before the operator saw it terminate).
    fn node_of(&self, rank: i32) -> Option<String> {
        let attempt = self.status.attempt;
        self.current_pods()
            .find(|p| p.node_rank == rank)
            .and_then(|p| p.node.clone())
            .or_else(|| {
                self.status
                    .placement
                    .iter()
                    .find(|p| p.attempt == attempt && p.node_rank == rank)
                    .map(|p| p.node.clone())
            })
    }

    /// Keeps status.placement to the current attempt and records every pod of it that is
    /// bound to a node (a pod seen on another node or with another UID under the same rank
    /// replaces the entry). Idempotent: called before deciding and again after, since the
    /// decision may start a new attempt.
    fn record_placement(&mut self) {
        let attempt = self.status.attempt;
        let bound: Vec<Placement> = self
            .current_pods()
            .filter_map(|p| {
                Some(Placement {
                    node_rank: p.node_rank,
                    attempt,
                    pod: p.name.clone(),
                    uid: p.uid.clone(),
                    node: p.node.clone()?,
                })
            })
            .collect();
        let placement = &mut self.status.placement;
        placement.retain(|p| p.attempt == attempt);
        for seen in bound {
            match placement.iter_mut().find(|p| p.node_rank == seen.node_rank) {
                Some(known) => *known = seen,
                None => placement.push(seen),
            }
        }
        placement.sort_by_key(|p| p.node_rank);
    }

    /// A failure of the job as a whole (no pod to blame).
    fn job_failure(&self, reason: &str, message: String) -> Failure {
        let mut f = self.failure(0, None, reason, message);
        (f.info.node_rank, f.info.pod) = (None, None);
        f
    }

    /// A gang restart, counted against maxRestarts unless a disruption caused it.
    fn restart_or_fail(&mut self, failure: Failure) {
        let max = self.o.spec.restart_policy.max_restarts.max(0);
        let describe = failure.describe();
        self.event(
            true,
            if failure.disruption {
                "Disrupted"
            } else {
                "RankFailed"
            },
            describe.clone(),
        );
        if !failure.disruption && self.status.restarts >= max {
            let mut failure = failure;
            failure.info.message = format!("maxRestarts {max} reached; last failure: {describe}");
            self.fail(failure, "MaxRestartsReached", "Failed");
            return;
        }
        if !failure.disruption {
            self.status.restarts += 1;
        }
        let cause = failure.info.reason.clone();
        *self
            .status
            .restarts_by_cause
            .entry(cause.clone())
            .or_default() += 1;
        let ended = if failure.disruption {
            EndCause::Disruption
        } else {
            ended_by(&cause)
        };
        self.record_end(ended, &failure);
        self.status.phase = Phase::Restarting;
        self.set_condition(condition::RESTARTING, true, &cause, describe);
        self.clear_running(&cause);
        self.end_attempt_progress();
        self.status.last_failure = Some(failure.info);
        self.stop_current_pods();
        let wait = self.restart_backoff();
        let next = self.status.attempt + 1;
        let note = if failure.disruption {
            format!(
                "gang restart after a disruption (not counted against maxRestarts {max}): attempt {next} starts in {}s from the latest checkpoint",
                wait.as_secs()
            )
        } else {
            format!(
                "gang restart {}/{max}: attempt {next} starts in {}s from the latest checkpoint",
                self.status.restarts,
                wait.as_secs()
            )
        };
        self.event(true, "Restarting", note);
        self.requeue_in(wait);
    }

    /// The wait before the next attempt: the doubling backoff after failures, the initial
    /// one after a disruption (nothing went wrong that waiting longer would help).
    fn restart_backoff(&self) -> Duration {
        let disrupted = self
            .status
            .last_failure
            .as_ref()
            .is_some_and(|f| f.attempt == self.status.attempt && f.reason == DISRUPTED);
        let restarts = if disrupted { 1 } else { self.status.restarts };
        backoff(self.o.spec, restarts)
    }

    /// Rates and ETA describe the attempt that reported them; once it ended they are no
    /// longer current (step, losses and the last checkpoint stay true).
    fn end_attempt_progress(&mut self) {
        if let Some(p) = self.status.progress.as_mut() {
            let r = &mut p.report;
            r.steps_per_second = None;
            r.samples_per_second = None;
            r.tokens_per_second = None;
            r.step_time_seconds = None;
            r.comm_fraction = None;
            r.eta_seconds = None;
            p.eta = None;
            p.estimated_completion_time = None;
        }
    }

    /// The recovery ledger in the status, started on first use.
    fn recovery(&mut self) -> &mut Recovery {
        self.status.recovery.get_or_insert_with(Recovery::default)
    }

    /// Closes the current attempt's record (if one is open) with `failure`.
    fn record_end(&mut self, cause: EndCause, failure: &Failure) {
        let now = self.now();
        let Some(r) = self.status.recovery.as_mut() else {
            return;
        };
        let i = &failure.info;
        r.end(AttemptEnd {
            cause,
            reason: i.reason.clone(),
            rank: i.node_rank.map(i64::from),
            exit_code: i.exit_code,
            node: i.node.clone(),
            // A pod that vanished went at the latest when it was missed.
            failed_at: failure.at.filter(|at| *at <= now).unwrap_or(now),
            detected_at: now,
        });
    }

    /// Phase Failed with `reason` (the Failed condition's) and a Warning event `event`.
    fn fail(&mut self, failure: Failure, reason: &str, event: &'static str) {
        // Whatever the attempt was waiting for, nothing is now (finished() sets the ttl's).
        self.requeue = None;
        let message = failure.describe();
        self.record_end(ended_by(&failure.info.reason), &failure);
        self.status.phase = Phase::Failed;
        self.status.completion_time = Some(Time(self.now()));
        self.clear_running(reason);
        if self.status.is_true(condition::RESTARTING) {
            self.set_condition(condition::RESTARTING, false, reason, String::new());
        }
        self.set_condition(condition::FAILED, true, reason, message.clone());
        self.end_attempt_progress();
        self.status.last_failure = Some(failure.info);
        self.event(true, event, message);
        self.finished();
    }

    /// Copies rank 0's report into the status when a user-visible value changed, maintains
    /// ProgressAvailable, and restarts a stalled gang.
    fn track_progress(&mut self, rank0: Option<&PodView>) {
        match &self.o.progress {
            ProgressObservation::Report(report) => self.progress_report(report),
            ProgressObservation::Unavailable(why) => self.progress_unavailable(why, rank0),
            ProgressObservation::NotPolled => {}
        }
        self.detect_stall();
    }

    /// Writes `report` into status.progress when a value a user sees changed.
    fn store_report(&mut self, report: &Progress) {
        let now = self.now();
        let rounded = report::rounded(report);
        let changed = self
            .status
            .progress
            .as_ref()
            .is_none_or(|p| report::changed_for_a_user(&p.report, &rounded));
        if changed {
            let eta = report::eta_seconds(&rounded);
            self.status.progress = Some(TrainingProgress {
                eta: eta.map(report::human_duration),
                estimated_completion_time: eta
                    .map(|s| Time(now + SignedDuration::from_secs(s.round() as i64))),
                updated_at: Some(Time(now)),
                report: rounded,
            });
            // With the status written anyway: the ledger's clock moves with the progress.
            if let Some(r) = self.status.recovery.as_mut() {
                r.report(StepReport::of(report), now);
            }
            if self.status.is_true(condition::STALLED) {
                self.set_condition(condition::STALLED, false, "ProgressResumed", String::new());
            }
        }
    }

    fn progress_report(&mut self, report: &Progress) {
        self.store_report(report);
        let was = self
            .status
            .condition(condition::PROGRESS_AVAILABLE)
            .map(|c| c.status.clone());
        if was.as_deref() != Some("True") {
            // After a blip (Unknown) nothing is news; after False it is.
            if was.as_deref() == Some("False") {
                self.event(false, "ProgressAvailable", "rank 0 serves /progress".into());
            }
            self.set_condition(
                condition::PROGRESS_AVAILABLE,
                true,
                "Reported",
                "rank 0 serves /progress".into(),
            );
        }
    }

    /// A poll failed. Never answered: False once rank 0 ran for the grace (an image without
    /// the endpoint). Answered before: Unknown at the first failed poll, False when polls
    /// kept failing for the grace, and the rates and ETA go (they are no longer current).
    /// Stall detection only runs while it is True, so failing polls never restart a gang.
    fn progress_unavailable(&mut self, why: &str, rank0: Option<&PodView>) {
        let now = self.now();
        let grace = self.o.timing.progress_grace;
        let Some(c) = self.status.condition(condition::PROGRESS_AVAILABLE) else {
            let running_since = rank0.and_then(|p| p.running_since).unwrap_or(now);
            let at = running_since + signed(grace);
            if now < at {
                self.requeue_at(at);
                return;
            }
            let message = format!(
                "rank 0 does not serve /progress ({why}); status.progress stays empty and stall detection is off"
            );
            self.event(false, "ProgressUnavailable", message.clone());
            let c = condition::PROGRESS_AVAILABLE;
            self.set_condition(c, false, "NoProgressEndpoint", message);
            return;
        };
        match c.status.as_str() {
            "True" => {
                let message = format!("polling rank 0's /progress failed: {}", first_line(why));
                self.set_condition_to(
                    condition::PROGRESS_AVAILABLE,
                    "Unknown",
                    "PollFailed",
                    message,
                );
                self.requeue_in(grace);
            }
            "Unknown" => {
                let at = c.last_transition_time.0 + signed(grace);
                if now < at {
                    self.requeue_at(at);
                    return;
                }
                let message = format!(
                    "rank 0's /progress has not answered for {}s ({}); rates and ETA are cleared and stall detection is paused until it answers",
                    grace.as_secs(),
                    first_line(why)
                );
                self.event(true, "ProgressUnavailable", message.clone());
                let c = condition::PROGRESS_AVAILABLE;
                self.set_condition(c, false, "PollsFailing", message);
                self.end_attempt_progress();
            }
            _ => {}
        }
    }

    fn detect_stall(&mut self) {
        let timeout = self.o.spec.stall_timeout_seconds;
        if timeout <= 0 || !self.status.is_true(condition::PROGRESS_AVAILABLE) {
            return;
        }
        let running_since = self
            .status
            .condition(condition::RUNNING)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0);
        let updated = self
            .status
            .progress
            .as_ref()
            .and_then(|p| p.updated_at.as_ref())
            .map(|t| t.0);
        let Some(since) = running_since.into_iter().chain(updated).max() else {
            return;
        };
        let at = since + SignedDuration::from_secs(timeout);
        if self.now() < at {
            self.requeue_at(at);
            return;
        }
        let step = self.status.progress.as_ref().map_or(0, |p| p.report.step);
        let message = format!("no progress for {timeout}s (step {step})");
        self.set_condition(condition::STALLED, true, "NoProgress", message.clone());
        self.event(true, "Stalled", message.clone());
        let failure = self.job_failure("Stalled", message);
        self.restart_or_fail(failure);
    }

    /// Pods of older attempts are deleted, terminated ones too: the next attempt starts
    /// only when they are gone ([`Self::earlier_attempt_remains`]), and a pod whose status
    /// says terminated may still run behind a partition (the pod GC marks pods of a vanished
    /// node Failed). `lastFailure` keeps the failed rank's message.
    fn clean_up_old_attempts(&mut self) {
        let current = self.status.attempt;
        let mut doomed = Vec::new();
        for p in self.o.pods.iter().filter(|p| p.attempt < current) {
            if p.deleting_since.is_none() {
                doomed.push(p.name.clone());
            }
        }
        for name in doomed {
            if !self.actions.contains(&Action::DeletePod(name.clone())) {
                self.actions.push(Action::DeletePod(name));
            }
        }
    }

    /// A pod on a lost node never finishes terminating (the kubelet cannot confirm), which
    /// would keep its GPUs booked and its name taken: force-delete it after a grace period.
    fn force_delete_stuck(&mut self) {
        let grace = SignedDuration::try_from(self.o.timing.force_delete_grace)
            .unwrap_or(SignedDuration::ZERO);
        let now = self.now();
        for p in self.o.pods {
            let (Some(deleting), Some(_)) = (p.deleting_since, p.node_lost_since) else {
                continue;
            };
            let at = deleting + grace;
            if now >= at {
                self.actions.push(Action::ForceDeletePod(p.name.clone()));
                self.event(
                    true,
                    "ForceDeleted",
                    format!(
                        "pod {} was stuck terminating on a lost node; force-deleted",
                        p.name
                    ),
                );
            } else {
                self.requeue_at(at);
            }
        }
    }

    fn count_replicas(&mut self) {
        let replicas = self.o.spec.replicas.max(1);
        let pods: Vec<&PodView> = self
            .current_pods()
            .filter(|p| p.node_rank < replicas)
            .collect();
        self.status.replicas = pods.len() as i32;
        self.status.running_replicas = pods
            .iter()
            .filter(|p| p.state == PodState::Running && p.deleting_since.is_none())
            .count() as i32;
        self.status.succeeded_replicas = pods
            .iter()
            .filter(|p| p.state == PodState::Succeeded)
            .count() as i32;
    }
}

/// The root cause of an attempt's end, with the other failures counted. Permanent failures
/// win (no restart can fix them); otherwise the earliest is the cause and the rest collateral
/// (their peer died), a kill before an error at the same second (exit times have second
/// resolution: the rank that was SIGKILLed and the rank whose all-reduce then broke often share
/// one). `suspects` (a node lost within its grace, a pod that cannot start) end nothing on
/// their own, but when something else failed they are candidates for its cause.
fn root_cause(failures: Vec<Failure>, suspects: Vec<Failure>) -> Option<Failure> {
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

/// Deletes first, then the rest (launches need the status written in between; the
/// controller writes the status after deletes).
/// The ledger's cause of an attempt that ended for `reason` (FailureInfo.reason).
fn ended_by(reason: &str) -> EndCause {
    match reason {
        "Stalled" => EndCause::Stall,
        DISRUPTED => EndCause::Disruption,
        "DeadlineExceeded" | "Suspended" => EndCause::Stopped,
        _ => EndCause::Failure,
    }
}

fn order(mut actions: Vec<Action>) -> Vec<Action> {
    actions.sort_by_key(|a| match a {
        Action::ForceDeletePod(_) | Action::DeletePod(_) => 0,
        Action::Launch { .. } => 1,
        Action::DeleteJob => 2,
    });
    actions.dedup();
    actions
}

fn first_line(s: &str) -> String {
    let line = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut out: String = line.chars().take(512).collect();
    if line.chars().count() > 512 {
        out.push('…');
    }
    out
}

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
    let reason = if reason.is_empty() { "Unknown" } else { reason }.to_string();
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
