//! Gang scheduling: which mechanism places a job's pods all-or-nothing, and what each needs
//! of the attempt: a group object (a PodGroup or Workload, owned by the job) and the pods'
//! labels, annotations, scheduler and, for Kubernetes' own API, a spec field the typed Pod of
//! this operator's API version cannot hold (so it travels as JSON). Pure, but for the
//! discovery of the native API ([`discover_native_api`]). docs/scheduling.md tells users.

use std::collections::BTreeMap;

use ferrotrain_api::crd::{DistributedTrainingSpec, GangScheduler};
use ferrotrain_api::reason;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

/// Kueue's keys (sigs.k8s.io/kueue pkg/controller/jobs/pod/constants).
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
pub const KUEUE_GROUP_KEY: &str = "kueue.x-k8s.io/pod-group-name";
pub const KUEUE_TOTAL_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";
/// Volcano's pod annotation naming its PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// scheduler-plugins' pod label naming its PodGroup.
pub const COSCHEDULING_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
pub const VOLCANO_SCHEDULER: &str = "volcano";
pub const COSCHEDULING_SCHEDULER: &str = "scheduler-plugins-scheduler";

/// The version of Kubernetes' workload-aware scheduling API the API server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeApi {
    /// 1.36: a PodGroup per gang; pods name it in `spec.schedulingGroup.podGroupName`.
    V1alpha2,
    /// 1.35: a Workload with one pod group; pods name it in `spec.workloadRef`.
    V1alpha1,
}

/// How the pods of a job are scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GangMode {
    Native(NativeApi),
    Kueue {
        queue: String,
    },
    Volcano {
        scheduler: String,
        queue: Option<String>,
    },
    Coscheduling {
        scheduler: String,
    },
    /// Native scheduling was asked for (or is the default) and is not served.
    NotServed {
        asked: bool,
    },
    /// spec.scheduling.gangScheduler: none.
    Off,
}

impl GangMode {
    /// The scheduler places the pods one by one: no group object or queue holds them.
    pub fn places_one_by_one(&self) -> bool {
        matches!(self, GangMode::Off | GangMode::NotServed { .. })
    }
}

/// Asks the API server which versions of scheduling.k8s.io it serves; the newest this
/// operator knows wins. None when neither is served (or discovery fails: pods are then
/// scheduled one by one, and the jobs say so).
pub async fn discover_native_api(client: &Client) -> Option<NativeApi> {
    let groups = client.list_api_groups().await.ok()?;
    let group = groups
        .groups
        .iter()
        .find(|g| g.name == "scheduling.k8s.io")?;
    let served = |v: &str| group.versions.iter().any(|gv| gv.version == v);
    if served("v1alpha2") {
        Some(NativeApi::V1alpha2)
    } else if served("v1alpha1") {
        Some(NativeApi::V1alpha1)
    } else {
        None
    }
}

/// The job's queue: spec.queueName, else the Kueue label of the job itself.
pub fn queue_name(
    spec: &DistributedTrainingSpec,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    spec.queue_name
        .clone()
        .or_else(|| labels.get(KUEUE_QUEUE_LABEL).cloned())
        .filter(|q| !q.is_empty())
}

/// The mechanism for a job: spec.scheduling.gangScheduler, else the operator's default
/// (`--default-gang-scheduler`), else kueue when it names a queue, else Kubernetes' own where
/// served.
pub fn mode(
    spec: &DistributedTrainingSpec,
    labels: &BTreeMap<String, String>,
    native: Option<NativeApi>,
    default: Option<GangScheduler>,
) -> GangMode {
    let queue = queue_name(spec, labels);
    let asked = spec.scheduling.gang_scheduler.or(default);
    let native_or = |asked| native.map_or(GangMode::NotServed { asked }, GangMode::Native);
    let scheduler = |default: &str| {
        spec.pod_template
            .as_ref()
            .and_then(|t| t.scheduler_name.clone())
            .or_else(|| spec.scheduling.scheduler_name.clone())
            .unwrap_or_else(|| default.to_string())
    };
    match (asked, queue) {
        (Some(GangScheduler::None), _) => GangMode::Off,
        (Some(GangScheduler::Kubernetes), _) => native_or(true),
        (Some(GangScheduler::Volcano), queue) => GangMode::Volcano {
            scheduler: scheduler(VOLCANO_SCHEDULER),
            queue,
        },
        (Some(GangScheduler::Coscheduling), _) => GangMode::Coscheduling {
            scheduler: scheduler(COSCHEDULING_SCHEDULER),
        },
        (Some(GangScheduler::Kueue) | None, Some(queue)) => GangMode::Kueue { queue },
        // Kueue without a queue: nothing would admit the pods; say so as not served.
        (Some(GangScheduler::Kueue), None) => GangMode::NotServed { asked: true },
        (None, None) => native_or(false),
    }
}

/// Condition GangScheduling for a mode: (status, reason, message); none when the gang is
/// off by choice (nothing to tell).
/// `min` is the fewest pods the group is admitted with (elastic.minReplicas, else replicas).
pub fn condition(mode: &GangMode, replicas: i32, min: i32) -> Option<(bool, &'static str, String)> {
    // How the group's pods are placed: all together, or (elastic) once `min` fit.
    let placed = if min < replicas {
        format!(
            "it is admitted once {min} of its pods fit, and the others are placed one by one as capacity frees up"
        )
    } else {
        "its pods are placed all together or not at all".to_string()
    };
    Some(match mode {
        GangMode::Native(api) => (
            true,
            reason::NATIVE_POD_GROUP,
            format!(
                "each attempt has a {} of {replicas} (scheduling.k8s.io/{}): {placed}",
                match api {
                    NativeApi::V1alpha2 => "PodGroup",
                    NativeApi::V1alpha1 => "Workload",
                },
                match api {
                    NativeApi::V1alpha2 => "v1alpha2",
                    NativeApi::V1alpha1 => "v1alpha1",
                }
            ),
        ),
        GangMode::Kueue { queue } => (
            true,
            reason::KUEUE,
            format!(
                "Kueue admits each attempt's {replicas} pods as one group from LocalQueue {queue}{}",
                if min < replicas {
                    " (Kueue admits a pod group whole: the job starts when all fit, and shrinks to elastic.minReplicas when pods are taken)"
                } else {
                    ""
                }
            ),
        ),
        GangMode::Volcano { scheduler, .. } => (
            true,
            reason::VOLCANO,
            format!(
                "each attempt has a Volcano PodGroup of {replicas} (scheduler {scheduler}): {placed}"
            ),
        ),
        GangMode::Coscheduling { scheduler } => (
            true,
            reason::COSCHEDULING,
            format!(
                "each attempt has a Coscheduling PodGroup of {replicas} (scheduler {scheduler}): {placed}"
            ),
        ),
        GangMode::NotServed { asked } => (
            false,
            reason::NATIVE_API_NOT_SERVED,
            format!(
                "{}the API server does not serve scheduling.k8s.io/v1alpha2 or v1alpha1 (feature gates GenericWorkload and GangScheduling, runtime-config scheduling.k8s.io/v1alpha2=true): pods are scheduled one by one",
                if *asked {
                    "gangScheduler kubernetes (or kueue without a queue): "
                } else {
                    ""
                }
            ),
        ),
        GangMode::Off => return None,
    })
}

/// The group of attempt `attempt`: `<job>-<attempt>`, new with every attempt (a Kueue pod
/// group is one admission; a PodGroup's spec cannot change).
pub fn group_name(job: &str, attempt: i32) -> String {
    format!("{job}-{attempt}")
}

/// A group object to create before the attempt's pods.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupObject {
    pub resource: ApiResource,
    pub object: DynamicObject,
}

fn api_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The group object of attempt `attempt` of job `job` in `namespace` (none for Kueue, which
/// makes its own, and without gang scheduling); the caller makes the job its owner.
pub fn group_object(
    job: &str,
    namespace: &str,
    spec: &DistributedTrainingSpec,
    mode: &GangMode,
    attempt: i32,
) -> Option<GroupObject> {
    let name = group_name(job, attempt);
    // Elastic: the group is admitted once minReplicas pods fit; the others are placed one by
    // one as capacity frees up, and join the gang at its next round.
    let min = spec.min_replicas();
    let (resource, body) = match mode {
        GangMode::Native(NativeApi::V1alpha2) => {
            let mut spec_json = json!({"schedulingPolicy": {"gang": {"minCount": min}}});
            if let Some(key) = &spec.scheduling.topology_key {
                spec_json["schedulingConstraints"] = json!({"topology": [{"key": key}]});
            }
            (
                api_resource("scheduling.k8s.io", "v1alpha2", "PodGroup", "podgroups"),
                json!({"spec": spec_json}),
            )
        }
        GangMode::Native(NativeApi::V1alpha1) => (
            api_resource("scheduling.k8s.io", "v1alpha1", "Workload", "workloads"),
            json!({"spec": {"podGroups": [{"name": "gang", "policy": {"gang": {"minCount": min}}}]}}),
        ),
        GangMode::Volcano { queue, .. } => {
            let mut spec_json = json!({"minMember": min});
            if let Some(queue) = queue {
                spec_json["queue"] = json!(queue);
            }
            (
                api_resource("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups"),
                json!({"spec": spec_json}),
            )
        }
        GangMode::Coscheduling { .. } => (
            api_resource("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
            json!({"spec": {"minMember": min}}),
        ),
        GangMode::Kueue { .. } | GangMode::NotServed { .. } | GangMode::Off => return None,
    };
    let mut object = DynamicObject::new(&name, &resource).within(namespace);
    object.data = body;
    Some(GroupObject { resource, object })
}

/// Makes `pod` a member of its attempt's group: Kueue's labels and annotations, Volcano's
/// annotation and scheduler, Coscheduling's label and scheduler. Kubernetes' own API needs a
/// spec field instead ([`native_pod_fields`]).
pub fn join(pod: &mut Pod, mode: &GangMode, group: &str, replicas: i32) {
    let meta = &mut pod.metadata;
    let mut put_label = |k: &str, v: &str| {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
    };
    match mode {
        GangMode::Kueue { queue } => {
            put_label(KUEUE_QUEUE_LABEL, queue);
            put_label(KUEUE_GROUP_KEY, group);
            let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(KUEUE_GROUP_KEY.into(), group.into());
            annotations.insert(KUEUE_TOTAL_ANNOTATION.into(), replicas.max(1).to_string());
        }
        GangMode::Volcano { scheduler, .. } => {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(VOLCANO_GROUP_ANNOTATION.into(), group.into());
            set_scheduler(pod, scheduler);
        }
        GangMode::Coscheduling { scheduler } => {
            put_label(COSCHEDULING_GROUP_LABEL, group);
            set_scheduler(pod, scheduler);
        }
        GangMode::Native(_) | GangMode::NotServed { .. } | GangMode::Off => {}
    }
}

fn set_scheduler(pod: &mut Pod, scheduler: &str) {
    if let Some(spec) = pod.spec.as_mut() {
        spec.scheduler_name = Some(scheduler.to_string());
    }
}

/// The pod spec fields of Kubernetes' own API, merged into the pod's JSON at create:
/// `schedulingGroup.podGroupName` (v1alpha2) or `workloadRef` (v1alpha1).
pub fn native_pod_fields(mode: &GangMode, group: &str) -> Option<Value> {
    match mode {
        GangMode::Native(NativeApi::V1alpha2) => {
            Some(json!({"spec": {"schedulingGroup": {"podGroupName": group}}}))
        }
        GangMode::Native(NativeApi::V1alpha1) => {
            Some(json!({"spec": {"workloadRef": {"name": group, "podGroup": "gang"}}}))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
