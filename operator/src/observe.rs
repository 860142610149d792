//! Observe: turn the cluster's objects (pods, nodes) into the plain data the state machine
//! decides from, and check what the schema cannot (the trainer config's cross-field rules,
//! volume references).

use ferrotrain_api::Progress;
use ferrotrain_api::crd::DistributedTrainingSpec;
use ferrotrain_api::reason;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::gang::{Disruption, PodState, PodView, Termination, WaitCause, Waiting};
use crate::labels;

/// The pod as the state machine sees it; None for a pod without the operator's labels.
/// `node` is the pod's node (None when it is unscheduled or the node object is gone; `node_known`
/// tells which).
pub fn pod_view(pod: &Pod, node: Option<&Node>) -> Option<PodView> {
    let meta = &pod.metadata;
    let labels = meta.labels.as_ref()?;
    let attempt = labels.get(labels::ATTEMPT)?.parse().ok()?;
    let node_rank = labels.get(labels::NODE_RANK)?.parse().ok()?;
    let status = pod.status.as_ref();
    let trainer = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == labels::TRAINER_CONTAINER));
    let state = trainer.and_then(|c| c.state.as_ref());
    let pod_phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");

    let terminated = state.and_then(|s| s.terminated.as_ref());
    let pod_state = if let Some(t) = terminated {
        if t.exit_code == 0 {
            PodState::Succeeded
        } else {
            PodState::Failed(Termination {
                exit_code: Some(t.exit_code),
                reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
                message: t.message.clone().unwrap_or_default(),
                finished_at: t.finished_at.as_ref().map(|f| f.0),
            })
        }
    } else if pod_phase == "Failed" {
        // Evicted, node shutdown, deadline...: the pod failed without its container exiting.
        PodState::Failed(Termination {
            exit_code: None,
            reason: status
                .and_then(|s| s.reason.clone())
                .unwrap_or_else(|| reason::POD_FAILED.into()),
            message: status.and_then(|s| s.message.clone()).unwrap_or_default(),
            finished_at: None,
        })
    } else if pod_phase == "Succeeded" {
        PodState::Succeeded
    } else if state.and_then(|s| s.running.as_ref()).is_some() {
        PodState::Running
    } else {
        PodState::Pending
    };
    let running_since = state
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0);

    let scheduled_on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let node_lost_since = match (scheduled_on, node) {
        (None, _) => None,
        (Some(_), Some(node)) => node_not_ready_since(node),
        // Scheduled on a node that no longer exists: lost since forever.
        (Some(_), None) => Some(Timestamp::UNIX_EPOCH),
    };

    let waiting = (pod_state == PodState::Pending)
        .then(|| waiting(pod))
        .flatten();
    Some(PodView {
        name: meta.name.clone()?,
        attempt,
        node_rank,
        state: pod_state,
        deleting_since: meta.deletion_timestamp.as_ref().map(|t| t.0),
        node_lost_since,
        node: scheduled_on.map(str::to_string),
        uid: meta.uid.clone(),
        running_since,
        ended_at: terminated.and_then(|t| t.finished_at.as_ref()).map(|f| f.0),
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        waiting,
        disruption: disruption(pod),
        final_report: terminated
            .filter(|t| t.exit_code == 0)
            .and_then(|t| t.message.as_deref())
            .and_then(Progress::from_termination_message)
            .map(Box::new),
    })
}

/// Why a pending pod waits: the scheduler's PodScheduled=False first (an unscheduled pod has
/// no container status worth reading), then the trainer container's waiting reason.
fn waiting(pod: &Pod) -> Option<Waiting> {
    let status = pod.status.as_ref()?;
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        let reason = c.reason.clone().unwrap_or_else(|| "Unschedulable".into());
        if reason == SCHEDULING_GATED {
            return Some(Waiting {
                cause: WaitCause::Queued,
                message: gates(pod),
                reason,
            });
        }
        return Some(Waiting {
            cause: WaitCause::Unschedulable,
            reason,
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == labels::TRAINER_CONTAINER)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())?;
    let reason = waiting.reason.clone().unwrap_or_default();
    let cause = WaitCause::of_container_reason(&reason);
    let mut message = waiting.message.clone().unwrap_or_default();
    if cause == WaitCause::Creating {
        // Multi-Attach and mount failures show only in the pod's Events, never in its status.
        let claims = claim_names(pod);
        if !claims.is_empty() {
            message = format!(
                "likely cause: a volume not attached or mounted (claims {}); the pod's events say (FailedAttachVolume, FailedMount, Multi-Attach)",
                claims.join(", ")
            );
        }
    }
    Some(Waiting {
        cause,
        reason: if reason.is_empty() {
            "ContainerCreating".into()
        } else {
            reason
        },
        message,
    })
}

/// PodScheduled's reason while scheduling gates hold a pod (the API server sets it).
const SCHEDULING_GATED: &str = "SchedulingGated";

/// "held by scheduling gates kueue.x-k8s.io/admission, ...".
fn gates(pod: &Pod) -> String {
    let names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.scheduling_gates.iter().flatten())
        .map(|g| g.name.as_str())
        .collect();
    if names.is_empty() {
        return "held by scheduling gates".into();
    }
    format!("held by scheduling gates {}", names.join(", "))
}

fn claim_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect()
}

/// Pod phase Failed reasons of disruptions: the kubelet's eviction (pkg/kubelet/eviction),
/// critical-pod preemption (pkg/kubelet/preemption) and graceful node shutdown
/// (pkg/kubelet/nodeshutdown: "Terminated", and "NodeShutdown" for a pod refused meanwhile).
const DISRUPTED_POD_REASONS: [&str; 4] = ["Evicted", "Preempting", "Terminated", "NodeShutdown"];

/// The pod is being or was taken away: a failed phase with a disruption's reason (the
/// kubelet's own words: `Evicted` and which resource ran low or which limit was passed), else
/// DisruptionTarget=True (set by the scheduler's preemption, the eviction API, the taint
/// manager and the kubelet before they delete or stop the pod).
fn disruption(pod: &Pod) -> Option<Disruption> {
    let status = pod.status.as_ref()?;
    // Kueue marks the pods it preempts with TerminationTarget before deleting them.
    let target = status.conditions.iter().flatten().find(|c| {
        matches!(c.type_.as_str(), "DisruptionTarget" | "TerminationTarget") && c.status == "True"
    });
    let since = target
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .or_else(|| trainer_finished_at(status));
    let failed_reason = status
        .reason
        .as_deref()
        .filter(|r| status.phase.as_deref() == Some("Failed") && DISRUPTED_POD_REASONS.contains(r));
    if let Some(reason) = failed_reason {
        return Some(Disruption {
            reason: reason.to_string(),
            message: status.message.clone().unwrap_or_default(),
            since,
        });
    }
    target.map(|c| Disruption {
        reason: c
            .reason
            .clone()
            .unwrap_or_else(|| "DisruptionTarget".into()),
        message: c.message.clone().unwrap_or_default(),
        since,
    })
}

/// When the trainer container ended, if it did.
fn trainer_finished_at(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<Timestamp> {
    status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == labels::TRAINER_CONTAINER)
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
}

/// When the node's Ready condition stopped being True (None while it is Ready).
pub fn node_not_ready_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(
            c.last_transition_time
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(Timestamp::UNIX_EPOCH),
        ),
        None => Some(Timestamp::UNIX_EPOCH),
    }
}

/// Problems the schema cannot catch; any of them keeps the job from launching pods (a Warning
/// event names it, and the job waits for a spec change).
pub fn spec_problems(spec: &DistributedTrainingSpec) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(config) = &spec.trainer {
        for e in config.validate() {
            problems.push(format!("spec.trainer.{}: {}", e.path, e.reason));
        }
    }
    let volumes: Vec<&str> = spec
        .pod_template
        .as_ref()
        .map(|t| t.volumes.iter().map(|v| v.name.as_str()).collect())
        .unwrap_or_default();
    let named = [
        (
            "spec.checkpoint.volumeName",
            spec.checkpoint
                .as_ref()
                .and_then(|c| c.volume_name.as_deref()),
        ),
        (
            "spec.data.volumeName",
            spec.data.as_ref().and_then(|d| d.volume_name.as_deref()),
        ),
    ];
    for (field, name) in named {
        if let Some(name) = name
            && !volumes.contains(&name)
        {
            problems.push(format!(
                "{field}: no volume named {name:?} in spec.podTemplate.volumes"
            ));
        }
    }
    let secret = spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.store_secret_name.as_ref());
    let store = spec
        .trainer
        .as_ref()
        .and_then(|t| t.checkpoint.store.as_ref());
    if spec.pytorch.is_some() {
        let others = [
            ("spec.command", spec.command.is_some()),
            ("spec.args", spec.args.is_some()),
            ("spec.trainer", spec.trainer.is_some()),
        ];
        for (field, set) in others {
            if set {
                problems.push(format!(
                    "spec.pytorch excludes {field}: it runs your command under ferrotrain's launcher"
                ));
            }
        }
        if spec.image.is_none() {
            problems.push(
                "spec.pytorch needs spec.image: an image with Python, torch and ferrotrain-launch"
                    .into(),
            );
        }
    }
    if secret.is_some() && store.is_none() {
        problems.push(
            "spec.checkpoint.storeSecretName: needs spec.trainer.checkpoint.store, the bucket its credentials are for".into(),
        );
    }
    let reserved = crate::objects::RESERVED_VOLUMES;
    for v in &volumes {
        if reserved.contains(v) {
            problems.push(format!(
                "spec.podTemplate.volumes: the name {v:?} is reserved by the operator"
            ));
        }
    }
    problems
}

/// The job's port range must leave out the operator's rendezvous and progress ports: as the
/// pods' ephemeral range, the kernel could hand one of them to an outgoing connection, and
/// the store or the progress server could then not bind it.
pub fn port_problems(spec: &DistributedTrainingSpec, ports: &[(&str, u16)]) -> Vec<String> {
    let np = &spec.network_policy;
    if !np.enabled {
        return Vec::new();
    }
    ports
        .iter()
        .filter(|(_, port)| np.port_range.contains(i32::from(*port)))
        .map(|(what, port)| {
            format!(
                "spec.networkPolicy.portRange: {} holds the {what} port {port}; choose a range without it",
                np.port_range.env_value()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{PodExt, api_pod};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        NodeCondition, NodeStatus, PersistentVolumeClaimVolumeSource, PodCondition, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn node(ready: &str, since: &str) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_transition_time: Some(Time(ts(since))),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn reads_attempt_rank_and_running_state() {
        let running = ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(ts("2025-01-01T00:00:10Z"))),
            }),
            ..ContainerState::default()
        };
        let healthy = node("True", "2025-01-01T00:00:00Z");
        let v = pod_view(
            &api_pod(2, 1).with_trainer(running).on_node("n1"),
            Some(&healthy),
        )
        .unwrap();
        assert_eq!((v.attempt, v.node_rank), (2, 1));
        assert_eq!(v.state, PodState::Running);
        assert_eq!(v.running_since, Some(ts("2025-01-01T00:00:10Z")));
        assert_eq!(v.node_lost_since, None);
    }

    #[test]
    fn exit_code_reason_and_termination_message_are_kept() {
        let terminated = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 3,
                reason: Some("Error".into()),
                message: Some("data/train.en: no such file".into()),
                finished_at: Some(Time(ts("2025-01-01T00:01:00Z"))),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        };
        let v = pod_view(&api_pod(2, 1).with_trainer(terminated), None).unwrap();
        assert_eq!(
            v.state,
            PodState::Failed(Termination {
                exit_code: Some(3),
                reason: "Error".into(),
                message: "data/train.en: no such file".into(),
                finished_at: Some(ts("2025-01-01T00:01:00Z")),
            })
        );
    }

    #[test]
    fn a_successful_rank_0_carries_its_final_report_from_the_termination_message() {
        let exited = |code: i32, message: &str| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: Some(message.into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        };
        let report = Progress {
            phase: ferrotrain_api::TrainerPhase::Finished,
            step: 2000,
            total_steps: 2000,
            eval_loss: Some(0.25),
            ..Progress::default()
        };
        let message = report.to_termination_message();
        let v = pod_view(&api_pod(2, 1).with_trainer(exited(0, &message)), None).unwrap();
        assert_eq!(v.state, PodState::Succeeded);
        assert_eq!(v.final_report.as_deref(), Some(&report));
        // A failure's message is a reason, and a success without a report has none.
        let v = pod_view(&api_pod(2, 1).with_trainer(exited(1, &message)), None).unwrap();
        assert_eq!(v.final_report, None);
        let v = pod_view(&api_pod(2, 1).with_trainer(exited(0, "done")), None).unwrap();
        assert_eq!(v.final_report, None);
    }

    #[test]
    fn evicted_pod_fails_without_exit_code() {
        let mut p = api_pod(2, 1).in_phase("Failed").on_node("n1");
        let status = p.status.as_mut().unwrap();
        status.reason = Some("Evicted".into());
        status.message = Some("The node was low on resource: memory.".into());
        let v = pod_view(&p, Some(&node("True", "2025-01-01T00:00:00Z"))).unwrap();
        let PodState::Failed(t) = v.state else {
            panic!("expected failed");
        };
        assert_eq!(t.exit_code, None);
        assert_eq!(t.reason, "Evicted");
    }

    #[test]
    fn node_not_ready_or_gone_is_lost() {
        let p = api_pod(2, 1).in_phase("Running").on_node("n1");
        let sick = node("Unknown", "2025-01-01T00:05:00Z");
        assert_eq!(
            pod_view(&p, Some(&sick)).unwrap().node_lost_since,
            Some(ts("2025-01-01T00:05:00Z"))
        );
        assert_eq!(
            pod_view(&p, None).unwrap().node_lost_since,
            Some(Timestamp::UNIX_EPOCH)
        );
        let unscheduled = api_pod(2, 1);
        assert_eq!(pod_view(&unscheduled, None).unwrap().node_lost_since, None);
    }

    #[test]
    fn unlabelled_pod_is_ignored() {
        let mut p = api_pod(2, 1).in_phase("Running");
        p.metadata.labels = None;
        assert!(pod_view(&p, None).is_none());
    }

    fn waiting_pod(reason: &str, message: &str) -> Pod {
        let state = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..ContainerState::default()
        };
        api_pod(2, 1).with_trainer(state).on_node("n1")
    }

    #[test]
    fn kubelet_waiting_reasons_are_read_from_the_trainer_container() {
        let cases = [
            ("ErrImagePull", WaitCause::ImagePull),
            ("ImagePullBackOff", WaitCause::ImagePull),
            ("ErrImageNeverPull", WaitCause::ImagePull),
            ("InvalidImageName", WaitCause::InvalidImageName),
            ("CreateContainerConfigError", WaitCause::ContainerConfig),
            ("CreateContainerError", WaitCause::ContainerError),
            ("ContainerCreating", WaitCause::Creating),
        ];
        for (reason, cause) in cases {
            let p = waiting_pod(reason, "the kubelet's words");
            let w = pod_view(&p, None).unwrap().waiting.unwrap();
            assert_eq!((w.cause, w.reason.as_str()), (cause, reason));
            if cause != WaitCause::Creating {
                assert_eq!(w.message, "the kubelet's words");
            }
        }
        let image = [WaitCause::ImagePull, WaitCause::InvalidImageName];
        assert!(image.iter().all(|c| !c.restart_can_help()));
        assert!(!WaitCause::ContainerConfig.restart_can_help());
        assert!(WaitCause::Unschedulable.restart_can_help());
    }

    #[test]
    fn an_unscheduled_pod_waits_with_the_schedulers_message() {
        let mut p = api_pod(2, 1);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/2 nodes are available: 1 Insufficient cpu.".into()),
            ..PodCondition::default()
        }]);
        let w = pod_view(&p, None).unwrap().waiting.unwrap();
        assert_eq!(w.cause, WaitCause::Unschedulable);
        assert_eq!(w.reason, "Unschedulable");
        assert_eq!(w.message, "0/2 nodes are available: 1 Insufficient cpu.");
    }

    #[test]
    fn container_creating_with_a_claim_names_the_volume_as_the_likely_cause() {
        let mut p = waiting_pod("ContainerCreating", "");
        p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "checkpoints".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "ckpt".into(),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        }]);
        let w = pod_view(&p, None).unwrap().waiting.unwrap();
        assert_eq!(w.cause, WaitCause::Creating);
        assert!(
            w.message
                .starts_with("likely cause: a volume not attached or mounted (claims ckpt)"),
            "{}",
            w.message
        );
        // Running pods wait for nothing.
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        };
        let v = pod_view(&api_pod(2, 1).with_trainer(running).on_node("n1"), None).unwrap();
        assert_eq!(v.waiting, None);
    }

    #[test]
    fn disruption_target_and_disrupted_failed_phases_are_disruptions() {
        let mut p = api_pod(2, 1).in_phase("Running").on_node("n1");
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("PreemptionByScheduler".into()),
            message: Some(
                "default-scheduler: preempting to accommodate a higher priority pod".into(),
            ),
            ..PodCondition::default()
        }]);
        let d = pod_view(&p, None).unwrap().disruption.unwrap();
        assert_eq!(d.reason, "PreemptionByScheduler");
        // The disruption controller resets a disruption that never went ahead to False.
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert_eq!(pod_view(&p, None).unwrap().disruption, None);

        for reason in ["Evicted", "Preempting", "Terminated"] {
            let mut p = api_pod(2, 1).in_phase("Failed").on_node("n1");
            p.status.as_mut().unwrap().reason = Some(reason.into());
            let d = pod_view(&p, None).unwrap().disruption.unwrap();
            assert_eq!(d.reason, reason);
        }
        let mut p = api_pod(2, 1).in_phase("Failed").on_node("n1");
        p.status.as_mut().unwrap().reason = Some("DeadlineExceeded".into());
        assert_eq!(pod_view(&p, None).unwrap().disruption, None);
    }

    /// The kubelet's two kinds of eviction (pkg/kubelet/eviction/eviction_manager.go): node
    /// pressure sets DisruptionTarget (TerminationByKubelet) before it kills the pod; a
    /// container over its ephemeral-storage limit is killed with no condition. Either way the
    /// failed pod's own reason and message, the kubelet's words, are what the job tells.
    #[test]
    fn the_kubelets_eviction_is_told_in_its_own_words_and_dated() {
        use crate::fixtures::{t, trainer_exited};
        let message =
            "Pod ephemeral local storage usage exceeds the total limit of containers 100Mi.";
        let mut p = api_pod(2, 1)
            .with_trainer(trainer_exited(143, ""))
            .in_phase("Failed")
            .on_node("n1");
        let s = p.status.as_mut().unwrap();
        s.reason = Some("Evicted".into());
        s.message = Some(message.into());
        let finished = t(90);
        let d = pod_view(&p, None).unwrap().disruption.unwrap();
        assert_eq!(
            (d.reason.as_str(), d.message.as_str()),
            ("Evicted", message)
        );
        assert_eq!(d.since, Some(finished), "no condition: the container's end");

        let began = t(89);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some("The node was low on resource: memory.".into()),
            last_transition_time: Some(Time(began)),
            ..PodCondition::default()
        }]);
        let d = pod_view(&p, None).unwrap().disruption.unwrap();
        assert_eq!(
            d.reason, "Evicted",
            "the failed phase's reason is the more precise"
        );
        assert_eq!(d.since, Some(began), "the condition says when it began");
    }

    #[test]
    fn a_gated_pod_is_queued_with_its_gates_and_kueues_preemption_is_a_disruption() {
        use k8s_openapi::api::core::v1::PodSchedulingGate;
        let mut p = api_pod(0, 1).in_phase("Pending");
        p.spec.as_mut().unwrap().scheduling_gates = Some(vec![PodSchedulingGate {
            name: "kueue.x-k8s.io/admission".into(),
        }]);
        // What the API server writes at create (pkg/registry/core/pod/strategy.go).
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("SchedulingGated".into()),
            message: Some("Scheduling is blocked due to non-empty scheduling gates".into()),
            ..PodCondition::default()
        }]);
        let w = pod_view(&p, None).unwrap().waiting.unwrap();
        assert_eq!(w.cause, WaitCause::Queued);
        assert_eq!(
            w.message,
            "held by scheduling gates kueue.x-k8s.io/admission"
        );

        // Kueue marks a pod it preempts (pkg/controller/jobs/pod: Stop), then deletes it.
        let mut p = api_pod(0, 1).in_phase("Running").on_node("n1");
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "TerminationTarget".into(),
            status: "True".into(),
            reason: Some("WorkloadEvictedDueToPreempted".into()),
            message: Some("Preempted to accommodate a workload".into()),
            ..PodCondition::default()
        }]);
        let d = pod_view(&p, None).unwrap().disruption.unwrap();
        assert_eq!(d.reason, "WorkloadEvictedDueToPreempted");
    }

    #[test]
    fn a_store_secret_without_a_store_is_a_spec_problem_and_a_store_without_one_is_not() {
        let spec = |store: serde_json::Value, secret: Option<&str>| -> DistributedTrainingSpec {
            serde_json::from_value(serde_json::json!({"replicas": 1,
                "trainer": {"task": "copy", "maxSteps": 10, "checkpoint": store},
                "checkpoint": {"storeSecretName": secret}}))
            .unwrap()
        };
        let store = serde_json::json!({"store": {"url": "s3://ckpt"}});
        let without = spec(serde_json::json!({}), Some("creds"));
        assert_eq!(
            spec_problems(&without),
            [
                "spec.checkpoint.storeSecretName: needs spec.trainer.checkpoint.store, the bucket its credentials are for"
            ]
        );
        assert!(spec_problems(&spec(store.clone(), Some("creds"))).is_empty());
        // Node or IRSA credentials: no Secret.
        assert!(spec_problems(&spec(store, None)).is_empty());
    }

    #[test]
    fn spec_pytorch_excludes_command_args_and_trainer_and_needs_an_image() {
        let spec = |json: serde_json::Value| -> DistributedTrainingSpec {
            serde_json::from_value(json).unwrap()
        };
        let good = spec(serde_json::json!({"replicas": 1, "image": "img",
            "pytorch": {"command": ["python3", "t.py"]}}));
        assert!(spec_problems(&good).is_empty());
        let bad = spec(
            serde_json::json!({"replicas": 1, "pytorch": {"command": ["python3"]},
            "command": ["torchrun"], "args": ["t.py"], "trainer": {"task": "copy", "maxSteps": 1}}),
        );
        let problems = spec_problems(&bad);
        assert_eq!(problems.len(), 4, "{problems:?}");
        for field in ["spec.command", "spec.args", "spec.trainer", "spec.image"] {
            assert!(
                problems.iter().any(|p| p.contains(field)),
                "{field}: {problems:?}"
            );
        }
    }

    #[test]
    fn a_port_range_holding_the_rendezvous_or_progress_port_is_a_spec_problem() {
        let spec = |np: serde_json::Value| -> DistributedTrainingSpec {
            serde_json::from_value(serde_json::json!({"replicas": 2, "networkPolicy": np})).unwrap()
        };
        let ports = [("rendezvous", 29500), ("progress", 9090)];
        let wide = spec(serde_json::json!({"portRange": {"first": 9000, "last": 30000}}));
        let problems = port_problems(&wide, &ports);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(
            problems[0],
            "spec.networkPolicy.portRange: 9000-30000 holds the rendezvous port 29500; choose a range without it"
        );
        assert!(port_problems(&spec(serde_json::json!({})), &ports).is_empty());
        let off = spec(
            serde_json::json!({"enabled": false, "portRange": {"first": 9000, "last": 30000}}),
        );
        assert!(port_problems(&off, &ports).is_empty());
    }
}
