//! What the operator's tests are made of, written once: the job (`mt` in namespace `ml`: two
//! replicas of the copy task, 1000 steps, checkpoints on claim `ckpt`), its statuses, its
//! pods as the state machine sees them ([`PodView`]) and as the API server holds them
//! ([`Pod`]), and the time ([`t`]). A test changes what it is about (`with_*`, struct update
//! syntax) and takes the rest from here, so a change of the spec or the status is made once.

use ferrotrain_api::Progress;
use ferrotrain_api::crd::{
    DistributedTraining, DistributedTrainingSpec, DistributedTrainingStatus, Phase, condition,
};
use ferrotrain_api::reason;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::gang::{Disruption, PodState, PodView, Termination, WaitCause, Waiting};
use crate::labels;
use crate::objects::{self, BuildSettings};

/// The job's name.
pub const NAME: &str = "mt";
/// The job's namespace.
pub const NS: &str = "ml";
/// The job's UID.
pub const UID: &str = "uid-1";

/// T0 + `s` seconds.
pub fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_750_000_000 + s).unwrap()
}

// The job.

/// Two replicas of the copy task, 1000 steps, checkpoints on claim `ckpt`; a lost pod restarts
/// the whole gang (restartPolicy.inPlace false: the tests of in-place restarts turn it on).
pub fn spec() -> DistributedTrainingSpec {
    serde_json::from_value(serde_json::json!({
        "replicas": 2,
        "trainer": {"task": "copy", "maxSteps": 1000},
        "checkpoint": {"claimName": "ckpt"},
        "restartPolicy": {"inPlace": false},
    }))
    .unwrap()
}

/// The job `mt` in namespace `ml` as the API server returns it: generation 1, created at
/// t(0), [`spec`], no status yet.
pub fn job() -> DistributedTraining {
    let mut dt = DistributedTraining::new(NAME, spec());
    dt.metadata = ObjectMeta {
        name: Some(NAME.into()),
        namespace: Some(NS.into()),
        uid: Some(UID.into()),
        generation: Some(1),
        resource_version: Some("100".into()),
        creation_timestamp: Some(Time(t(0))),
        ..ObjectMeta::default()
    };
    dt
}

/// Changes to [`job`].
pub trait JobExt {
    /// This spec (JSON, as a user writes it) instead of [`spec`].
    fn with_spec(self, spec: serde_json::Value) -> Self;
    /// This status.
    fn with_status(self, status: DistributedTrainingStatus) -> Self;
}

impl JobExt for DistributedTraining {
    fn with_spec(mut self, spec: serde_json::Value) -> Self {
        self.spec = serde_json::from_value(spec).unwrap();
        self
    }

    fn with_status(mut self, status: DistributedTrainingStatus) -> Self {
        self.status = Some(status);
        self
    }
}

// Its status.

/// Condition `type_`, True or False since t(`since`), reason Test.
pub fn cond(type_: &str, status: bool, since: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: "Test".into(),
        message: String::new(),
        last_transition_time: Time(t(since)),
        observed_generation: Some(1),
    }
}

/// A status of generation 1 in `phase`, started at t(0) unless it is the first attempt's
/// Pending.
pub fn status(
    phase: Phase,
    attempt: i32,
    restarts: i32,
    conditions: Vec<Condition>,
) -> DistributedTrainingStatus {
    DistributedTrainingStatus {
        phase,
        attempt,
        restarts,
        start_time: (phase != Phase::Pending || attempt > 0).then(|| Time(t(0))),
        conditions,
        observed_generation: Some(1),
        ..DistributedTrainingStatus::default()
    }
}

/// Starting: the attempt's pods were created at t(0).
pub fn starting_status(attempt: i32, restarts: i32) -> DistributedTrainingStatus {
    status(
        Phase::Starting,
        attempt,
        restarts,
        vec![cond(condition::CREATED, true, 0)],
    )
}

/// Running: created at t(0), both pods run since t(10).
pub fn running_status(attempt: i32, restarts: i32) -> DistributedTrainingStatus {
    DistributedTrainingStatus {
        replicas: 2,
        running_replicas: 2,
        ..status(
            Phase::Running,
            attempt,
            restarts,
            vec![
                cond(condition::CREATED, true, 0),
                Condition {
                    reason: reason::ALL_RANKS_RUNNING.into(),
                    message: format!("all 2 pods of attempt {attempt} run"),
                    ..cond(condition::RUNNING, true, 10)
                },
            ],
        )
    }
}

/// Restarting since t(`since`).
pub fn restarting_status(attempt: i32, restarts: i32, since: i64) -> DistributedTrainingStatus {
    status(
        Phase::Restarting,
        attempt,
        restarts,
        vec![
            cond(condition::CREATED, true, 0),
            cond(condition::RESTARTING, true, since),
        ],
    )
}

/// Rank 0's report at `step` of 1000, two steps a second.
pub fn report(step: u64, loss: f64) -> Progress {
    Progress {
        step,
        total_steps: 1000,
        steps_per_second: Some(2.0),
        loss: Some(loss),
        // The trainer owns the ETA (the operator does not estimate it from the rate).
        eta_seconds: Some((1000 - step.min(1000)) as f64 / 2.0),
        ..Progress::default()
    }
}

// Its pods as the state machine sees them.

/// The scheduler's words for a pod no node fits.
pub const NO_FIT: &str = "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s). preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";
/// The kubelet's words for an image it cannot pull.
pub const PULL: &str = "Back-off pulling image \"registry.example/ferrotrain:nope\"";

/// Pod `mt-<attempt>-<rank>` in `state`, created at t(0) on node `node-<rank>` (running
/// since t(0) when it runs).
pub fn pod_view(attempt: i32, rank: i32, state: PodState) -> PodView {
    PodView {
        name: labels::pod_name(NAME, attempt, rank),
        attempt,
        node_rank: rank,
        running_since: matches!(state, PodState::Running).then(|| t(0)),
        ended_at: None,
        state,
        deleting_since: None,
        node_lost_since: None,
        node: Some(format!("node-{rank}")),
        uid: Some(format!("uid-{attempt}-{rank}")),
        created: Some(t(0)),
        waiting: None,
        disruption: None,
        final_report: None,
    }
}

pub fn running(attempt: i32, rank: i32) -> PodView {
    pod_view(attempt, rank, PodState::Running)
}

pub fn pending(attempt: i32, rank: i32) -> PodView {
    pod_view(attempt, rank, PodState::Pending)
}

/// Exited with `code` at t(`at`): Succeeded for 0, else Failed with `message`.
pub fn exited(attempt: i32, rank: i32, code: i32, message: &str, at: i64) -> PodView {
    pod_view(
        attempt,
        rank,
        if code == 0 {
            PodState::Succeeded
        } else {
            PodState::Failed(Termination {
                exit_code: Some(code),
                reason: "Error".into(),
                message: message.into(),
                finished_at: Some(t(at)),
            })
        },
    )
}

/// A pending pod that says why it waits.
pub fn stuck(attempt: i32, rank: i32, reason: &str, message: &str) -> PodView {
    let mut p = pending(attempt, rank);
    let cause = if reason == "Unschedulable" {
        WaitCause::Unschedulable
    } else {
        WaitCause::of_container_reason(reason)
    };
    p.waiting = Some(Waiting {
        cause,
        reason: reason.into(),
        message: message.into(),
    });
    p
}

/// Rank `rank`'s pod of attempt `attempt` that no node fits (not bound, Unschedulable).
pub fn unplaced(attempt: i32, rank: i32) -> PodView {
    let mut p = stuck(attempt, rank, "Unschedulable", "0/2 nodes are available");
    p.node = None;
    p
}

/// Makes `s` elastic with in-place restarts: `replicas` pods asked for, at least `min`, up to
/// `max` (None: replicas), a 30 s elastic wait.
pub fn elastic(s: &mut DistributedTrainingSpec, replicas: i32, min: i32, max: Option<i32>) {
    s.replicas = replicas;
    s.restart_policy.in_place = true;
    s.elastic = Some(ferrotrain_api::crd::ElasticSpec {
        min_replicas: Some(min),
        max_replicas: max,
        wait_seconds: 30,
        surplus_priority_class_name: None,
    });
}

/// `p` with a disruption condition of `reason`.
pub fn disrupted(mut p: PodView, reason: &str) -> PodView {
    p.disruption = Some(Disruption {
        reason: reason.into(),
        message: String::new(),
        since: None,
    });
    p
}

/// `p` being deleted since t(`since`).
pub fn deleting(mut p: PodView, since: i64) -> PodView {
    p.deleting_since = Some(t(since));
    p
}

/// `p` on a node NotReady since t(`since`).
pub fn node_lost(mut p: PodView, since: i64) -> PodView {
    p.node_lost_since = Some(t(since));
    p
}

// Its pods as the API server holds them.

/// What the tests build objects with.
pub fn build_settings() -> BuildSettings {
    BuildSettings {
        trainer_image: "registry.example/ferrotrain:1".into(),
        master_port: 29500,
        trainer_metrics_port: 9090,
        termination_grace_seconds: 70,
        restarts_left: 10,
        round: 0,
        gang: crate::scheduling::GangMode::Off,
        operator_pods: None,
        store_service: None,
    }
}

/// Pod `mt-<attempt>-<rank>` of [`job`] as the operator builds it, Pending: not scheduled,
/// no container started.
pub fn api_pod(attempt: i32, rank: i32) -> Pod {
    let dt = job();
    let owner = objects::Owner::of(&dt).unwrap();
    let mut p = objects::pod(&owner, &dt.spec, attempt, rank, &build_settings());
    p.status = Some(PodStatus {
        phase: Some("Pending".into()),
        ..PodStatus::default()
    });
    p
}

/// Changes to [`api_pod`].
pub trait PodExt {
    /// The trainer container in `state`, and the pod's phase as the kubelet then reports it.
    fn with_trainer(self, state: ContainerState) -> Self;
    /// The pod's phase alone (no container status).
    fn in_phase(self, phase: &str) -> Self;
    /// Scheduled on `node`.
    fn on_node(self, node: &str) -> Self;
    /// With this pod IP.
    fn with_ip(self, ip: &str) -> Self;
}

impl PodExt for Pod {
    fn with_trainer(self, state: ContainerState) -> Self {
        let phase = match (&state.running, &state.terminated) {
            (Some(_), _) => "Running",
            (None, Some(t)) if t.exit_code == 0 => "Succeeded",
            (None, Some(_)) => "Failed",
            (None, None) => "Pending",
        };
        let mut p = self.in_phase(phase);
        p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: labels::TRAINER_CONTAINER.into(),
            state: Some(state),
            ..ContainerStatus::default()
        }]);
        p
    }

    fn in_phase(mut self, phase: &str) -> Self {
        self.status.get_or_insert_with(PodStatus::default).phase = Some(phase.into());
        self
    }

    fn on_node(mut self, node: &str) -> Self {
        self.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
        self
    }

    fn with_ip(mut self, ip: &str) -> Self {
        self.status.get_or_insert_with(PodStatus::default).pod_ip = Some(ip.into());
        self
    }
}

/// The trainer container runs since t(5).
pub fn trainer_running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(Time(t(5))),
        }),
        ..ContainerState::default()
    }
}

/// The trainer container exited with `code` at t(90), its termination message `message`.
pub fn trainer_exited(code: i32, message: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            message: Some(message.into()),
            finished_at: Some(Time(t(90))),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}
