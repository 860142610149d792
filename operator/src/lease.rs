//! Leader election on a coordination.k8s.io Lease: one replica acts, the others wait and take
//! over within a lease duration, or at once when the leader stops cleanly and releases it.

use std::future::Future;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::Args;
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
         allow get, create and patch on leases.coordination.k8s.io in {namespace}?): {source}"
    )]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: LeaseManagerError,
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

/// A replica taking part in the election. Dropping it without [`Leadership::release`] leaves
/// the Lease to expire.
pub struct Leadership {
    leader: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    settings: LeaseSettings,
}

impl Leadership {
    /// Joins the election (creates the Lease if it does not exist).
    pub async fn join(client: Client, settings: LeaseSettings) -> Result<Self, Error> {
        let duration = settings.duration_seconds;
        let manager = LeaseManagerBuilder::new(client, &settings.name)
            .with_namespace(&settings.namespace)
            .with_identity(&settings.identity)
            .with_duration(duration)
            .with_grace((duration / 3).max(1))
            .with_field_manager(labels::FIELD_MANAGER)
            .build()
            .await
            .map_err(|source| Error::Lease {
                namespace: settings.namespace.clone(),
                name: settings.name.clone(),
                source,
            })?;
        let (leader, task) = manager.watch().await;
        info!(lease = %settings.name, namespace = %settings.namespace, identity = %settings.identity, "waiting to lead");
        Ok(Leadership {
            leader,
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

    /// Gives the Lease up, so that another replica leads at once instead of after expiry.
    /// Every future from [`Leadership::lost`] must be dropped first.
    pub async fn release(self) {
        drop(self.leader);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) => info!(lease = %self.settings.name, "released the lease"),
            Ok(Ok(Err(e))) => warn!(error = %e, "releasing the lease failed; it expires instead"),
            Ok(Err(e)) => warn!(error = %e, "lease task failed; the lease expires instead"),
            Err(_) => warn!("releasing the lease timed out; it expires instead"),
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
