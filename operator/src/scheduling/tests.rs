//! Which mechanism a job gets, and what each puts on the attempt's group object and pods.

use super::*;
use crate::fixtures::{JobExt, job};
use k8s_openapi::api::core::v1::PodSpec;

fn spec(json: serde_json::Value) -> DistributedTrainingSpec {
    job().with_spec(json).spec
}

fn two_pods() -> serde_json::Value {
    serde_json::json!({"replicas": 2, "trainer": {"task": "copy", "maxSteps": 10}})
}

fn with(extra: serde_json::Value) -> DistributedTrainingSpec {
    let mut s = two_pods();
    s.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    spec(s)
}

#[test]
fn the_mechanism_follows_the_spec_the_queue_and_what_the_api_server_serves() {
    let none = BTreeMap::new();
    let native = Some(NativeApi::V1alpha2);
    assert_eq!(
        mode(&spec(two_pods()), &none, native, None),
        GangMode::Native(NativeApi::V1alpha2)
    );
    assert_eq!(
        mode(&spec(two_pods()), &none, None, None),
        GangMode::NotServed { asked: false },
        "the default falls back to pod by pod where the API is not served"
    );
    let queued = with(serde_json::json!({"queueName": "team-a"}));
    assert_eq!(
        mode(&queued, &none, native, None),
        GangMode::Kueue {
            queue: "team-a".into()
        },
        "a queue means Kueue"
    );
    let label = BTreeMap::from([(KUEUE_QUEUE_LABEL.to_string(), "team-b".to_string())]);
    assert_eq!(
        mode(&spec(two_pods()), &label, None, None),
        GangMode::Kueue {
            queue: "team-b".into()
        }
    );
    let off = with(serde_json::json!({"scheduling": {"gangScheduler": "none"}}));
    assert_eq!(mode(&off, &none, native, None), GangMode::Off);
    let volcano =
        with(serde_json::json!({"queueName": "q", "scheduling": {"gangScheduler": "volcano"}}));
    assert_eq!(
        mode(&volcano, &none, native, None),
        GangMode::Volcano {
            scheduler: "volcano".into(),
            queue: Some("q".into())
        }
    );
    let cosched = with(
        serde_json::json!({"scheduling": {"gangScheduler": "coscheduling", "schedulerName": "gang"}}),
    );
    assert_eq!(
        mode(&cosched, &none, None, None),
        GangMode::Coscheduling {
            scheduler: "gang".into()
        }
    );
    let asked = with(serde_json::json!({"scheduling": {"gangScheduler": "kubernetes"}}));
    assert_eq!(
        mode(&asked, &none, None, None),
        GangMode::NotServed { asked: true }
    );
    assert_eq!(
        mode(&asked, &none, Some(NativeApi::V1alpha1), None),
        GangMode::Native(NativeApi::V1alpha1)
    );
}

#[test]
fn the_condition_says_how_or_why_not() {
    let (on, why, message) = condition(&GangMode::Native(NativeApi::V1alpha2), 2, 2).unwrap();
    assert!(on);
    assert_eq!(why, "NativePodGroup");
    assert!(message.contains("PodGroup of 2"), "{message}");
    let (on, why, message) = condition(&GangMode::NotServed { asked: false }, 2, 2).unwrap();
    assert!(!on);
    assert_eq!(why, "NativeApiNotServed");
    for needle in [
        "GenericWorkload",
        "GangScheduling",
        "scheduling.k8s.io/v1alpha2=true",
        "one by one",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert_eq!(
        condition(&GangMode::Off, 2, 2),
        None,
        "off by choice: nothing to tell"
    );
}

#[test]
fn a_native_pod_group_per_attempt_with_the_gang_size_and_topology() {
    let s = with(serde_json::json!({"scheduling": {"topologyKey": "topology.kubernetes.io/zone"}}));
    let g = group_object("mt", "ml", &s, &GangMode::Native(NativeApi::V1alpha2), 3).unwrap();
    assert_eq!(g.resource.api_version, "scheduling.k8s.io/v1alpha2");
    assert_eq!(
        (g.resource.kind.as_str(), g.resource.plural.as_str()),
        ("PodGroup", "podgroups")
    );
    assert_eq!(g.object.metadata.name.as_deref(), Some("mt-3"));
    assert_eq!(g.object.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(
        g.object.data,
        serde_json::json!({"spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]}
        }})
    );
    assert_eq!(
        native_pod_fields(&GangMode::Native(NativeApi::V1alpha2), "mt-3"),
        Some(serde_json::json!({"spec": {"schedulingGroup": {"podGroupName": "mt-3"}}}))
    );
    // 1.35's shape.
    let w = group_object("mt", "ml", &s, &GangMode::Native(NativeApi::V1alpha1), 0).unwrap();
    assert_eq!(
        (w.resource.kind.as_str(), w.resource.api_version.as_str()),
        ("Workload", "scheduling.k8s.io/v1alpha1")
    );
    assert_eq!(
        w.object.data["spec"]["podGroups"][0]["policy"]["gang"]["minCount"],
        2
    );
    assert_eq!(
        native_pod_fields(&GangMode::Native(NativeApi::V1alpha1), "mt-0"),
        Some(serde_json::json!({"spec": {"workloadRef": {"name": "mt-0", "podGroup": "gang"}}}))
    );
}

#[test]
fn an_elastic_group_is_admitted_once_its_min_replicas_fit() {
    let s = spec(serde_json::json!({
        "replicas": 4, "elastic": {"minReplicas": 2},
        "trainer": {"task": "copy", "maxSteps": 10}
    }));
    let native = GangMode::Native(NativeApi::V1alpha2);
    let g = group_object("mt", "ml", &s, &native, 0).unwrap();
    assert_eq!(
        g.object.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
        2
    );
    let volcano = GangMode::Volcano {
        scheduler: "volcano".into(),
        queue: None,
    };
    let v = group_object("mt", "ml", &s, &volcano, 0).unwrap();
    assert_eq!(v.object.data["spec"]["minMember"], 2);
    let (_, _, message) = condition(&native, 4, 2).unwrap();
    assert!(
        message.contains("admitted once 2 of its pods fit"),
        "{message}"
    );
    let (_, _, message) = condition(&GangMode::Kueue { queue: "q".into() }, 4, 2).unwrap();
    assert!(message.contains("starts when all fit"), "{message}");
    // Not elastic without in-place restarts: every pod.
    let whole = spec(serde_json::json!({
        "replicas": 4, "elastic": {"minReplicas": 2}, "restartPolicy": {"inPlace": false},
        "trainer": {"task": "copy", "maxSteps": 10}
    }));
    let g = group_object("mt", "ml", &whole, &native, 0).unwrap();
    assert_eq!(
        g.object.data["spec"]["schedulingPolicy"]["gang"]["minCount"],
        4
    );
}

fn joined(mode: &GangMode) -> Pod {
    let mut pod = Pod {
        spec: Some(PodSpec::default()),
        ..Pod::default()
    };
    join(&mut pod, mode, "mt-1", 2);
    pod
}

#[test]
fn pods_join_their_attempts_group_as_each_scheduler_expects() {
    let kueue = joined(&GangMode::Kueue {
        queue: "team-a".into(),
    });
    let labels = kueue.metadata.labels.unwrap();
    assert_eq!(labels[KUEUE_QUEUE_LABEL], "team-a");
    assert_eq!(labels[KUEUE_GROUP_KEY], "mt-1");
    let annotations = kueue.metadata.annotations.unwrap();
    assert_eq!(
        annotations[KUEUE_GROUP_KEY], "mt-1",
        "read first by Kueue >= 0.18"
    );
    assert_eq!(annotations[KUEUE_TOTAL_ANNOTATION], "2");
    assert!(
        group_object(
            "mt",
            "ml",
            &spec(two_pods()),
            &GangMode::Kueue { queue: "q".into() },
            1
        )
        .is_none(),
        "Kueue makes its own Workload"
    );

    let volcano = joined(&GangMode::Volcano {
        scheduler: "volcano".into(),
        queue: None,
    });
    assert_eq!(
        volcano.metadata.annotations.unwrap()[VOLCANO_GROUP_ANNOTATION],
        "mt-1"
    );
    assert_eq!(
        volcano.spec.unwrap().scheduler_name.as_deref(),
        Some("volcano")
    );
    let g = group_object(
        "mt",
        "ml",
        &spec(two_pods()),
        &GangMode::Volcano {
            scheduler: "volcano".into(),
            queue: Some("gpu".into()),
        },
        1,
    )
    .unwrap();
    assert_eq!(g.resource.api_version, "scheduling.volcano.sh/v1beta1");
    assert_eq!(
        g.object.data,
        serde_json::json!({"spec": {"minMember": 2, "queue": "gpu"}})
    );

    let co = joined(&GangMode::Coscheduling {
        scheduler: "sp".into(),
    });
    assert_eq!(
        co.metadata.labels.unwrap()[COSCHEDULING_GROUP_LABEL],
        "mt-1"
    );
    assert_eq!(co.spec.unwrap().scheduler_name.as_deref(), Some("sp"));
    let g = group_object(
        "mt",
        "ml",
        &spec(two_pods()),
        &GangMode::Coscheduling {
            scheduler: "sp".into(),
        },
        1,
    )
    .unwrap();
    assert_eq!(g.resource.api_version, "scheduling.x-k8s.io/v1alpha1");
    assert_eq!(g.object.data, serde_json::json!({"spec": {"minMember": 2}}));

    let native = joined(&GangMode::Native(NativeApi::V1alpha2));
    assert_eq!(
        native.metadata.labels, None,
        "the native API needs a spec field instead"
    );
}

#[test]
fn the_operators_default_applies_where_the_job_says_nothing() {
    let none = BTreeMap::new();
    let default = Some(GangScheduler::Volcano);
    assert!(matches!(
        mode(&spec(two_pods()), &none, None, default),
        GangMode::Volcano { .. }
    ));
    let own = with(serde_json::json!({"scheduling": {"gangScheduler": "none"}}));
    assert_eq!(
        mode(&own, &none, None, default),
        GangMode::Off,
        "the job's own choice wins"
    );
}
