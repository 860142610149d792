//! The pods' side of the hollow kubelet, as plain data: what the simulator knows of each pod
//! and job, and what a pod event means for them. No client: [`super::kubelet`] carries the
//! decisions out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::labels::{
    ANNOTATION_EXIT, ANNOTATION_PROGRESS, ANNOTATION_STEPS_PER_SECOND, ANNOTATION_TOTAL_STEPS,
    JOB_LABEL,
};
use super::training::{Pace, Run};

/// A job: namespace and name.
pub type JobKey = (String, String);

/// Where a pod is in the hollow kubelet's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Bound to a hollow node; its Running status is being written.
    Starting,
    Running,
    /// Its containers were stopped (deleted, commanded, finished): nothing more to do but
    /// forget it when it is gone.
    Stopped,
}

/// What the simulator keeps of a pod bound to one of its nodes.
#[derive(Clone, Debug)]
pub struct PodSim {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub ip: Ipv4Addr,
    pub stage: Stage,
    /// The ferrotrain gang it belongs to (none for other pods: they only run).
    pub member: Option<Member>,
}

/// A pod's place in its gang.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub job: JobKey,
    pub attempt: i32,
    pub node_rank: i32,
    /// NNODES: pods in the gang.
    pub pods: i32,
    pub procs_per_pod: u32,
    /// FERROTRAIN_METRICS_PORT: where rank 0 serves /progress.
    pub metrics_port: u16,
    pub pace: Option<Pace>,
    pub silent: bool,
}

/// A job's simulated training and which of its current attempt's pods run.
#[derive(Debug)]
pub struct JobSim {
    pub run: Run,
    pub pods: i32,
    pub running: BTreeSet<i32>,
    /// Rank 0's /progress never answers (`hollow.ferrotrain.dev/progress: silent`).
    pub silent: bool,
    /// Its pods were told to finish (the run reached its total steps).
    pub finished: bool,
}

/// What an event about a pod asks of the hollow kubelet.
#[derive(Clone, Debug, PartialEq)]
pub enum Todo {
    Nothing,
    /// Write the Running status (a new pod, or one adopted from an earlier simulator: no write).
    Start {
        adopt: bool,
    },
    /// Stop its containers with this exit, then delete it (it is being deleted).
    StopAndDelete,
    /// Stop its containers with this exit (commanded by the exit annotation).
    Terminate(Exit),
}

/// How a container ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Exit {
    pub code: i32,
    pub reason: String,
    pub message: String,
}

impl Exit {
    /// `<code>[:<reason>[:<message>]]` (the exit annotation's value).
    pub fn parse(value: &str) -> Option<Exit> {
        let mut parts = value.splitn(3, ':');
        let code: i32 = parts.next()?.trim().parse().ok()?;
        let default_reason = if code == 0 { "Completed" } else { "Error" };
        let reason = parts
            .next()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .unwrap_or(default_reason);
        Some(Exit {
            code,
            reason: reason.to_string(),
            message: parts.next().unwrap_or_default().trim().to_string(),
        })
    }

    /// What a container stopped by its pod's deletion shows: killed by SIGTERM.
    pub fn sigterm() -> Exit {
        Exit {
            code: 143,
            reason: "Error".into(),
            message: String::new(),
        }
    }
}

/// The pod's gang membership, from the labels and environment the operator gives it.
pub fn member_of(pod: &Pod) -> Option<Member> {
    let meta = &pod.metadata;
    let labels = meta.labels.as_ref()?;
    let job = labels.get(JOB_LABEL)?.clone();
    let attempt = labels.get("ferrotrain.dev/attempt")?.parse().ok()?;
    let node_rank = labels.get("ferrotrain.dev/node-rank")?.parse().ok()?;
    let env = |name: &str| -> Option<String> {
        pod.spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let annotations = meta.annotations.clone().unwrap_or_default();
    let number = |key: &str| {
        annotations
            .get(key)
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let pace = match (
        number(ANNOTATION_STEPS_PER_SECOND),
        number(ANNOTATION_TOTAL_STEPS),
    ) {
        (None, None) => None,
        (rate, total) => Some(Pace {
            steps_per_second: rate.unwrap_or(1.0).max(1e-6),
            total_steps: total.map_or(u64::MAX / 2, |t| t as u64),
        }),
    };
    Some(Member {
        job: (meta.namespace.clone()?, job),
        attempt,
        node_rank,
        pods: env(ferrotrain_api::env::NNODES)?.parse().ok()?,
        procs_per_pod: env(ferrotrain_api::env::NPROC_PER_NODE)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
        metrics_port: env(ferrotrain_api::env::FERROTRAIN_METRICS_PORT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(9090),
        pace,
        silent: annotations.get(ANNOTATION_PROGRESS).map(String::as_str) == Some("silent"),
    })
}

/// What a pod event (added or changed) asks for, given what the simulator knows of the pod.
pub fn todo(pod: &Pod, known: Option<&PodSim>) -> Todo {
    let stage = known.map(|k| k.stage);
    if pod.metadata.deletion_timestamp.is_some() {
        return if stage == Some(Stage::Stopped) {
            Todo::Nothing
        } else {
            Todo::StopAndDelete
        };
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) || stage == Some(Stage::Stopped) {
        return Todo::Nothing;
    }
    let commanded = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_EXIT))
        .and_then(|v| Exit::parse(v));
    match (stage, commanded) {
        (Some(Stage::Running), Some(exit)) => Todo::Terminate(exit),
        (Some(_), _) => Todo::Nothing,
        (None, _) => Todo::Start {
            adopt: phase == Some("Running") && pod_ip(pod).is_some(),
        },
    }
}

/// The pod's IP, when it has an IPv4 one.
pub fn pod_ip(pod: &Pod) -> Option<Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// Pod IPs 127.<block>.x.y (y in 1..=254), reused once their pod is gone.
#[derive(Debug)]
pub struct IpPool {
    block: u8,
    next: u32,
    free: Vec<Ipv4Addr>,
    taken: BTreeSet<Ipv4Addr>,
}

impl IpPool {
    pub fn new(block: u8) -> Self {
        IpPool {
            block,
            next: 0,
            free: Vec::new(),
            taken: BTreeSet::new(),
        }
    }

    /// A free address (None when the block's 64,770 are all taken).
    pub fn take(&mut self) -> Option<Ipv4Addr> {
        let ip = match self.free.pop() {
            Some(ip) => ip,
            None => {
                if self.next >= 256 * 254 {
                    return None;
                }
                let n = self.next;
                self.next += 1;
                Ipv4Addr::new(127, self.block, (n / 254) as u8, (n % 254 + 1) as u8)
            }
        };
        self.taken.insert(ip);
        Some(ip)
    }

    /// Marks an address as taken (a pod adopted with its IP); false when it is not this
    /// pool's or already taken.
    pub fn claim(&mut self, ip: Ipv4Addr) -> bool {
        let o = ip.octets();
        if o[0] != 127 || o[1] != self.block || o[3] == 0 || o[3] == 255 {
            return false;
        }
        self.free.retain(|f| *f != ip);
        self.taken.insert(ip)
    }

    pub fn give_back(&mut self, ip: Ipv4Addr) {
        if self.taken.remove(&ip) {
            self.free.push(ip);
        }
    }
}

/// The jobs' state: which ranks of the current attempt run, and their training.
#[derive(Debug, Default)]
pub struct Jobs {
    pub jobs: HashMap<JobKey, JobSim>,
}

impl Jobs {
    /// A pod of the job runs: a newer attempt resets the gang; the gang whole starts stepping.
    /// True when this pod made the gang whole.
    pub fn running(&mut self, m: &Member, default: Pace, now: Timestamp) -> bool {
        let world = m.pods.max(1) as u32 * m.procs_per_pod.max(1);
        let job = self.jobs.entry(m.job.clone()).or_insert_with(|| JobSim {
            run: Run::new(m.pace.unwrap_or(default), m.attempt, world),
            pods: m.pods,
            running: BTreeSet::new(),
            silent: m.silent,
            finished: false,
        });
        if m.attempt < job.run.attempt() {
            return false;
        }
        if m.attempt > job.run.attempt() {
            job.run.attempt_started(m.attempt, world, now);
            job.running.clear();
            job.pods = m.pods;
            job.finished = false;
        }
        job.silent = m.silent;
        job.running.insert(m.node_rank);
        let whole = job.running.len() as i32 >= job.pods && job.run.stepping_since().is_none();
        if whole {
            job.run.whole(now);
        }
        whole
    }

    /// A running pod of the job stopped or went: its round ends.
    pub fn left(&mut self, m: &Member, now: Timestamp) {
        let Some(job) = self.jobs.get_mut(&m.job) else {
            return;
        };
        if m.attempt != job.run.attempt() || !job.running.remove(&m.node_rank) {
            return;
        }
        if job.running.is_empty() || job.finished {
            job.run.stop(now);
        } else {
            job.run.pod_left(m.node_rank, m.procs_per_pod, now);
        }
    }
}

/// A snapshot of one job for the bench and the tests.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub attempt: i32,
    pub round: u64,
    pub step: u64,
    /// Milliseconds since the epoch when the gang last became whole (None: it waits).
    pub stepping_since_ms: Option<i64>,
    pub running_pods: usize,
}

/// Every job, keyed `<namespace>/<name>`.
pub fn job_views(jobs: &Jobs, now: Timestamp) -> BTreeMap<String, JobView> {
    jobs.jobs
        .iter()
        .map(|((ns, name), j)| {
            (
                format!("{ns}/{name}"),
                JobView {
                    attempt: j.run.attempt(),
                    round: j.run.round(),
                    step: j.run.step(now),
                    stepping_since_ms: j.run.stepping_since().map(|t| t.as_millisecond()),
                    running_pods: j.running.len(),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "job-0-1", "namespace": "ns",
                "labels": {JOB_LABEL: "job", "ferrotrain.dev/attempt": "0", "ferrotrain.dev/node-rank": "1"},
                "annotations": annotations
            },
            "spec": {"nodeName": "n", "containers": [{"name": "trainer", "env": [
                {"name": "NNODES", "value": "2"},
                {"name": "NPROC_PER_NODE", "value": "4"},
                {"name": "FERROTRAIN_METRICS_PORT", "value": "9191"}
            ]}]},
            "status": status
        }))
        .unwrap()
    }

    fn known(stage: Stage) -> PodSim {
        PodSim {
            namespace: "ns".into(),
            name: "job-0-1".into(),
            node: "n".into(),
            ip: Ipv4Addr::new(127, 43, 0, 1),
            stage,
            member: None,
        }
    }

    #[test]
    fn a_pod_is_started_then_commanded_then_deleted() {
        let fresh = pod(json!({}), json!({"phase": "Pending"}));
        assert_eq!(todo(&fresh, None), Todo::Start { adopt: false });
        assert_eq!(todo(&fresh, Some(&known(Stage::Starting))), Todo::Nothing);
        let told = pod(
            json!({ANNOTATION_EXIT: "3:Error:no data"}),
            json!({"phase": "Running"}),
        );
        assert_eq!(
            todo(&told, Some(&known(Stage::Running))),
            Todo::Terminate(Exit {
                code: 3,
                reason: "Error".into(),
                message: "no data".into()
            })
        );
        assert_eq!(todo(&told, Some(&known(Stage::Stopped))), Todo::Nothing);
        let mut deleted = fresh.clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert_eq!(
            todo(&deleted, Some(&known(Stage::Running))),
            Todo::StopAndDelete
        );
        let running = pod(
            json!({}),
            json!({"phase": "Running", "podIP": "127.43.0.9"}),
        );
        assert_eq!(todo(&running, None), Todo::Start { adopt: true });
    }

    #[test]
    fn membership_comes_from_the_operators_labels_and_environment() {
        let m = member_of(&pod(
            json!({ANNOTATION_TOTAL_STEPS: "500", ANNOTATION_PROGRESS: "silent"}),
            json!({}),
        ))
        .unwrap();
        assert_eq!(m.job, ("ns".to_string(), "job".to_string()));
        assert_eq!((m.attempt, m.node_rank, m.pods), (0, 1, 2));
        assert_eq!((m.procs_per_pod, m.metrics_port), (4, 9191));
        assert_eq!(m.pace.unwrap().total_steps, 500);
        assert!(m.silent);
        assert_eq!(Exit::parse("0").unwrap().reason, "Completed");
        assert_eq!(Exit::parse("x"), None);
    }

    #[test]
    fn the_gang_steps_when_whole_and_a_new_attempt_starts_over() {
        let pace = Pace {
            steps_per_second: 1.0,
            total_steps: 1000,
        };
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut m = member_of(&pod(json!({}), json!({}))).unwrap();
        let mut jobs = Jobs::default();
        jobs.running(&m, pace, t(0));
        m.node_rank = 0;
        jobs.running(&m, pace, t(1));
        let view = |jobs: &Jobs, at| job_views(jobs, t(at))["ns/job"].clone();
        assert_eq!(view(&jobs, 11).step, 10);
        jobs.left(&m, t(11));
        assert_eq!((view(&jobs, 20).step, view(&jobs, 20).round), (10, 1));
        m.attempt = 1;
        jobs.running(&m, pace, t(30));
        let v = view(&jobs, 30);
        assert_eq!((v.attempt, v.round, v.running_pods), (1, 0, 1));
        assert_eq!(v.stepping_since_ms, None);
    }

    #[test]
    fn ips_are_unique_and_reused() {
        let mut pool = IpPool::new(43);
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_ne!(a, b);
        pool.give_back(a);
        assert_eq!(pool.take(), Some(a));
        assert!(pool.claim(Ipv4Addr::new(127, 43, 9, 9)));
        assert!(!pool.claim(Ipv4Addr::new(127, 43, 9, 9)));
        assert!(!pool.claim(Ipv4Addr::new(10, 0, 0, 1)));
    }
}
