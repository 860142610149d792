//! The built objects: names, env contract, volumes, security context, resources.

use super::*;
use crate::fixtures::{JobExt, build_settings, job};
use ferrotrain_api::TrainerConfig;
use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

fn gpu_job() -> DistributedTraining {
    job().with_spec(serde_json::json!({
        "replicas": 2,
        "gpusPerReplica": 4,
        "resources": {"limits": {"memory": "32Gi"}, "requests": {"cpu": "8"}},
        "trainer": {"task": "copy", "maxSteps": 100, "checkpoint": {"everySteps": 50}},
        "checkpoint": {"claimName": "ckpt"},
        "data": {"claimName": "wmt"},
        "podTemplate": {
            "labels": {"team": "nlp", "ferrotrain.dev/attempt": "spoofed"},
            "annotations": {"a": "b"},
            "nodeSelector": {"gpu": "a100"},
            "priorityClassName": "training",
            "schedulerName": "volcano",
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "WORLD_SIZE", "value": "999"}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "shmSize": "8Gi"
        }
    }))
}

fn env_of(pod: &Pod) -> Vec<(String, String)> {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => match (&from.secret_key_ref, &from.field_ref) {
                    (Some(s), _) => format!("secret:{}/{}", s.name, s.key),
                    (None, Some(f)) => format!("field:{}", f.field_path),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            (e.name.clone(), value)
        })
        .collect()
}

#[test]
fn env_contract_of_a_gpu_pod() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 3, 1, &build_settings());
    let env = env_of(&pod);
    let expected: Vec<(&str, &str)> = vec![
        ("MASTER_ADDR", "mt-3-0.mt.ml.svc"),
        ("MASTER_PORT", "29500"),
        ("NNODES", "2"),
        ("NODE_RANK", "1"),
        ("NPROC_PER_NODE", "4"),
        ("WORLD_SIZE", "8"),
        ("PET_MASTER_ADDR", "mt-3-0.mt.ml.svc"),
        ("PET_MASTER_PORT", "29500"),
        ("PET_NNODES", "2"),
        ("PET_NODE_RANK", "1"),
        ("PET_NPROC_PER_NODE", "4"),
        ("TORCHELASTIC_RESTART_COUNT", "3"),
        ("FERROTRAIN_JOB", "mt"),
        ("FERROTRAIN_ATTEMPT", "3"),
        ("FERROTRAIN_STOP_GRACE_SECONDS", "65"),
        // In place: the launchers restart their ranks up to the restarts the job has left.
        ("FERROTRAIN_RESTART_IN_PLACE", "true"),
        ("FERROTRAIN_MAX_RESTARTS", "10"),
        // A replacement of node 0's pod starts the gang's rounds where the status counts them.
        ("FERROTRAIN_FIRST_ROUND", "0"),
        ("FERROTRAIN_RESTART_BACKOFF_SECONDS", "10"),
        ("FERROTRAIN_RESTART_BACKOFF_MAX_SECONDS", "300"),
        ("FERROTRAIN_RENDEZVOUS_TIMEOUT_SECONDS", "300"),
        ("FERROTRAIN_PERMANENT_EXIT_CODES", "2,3,4"),
        // How long a pod's launcher may be silent before the others go on without it.
        ("FERROTRAIN_HEARTBEAT_TIMEOUT_SECONDS", "10"),
        // The launcher's identity: a stale agent of a replaced pod is no member of a round.
        ("POD_UID", "field:metadata.uid"),
        ("FERROTRAIN_EXPECT_GPUS", "4"),
        ("FERROTRAIN_CONFIG", "/etc/ferrotrain/trainer.yaml"),
        ("FERROTRAIN_CHECKPOINT_DIR", "/checkpoints"),
        (
            "FERROTRAIN_RDZV_TOKEN_FILE",
            "/var/run/ferrotrain/rdzv/token",
        ),
        ("FERROTRAIN_METRICS_PORT", "9090"),
        // The ports the job's NetworkPolicy names for the ring.
        ("FERROTRAIN_PORT_RANGE", "41000-42999"),
        ("HOME", "/tmp"),
        // The user's extra variable, after the contract; their WORLD_SIZE is dropped.
        ("NCCL_DEBUG", "INFO"),
    ];
    let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(got, expected);
}

#[test]
fn cpu_pod_defaults_to_one_rank_and_no_gpu() {
    let dt = job()
        .with_spec(serde_json::json!({"replicas": 3, "trainer": {"task": "copy", "maxSteps": 10}}));
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 0, 2, &build_settings());
    let env = env_of(&pod);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("NPROC_PER_NODE").as_deref(), Some("1"));
    assert_eq!(get("WORLD_SIZE").as_deref(), Some("3"));
    assert_eq!(get("MASTER_ADDR").as_deref(), Some("mt-0-0.mt.ml.svc"));
    assert_eq!(
        get("FERROTRAIN_EXPECT_GPUS"),
        None,
        "a CPU pod expects no GPU"
    );
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.resources, None);
    assert_eq!(c.image.as_deref(), Some("registry.example/ferrotrain:1"));
}

#[test]
fn names_labels_and_owner() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 3, 1, &build_settings());
    assert_eq!(pod.metadata.name.as_deref(), Some("mt-3-1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.hostname.as_deref(), Some("mt-3-1"));
    assert_eq!(spec.subdomain.as_deref(), Some("mt"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let l = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(l.get("ferrotrain.dev/job").map(String::as_str), Some("mt"));
    assert_eq!(
        l.get("ferrotrain.dev/attempt").map(String::as_str),
        Some("3")
    );
    assert_eq!(
        l.get("ferrotrain.dev/node-rank").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        l.get("app.kubernetes.io/managed-by").map(String::as_str),
        Some("ferrotrain-operator")
    );
    assert_eq!(l.get("team").map(String::as_str), Some("nlp"));
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()["a"], "b");
    let refs = pod.metadata.owner_references.as_ref().unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].kind, "DistributedTraining");
    assert_eq!(refs[0].api_version, "ferrotrain.dev/v1alpha1");
    assert_eq!(refs[0].uid, "uid-1");
    assert_eq!(refs[0].controller, Some(true));
    assert_eq!(spec.node_selector.as_ref().unwrap()["gpu"], "a100");
    assert_eq!(spec.priority_class_name.as_deref(), Some("training"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"));

    for meta in [
        service(&owner, &build_settings()).metadata,
        config_map(&owner, &dt.spec).unwrap().metadata,
        secret(&owner, "t").metadata,
    ] {
        assert_eq!(meta.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(meta.labels.as_ref().unwrap()["ferrotrain.dev/job"], "mt");
    }
}

#[test]
fn volumes_and_mounts() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 0, 0, &build_settings());
    let spec = pod.spec.as_ref().unwrap();
    let volumes = spec.volumes.as_ref().unwrap();
    let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "shm",
            "tmp",
            "rdzv-token",
            "trainer-config",
            "checkpoints",
            "data",
            "cache"
        ]
    );
    let shm = volumes[0].empty_dir.as_ref().unwrap();
    assert_eq!(shm.medium.as_deref(), Some("Memory"));
    assert_eq!(shm.size_limit, Some(Quantity("8Gi".into())));
    // The token as a file of the job's Secret, not an environment variable.
    let token = volumes[2].secret.as_ref().unwrap();
    assert_eq!(token.secret_name.as_deref(), Some("mt-rdzv"));
    assert_eq!(volumes[3].config_map.as_ref().unwrap().name, "mt-config");
    let ckpt = volumes[4].persistent_volume_claim.as_ref().unwrap();
    assert_eq!((ckpt.claim_name.as_str(), ckpt.read_only), ("ckpt", None));
    let data = volumes[5].persistent_volume_claim.as_ref().unwrap();
    assert_eq!(
        (data.claim_name.as_str(), data.read_only),
        ("wmt", Some(true))
    );

    let c = &spec.containers[0];
    let mounts: Vec<(&str, &str, Option<bool>)> = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("shm", "/dev/shm", None),
            ("tmp", "/tmp", None),
            ("rdzv-token", "/var/run/ferrotrain/rdzv", Some(true)),
            ("trainer-config", "/etc/ferrotrain", Some(true)),
            ("checkpoints", "/checkpoints", None),
            ("data", "/data", Some(true)),
            ("cache", "/cache", None),
        ]
    );
    assert_eq!(c.working_dir.as_deref(), Some("/data"));
}

/// A volume's name and what backs it (`claim ckpt`, `emptyDir`, `nfs`, ...).
type Backing = (String, &'static str);
/// A mount's volume name and path.
type Mount = (String, String);

/// Every volume of the pod with what backs it, and every mount of its trainer container.
fn volumes_of(pod: &Pod) -> (Vec<Backing>, Vec<Mount>) {
    let spec = pod.spec.as_ref().unwrap();
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            let source = if let Some(c) = &v.persistent_volume_claim {
                if c.claim_name == "ckpt" {
                    "claim ckpt"
                } else {
                    "another claim"
                }
            } else if v.empty_dir.is_some() {
                "emptyDir"
            } else if v.nfs.is_some() {
                "nfs"
            } else {
                "other"
            };
            (v.name.clone(), source)
        })
        .collect();
    let mounts = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.clone(), m.mount_path.clone()))
        .collect();
    (volumes, mounts)
}

/// What backs `path` in the pod.
fn checkpoint_mount(pod: &Pod, path: &str) -> Backing {
    let (volumes, mounts) = volumes_of(pod);
    let (name, _) = mounts
        .iter()
        .find(|(_, p)| p == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    let source = volumes
        .iter()
        .find(|(v, _)| v == name)
        .map(|(_, s)| *s)
        .unwrap_or_else(|| panic!("mount {name} has no volume"));
    (name.clone(), source)
}

#[test]
fn only_the_node_rank_0_pod_mounts_the_checkpoint_volume_so_read_write_once_works() {
    let trainer = serde_json::json!({"task": "copy", "maxSteps": 10});
    let nfs = serde_json::json!([{"name": "nfs", "nfs": {"server": "10.0.0.1", "path": "/x"}}]);
    // (what, spec, node rank, expected (volume, source) at the checkpoint path, the pod's
    // volumes that are not the operator's own shm/tmp/trainer-config)
    type Row = (
        &'static str,
        serde_json::Value,
        i32,
        (&'static str, &'static str),
        Vec<(&'static str, &'static str)>,
    );
    let rows: Vec<Row> = vec![
        (
            "claim, node rank 0: the claim",
            serde_json::json!({"replicas": 2, "trainer": trainer, "checkpoint": {"claimName": "ckpt"}}),
            0,
            ("checkpoints", "claim ckpt"),
            vec![("checkpoints", "claim ckpt")],
        ),
        (
            "claim, node rank 1: an emptyDir, the claim is not in the pod at all",
            serde_json::json!({"replicas": 2, "trainer": trainer, "checkpoint": {"claimName": "ckpt"}}),
            1,
            ("checkpoints", "emptyDir"),
            vec![("checkpoints", "emptyDir")],
        ),
        (
            "claim, node rank 0 with 4 ranks per pod: the claim (global rank 0 is local rank 0 there)",
            serde_json::json!({"replicas": 2, "procsPerReplica": 4, "trainer": trainer, "checkpoint": {"claimName": "ckpt"}}),
            0,
            ("checkpoints", "claim ckpt"),
            vec![("checkpoints", "claim ckpt")],
        ),
        (
            "user volume, node rank 0: the user volume",
            serde_json::json!({"replicas": 2, "trainer": trainer, "checkpoint": {"volumeName": "nfs"}, "podTemplate": {"volumes": nfs}}),
            0,
            ("nfs", "nfs"),
            vec![("nfs", "nfs")],
        ),
        (
            "user volume, node rank 1: an emptyDir, and the unused user volume is left out",
            serde_json::json!({"replicas": 2, "trainer": trainer, "checkpoint": {"volumeName": "nfs"}, "podTemplate": {"volumes": nfs}}),
            1,
            ("checkpoints", "emptyDir"),
            vec![("checkpoints", "emptyDir")],
        ),
        (
            "user volume that also holds the data, node rank 1: an emptyDir, the volume stays for the data",
            serde_json::json!({"replicas": 2, "trainer": trainer, "checkpoint": {"volumeName": "nfs"}, "data": {"volumeName": "nfs"}, "podTemplate": {"volumes": nfs}}),
            1,
            ("checkpoints", "emptyDir"),
            vec![("checkpoints", "emptyDir"), ("nfs", "nfs")],
        ),
        (
            "custom command, node rank 1: the claim (the program may read checkpoints on every rank)",
            serde_json::json!({"replicas": 2, "command": ["torchrun", "train.py"], "checkpoint": {"claimName": "ckpt"}}),
            1,
            ("checkpoints", "claim ckpt"),
            vec![("checkpoints", "claim ckpt")],
        ),
        (
            "no checkpoint volume, node rank 0: an emptyDir (no resume across restarts)",
            serde_json::json!({"replicas": 2, "trainer": trainer}),
            0,
            ("checkpoints", "emptyDir"),
            vec![("checkpoints", "emptyDir")],
        ),
    ];
    for (what, spec, node_rank, at_path, volumes) in rows {
        let dt = job().with_spec(spec);
        let owner = Owner::of(&dt).unwrap();
        let pod = pod(&owner, &dt.spec, 0, node_rank, &build_settings());
        let (name, source) = checkpoint_mount(&pod, "/checkpoints");
        assert_eq!((name.as_str(), source), at_path, "{what}");
        let (all, _) = volumes_of(&pod);
        let own = ["shm", "tmp", "rdzv-token", "trainer-config"];
        let user: Vec<(&str, &str)> = all
            .iter()
            .filter(|(n, _)| !own.contains(&n.as_str()))
            .map(|(n, s)| (n.as_str(), *s))
            .collect();
        assert_eq!(user, volumes, "{what}");
        // Every pod gets the same FERROTRAIN_CHECKPOINT_DIR, mounted or not.
        let env = env_of(&pod);
        assert!(
            env.contains(&("FERROTRAIN_CHECKPOINT_DIR".into(), "/checkpoints".into())),
            "{what}"
        );
    }
}

#[test]
fn checkpoint_and_data_share_a_named_user_volume_at_their_own_paths() {
    let dt = job().with_spec(serde_json::json!({
        "replicas": 1,
        "trainer": {"task": "copy", "maxSteps": 10},
        "checkpoint": {"volumeName": "nfs", "mountPath": "/ckpt"},
        "data": {"volumeName": "nfs", "mountPath": "/corpus", "readOnly": false},
        "podTemplate": {"volumes": [{"name": "nfs", "nfs": {"server": "10.0.0.1", "path": "/x"}}]}
    }));
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 0, 0, &build_settings());
    let spec = pod.spec.unwrap();
    let names: Vec<String> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["shm", "tmp", "rdzv-token", "trainer-config", "nfs"]);
    let mounts: Vec<(String, String, Option<bool>)> = spec.containers[0]
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.mount_path, m.read_only))
        .collect();
    assert!(mounts.contains(&("nfs".into(), "/ckpt".into(), None)));
    assert!(mounts.contains(&("nfs".into(), "/corpus".into(), None)));
}

#[test]
fn a_checkpoint_mount_path_applies_to_every_pod() {
    let dt = job().with_spec(serde_json::json!({
        "replicas": 3,
        "trainer": {"task": "copy", "maxSteps": 10},
        "checkpoint": {"claimName": "ckpt", "mountPath": "/ckpt"}
    }));
    let owner = Owner::of(&dt).unwrap();
    let sources: Vec<(String, &str)> = (0..3)
        .map(|rank| checkpoint_mount(&pod(&owner, &dt.spec, 2, rank, &build_settings()), "/ckpt"))
        .collect();
    assert_eq!(
        sources,
        [
            ("checkpoints".to_string(), "claim ckpt"),
            ("checkpoints".to_string(), "emptyDir"),
            ("checkpoints".to_string(), "emptyDir"),
        ]
    );
}

#[test]
fn restricted_security_context() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 0, 0, &build_settings());
    let spec = pod.spec.as_ref().unwrap();
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(RUN_AS));
    assert_eq!(psc.fs_group, Some(RUN_AS));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let sc = spec.containers[0].security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
}

#[test]
fn the_pods_listeners_are_pinned_to_the_policys_port_range_unless_it_is_off() {
    let built = |np: serde_json::Value, template: serde_json::Value| {
        let dt = job().with_spec(serde_json::json!({
            "replicas": 2, "networkPolicy": np, "podTemplate": template
        }));
        pod(&Owner::of(&dt).unwrap(), &dt.spec, 0, 1, &build_settings())
    };
    let sysctls = |p: &Pod| -> Vec<(String, String)> {
        let psc = p.spec.as_ref().unwrap().security_context.as_ref().unwrap();
        psc.sysctls
            .iter()
            .flatten()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect()
    };
    let range = |p: &Pod| {
        env_of(p)
            .into_iter()
            .find(|(k, _)| k == "FERROTRAIN_PORT_RANGE")
            .map(|(_, v)| v)
    };
    let p = built(serde_json::json!({}), serde_json::json!({}));
    assert_eq!(
        sysctls(&p),
        [(PORT_RANGE_SYSCTL.to_string(), "41000 42999".to_string())]
    );
    assert_eq!(range(&p).as_deref(), Some("41000-42999"));
    // A template's own security context keeps its sysctls; its own range wins.
    let own = serde_json::json!({"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_keepalive_time", "value": "60"}
    ]}});
    let p = built(
        serde_json::json!({"portRange": {"first": 50000, "last": 50999}}),
        own,
    );
    assert_eq!(sysctls(&p).len(), 2);
    assert_eq!(sysctls(&p)[1].1, "50000 50999");
    let p = built(serde_json::json!({"enabled": false}), serde_json::json!({}));
    assert!(sysctls(&p).is_empty());
    assert_eq!(range(&p), None);
}

#[test]
fn rdma_jobs_get_ipc_lock_alone_and_gpu_pods_an_nccl_debug_level_they_may_override() {
    let built = |spec: serde_json::Value| {
        let dt = job().with_spec(spec);
        pod(&Owner::of(&dt).unwrap(), &dt.spec, 0, 0, &build_settings())
    };
    let caps = |p: &Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .clone()
            .unwrap()
    };
    let nccl_debug = |p: &Pod| {
        env_of(p)
            .into_iter()
            .filter(|(k, _)| k == "NCCL_DEBUG")
            .map(|(_, v)| v)
            .collect::<Vec<_>>()
    };
    let rdma = built(serde_json::json!({
        "replicas": 2, "gpusPerReplica": 8, "ipcLock": true,
        "resources": {"limits": {"rdma/hca": 1}}
    }));
    let c = caps(&rdma);
    assert_eq!(c.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(c.add.as_deref(), Some(&["IPC_LOCK".to_string()][..]));
    let limits = rdma.spec.as_ref().unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert!(limits.contains_key("rdma/hca") && limits.contains_key(GPU_RESOURCE));
    assert_eq!(nccl_debug(&rdma), ["WARN"]);
    // Without ipcLock nothing is added; the job's own NCCL_DEBUG wins; CPU pods get none.
    let tcp = built(serde_json::json!({
        "replicas": 2, "gpusPerReplica": 8,
        "podTemplate": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}
    }));
    assert_eq!(caps(&tcp).add, None);
    assert_eq!(nccl_debug(&tcp), ["INFO"]);
    assert!(nccl_debug(&built(serde_json::json!({"replicas": 2}))).is_empty());
}

#[test]
fn resources_carry_gpus() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let pod = pod(&owner, &dt.spec, 0, 0, &build_settings());
    let r = pod.spec.unwrap().containers[0].resources.clone().unwrap();
    let limits = r.limits.unwrap();
    let requests = r.requests.unwrap();
    assert_eq!(limits["nvidia.com/gpu"], Quantity("4".into()));
    assert_eq!(limits["memory"], Quantity("32Gi".into()));
    assert_eq!(requests["nvidia.com/gpu"], Quantity("4".into()));
    assert_eq!(requests["cpu"], Quantity("8".into()));
}

#[test]
fn command_default_and_bring_your_own() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let c = pod(&owner, &dt.spec, 0, 0, &build_settings())
        .spec
        .unwrap()
        .containers[0]
        .clone();
    assert_eq!(c.command.unwrap(), ["ferrotrain", "launch"]);
    assert_eq!(
        c.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(
        c.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );

    let byo = job().with_spec(serde_json::json!({
        "replicas": 2,
        "image": "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime",
        "command": ["torchrun"],
        "args": ["/workspace/train.py"],
    }));
    let owner = Owner::of(&byo).unwrap();
    let p = pod(&owner, &byo.spec, 0, 0, &build_settings());
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.command.as_deref(), Some(&["torchrun".to_string()][..]));
    assert_eq!(
        c.args.as_deref(),
        Some(&["/workspace/train.py".to_string()][..])
    );
    let env = env_of(&p);
    assert!(!env.iter().any(|(k, _)| k == "FERROTRAIN_CONFIG"));
    assert!(env.iter().any(|(k, v)| k == "PET_NNODES" && v == "2"));
    let volumes = p.spec.unwrap().volumes.unwrap();
    assert!(!volumes.iter().any(|v| v.name == "trainer-config"));
    assert!(config_map(&owner, &byo.spec).is_none());
}

/// spec.pytorch: the launcher alone is the entrypoint and runs the script's command after
/// `--`; the spares' pre-imports; no trainer config; every pod mounts the checkpoint volume;
/// in-place restarts as for the trainer.
#[test]
fn a_pytorch_script_runs_under_the_launcher() {
    let dt = job().with_spec(serde_json::json!({
        "replicas": 2,
        "image": "ferrotrain/pytorch:dev",
        "pytorch": {"command": ["python3", "/workspace/gpt.py", "--steps", "600"], "preImport": ["numpy", "yaml"]},
        "checkpoint": {"claimName": "ckpt"},
    }));
    let owner = Owner::of(&dt).unwrap();
    let p = pod(&owner, &dt.spec, 0, 1, &build_settings());
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["ferrotrain-launch".to_string()][..])
    );
    let args: Vec<&str> = c
        .args
        .as_ref()
        .unwrap()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(
        args,
        ["--", "python3", "/workspace/gpt.py", "--steps", "600"]
    );
    let env = env_of(&p);
    let value = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(value("FERROTRAIN_PRE_IMPORT"), Some("numpy,yaml"));
    assert_eq!(value("FERROTRAIN_RESTART_IN_PLACE"), Some("true"));
    assert_eq!(value("FERROTRAIN_CONFIG"), None);
    assert!(
        value("FERROTRAIN_PORT_RANGE").is_some(),
        "MASTER_PORT's range"
    );
    assert!(config_map(&owner, &dt.spec).is_none());
    let volumes = p.spec.unwrap().volumes.unwrap();
    let ckpt = volumes.iter().find(|v| v.name == "checkpoints").unwrap();
    assert!(
        ckpt.persistent_volume_claim.is_some(),
        "node rank 1 mounts the claim too"
    );
}

#[test]
fn service_is_headless_and_publishes_not_ready_pods() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let svc = service(&owner, &build_settings());
    assert_eq!(svc.metadata.name.as_deref(), Some("mt"));
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    assert_eq!(spec.selector.unwrap()["ferrotrain.dev/job"], "mt");
    let ports: Vec<i32> = spec.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, [29500, 9090]);
}

#[test]
fn config_map_holds_the_trainer_config_with_its_own_checkpoint_policy() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let cm = config_map(&owner, &dt.spec).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("mt-config"));
    let yaml = &cm.data.unwrap()["trainer.yaml"];
    let config = TrainerConfig::from_yaml(yaml, "configmap").unwrap();
    assert_eq!(config.max_steps, 100);
    assert_eq!(
        config.checkpoint.every_steps, 50,
        "trainer.checkpoint, the one home"
    );
    assert_eq!(
        config,
        dt.spec.trainer.clone().unwrap(),
        "spec.trainer as written"
    );
}

#[test]
fn tokens_are_random_and_long() {
    let a = new_token();
    let b = new_token();
    assert_eq!(a.len(), 64);
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
    let dt = gpu_job();
    let s = secret(&Owner::of(&dt).unwrap(), &a);
    assert_eq!(s.metadata.name.as_deref(), Some("mt-rdzv"));
    assert_eq!(s.string_data.unwrap()["token"], a);
}

#[test]
fn building_is_deterministic() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    assert_eq!(
        pod(&owner, &dt.spec, 1, 1, &build_settings()),
        pod(&owner, &dt.spec, 1, 1, &build_settings())
    );
}

#[test]
fn owner_needs_name_namespace_and_uid() {
    let mut dt = gpu_job();
    dt.metadata.uid = None;
    assert!(matches!(Owner::of(&dt), Err(Error::MissingMetadata("uid"))));
}

#[test]
fn gang_holds_every_object_of_the_launch_and_only_the_missing_pods() {
    let dt = gpu_job();
    let owner = Owner::of(&dt).unwrap();
    let objects = gang(&owner, &dt.spec, 3, &[1], &build_settings(), "tok");
    assert_eq!(objects.service, service(&owner, &build_settings()));
    assert_eq!(objects.config_map, config_map(&owner, &dt.spec));
    assert_eq!(objects.secret, secret(&owner, "tok"));
    let pods: Vec<String> = objects.pods.iter().map(|p| p.name_any()).collect();
    assert_eq!(pods, ["mt-3-1"]);
    for meta in [
        &objects.service.metadata,
        &objects.secret.metadata,
        &objects.pods[0].metadata,
    ] {
        assert!(owner.controls(meta), "{:?}", meta.name);
    }
}

#[test]
fn only_a_controller_reference_with_the_jobs_uid_is_control() {
    let owner = Owner::of(&gpu_job()).unwrap();
    let with = |uid: &str, controller: Option<bool>| ObjectMeta {
        owner_references: Some(vec![OwnerReference {
            uid: uid.into(),
            controller,
            ..owner.reference.clone()
        }]),
        ..ObjectMeta::default()
    };
    let uid = owner.reference.uid.clone();
    assert!(owner.controls(&with(&uid, Some(true))));
    assert!(
        !owner.controls(&with(&uid, None)),
        "an owner, not the controller"
    );
    assert!(
        !owner.controls(&with("a-namesake", Some(true))),
        "a re-created job"
    );
    assert!(!owner.controls(&ObjectMeta::default()), "a user's object");
}

#[test]
fn the_termination_grace_is_the_one_sized_from_the_save_unless_the_template_sets_one() {
    let sized = job()
        .with_spec(serde_json::json!({"replicas": 2, "trainer": {"task": "copy", "maxSteps": 10}}));
    let owner = Owner::of(&sized).unwrap();
    let grace = |p: &Pod| p.spec.as_ref().unwrap().termination_grace_period_seconds;
    let stop = |p: &Pod| {
        env_of(p)
            .into_iter()
            .find(|(k, _)| k == "FERROTRAIN_STOP_GRACE_SECONDS")
            .map(|(_, v)| v)
    };
    let p = pod(&owner, &sized.spec, 0, 0, &build_settings());
    assert_eq!(grace(&p), Some(70));
    // The launcher stops its ranks 5 s before the kubelet's SIGKILL.
    assert_eq!(stop(&p).as_deref(), Some("65"));
    let fixed = job().with_spec(
        serde_json::json!({"replicas": 2, "trainer": {"task": "copy", "maxSteps": 10},
        "podTemplate": {"terminationGracePeriodSeconds": 120}}),
    );
    let p = pod(&owner, &fixed.spec, 0, 0, &build_settings());
    assert_eq!(grace(&p), Some(120));
    assert_eq!(stop(&p).as_deref(), Some("115"));
}

#[test]
fn the_launchers_restart_in_place_with_their_own_launcher_on_one_pod_as_on_several() {
    let restart_env = |spec: serde_json::Value, left: u32| {
        let dt = job().with_spec(spec);
        let owner = Owner::of(&dt).unwrap();
        let settings = BuildSettings {
            restarts_left: left,
            ..build_settings()
        };
        let env = env_of(&pod(&owner, &dt.spec, 0, 0, &settings));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        (
            get("FERROTRAIN_RESTART_IN_PLACE"),
            get("FERROTRAIN_MAX_RESTARTS"),
        )
    };
    let trainer = serde_json::json!({"task": "copy", "maxSteps": 10});
    let two = serde_json::json!({"replicas": 2, "trainer": trainer});
    assert_eq!(
        restart_env(two.clone(), 7),
        (Some("true".into()), Some("7".into()))
    );
    assert_eq!(
        restart_env(two, 0),
        (Some("true".into()), Some("0".into())),
        "budget spent"
    );
    let off =
        serde_json::json!({"replicas": 2, "trainer": trainer, "restartPolicy": {"inPlace": false}});
    assert_eq!(
        restart_env(off, 7),
        (None, Some("0".into())),
        "the operator restarts the gang"
    );
    let one = serde_json::json!({"replicas": 1, "trainer": trainer});
    assert_eq!(
        restart_env(one, 7),
        (Some("true".into()), Some("7".into())),
        "one pod of several ranks: a rank's crash restarts them in place too"
    );
    let byo = serde_json::json!({"replicas": 2, "command": ["torchrun", "train.py"]});
    assert_eq!(
        restart_env(byo, 7),
        (None, Some("0".into())),
        "not our launcher"
    );
    let pytorch = serde_json::json!({"replicas": 2, "image": "i", "pytorch": {"command": ["python3", "t.py"]}});
    assert_eq!(
        restart_env(pytorch, 7),
        (Some("true".into()), Some("7".into())),
        "a script under our launcher restarts in place"
    );
}

#[test]
fn the_pods_beyond_min_replicas_get_the_surplus_priority_class() {
    let dt = job().with_spec(serde_json::json!({
        "replicas": 4,
        "trainer": {"task": "copy", "maxSteps": 100},
        "podTemplate": {"priorityClassName": "training"},
        "elastic": {"minReplicas": 2, "surplusPriorityClassName": "training-surplus"}
    }));
    let owner = Owner::of(&dt).unwrap();
    let classes: Vec<Option<String>> = (0..4)
        .map(|rank| pod(&owner, &dt.spec, 0, rank, &build_settings()))
        .map(|p| p.spec.unwrap().priority_class_name)
        .collect();
    let named = |c: &str| Some(c.to_string());
    assert_eq!(
        classes,
        [
            named("training"),
            named("training"),
            named("training-surplus"),
            named("training-surplus")
        ]
    );
}

#[test]
fn a_gang_that_may_grow_beyond_replicas_gets_pods_and_world_for_max_replicas_and_the_batch_of_replicas()
 {
    let dt = job().with_spec(serde_json::json!({
        "replicas": 2,
        "procsPerReplica": 2,
        "trainer": {"task": "copy", "maxSteps": 100},
        "elastic": {"minReplicas": 1, "maxReplicas": 4}
    }));
    assert_eq!(
        (
            dt.spec.pod_count(),
            dt.spec.max_world_size(),
            dt.spec.world_size()
        ),
        (4, 8, 4)
    );
    let owner = Owner::of(&dt).unwrap();
    let env = env_of(&pod(&owner, &dt.spec, 0, 3, &build_settings()));
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(get("NNODES"), Some("4"));
    assert_eq!(get("WORLD_SIZE"), Some("8"));
    assert_eq!(
        get("FERROTRAIN_BATCH_WORLD"),
        Some("4"),
        "the batch of replicas"
    );
    assert_eq!(get("FERROTRAIN_MIN_NODES"), Some("1"));
    // Without it, or without in-place restarts: the pods asked for.
    let plain = job().with_spec(serde_json::json!({
        "replicas": 2, "trainer": {"task": "copy", "maxSteps": 100},
        "elastic": {"maxReplicas": 4}, "restartPolicy": {"inPlace": false}
    }));
    assert_eq!(plain.spec.pod_count(), 2);
    let env = env_of(&pod(&owner, &plain.spec, 0, 1, &build_settings()));
    assert!(env.iter().all(|(k, _)| k != "FERROTRAIN_BATCH_WORLD"));
}

#[test]
fn each_pod_is_labelled_with_what_taking_it_costs() {
    let cost = |spec: serde_json::Value| -> Vec<String> {
        let dt = job().with_spec(spec);
        let owner = Owner::of(&dt).unwrap();
        (0..dt.spec.pod_count())
            .map(|rank| pod(&owner, &dt.spec, 0, rank, &build_settings()))
            .map(|p| p.metadata.labels.unwrap()["ferrotrain.dev/preemption-cost"].clone())
            .collect()
    };
    let elastic = cost(serde_json::json!({
        "replicas": 3, "trainer": {"task": "copy", "maxSteps": 100},
        "elastic": {"minReplicas": 2, "maxReplicas": 4}
    }));
    assert_eq!(elastic, ["rendezvous", "needed", "surplus", "surplus"]);
    let fixed = cost(serde_json::json!({
        "replicas": 2, "trainer": {"task": "copy", "maxSteps": 100}
    }));
    assert_eq!(fixed, ["rendezvous", "needed"]);
}
