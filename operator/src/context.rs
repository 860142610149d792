//! Shared state of every reconcile, built once: the client, the event recorder, the metrics,
//! the settings, the pod and node caches and the progress client.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use ferrotrain_api::crd::DistributedTraining;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use crate::config::Settings;
use crate::gang::{LaunchStop, Timing};
use crate::labels;
use crate::metrics::Metrics;
use crate::objects::BuildSettings;
use crate::pod_cache::PodCache;
use crate::progress::ProgressClient;
use crate::scheduling::NativeApi;
use crate::unseen::UnseenPods;

/// The object as our last status write returned it, and every resourceVersion our writes
/// replaced: while the cache shows one of those, it is older than what we know (the job watch
/// lags behind the pod watch), and deciding from it would repeat a restart.
struct Written {
    superseded: Vec<String>,
    object: Arc<DistributedTraining>,
    at: Timestamp,
}

/// How long a written object stands in for the cache's older copy. The cache lags by a write
/// or two, seconds at most; kept until a reconcile saw the cache catch up, the object of a job
/// not reconciled again (suspended, finished, deleted) stayed for the process's life: 8 MB of
/// the fleet bench leader's 23 MB of heap, and more with every job it ever wrote.
const WRITTEN_TTL: SignedDuration = SignedDuration::from_mins(2);

/// A job's attempt whose own objects (all but the pods) were applied, at a generation of its
/// spec (a new generation may change them: they are applied again).
#[derive(Clone, Debug, PartialEq)]
pub struct GangApplied {
    pub uid: String,
    pub attempt: i32,
    pub generation: Option<i64>,
}

/// Pods that may be built and waiting for their creates at once, over every reconcile; a
/// launch holds one permit per pod (at least one: a launch of no pod still applies its gang's
/// objects; at most all: a larger gang waits for every permit). A burst of new jobs otherwise
/// built every gang's pods at once and held them while their creates waited for the client's
/// [`API_CONCURRENCY`] slots: the fleet bench's leader reached 70 MB of heap launching 40
/// jobs (23 MB before and after), and glibc kept most of it. Counted in pods, not launches:
/// a bound of 16 launches let 128 pods of 8-pod gangs through but only 16 single-pod
/// replacements, half the client's slots (on the fleet bench's 2 cores the API server was the
/// tighter bound: 400 pods of lost nodes were replaced at 12-14 a second either way). Four
/// times the client's slots: they stay busy whatever the gangs' sizes, and the pods held are
/// about a megabyte.
///
/// [`API_CONCURRENCY`]: crate::client::API_CONCURRENCY
pub const PODS_BUILT_AT_ONCE: usize = crate::client::API_CONCURRENCY * 4;

/// The [`PODS_BUILT_AT_ONCE`] permits a launch of `pods` pods holds.
pub fn launch_permits(pods: usize) -> u32 {
    pods.clamp(1, PODS_BUILT_AT_ONCE) as u32
}

/// Shared state of every reconcile, built once.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub pods: PodCache,
    pub nodes: Store<Node>,
    pub progress: ProgressClient,
    /// False until the pod and node caches are synced: deciding from an empty pod cache would
    /// see every pod "deleted".
    pub caches_ready: Arc<AtomicBool>,
    written: Mutex<HashMap<String, Written>>,
    /// When this process last wrote each job's status (by UID): progress-only changes wait
    /// for `progress_write_interval` (a new leader writes its first at once).
    status_writes: Mutex<HashMap<String, Timestamp>>,
    /// Consecutive failed reconciles per job (the backoff of `error_policy`).
    pub(crate) error_counts: Mutex<HashMap<String, u32>>,
    /// Why the last launch of each job's pods stopped (by UID), for its next decision.
    launch_stops: Mutex<HashMap<String, LaunchStop>>,
    /// The attempt (and spec generation) whose Service, ConfigMap, Secret, NetworkPolicy and
    /// group this process applied last, by job UID, and when: a launch of more pods in that
    /// attempt within the hour creates only the pods.
    gangs_applied: Mutex<HashMap<String, (GangApplied, Timestamp)>>,
    /// The version of Kubernetes' own gang scheduling API the API server serves (discovered
    /// when the controller starts: enabling it needs an operator restart).
    pub native_gang: Option<NativeApi>,
    /// Pods this process created that the pod cache has not shown yet (they count as present).
    pub unseen: UnseenPods,
    /// [`PODS_BUILT_AT_ONCE`] permits: a reconcile holds [`launch_permits`] from building a
    /// launch to the end of its creates.
    pub launching: tokio::sync::Semaphore,
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Arc<Metrics>,
        pods: PodCache,
        nodes: Store<Node>,
        caches_ready: Arc<AtomicBool>,
    ) -> Self {
        let reporter = Reporter {
            controller: labels::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            progress: ProgressClient::new(settings.progress_timeout),
            client,
            metrics,
            settings,
            pods,
            nodes,
            caches_ready,
            written: Mutex::new(HashMap::new()),
            status_writes: Mutex::new(HashMap::new()),
            error_counts: Mutex::new(HashMap::new()),
            launch_stops: Mutex::new(HashMap::new()),
            gangs_applied: Mutex::new(HashMap::new()),
            native_gang: None,
            unseen: UnseenPods::default(),
            launching: tokio::sync::Semaphore::new(PODS_BUILT_AT_ONCE),
        }
    }

    pub fn build_settings(&self) -> BuildSettings {
        BuildSettings {
            trainer_image: self.settings.trainer_image.clone(),
            master_port: self.settings.master_port,
            trainer_metrics_port: self.settings.trainer_metrics_port,
            termination_grace_seconds: 30,
            restarts_left: 0,
            round: 0,
            gang: crate::scheduling::GangMode::Off,
            operator_pods: self.settings.operator_pods.clone(),
            store_service: None,
        }
    }

    pub fn timing(&self) -> Timing {
        Timing::from(&self.settings)
    }

    /// The newest version of the object we know: ours while the cache shows a version our
    /// writes replaced, else the cache's (it caught up, or someone else wrote after us).
    /// What we wrote counts for [`WRITTEN_TTL`] after the write.
    pub fn freshest(
        &self,
        dt: Arc<DistributedTraining>,
        now: Timestamp,
    ) -> Arc<DistributedTraining> {
        let uid = dt.uid().unwrap_or_default();
        let mut written = self.written.lock().expect("lock");
        let Some(w) = written.get(&uid) else {
            return dt;
        };
        let recent = now.duration_since(w.at) < WRITTEN_TTL;
        match dt.resource_version() {
            Some(v) if recent && w.superseded.contains(&v) => w.object.clone(),
            _ => {
                written.remove(&uid);
                dt
            }
        }
    }

    /// Whether a status change that only refreshes the progress is due at `now`: this process
    /// wrote the job's status `progress_write_interval` ago or more, or not at all.
    pub fn progress_write_due(&self, uid: &str, now: Timestamp) -> bool {
        let interval = SignedDuration::try_from(self.settings.progress_write_interval)
            .unwrap_or(SignedDuration::MAX);
        let writes = self.status_writes.lock().expect("lock");
        writes
            .get(uid)
            .is_none_or(|at| now.duration_since(*at) >= interval)
    }

    /// Notes a status write of job `uid` at `now`; forgets jobs not written for an hour (gone).
    pub fn wrote_status(&self, uid: &str, now: Timestamp) {
        let mut writes = self.status_writes.lock().expect("lock");
        writes.retain(|_, at| now.duration_since(*at) < SignedDuration::from_hours(1));
        writes.insert(uid.to_string(), now);
    }

    /// Why the last launch of job `uid`'s pods stopped, if it did.
    pub fn launch_stop(&self, uid: &str) -> Option<LaunchStop> {
        self.launch_stops.lock().expect("lock").get(uid).cloned()
    }

    /// Notes how the launch of job `uid` at `now` went: `stop` when it stopped, None when every
    /// pod was created. Forgets stops of an hour ago (their jobs are gone or launched since).
    pub fn launch_went(&self, uid: &str, stop: Option<LaunchStop>, now: Timestamp) {
        let mut stops = self.launch_stops.lock().expect("lock");
        stops.retain(|_, s| now.duration_since(s.at) < SignedDuration::from_hours(1));
        match stop {
            Some(stop) => stops.insert(uid.to_string(), stop),
            None => stops.remove(uid),
        };
    }

    /// Whether this process applied the objects of `gang` (that attempt at that generation)
    /// within the hour.
    pub fn gang_applied(&self, gang: &GangApplied) -> bool {
        let applied = self.gangs_applied.lock().expect("lock");
        applied.get(&gang.uid).is_some_and(|(g, _)| g == gang)
    }

    /// Notes that the objects of `gang` exist at `now` (applied, or found to be this job's);
    /// the job's earlier attempts, and whatever was noted an hour ago (deleted jobs among it:
    /// a job that launches again applies its objects again, once), are forgotten.
    pub fn note_gang_applied(&self, gang: GangApplied, now: Timestamp) {
        let mut applied = self.gangs_applied.lock().expect("lock");
        applied.retain(|_, (_, at)| now.duration_since(*at) < SignedDuration::from_hours(1));
        applied.insert(gang.uid.clone(), (gang, now));
    }

    /// Forgets what was written [`WRITTEN_TTL`] ago.
    pub fn remember_write(
        &self,
        read: &DistributedTraining,
        object: DistributedTraining,
        now: Timestamp,
    ) {
        let uid = object.uid().unwrap_or_default();
        let mut written = self.written.lock().expect("lock");
        written.retain(|_, w| now.duration_since(w.at) < WRITTEN_TTL);
        let mut superseded = written
            .remove(&uid)
            .map(|w| w.superseded)
            .unwrap_or_default();
        superseded.extend(read.resource_version());
        // A handful is plenty: the cache lags by a write or two.
        if superseded.len() > 16 {
            superseded.drain(..superseded.len() - 16);
        }
        written.insert(
            uid,
            Written {
                superseded,
                object: Arc::new(object),
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{job, t};
    use kube::runtime::reflector;

    fn context() -> Context {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let settings = Settings::default();
        let (pods, _) = crate::pod_cache::pod_cache();
        let (nodes, _) = reflector::store::<Node>();
        let ready = Arc::new(AtomicBool::new(true));
        Context::new(
            client,
            settings,
            Arc::new(Metrics::new()),
            pods,
            nodes,
            ready,
        )
    }

    #[test]
    fn a_launch_holds_a_permit_per_pod_within_the_bound() {
        use crate::gang::{Action, Decision};
        let decision = |actions| Decision {
            status: Default::default(),
            actions,
            events: Vec::new(),
            requeue_after: None,
            restarts_left: 0,
        };
        let launch = |ranks: Vec<i32>| Action::Launch {
            attempt: 0,
            node_ranks: ranks,
        };
        let none = decision(vec![Action::DeletePod("p".into())]);
        assert_eq!(none.pods_to_launch(), None);
        let gang = decision(vec![launch((0..8).collect())]);
        assert_eq!(gang.pods_to_launch(), Some(8));
        let objects_only = decision(vec![launch(vec![])]);
        assert_eq!(objects_only.pods_to_launch(), Some(0));
        // A single replacement takes one permit: 128 of them are built at once, not 16.
        assert_eq!(launch_permits(1), 1);
        assert_eq!(launch_permits(0), 1);
        assert_eq!(launch_permits(8), 8);
        assert_eq!(
            launch_permits(1000),
            PODS_BUILT_AT_ONCE as u32,
            "a gang larger than the bound waits for all of it, not for ever"
        );
        assert_eq!(PODS_BUILT_AT_ONCE, 128);
    }

    fn at_version(v: &str) -> DistributedTraining {
        let mut dt = job();
        dt.metadata.resource_version = Some(v.into());
        dt
    }

    #[tokio::test]
    async fn a_written_object_stands_in_for_a_lagging_cache_for_two_minutes_only() {
        let ctx = context();
        let (read, written) = (at_version("100"), at_version("101"));
        ctx.remember_write(&read, written, t(100));
        let version = |dt: Arc<DistributedTraining>| dt.resource_version().unwrap();
        // The cache still shows the version the write replaced: ours stands in.
        let stale = Arc::new(at_version("100"));
        assert_eq!(version(ctx.freshest(stale.clone(), t(119))), "101");
        // Two minutes on, the cache's copy is taken as it is.
        assert_eq!(version(ctx.freshest(stale, t(220))), "100");
        // Another job's write forgets entries that old (a job never reconciled again).
        let mut other = at_version("5");
        other.metadata.uid = Some("other".into());
        ctx.remember_write(&at_version("100"), at_version("101"), t(300));
        ctx.remember_write(&other.clone(), other, t(421));
        assert_eq!(ctx.written.lock().unwrap().len(), 1);
    }
}
