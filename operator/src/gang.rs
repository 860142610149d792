//! The gang state machine: given what the operator observed (the object's spec and status,
//! its pods, rank 0's progress report, the time), decide the next status, the actions and the
//! events. Pure: no client, no async, no clock — every test is a table row.
//!
//! Everything it needs to remember lives in the status it returns (phase, attempt, restarts,
//! condition transition times, progress with its update time) and in the pods' labels
//! (attempt, node rank), so a restarted operator decides exactly as the old one would have.

use std::collections::BTreeMap;
use std::time::Duration;

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{
    DistributedTrainingSpec, DistributedTrainingStatus, FailureInfo, Phase, TrainingProgress,
    condition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::progress;

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
    /// When the trainer container started running.
    pub running_since: Option<Timestamp>,
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

impl Default for Timing {
    fn default() -> Self {
        Timing {
            progress_interval: Duration::from_secs(5),
            progress_grace: Duration::from_secs(120),
            node_lost_grace: Duration::from_secs(60),
            force_delete_grace: Duration::from_secs(60),
        }
    }
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
    finished_at: Option<Timestamp>,
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
        if i.message.is_empty() {
            what
        } else {
            format!("{what}: {}", i.message)
        }
    }
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
            Phase::Succeeded | Phase::Failed => self.finished(),
            _ if o.spec.suspend => self.suspend(),
            Phase::Suspended => {
                self.resume();
                self.active();
            }
            _ => self.active(),
        }
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
        set_condition(
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

    fn suspend(&mut self) {
        if self.status.phase != Phase::Suspended {
            let from = self.status.phase;
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
        let failure = Failure {
            info: FailureInfo {
                attempt: self.status.attempt,
                node_rank: None,
                pod: None,
                exit_code: None,
                reason: "DeadlineExceeded".into(),
                message: format!("activeDeadlineSeconds {deadline} passed"),
                time: Time(self.now()),
            },
            permanent: true,
            finished_at: None,
        };
        self.fail(failure, "DeadlineExceeded");
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
        let at = since
            + SignedDuration::try_from(backoff(self.o.spec, self.status.restarts))
                .unwrap_or(SignedDuration::ZERO);
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
            let already = self
                .status
                .condition(condition::CREATED)
                .is_some_and(|c| c.reason == "InvalidSpec" && c.message == message);
            if !already {
                self.event(true, "InvalidSpec", format!("no pods created: {message}"));
            }
            self.set_condition(condition::CREATED, false, "InvalidSpec", message);
            return false;
        }
        if self.status.start_time.is_none() {
            self.status.start_time = Some(Time(self.now()));
        }
        let attempt = self.status.attempt;
        if missing.len() as i32 == replicas {
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

    /// Starting or Running: look at every rank of the current attempt.
    fn evaluate(&mut self) {
        let replicas = self.o.spec.replicas.max(1);
        let now = self.now();
        let by_rank: BTreeMap<i32, &PodView> = self
            .current_pods()
            .filter(|p| p.node_rank < replicas)
            .map(|p| (p.node_rank, p))
            .collect();
        let mut failures = Vec::new();
        let mut running = 0;
        let mut succeeded = 0;
        let attempt = self.status.attempt;
        for rank in 0..replicas {
            let Some(pod) = by_rank.get(&rank) else {
                failures.push(self.failure(
                    rank,
                    None,
                    "PodDeleted",
                    "pod was deleted".into(),
                    None,
                ));
                continue;
            };
            match &pod.state {
                PodState::Succeeded => {
                    succeeded += 1;
                    continue;
                }
                PodState::Failed(t) => {
                    let mut f = self.failure(
                        rank,
                        Some(&pod.name),
                        if t.exit_code.is_some() {
                            "ExitCode"
                        } else {
                            "PodFailed"
                        },
                        first_line(if t.message.is_empty() {
                            &t.reason
                        } else {
                            &t.message
                        }),
                        t.exit_code,
                    );
                    f.finished_at = t.finished_at;
                    if let Some(code) = t.exit_code
                        && self
                            .o
                            .spec
                            .restart_policy
                            .permanent_exit_codes
                            .contains(&code)
                    {
                        f.permanent = true;
                        f.info.reason = "PermanentExitCode".into();
                    }
                    failures.push(f);
                    continue;
                }
                PodState::Running => running += 1,
                PodState::Pending => {}
            }
            if pod.deleting_since.is_some() {
                failures.push(self.failure(
                    rank,
                    Some(&pod.name),
                    "PodDeleted",
                    "pod is being deleted (evicted, preempted or drained)".into(),
                    None,
                ));
            } else if let Some(since) = pod.node_lost_since {
                let at = since
                    + SignedDuration::try_from(self.o.timing.node_lost_grace)
                        .unwrap_or(SignedDuration::ZERO);
                if now >= at {
                    failures.push(self.failure(
                        rank,
                        Some(&pod.name),
                        "NodeLost",
                        "the pod's node is NotReady or gone".into(),
                        None,
                    ));
                } else {
                    self.requeue_at(at);
                }
            }
        }

        if let Some(failure) = pick_failure(failures) {
            if failure.permanent {
                self.event(true, "RankFailed", failure.describe());
                self.fail(failure, "PermanentFailure");
            } else {
                self.restart_or_fail(failure);
            }
            return;
        }

        if succeeded == replicas {
            self.status.phase = Phase::Succeeded;
            self.status.completion_time = Some(Time(now));
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
            return;
        }

        if running + succeeded == replicas {
            if self.status.phase != Phase::Running {
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
            self.track_progress(by_rank.get(&0).copied());
            self.requeue_in(self.o.timing.progress_interval);
        } else {
            self.status.phase = Phase::Starting;
            self.requeue_in(Duration::from_secs(30));
        }
    }

    fn failure(
        &self,
        rank: i32,
        pod: Option<&str>,
        reason: &str,
        message: String,
        exit_code: Option<i32>,
    ) -> Failure {
        Failure {
            info: FailureInfo {
                attempt: self.status.attempt,
                node_rank: Some(rank),
                pod: Some(pod.map(str::to_string).unwrap_or_else(|| {
                    crate::labels::pod_name(self.o.job, self.status.attempt, rank)
                })),
                exit_code,
                reason: reason.into(),
                message,
                time: Time(self.now()),
            },
            permanent: false,
            finished_at: None,
        }
    }

    fn restart_or_fail(&mut self, failure: Failure) {
        let max = self.o.spec.restart_policy.max_restarts.max(0);
        self.event(true, "RankFailed", failure.describe());
        if self.status.restarts >= max {
            let mut failure = failure;
            failure.info.message = format!(
                "maxRestarts {max} reached; last failure: {}",
                failure.describe()
            );
            self.fail(failure, "MaxRestartsReached");
            return;
        }
        self.status.restarts += 1;
        self.status.phase = Phase::Restarting;
        let wait = backoff(self.o.spec, self.status.restarts);
        let describe = failure.describe();
        self.set_condition(
            condition::RESTARTING,
            true,
            &failure.info.reason,
            describe.clone(),
        );
        self.clear_running(&failure.info.reason);
        self.status.last_failure = Some(failure.info);
        self.stop_current_pods();
        self.event(
            true,
            "Restarting",
            format!(
                "gang restart {}/{max}: attempt {} starts in {}s from the latest checkpoint",
                self.status.restarts,
                self.status.attempt + 1,
                wait.as_secs()
            ),
        );
        self.requeue_in(wait);
    }

    fn fail(&mut self, failure: Failure, reason: &str) {
        let message = failure.describe();
        self.status.phase = Phase::Failed;
        self.status.completion_time = Some(Time(self.now()));
        self.clear_running(reason);
        if self.status.is_true(condition::RESTARTING) {
            self.set_condition(condition::RESTARTING, false, reason, String::new());
        }
        self.set_condition(condition::FAILED, true, reason, message.clone());
        self.status.last_failure = Some(failure.info);
        self.event(true, "Failed", message);
        self.finished();
    }

    /// Copies rank 0's report into the status when a user-visible value changed, maintains
    /// ProgressAvailable, and restarts a stalled gang.
    fn track_progress(&mut self, rank0: Option<&PodView>) {
        let now = self.now();
        let o = self.o;
        match &o.progress {
            ProgressObservation::Report(report) => {
                let rounded = progress::rounded(report);
                let changed = self
                    .status
                    .progress
                    .as_ref()
                    .is_none_or(|p| p.report != rounded);
                if changed {
                    let eta = progress::eta_seconds(&rounded);
                    self.status.progress = Some(TrainingProgress {
                        eta: eta.map(progress::human_duration),
                        estimated_completion_time: eta
                            .map(|s| Time(now + SignedDuration::from_secs(s.round() as i64))),
                        updated_at: Some(Time(now)),
                        report: rounded,
                    });
                    if self.status.is_true(condition::STALLED) {
                        self.set_condition(
                            condition::STALLED,
                            false,
                            "ProgressResumed",
                            String::new(),
                        );
                    }
                }
                if !self.status.is_true(condition::PROGRESS_AVAILABLE) {
                    if self
                        .status
                        .condition(condition::PROGRESS_AVAILABLE)
                        .is_some()
                    {
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
            ProgressObservation::Unavailable(why) => {
                let known = self
                    .status
                    .condition(condition::PROGRESS_AVAILABLE)
                    .is_some();
                let running_since = rank0.and_then(|p| p.running_since).unwrap_or(now);
                let grace_end = running_since
                    + SignedDuration::try_from(self.o.timing.progress_grace)
                        .unwrap_or(SignedDuration::ZERO);
                if !known && now >= grace_end {
                    let message = format!(
                        "rank 0 does not serve /progress ({why}); status.progress stays empty and stall detection is off"
                    );
                    self.event(false, "ProgressUnavailable", message.clone());
                    self.set_condition(
                        condition::PROGRESS_AVAILABLE,
                        false,
                        "NoProgressEndpoint",
                        message,
                    );
                }
            }
            ProgressObservation::NotPolled => {}
        }
        self.detect_stall();
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
        let failure = Failure {
            info: FailureInfo {
                attempt: self.status.attempt,
                node_rank: None,
                pod: None,
                exit_code: None,
                reason: "Stalled".into(),
                message,
                time: Time(self.now()),
            },
            permanent: false,
            finished_at: None,
        };
        self.restart_or_fail(failure);
    }

    /// Pods of older attempts: running ones are deleted; terminated ones of the previous
    /// attempt stay (their logs explain the restart), older ones go.
    fn clean_up_old_attempts(&mut self) {
        let current = self.status.attempt;
        let mut doomed = Vec::new();
        for p in self.o.pods.iter().filter(|p| p.attempt < current) {
            let keep_for_logs = p.state.is_terminated() && p.attempt == current - 1;
            if p.deleting_since.is_none() && !keep_for_logs {
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

/// Permanent failures win (no restart can fix them); otherwise the rank that failed first is
/// the cause and the others are collateral (their peer died).
fn pick_failure(mut failures: Vec<Failure>) -> Option<Failure> {
    failures.sort_by(|a, b| {
        b.permanent
            .cmp(&a.permanent)
            .then_with(|| {
                // Failures with an exit time first, earliest first.
                match (a.finished_at, b.finished_at) {
                    (Some(x), Some(y)) => x.cmp(&y),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                }
            })
            .then_with(|| a.info.node_rank.cmp(&b.info.node_rank))
    });
    failures.into_iter().next()
}

/// Deletes first, then the rest (launches need the status written in between; the
/// controller writes the status after deletes).
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
    let status = if status { "True" } else { "False" }.to_string();
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
