//! Pods this process created that its pod cache has not shown yet. A reconcile between a
//! create and the watch event that brings the pod would see the pod missing and create it
//! again (the API answers 409; a GET follows to check its owner): the fleet bench's drain of
//! 160 pods made 44 such second creates. Kubernetes' own controllers keep "expectations" for
//! the same reason (the ReplicaSet controller waits for the adds it expects, for up to 5
//! minutes); here a created pod simply counts as present until the cache shows it, for at most
//! [`UNSEEN_TTL`] (a pod deleted before the cache ever showed it is then launched again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::labels;
use crate::objects::Owner;

/// How long a created pod counts as present without the cache showing it: far above a
/// watch's lag (under a second; seconds on a loaded API server), short enough that a pod
/// lost before it was ever seen is replaced soon.
pub const UNSEEN_TTL: SignedDuration = SignedDuration::from_secs(15);

/// A pod's namespace and name.
type PodKey = (String, String);

/// Created pods by namespace and name, with when they were created.
#[derive(Default)]
pub struct UnseenPods {
    pods: Mutex<HashMap<PodKey, (Arc<Pod>, Timestamp)>>,
}

impl UnseenPods {
    /// Notes `pod` (as the API returned it, with its UID) created at `now`.
    pub fn created(&self, pod: Pod, now: Timestamp) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let mut pods = self.pods.lock().expect("lock");
        pods.insert(key, (Arc::new(pod), now));
    }

    /// `cached` (the owner's pods in the cache) with the owner's created pods the cache has
    /// not shown yet: each replaces a cached pod of its name (an older one, deleted, since
    /// the API accepted a new pod of that name). A created pod the cache shows (same UID), or
    /// noted [`UNSEEN_TTL`] ago, is forgotten.
    pub fn with_unseen(
        &self,
        owner: &Owner,
        mut cached: Vec<Arc<Pod>>,
        now: Timestamp,
    ) -> Vec<Arc<Pod>> {
        let mut pods = self.pods.lock().expect("lock");
        pods.retain(|_, (pod, at)| {
            let fresh = now.duration_since(*at) < UNSEEN_TTL;
            let seen = is_owners(owner, pod)
                && pod.metadata.uid.is_some()
                && cached.iter().any(|c| c.metadata.uid == pod.metadata.uid);
            fresh && !seen
        });
        for (pod, _) in pods.values().filter(|(pod, _)| is_owners(owner, pod)) {
            cached.retain(|c| c.metadata.name != pod.metadata.name);
            cached.push(pod.clone());
        }
        cached
    }
}

fn is_owners(owner: &Owner, pod: &Pod) -> bool {
    pod.metadata.namespace.as_deref() == Some(owner.namespace.as_str())
        && pod.labels().get(labels::JOB) == Some(&owner.name)
        && owner.controls(&pod.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{PodExt, api_pod, job, t};

    fn with_uid(mut pod: Pod, uid: &str) -> Pod {
        pod.metadata.uid = Some(uid.into());
        pod
    }

    fn names_and_uids(pods: &[Arc<Pod>]) -> Vec<(String, String)> {
        let mut v: Vec<_> = pods
            .iter()
            .map(|p| (p.name_any(), p.metadata.uid.clone().unwrap_or_default()))
            .collect();
        v.sort();
        v
    }

    fn pair(name: &str, uid: &str) -> (String, String) {
        (name.into(), uid.into())
    }

    #[test]
    fn a_created_pod_counts_until_the_cache_shows_it() {
        let owner = Owner::of(&job()).unwrap();
        let unseen = UnseenPods::default();
        let cached = vec![Arc::new(with_uid(api_pod(0, 0), "a"))];
        unseen.created(with_uid(api_pod(0, 1), "b"), t(100));
        let pods = unseen.with_unseen(&owner, cached.clone(), t(101));
        assert_eq!(
            names_and_uids(&pods),
            [pair("mt-0-0", "a"), pair("mt-0-1", "b")]
        );
        // The cache shows it: the cache's copy alone, and it is forgotten.
        let mut shown = cached.clone();
        shown.push(Arc::new(with_uid(api_pod(0, 1), "b").with_ip("10.0.0.2")));
        let pods = unseen.with_unseen(&owner, shown, t(102));
        assert_eq!(pods.len(), 2);
        assert!(pods[1].status.as_ref().unwrap().pod_ip.is_some());
        // Deleted afterwards: missing, as the cache says.
        let pods = unseen.with_unseen(&owner, cached, t(103));
        assert_eq!(names_and_uids(&pods), [pair("mt-0-0", "a")]);
    }

    #[test]
    fn a_created_pod_replaces_the_older_pod_of_its_name_the_cache_still_holds() {
        let owner = Owner::of(&job()).unwrap();
        let unseen = UnseenPods::default();
        unseen.created(with_uid(api_pod(0, 1), "new"), t(100));
        let cached = vec![Arc::new(with_uid(api_pod(0, 1), "old"))];
        let pods = unseen.with_unseen(&owner, cached, t(100));
        assert_eq!(names_and_uids(&pods), [pair("mt-0-1", "new")]);
    }

    #[test]
    fn an_unseen_pod_is_forgotten_after_the_ttl_and_other_jobs_never_see_it() {
        let owner = Owner::of(&job()).unwrap();
        let unseen = UnseenPods::default();
        unseen.created(with_uid(api_pod(0, 1), "b"), t(100));
        let mut other_job = job();
        other_job.metadata.name = Some("other".into());
        other_job.metadata.uid = Some("other-uid".into());
        let other = Owner::of(&other_job).unwrap();
        assert!(unseen.with_unseen(&other, vec![], t(101)).is_empty());
        let ttl = UNSEEN_TTL.as_secs();
        assert_eq!(
            unseen.with_unseen(&owner, vec![], t(100 + ttl - 1)).len(),
            1
        );
        assert!(unseen.with_unseen(&owner, vec![], t(100 + ttl)).is_empty());
    }
}
