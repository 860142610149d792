//! Readiness of this replica, fed by the watch streams themselves.
//!
//! kube-runtime 5's `Store::wait_until_ready()` wakes only the last task that polled it, and
//! the controller's applier polls the same store: a second task waiting on it never woke, so
//! the operator stayed "not ready" forever and never created a pod. Here every watch stream
//! reports its own events (`InitDone` = listed and synced, errors = failing), and readiness is
//! computed from those: nothing waits on a future another task may steal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::runtime::watcher;
use tracing::{info, warn};

/// A watch counts as failing (and the replica as not ready) after this many errors in a row.
pub const FAILING_AFTER: u32 = 3;

#[derive(Debug, Default)]
struct WatchState {
    synced: bool,
    consecutive_errors: u32,
    last_error: Option<String>,
}

/// What `/readyz` answers and whether reconciles may act.
#[derive(Debug)]
pub struct Readiness {
    watches: Mutex<BTreeMap<&'static str, WatchState>>,
    /// True once every watch has listed its objects at least once: deciding from an empty pod
    /// cache would see every pod "deleted". The controller's context reads this flag.
    synced: Arc<AtomicBool>,
    /// A replica waiting for the leader lease has no watches and is ready (it can take over).
    following: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            watches: Mutex::new(BTreeMap::new()),
            synced: Arc::new(AtomicBool::new(false)),
            following: AtomicBool::new(false),
        }
    }
}

impl Readiness {
    /// Starts tracking `names` as new, unsynced watches (when the caches start).
    pub fn track(&self, names: &[&'static str]) {
        let mut watches = self.watches.lock().expect("lock");
        watches.clear();
        for name in names {
            watches.insert(name, WatchState::default());
        }
        self.synced.store(false, Ordering::Relaxed);
        self.following.store(false, Ordering::Relaxed);
    }

    /// This replica waits for the lease: ready, with nothing to watch yet.
    pub fn follow(&self) {
        self.following.store(true, Ordering::Relaxed);
    }

    /// This replica leads: ready when its watches are synced and not failing.
    pub fn lead(&self) {
        self.following.store(false, Ordering::Relaxed);
    }

    /// The flag reconciles check before acting.
    pub fn synced_flag(&self) -> Arc<AtomicBool> {
        self.synced.clone()
    }

    /// Feeds one item of the watch stream `name`.
    pub fn observe<K>(&self, name: &'static str, item: &Result<watcher::Event<K>, watcher::Error>) {
        let mut watches = self.watches.lock().expect("lock");
        let Some(state) = watches.get_mut(name) else {
            return;
        };
        match item {
            // Init is emitted before the list request it announces: no proof that the API
            // answered, so it neither clears nor counts an error.
            Ok(watcher::Event::Init) => {}
            Ok(event) => {
                if state.consecutive_errors >= FAILING_AFTER {
                    info!(watch = name, "watch recovered");
                }
                state.consecutive_errors = 0;
                state.last_error = None;
                if matches!(event, watcher::Event::InitDone) && !state.synced {
                    state.synced = true;
                    info!(watch = name, "watch synced");
                }
            }
            Err(error) => {
                state.consecutive_errors = state.consecutive_errors.saturating_add(1);
                state.last_error = Some(error.to_string());
                warn!(
                    watch = name,
                    %error,
                    consecutive = state.consecutive_errors,
                    "watch failed; retrying with backoff"
                );
            }
        }
        let all_synced = watches.values().all(|w| w.synced);
        if all_synced && !self.synced.swap(true, Ordering::Relaxed) {
            info!("every watch synced: reconciling");
        }
    }

    /// Ok when this replica can act (or is a follower); else why not, naming the watch.
    pub fn check(&self) -> Result<(), String> {
        if self.following.load(Ordering::Relaxed) {
            return Ok(());
        }
        let watches = self.watches.lock().expect("lock");
        if watches.is_empty() {
            return Err("not started".into());
        }
        let mut problems = Vec::new();
        for (name, state) in watches.iter() {
            if state.consecutive_errors >= FAILING_AFTER {
                problems.push(format!(
                    "watch {name} failing ({} errors in a row): {}",
                    state.consecutive_errors,
                    state.last_error.as_deref().unwrap_or_default()
                ));
            } else if !state.synced {
                problems.push(format!("watch {name} not synced"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn err() -> Result<watcher::Event<Pod>, watcher::Error> {
        Err(watcher::Error::NoResourceVersion)
    }

    #[test]
    fn ready_only_once_every_watch_synced() {
        let r = Readiness::default();
        assert!(r.check().is_err(), "not started");
        r.track(&["jobs", "pods"]);
        r.observe::<Pod>("jobs", &Ok(watcher::Event::Init));
        r.observe::<Pod>("jobs", &Ok(watcher::Event::InitDone));
        assert_eq!(r.check().unwrap_err(), "watch pods not synced");
        assert!(!r.synced_flag().load(Ordering::Relaxed));
        r.observe::<Pod>("pods", &Ok(watcher::Event::InitDone));
        assert_eq!(r.check(), Ok(()));
        assert!(r.synced_flag().load(Ordering::Relaxed));
    }

    #[test]
    fn a_watch_that_keeps_failing_makes_the_replica_unready_until_it_recovers() {
        let r = Readiness::default();
        r.track(&["pods"]);
        r.observe::<Pod>("pods", &Ok(watcher::Event::InitDone));
        for _ in 0..FAILING_AFTER - 1 {
            r.observe("pods", &err());
        }
        assert_eq!(r.check(), Ok(()), "a blip is not a failure");
        r.observe("pods", &err());
        let why = r.check().unwrap_err();
        assert!(
            why.starts_with("watch pods failing (3 errors in a row)"),
            "{why}"
        );
        // The cache stays synced (it holds the last good state): reconciles may go on.
        assert!(r.synced_flag().load(Ordering::Relaxed));
        // A relist starting is not a recovery; its first object is.
        r.observe::<Pod>("pods", &Ok(watcher::Event::Init));
        assert!(r.check().is_err());
        r.observe::<Pod>("pods", &Ok(watcher::Event::InitApply(Pod::default())));
        assert_eq!(r.check(), Ok(()));
    }

    #[test]
    fn a_follower_is_ready_and_a_leader_only_once_synced() {
        let r = Readiness::default();
        r.track(&["jobs"]);
        r.follow();
        assert_eq!(r.check(), Ok(()));
        r.lead();
        assert!(r.check().is_err());
        r.observe::<Pod>("jobs", &Ok(watcher::Event::InitDone));
        assert_eq!(r.check(), Ok(()));
    }
}
