//! Every reason the operator writes on a `DistributedTraining`: the reasons of its status
//! conditions (`crd::condition`), of its Kubernetes Events, and of
//! `status.lastFailure.reason` (which is also the key of `status.restartsByCause`, the
//! `reason` label of `ferrotrain_operator_gang_restarts_total` and the reason of the recovery
//! ledger's attempt ends). One constant per string, so a typo cannot make a new reason that
//! users' alerts miss. docs/reasons.md lists them with what each means and what to do.
//!
//! Where a string serves several of these (a failure's reason is also the Restarting
//! condition's reason and, when it fails the job, the Failed condition's), it is one constant.

use crate::documented::documented;

documented! {
    /// Every reason above, in this order, with its rustdoc (docs/reference/reasons.md).
    pub const ALL;

    // The launch: condition Created.

    /// Created=True: every pod of the current attempt was created.
    pub const PODS_CREATED: &str = "PodsCreated";
    /// Normal event: the operator creates the attempt's pods.
    pub const CREATED: &str = "Created";
    /// Created=False, Warning event, and (past `spec.startupTimeoutSeconds`) the Failed
    /// condition's and `lastFailure.reason`: the API refused a pod of the attempt (ResourceQuota,
    /// LimitRange, an admission webhook).
    pub const POD_CREATE_REFUSED: &str = "PodCreateRefused";
    /// Created=False: an elastic job whose pods are scheduled one by one creates node 0's pod
    /// first (it hosts the rendezvous: a gang placed without it trains nothing) and the others
    /// once it has a node; the message says why it waits.
    pub const NODE_0_FIRST: &str = "Node0First";
    /// Created=False: the next attempt waits until no pod of an earlier one exists (one checkpoint
    /// writer at a time).
    pub const PREVIOUS_ATTEMPT_TERMINATING: &str = "PreviousAttemptTerminating";
    /// Created=False and Warning event: an object of one of the job's names (Service, ConfigMap,
    /// Secret, pod) exists and this job does not control it.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// Created=False and Warning event: the Secret `spec.checkpoint.storeSecretName` does not
    /// exist or lacks a key the pods need; no pod is created until it has them.
    pub const STORE_SECRET_MISSING: &str = "StoreSecretMissing";
    /// Failed=True, Warning event and `lastFailure.reason`: the spec is invalid in a way the
    /// schema cannot see; no pod is created.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Failed=False: the spec of a job that failed as [`INVALID_SPEC`] changed; it is tried again.
    pub const SPEC_CHANGED: &str = "SpecChanged";

    // Start-up: condition Running while the attempt's pods start.

    /// Running=True: every pod of the attempt runs.
    pub const ALL_RANKS_RUNNING: &str = "AllRanksRunning";
    /// Normal event: every pod of the attempt runs.
    pub const RUNNING: &str = "Running";
    /// Running=False: the attempt's pods are on their way, nothing is wrong.
    pub const PODS_STARTING: &str = "PodsStarting";
    /// A pod cannot be scheduled (its PodScheduled condition is False). Running=False and a
    /// Warning event while it waits; at the start-up timeout `lastFailure.reason` and a gang
    /// restart.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The trainer image cannot be pulled (ErrImagePull, ImagePullBackOff, ...). Running=False and
    /// a Warning event while it waits; at the start-up timeout `lastFailure.reason` and Failed.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// The image name cannot be parsed: `lastFailure.reason` and Failed at once.
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    /// A ConfigMap, Secret or key the pod needs is missing. Running=False and a Warning event
    /// while it waits; at the start-up timeout `lastFailure.reason` and Failed.
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    /// Another kubelet reason (CreateContainerError, RunContainerError, ...). Running=False and a
    /// Warning event while it waits; at the start-up timeout `lastFailure.reason` and a gang
    /// restart.
    pub const CONTAINER_ERROR: &str = "ContainerError";
    /// A pod stayed ContainerCreating or PodInitializing (normal for a while: a volume attaches,
    /// the image is pulled) until the start-up timeout: `lastFailure.reason` and a gang restart.
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    /// A pod did not run within the start-up timeout and nobody said why: `lastFailure.reason`
    /// and a gang restart.
    pub const STARTUP_TIMEOUT: &str = "StartupTimeout";

    // Why an attempt ended: lastFailure.reason, Restarting=True, restartsByCause.

    /// A rank's trainer exited non-zero with a retryable code.
    pub const EXIT_CODE: &str = "ExitCode";
    /// A rank exited with a permanent code (2, 3, 4 or `restartPolicy.permanentExitCodes`).
    pub const PERMANENT_EXIT_CODE: &str = "PermanentExitCode";
    /// A pod failed without its trainer exiting (the kubelet failed it).
    pub const POD_FAILED: &str = "PodFailed";
    /// A pod of the attempt was deleted, or vanished, without a disruption condition.
    pub const POD_DELETED: &str = "PodDeleted";
    /// A pod's node was NotReady or gone for the operator's node-lost grace.
    pub const NODE_LOST: &str = "NodeLost";
    /// A pod was evicted, preempted, drained, or its node shut down: a restart that spends no
    /// `maxRestarts`. Also the Warning event of such a restart.
    pub const DISRUPTED: &str = "Disrupted";
    /// The progress report did not change for `stallTimeoutSeconds`. Also the Warning event.
    pub const STALLED: &str = "Stalled";
    /// `activeDeadlineSeconds` passed: `lastFailure.reason` and Failed.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

    // In-place restarts (`restartPolicy.inPlace`): the ranks of every pod restarted in a new
    // round; lastFailure.reason and restartsByCause say why (with ExitCode, PermanentExitCode).

    /// A rank's trainer was killed by a signal (SIGKILL, the OOM killer) inside its pod.
    pub const KILLED: &str = "Killed";
    /// A rank's trainer was stopped (SIGSTOP, a debugger) and its peers timed out waiting.
    pub const FROZEN: &str = "Frozen";
    /// A rank did not answer its peers in a collective (hung); they name it in their timeouts.
    pub const UNRESPONSIVE: &str = "Unresponsive";
    /// A pod's launcher sent no report of the round: it was killed (SIGKILL, the OOM killer) or
    /// its pod lost, and its ranks with it; the pod is replaced alone.
    pub const AGENT_LOST: &str = "AgentLost";
    /// Warning event: every rank restarted in place, in the same pods, as a new round.
    pub const RESTARTED_IN_PLACE: &str = "RestartedInPlace";
    /// Running=False and a Normal event: a pod went away (deleted, evicted) and is created again
    /// alone; the other pods keep running and their launchers wait for it.
    pub const POD_REPLACED: &str = "PodReplaced";
    /// lastFailure (in place): a pod's launcher was signalled, its pod going away.
    pub const POD_LEAVING: &str = "PodLeaving";
    /// Resized=True and a Warning event: the job trains on fewer ranks than its gang; Resized=False
    /// and a Normal event (reason WholeGang) once all of them train again.
    pub const SHRUNK: &str = "Shrunk";
    /// Resized=False: the whole gang trains again.
    pub const WHOLE_GANG: &str = "WholeGang";
    /// Resized=True and a Normal event: the job trains on more ranks than `replicas` asks for,
    /// in pods up to `elastic.maxReplicas` that found a place.
    pub const GROWN: &str = "Grown";
    /// The ledger's end of a round that ended so that the gang grows back (not a failure).
    pub const RESIZED: &str = "Resized";
    /// The ledger's end of a round that no rank ended: every node's ranks were stopped from
    /// outside (each launcher signalled at once).
    pub const STOPPED: &str = "Stopped";
    /// The ledger's end of an attempt or round whose launcher was signalled (SIGTERM, SIGINT:
    /// the pod deleted, the job suspended, Ctrl-C): its ranks stopped, rank 0 saving first.
    pub const SIGNALLED: &str = "Signalled";
    /// A single launcher's ledger (`--recovery-file`): its ranks were stopped because a rank on
    /// another node failed (node 0's ledger names that rank instead).
    pub const PEER_FAILED: &str = "PeerFailed";

    // The end of a job: conditions Restarting, Failed, Succeeded.

    /// Warning event naming the failed rank of a restart or of a permanent failure.
    pub const RANK_FAILED: &str = "RankFailed";
    /// Warning event: a gang restart, with the next attempt and its backoff.
    pub const RESTARTING: &str = "Restarting";
    /// Restarting=False: the backoff is over and the next attempt was launched.
    pub const RELAUNCHED: &str = "Relaunched";
    /// Failed=True after a rank exited with a permanent code ([`PERMANENT_EXIT_CODE`]).
    pub const PERMANENT_FAILURE: &str = "PermanentFailure";
    /// Failed=True: another retryable failure came after `maxRestarts` restarts.
    pub const MAX_RESTARTS_REACHED: &str = "MaxRestartsReached";
    /// Warning event: the job failed for good.
    pub const FAILED: &str = "Failed";
    /// Succeeded=True: every rank exited 0.
    pub const ALL_RANKS_SUCCEEDED: &str = "AllRanksSucceeded";
    /// Normal event: training finished; also the reason of the ledger's last attempt end.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Warning event: a pod on a lost node was force-deleted (at once when its launcher is fenced,
    /// else once stuck terminating).
    pub const FORCE_DELETED: &str = "ForceDeleted";

    // Suspend and resume: condition Suspended.

    /// Suspended=True and Normal event: `spec.suspend` is true; also the reason Running and
    /// Restarting turn False with, and the ledger's attempt end.
    pub const SUSPENDED: &str = "Suspended";
    /// Suspended=False and Normal event: `spec.suspend` is false again.
    pub const RESUMED: &str = "Resumed";

    // Progress: conditions ProgressAvailable and Stalled.

    /// ProgressAvailable=True: rank 0 serves /progress.
    pub const REPORTED: &str = "Reported";
    /// ProgressAvailable=Unknown: the last poll of rank 0's /progress failed.
    pub const POLL_FAILED: &str = "PollFailed";
    /// ProgressAvailable=False: polls kept failing for the operator's progress grace.
    pub const POLLS_FAILING: &str = "PollsFailing";
    /// ProgressAvailable=False: rank 0 never served /progress (an image without the endpoint).
    pub const NO_PROGRESS_ENDPOINT: &str = "NoProgressEndpoint";
    /// Normal event: rank 0 serves /progress again after ProgressAvailable was False.
    pub const PROGRESS_AVAILABLE: &str = "ProgressAvailable";
    /// Event: ProgressAvailable turned False (Normal for an image without the endpoint, Warning
    /// when polls that answered before keep failing).
    pub const PROGRESS_UNAVAILABLE: &str = "ProgressUnavailable";
    /// Stalled=True: no progress for `stallTimeoutSeconds`.
    pub const NO_PROGRESS: &str = "NoProgress";
    /// Stalled=False: the report changed again.
    pub const PROGRESS_RESUMED: &str = "ProgressResumed";
    /// CheckpointsSaved=False and Warning event: rank 0's saves fail (the disk under the
    /// checkpoints refused them: full, over quota, read-only or failing); training goes on.
    pub const CHECKPOINT_SAVE_FAILED: &str = "CheckpointSaveFailed";
    /// CheckpointsSaved=True and Normal event: a save completed again after failing.
    pub const CHECKPOINT_SAVED: &str = "CheckpointSaved";
    /// Warning event: the API server refused the job's status because the installed CRD
    /// lacks fields this operator writes (an older CRD: `helm upgrade` never upgrades one).
    pub const CRD_OUT_OF_DATE: &str = "CrdOutOfDate";

    /// A condition's reason when none is given (Kubernetes requires one).
    pub const UNKNOWN: &str = "Unknown";

    // Scheduling: condition GangScheduling, phase Queued.

    /// GangScheduling=True: a PodGroup of Kubernetes' own API (scheduling.k8s.io) holds each
    /// attempt's pods until all of them can be placed.
    pub const NATIVE_POD_GROUP: &str = "NativePodGroup";
    /// GangScheduling=True: Kueue admits the attempt's pods as one group.
    pub const KUEUE: &str = "Kueue";
    /// GangScheduling=True: a Volcano PodGroup.
    pub const VOLCANO: &str = "Volcano";
    /// GangScheduling=True: a scheduler-plugins Coscheduling PodGroup.
    pub const COSCHEDULING: &str = "Coscheduling";
    /// GangScheduling=False and a Warning event: the native API is not served (or not in a
    /// version this operator knows); pods are scheduled one by one.
    pub const NATIVE_API_NOT_SERVED: &str = "NativeApiNotServed";
    /// Running=False and a Normal event: the attempt's pods wait for a queue to admit them.
    pub const QUEUED: &str = "Queued";
    /// Running=False: the queue admitted the attempt (its pods' gates are gone).
    pub const ADMITTED: &str = "Admitted";
    /// Failed=True and lastFailure: the attempt stayed Queued longer than
    /// spec.scheduling.queueTimeoutSeconds.
    pub const QUEUE_TIMEOUT: &str = "QueueTimeout";
    /// Warning event: the API server dropped the pods' scheduling group (spec.schedulingGroup):
    /// the GenericWorkload gate is off on it although the API is served.
    pub const SCHEDULING_GROUP_DROPPED: &str = "SchedulingGroupDropped";

    /// Event: the gang's rendezvous store or ring refused 10, 100, 1000, ... connections.
    pub const REJECTED_CONNECTIONS: &str = "RejectedConnections";
}

#[cfg(test)]
mod tests {
    /// docs/reasons.md is where users look a reason up: it has a row for every one.
    #[test]
    fn every_reason_is_documented() {
        let docs = include_str!("../../docs/reasons.md");
        assert!(super::ALL.len() > 60, "{:?}", super::ALL);
        for reason in super::ALL {
            assert!(
                docs.contains(&format!("`{}`", reason.value)),
                "docs/reasons.md does not list {}",
                reason.value
            );
        }
    }

    #[test]
    fn the_table_lists_every_reason_once() {
        assert_eq!(super::ALL[0].value, super::PODS_CREATED);
        let values: std::collections::BTreeSet<_> = super::ALL.iter().map(|r| r.value).collect();
        assert_eq!(values.len(), super::ALL.len(), "a reason is listed twice");
        assert!(super::ALL.iter().all(|r| !r.text().is_empty()));
    }
}
