//! What [`super::decide`] returns: the next status, the changes to the cluster, the events.

use std::time::Duration;

use ferrotrain_api::crd::DistributedTrainingStatus;

/// A change to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ensure the Service, ConfigMap and Secret exist and create these ranks' pods of `attempt`.
    Launch { attempt: i32, node_ranks: Vec<i32> },
    /// Delete a pod (graceful).
    DeletePod(String),
    /// Delete a pod stuck terminating on a lost node, with grace period 0.
    ForceDeletePod(String),
    /// Delete the DistributedTraining itself (ttlSecondsAfterFinished passed).
    DeleteJob,
}

/// A Kubernetes Event to publish on the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// The in-place round it tells of (the status's round when it was made), so that the
    /// rounds one reconcile counts file their events apart; None: the status's round.
    pub round: Option<i32>,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to write (written only when it differs from the observed one).
    pub status: DistributedTrainingStatus,
    /// In the order they must run: deletes, then (after the status write) launches.
    pub actions: Vec<Action>,
    pub events: Vec<EventNote>,
    /// Reconcile again after this long even if nothing changes.
    pub requeue_after: Option<Duration>,
    /// What is left of restartPolicy.maxRestarts after this decision: the launchers of the
    /// pods it creates may spend this many in place.
    pub restarts_left: u32,
}

impl Decision {
    /// The pods it creates (a new attempt's gang, or replacements); `None` when it launches
    /// nothing.
    pub fn pods_to_launch(&self) -> Option<usize> {
        let mut launches = self.actions.iter().filter_map(|a| match a {
            Action::Launch { node_ranks, .. } => Some(node_ranks.len()),
            _ => None,
        });
        let first = launches.next()?;
        Some(first + launches.sum::<usize>())
    }

    /// The node ranks of the pods it creates.
    pub fn node_ranks_to_launch(&self) -> Vec<i32> {
        self.actions
            .iter()
            .flat_map(|a| match a {
                Action::Launch { node_ranks, .. } => node_ranks.as_slice(),
                _ => &[],
            })
            .copied()
            .collect()
    }
}

/// Deletes first, then the rest (launches need the status written in between; the
/// controller writes the status after deletes).
pub(super) fn order(mut actions: Vec<Action>) -> Vec<Action> {
    actions.sort_by_key(|a| match a {
        Action::ForceDeletePod(_) | Action::DeletePod(_) => 0,
        Action::Launch { .. } => 1,
        Action::DeleteJob => 2,
    });
    actions.dedup();
    actions
}
