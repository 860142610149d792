//! What the builders take from the operator and the job's state besides the object.

use ferrotrain_api::crd::DistributedTrainingSpec;

use super::network::OperatorPods;
use super::store::StoreService;
use crate::scheduling::GangMode;

/// What the builders need besides the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSettings {
    pub trainer_image: String,
    pub master_port: u16,
    pub trainer_metrics_port: u16,
    /// terminationGracePeriodSeconds of pods whose template sets none: sized from the last
    /// checkpoint save (gang::save_grace_seconds), so rank 0 can save before SIGKILL.
    pub termination_grace_seconds: i64,
    /// Restarts of restartPolicy.maxRestarts the job has not spent yet: the pods' launchers
    /// may restart their ranks in place this many times.
    pub restarts_left: u32,
    /// The gang's round (status.round): a pod created now starts its rounds there when it is
    /// node 0's replacement.
    pub round: u32,
    /// How the job's pods are scheduled all-or-nothing (scheduling::mode).
    pub gang: GangMode,
    /// The operator's own pods, which poll rank 0's progress (the job's NetworkPolicy lets
    /// them in); None: unknown, and the progress port stays open to every pod.
    pub operator_pods: Option<OperatorPods>,
    /// The Service the checkpoint store's endpoint names, as the operator read it for the
    /// NetworkPolicy's egress rule; None when it names none or the Service could not be read.
    pub store_service: Option<StoreService>,
}

/// The pods' termination grace: the template's, or the one sized from the save time.
pub fn termination_grace(spec: &DistributedTrainingSpec, s: &BuildSettings) -> i64 {
    spec.pod_template
        .as_ref()
        .and_then(|t| t.termination_grace_period_seconds)
        .unwrap_or(s.termination_grace_seconds)
}
