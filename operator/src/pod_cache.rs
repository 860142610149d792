//! The cache of the pods ferrotrain manages, indexed by job: a reconcile reads its own job's
//! pods instead of walking every pod in the cache (at 500 running jobs of 8 pods, a reconcile
//! every 5 s each walked 4,000 pods: 400,000 a second, growing with the square of the fleet).
//! controller-runtime's cache indexes (`IndexField`) serve the same purpose.
//!
//! The index holds names, fed the same watch events as the cache: it may name a pod the cache
//! no longer holds (a pod relabelled away from its job), so readers look every name up in the
//! cache and check its label there; it never misses one the cache holds.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;

use crate::labels;

/// Pod names by namespace and job.
type Index = HashMap<String, HashMap<String, BTreeSet<String>>>;

/// The pod cache and its index; cloning shares both.
#[derive(Clone)]
pub struct PodCache {
    store: Store<Pod>,
    by_job: PodsByJob,
}

/// What feeds a [`PodCache`]: every event of the pod watch, in order.
pub struct PodCacheWriter {
    writer: Writer<Pod>,
    by_job: PodsByJob,
}

/// An empty cache and its writer.
pub fn pod_cache() -> (PodCache, PodCacheWriter) {
    let (store, writer) = reflector::store();
    let by_job = PodsByJob::default();
    let cache = PodCache {
        store,
        by_job: by_job.clone(),
    };
    (cache, PodCacheWriter { writer, by_job })
}

impl PodCache {
    /// Every cached pod, by name.
    pub fn store(&self) -> &Store<Pod> {
        &self.store
    }

    /// The cached pods labelled with job `job` of `namespace`.
    pub fn of_job(&self, namespace: &str, job: &str) -> Vec<Arc<Pod>> {
        self.by_job.pods(&self.store, namespace, job)
    }
}

impl PodCacheWriter {
    /// Takes in one event of the pod watch: the cache first, then the index.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<Pod>) {
        self.writer.apply_watcher_event(event);
        self.by_job.observe(event);
    }
}

/// The names of each job's pods; cloning shares it.
#[derive(Clone, Default)]
struct PodsByJob(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    index: Index,
    /// A re-list in progress: what it has listed so far (swapped in when it is done, as the
    /// cache does).
    relisting: Option<Index>,
}

impl PodsByJob {
    /// Takes in one event of the pod watch, after the cache has.
    fn observe(&self, event: &watcher::Event<Pod>) {
        let mut state = self.0.lock().expect("lock");
        match event {
            watcher::Event::Apply(pod) => insert(&mut state.index, pod),
            watcher::Event::Delete(pod) => remove(&mut state.index, pod),
            watcher::Event::Init => state.relisting = Some(Index::new()),
            watcher::Event::InitApply(pod) => {
                insert(state.relisting.get_or_insert_with(Index::new), pod)
            }
            watcher::Event::InitDone => state.index = state.relisting.take().unwrap_or_default(),
        }
    }

    fn pods(&self, cache: &Store<Pod>, namespace: &str, job: &str) -> Vec<Arc<Pod>> {
        let names: Vec<String> = {
            let state = self.0.lock().expect("lock");
            let names = state.index.get(namespace).and_then(|jobs| jobs.get(job));
            names.into_iter().flatten().cloned().collect()
        };
        names
            .into_iter()
            .filter_map(|name| cache.get(&ObjectRef::new(&name).within(namespace)))
            .filter(|pod| job_of(pod) == Some(job))
            .collect()
    }
}

fn job_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(labels::JOB).map(String::as_str)
}

fn insert(index: &mut Index, pod: &Pod) {
    let (Some(namespace), Some(job)) = (pod.metadata.namespace.as_deref(), job_of(pod)) else {
        return;
    };
    index
        .entry(namespace.to_string())
        .or_default()
        .entry(job.to_string())
        .or_default()
        .insert(pod.name_any());
}

fn remove(index: &mut Index, pod: &Pod) {
    let (Some(namespace), Some(job)) = (pod.metadata.namespace.as_deref(), job_of(pod)) else {
        return;
    };
    let Some(jobs) = index.get_mut(namespace) else {
        return;
    };
    if let Some(names) = jobs.get_mut(job) {
        names.remove(&pod.name_any());
        if names.is_empty() {
            jobs.remove(job);
        }
    }
    if jobs.is_empty() {
        index.remove(namespace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn pod(namespace: &str, name: &str, job: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(namespace.into());
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some([(labels::JOB.to_string(), job.to_string())].into());
        pod
    }

    fn names(pods: Vec<Arc<Pod>>) -> Vec<String> {
        let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    /// A cache fed `events`, as the pod watch feeds it.
    fn watched(events: Vec<Event<Pod>>) -> PodCache {
        let (cache, mut writer) = pod_cache();
        for event in &events {
            writer.apply_watcher_event(event);
        }
        cache
    }

    #[test]
    fn a_job_gets_its_own_pods_and_no_other_jobs_or_namespaces() {
        let cache = watched(vec![
            Event::Init,
            Event::InitApply(pod("a", "j-0", "j")),
            Event::InitApply(pod("a", "k-0", "k")),
            Event::InitApply(pod("b", "j-0", "j")),
            Event::InitDone,
            Event::Apply(pod("a", "j-1", "j")),
        ]);
        assert_eq!(names(cache.of_job("a", "j")), ["j-0", "j-1"]);
        assert_eq!(names(cache.of_job("b", "j")), ["j-0"]);
        assert!(cache.of_job("c", "j").is_empty());
    }

    #[test]
    fn a_deleted_pod_is_gone_and_a_relist_replaces_the_index_as_it_does_the_cache() {
        let cache = watched(vec![
            Event::Apply(pod("a", "j-0", "j")),
            Event::Apply(pod("a", "j-1", "j")),
            Event::Delete(pod("a", "j-0", "j")),
        ]);
        assert_eq!(names(cache.of_job("a", "j")), ["j-1"]);

        // A re-list after a watch gap in which j-1 went and j-2 came.
        let cache = watched(vec![
            Event::Apply(pod("a", "j-1", "j")),
            Event::Init,
            Event::InitApply(pod("a", "j-2", "j")),
            Event::InitDone,
        ]);
        assert_eq!(names(cache.of_job("a", "j")), ["j-2"]);
        let state = cache.by_job.0.lock().unwrap();
        assert_eq!(state.index["a"]["j"].len(), 1, "the old list is dropped");
    }

    #[test]
    fn the_same_answer_as_walking_the_whole_cache() {
        let mut events = vec![Event::Init];
        for j in 0..20 {
            for r in 0..8 {
                events.push(Event::InitApply(pod(
                    "ns",
                    &format!("job{j}-{r}"),
                    &format!("job{j}"),
                )));
            }
        }
        events.push(Event::InitDone);
        for j in (0..20).step_by(3) {
            events.push(Event::Delete(pod(
                "ns",
                &format!("job{j}-5"),
                &format!("job{j}"),
            )));
        }
        let cache = watched(events);
        for j in 0..20 {
            let job = format!("job{j}");
            let walked: Vec<Arc<Pod>> = cache
                .store()
                .state()
                .into_iter()
                .filter(|p| job_of(p) == Some(job.as_str()))
                .collect();
            assert_eq!(names(cache.of_job("ns", &job)), names(walked), "{job}");
        }
    }
}
