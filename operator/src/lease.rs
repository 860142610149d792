//! Leader election on a coordination.k8s.io Lease: one replica acts, the others watch the Lease
//! and take over within a lease duration when the leader stops renewing it, or at once when it
//! stops cleanly and releases it (SIGTERM: a rollout, a drained node, `kubectl delete pod`).

use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::Args;
use crate::error::is_status;
use crate::labels;

/// Why leader election could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "leader election needs the Lease's namespace: set --lease-namespace \
         (FERROTRAIN_OPERATOR_LEASE_NAMESPACE) or POD_NAMESPACE (the Helm chart sets it from \
         the pod), or run a single replica with --leader-election false"
    )]
    NoNamespace,
    #[error(
        "cannot use Lease {namespace}/{name} for leader election (does the operator's Role \
         allow get, list, watch, create and update on leases.coordination.k8s.io in {namespace}?): {source}"
    )]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("leader election stopped")]
    Stopped,
}

/// Where the Lease lives and who this replica is.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration_seconds: u64,
}

impl LeaseSettings {
    /// From the flags and the pod's downward-API environment (POD_NAMESPACE, POD_NAME).
    pub fn resolve(
        args: &Args,
        pod_namespace: Option<String>,
        pod_name: Option<String>,
        hostname: Option<String>,
    ) -> Result<Self, Error> {
        let namespace = args
            .lease_namespace
            .clone()
            .or(pod_namespace)
            .filter(|ns| !ns.is_empty())
            .ok_or(Error::NoNamespace)?;
        let identity = args
            .identity
            .clone()
            .or(pod_name)
            .or(hostname)
            .unwrap_or_else(|| format!("ferrotrain-operator-{}", std::process::id()));
        Ok(LeaseSettings {
            name: args.lease_name.clone(),
            namespace,
            identity,
            duration_seconds: args.lease_duration_seconds.max(2),
        })
    }

    /// From the flags and this process's environment.
    pub fn from_env(args: &Args) -> Result<Self, Error> {
        let var = |name| std::env::var(name).ok();
        Self::resolve(args, var("POD_NAMESPACE"), var("POD_NAME"), var("HOSTNAME"))
    }
}

/// What a replica does next with the Lease, given what it last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It holds the Lease and the renew period has passed: renew it.
    Renew,
    /// Nobody holds it (released, or never held) or its holder stopped renewing it: take it.
    Acquire,
    /// Nothing to do for at most this long: it holds the Lease and renewed it recently, or
    /// another replica holds it (wait for it to be released or to expire).
    Wait(Duration),
}

/// The election rule (client-go's): a Lease is free when it has no holder, or when it did not
/// change for its duration as *this* replica observed it (`unchanged_for`, measured with the
/// local monotonic clock, so clocks that disagree between nodes do not matter). Its holder
/// renews it once per renew period (`since_renewed`: since its own last write), not on every
/// change it sees: its own renewal is a change too.
pub fn plan(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    duration: Duration,
    since_renewed: Option<Duration>,
) -> Step {
    let period = renew_period(duration);
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h == me => match since_renewed {
            Some(since) if since < period => Step::Wait(period - since),
            _ => Step::Renew,
        },
        None => Step::Acquire,
        Some(_) if unchanged_for >= duration => Step::Acquire,
        Some(_) => Step::Wait(duration - unchanged_for),
    }
}

/// How often the leader renews: a fifth of the duration (3 s of 15, as client-go's 2 s of 15).
fn renew_period(duration: Duration) -> Duration {
    (duration / 5).max(Duration::from_millis(500))
}

/// The leader gives up when it could not renew for two thirds of the duration (client-go's
/// renew deadline), before any follower may take the Lease over.
fn renew_deadline(duration: Duration) -> Duration {
    duration * 2 / 3
}

/// A replica taking part in the election. Dropping it without [`Leadership::release`] leaves
/// the Lease to expire.
pub struct Leadership {
    leader: watch::Receiver<bool>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    settings: LeaseSettings,
}

impl Leadership {
    /// Joins the election (creates the Lease if it does not exist). A follower watches the
    /// Lease, so a released one is taken over at once, not after it expires.
    pub async fn join(client: Client, settings: LeaseSettings) -> Result<Self, Error> {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        ensure_lease(&api, &settings.name)
            .await
            .map_err(|source| Error::Lease {
                namespace: settings.namespace.clone(),
                name: settings.name.clone(),
                source,
            })?;
        let (tx, leader) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(Election::new(api, settings.clone(), tx).run(stopped));
        info!(lease = %settings.name, namespace = %settings.namespace, identity = %settings.identity, "waiting to lead");
        Ok(Leadership {
            leader,
            stop,
            task,
            settings,
        })
    }

    /// Waits until this replica leads (true) or `stop` completes first (false).
    pub async fn wait_to_lead(&mut self, stop: impl Future<Output = ()>) -> Result<bool, Error> {
        tokio::pin!(stop);
        while !*self.leader.borrow_and_update() {
            tokio::select! {
                changed = self.leader.changed() => changed.map_err(|_| Error::Stopped)?,
                _ = &mut stop => return Ok(false),
            }
        }
        info!(identity = %self.settings.identity, "leading");
        Ok(true)
    }

    /// Completes when this replica stops being the leader (the Lease was lost or taken).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut leader = self.leader.clone();
        async move {
            loop {
                if leader.changed().await.is_err() || !*leader.borrow_and_update() {
                    return;
                }
            }
        }
    }

    /// Gives the Lease up (no holder, a duration of 1 s), so that a follower, which watches
    /// it, leads at once instead of after expiry.
    pub async fn release(self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            warn!(lease = %self.settings.name, "releasing the lease timed out; it expires instead");
        }
    }
}

fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(labels::FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Creates the Lease, without a holder, unless it exists.
async fn ensure_lease(api: &Api<Lease>, name: &str) -> Result<(), kube::Error> {
    if api.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    };
    match api.create(&write_params(), &lease).await {
        Err(e) if is_status(&e, 409) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// One replica's side of the election: reads the Lease whenever it changes (a watch) or a
/// timer fires, and renews, acquires or follows it as [`plan`] says.
struct Election {
    api: Api<Lease>,
    settings: LeaseSettings,
    duration: Duration,
    leader: watch::Sender<bool>,
    /// The resourceVersion last read and when it was first seen (a Lease that keeps one
    /// version for its duration has expired).
    seen: Option<(String, Instant)>,
    /// When this replica last renewed (or acquired) the Lease.
    renewed: Option<Instant>,
}

impl Election {
    fn new(api: Api<Lease>, settings: LeaseSettings, leader: watch::Sender<bool>) -> Self {
        let duration = Duration::from_secs(settings.duration_seconds);
        Election {
            api,
            settings,
            duration,
            leader,
            seen: None,
            renewed: None,
        }
    }

    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let selector = format!("metadata.name={}", self.settings.name);
        let changes = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&selector),
        )
        .default_backoff();
        tokio::pin!(changes);
        loop {
            let wait = self.step().await;
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(wait) => {}
                _ = changes.next() => {}
            }
        }
        if *self.leader.borrow() {
            self.release().await;
        }
    }

    /// Reads the Lease and acts on it; returns how long to wait at most before looking again.
    async fn step(&mut self) -> Duration {
        let retry = renew_period(self.duration);
        let lease = match self.api.get(&self.settings.name).await {
            Ok(lease) => lease,
            Err(e) => {
                warn!(lease = %self.settings.name, error = %e, "reading the lease failed");
                self.check_deadline();
                return retry;
            }
        };
        let now = Instant::now();
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.seen.as_ref().is_none_or(|(v, _)| *v != version) {
            self.seen = Some((version, now));
        }
        let unchanged_for = self
            .seen
            .as_ref()
            .map_or(Duration::ZERO, |(_, at)| now - *at);
        let spec = lease.spec.clone().unwrap_or_default();
        let duration = spec
            .lease_duration_seconds
            .map_or(self.duration, |d| Duration::from_secs(d.max(0) as u64));
        let holder = spec.holder_identity.as_deref();
        let mine = holder == Some(self.settings.identity.as_str());
        let since_renewed = self.renewed.map(|at| now - at);
        match plan(
            holder,
            &self.settings.identity,
            unchanged_for,
            duration,
            since_renewed,
        ) {
            Step::Wait(left) => {
                if !mine {
                    self.set_leader(false);
                }
                left.min(self.duration)
            }
            Step::Renew | Step::Acquire => {
                if self.write(lease, mine).await {
                    self.renewed = Some(Instant::now());
                    self.set_leader(true);
                } else {
                    self.check_deadline();
                }
                retry
            }
        }
    }

    /// Renews or takes the Lease (a replace at the version read: a race loses with 409).
    async fn write(&self, mut lease: Lease, renew: bool) -> bool {
        let now = MicroTime(Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !renew {
            spec.holder_identity = Some(self.settings.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(self.settings.duration_seconds as i32);
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.settings.name, &write_params(), &lease)
            .await
        {
            Ok(_) => true,
            Err(e) if is_status(&e, 409) => false,
            Err(e) => {
                warn!(lease = %self.settings.name, error = %e, "writing the lease failed");
                false
            }
        }
    }

    /// A leader that could not renew within the deadline stops leading.
    fn check_deadline(&mut self) {
        let late = self
            .renewed
            .is_none_or(|at| at.elapsed() >= renew_deadline(self.duration));
        if *self.leader.borrow() && late {
            warn!(lease = %self.settings.name, "could not renew the lease in time");
            self.set_leader(false);
        }
    }

    fn set_leader(&self, leading: bool) {
        self.leader
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
    }

    /// No holder and a duration of 1 s (client-go's release): followers take it at once.
    async fn release(&self) {
        let result = async {
            let mut lease = self.api.get(&self.settings.name).await?;
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api
                .replace(&self.settings.name, &write_params(), &lease)
                .await
                .map(|_| ())
        }
        .await;
        match result {
            Ok(()) => info!(lease = %self.settings.name, "released the lease"),
            Err(e) => warn!(error = %e, "releasing the lease failed; it expires instead"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["ferrotrain-operator", "run"];
        argv.extend_from_slice(extra);
        let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("run");
        };
        *args
    }

    #[test]
    fn a_replica_renews_its_own_lease_once_a_period_takes_a_free_or_expired_one_and_follows_a_live_one()
     {
        let d = Duration::from_secs(15);
        let s = Duration::from_secs;
        assert_eq!(plan(Some("me"), "me", s(3), d, Some(s(3))), Step::Renew);
        assert_eq!(
            plan(Some("me"), "me", s(0), d, None),
            Step::Renew,
            "a leader new to us"
        );
        // Its own renewal wakes the leader (a watch event): it waits out the period.
        assert_eq!(
            plan(Some("me"), "me", s(0), d, Some(s(1))),
            Step::Wait(s(2))
        );
        assert_eq!(plan(None, "me", s(0), d, None), Step::Acquire, "never held");
        assert_eq!(
            plan(Some(""), "me", s(0), d, None),
            Step::Acquire,
            "released"
        );
        assert_eq!(plan(Some("op-1"), "me", s(4), d, None), Step::Wait(s(11)));
        assert_eq!(
            plan(Some("op-1"), "me", s(15), d, None),
            Step::Acquire,
            "expired"
        );
        // The leader renews well inside the deadline, which ends before a follower may take over.
        assert_eq!(renew_period(d), s(3));
        assert_eq!(renew_deadline(d), s(10));
        assert!(renew_deadline(d) < d);
    }

    #[test]
    fn the_lease_namespace_comes_from_the_flag_or_the_pod() {
        let from_pod =
            LeaseSettings::resolve(&args(&[]), Some("ops".into()), Some("op-1".into()), None)
                .unwrap();
        assert_eq!(
            (from_pod.namespace.as_str(), from_pod.identity.as_str()),
            ("ops", "op-1")
        );
        let flag = LeaseSettings::resolve(
            &args(&["--lease-namespace", "elect", "--identity", "me"]),
            Some("ops".into()),
            Some("op-1".into()),
            None,
        )
        .unwrap();
        assert_eq!(
            (flag.namespace.as_str(), flag.identity.as_str()),
            ("elect", "me")
        );
    }

    #[test]
    fn outside_a_pod_without_a_namespace_the_error_says_what_to_set() {
        let err = LeaseSettings::resolve(&args(&[]), None, None, Some("laptop".into()))
            .unwrap_err()
            .to_string();
        for needle in [
            "--lease-namespace",
            "POD_NAMESPACE",
            "--leader-election false",
        ] {
            assert!(err.contains(needle), "{err}");
        }
    }
}
