//! The faults the soak injects, each a real mechanism (what breaks, not a simulation of it),
//! and what the job's recovery ledger (`status.recovery`) must say about each: whether it ends
//! a round, why, whom it blames, and whether the next round may start from a checkpoint.

use ferrotrain_api::reason;
use ferrotrain_api::recovery::EndCause;

use crate::chaos::shape::Shape;

/// What is done, and to what (see [`Fault`] for the target).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// SIGKILL of a trainer process (any rank, any local rank), from this machine where the
    /// kit runs its containers: a crash, the OOM killer inside the container.
    KillTrainer,
    /// SIGSTOP of a trainer: a hang (a debugger, a stuck driver).
    StopTrainer,
    /// SIGKILL of a pod's launcher, its container's first process, from this machine: the
    /// OOM killer at the pod's limit; the pod fails with 137.
    KillLauncher,
    /// `kubectl delete pod`.
    DeletePod,
    /// The Eviction API (what `kubectl drain` sends).
    EvictPod,
    /// The kubelet's own eviction: 200 MiB written into the pod's /tmp (an emptyDir) against
    /// its 100Mi ephemeral-storage limit (30-120 s until the kubelet acts).
    KubeletEvict,
    /// Every packet into and out of the pod's network namespace dropped, and its node's
    /// kubelet stopped, so that Kubernetes loses the node (`crate::partition`).
    Partition,
    /// The acting operator's pod (the Lease holder) deleted.
    OperatorDeleted,
    /// The kit's kube-apiserver killed (SIGKILL) and started again by up.sh after 10-20 s.
    ApiServerDown,
    /// The kit's DNS server (dnsmasq) killed while a pod of the job is deleted and replaced;
    /// started again by up.sh after 5-15 s: the replacement's name must resolve once it is
    /// back.
    DnsDownReplace,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::KillTrainer,
        Kind::StopTrainer,
        Kind::KillLauncher,
        Kind::DeletePod,
        Kind::EvictPod,
        Kind::KubeletEvict,
        Kind::Partition,
        Kind::OperatorDeleted,
        Kind::ApiServerDown,
        Kind::DnsDownReplace,
    ];

    /// The kinds that act within a second or two: the short soak's, and those a second fault
    /// may overlap.
    pub const FAST: [Kind; 6] = [
        Kind::KillTrainer,
        Kind::StopTrainer,
        Kind::KillLauncher,
        Kind::DeletePod,
        Kind::EvictPod,
        Kind::OperatorDeleted,
    ];

    /// The name on the command line and in the report.
    pub fn key(self) -> &'static str {
        match self {
            Kind::KillTrainer => "kill-trainer",
            Kind::StopTrainer => "stop-trainer",
            Kind::KillLauncher => "kill-launcher",
            Kind::DeletePod => "delete-pod",
            Kind::EvictPod => "evict-api",
            Kind::KubeletEvict => "evict-kubelet",
            Kind::Partition => "partition",
            Kind::OperatorDeleted => "operator-deleted",
            Kind::ApiServerDown => "apiserver-down",
            Kind::DnsDownReplace => "dns-down-replace",
        }
    }

    pub fn parse(key: &str) -> Result<Kind, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.key() == key)
            .ok_or_else(|| {
                let keys: Vec<&str> = Kind::ALL.iter().map(|k| k.key()).collect();
                format!("unknown fault kind {key} ({})", keys.join(", "))
            })
    }

    /// Whether it ends the round it hits (the API server, DNS or the operator going away must
    /// not; DNS's pod replacement does).
    pub fn ends_a_round(self) -> bool {
        !matches!(self, Kind::OperatorDeleted | Kind::ApiServerDown)
    }

    /// Whether it targets a trainer (a pod and its local rank).
    pub fn targets_a_trainer(self) -> bool {
        matches!(self, Kind::KillTrainer | Kind::StopTrainer)
    }

    /// Whether it targets a pod of the job (a trainer's too).
    pub fn targets_a_pod(self) -> bool {
        !matches!(self, Kind::OperatorDeleted | Kind::ApiServerDown)
    }

    /// Whether it takes a pod away: an elastic gang trains on without it, then grows back
    /// when its replacement joins (a round end of its own, `Resized`).
    pub fn takes_a_pod(self) -> bool {
        matches!(
            self,
            Kind::KillLauncher
                | Kind::DeletePod
                | Kind::EvictPod
                | Kind::KubeletEvict
                | Kind::Partition
                | Kind::DnsDownReplace
        )
    }

    /// Whether `shape` can take it: a partition needs another pod to be cut off from (and
    /// node 0 keeps the rendezvous, so the cut pod is never node 0's).
    pub fn fits(self, shape: &Shape) -> bool {
        self != Kind::Partition || shape.replicas > 1
    }
}

/// One fault: a kind and its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    /// The pod's node rank (pod faults).
    pub node: i32,
    /// The trainer's local rank (trainer faults).
    pub local: i32,
    /// How long the kit's process stays down (API server, DNS), seconds.
    pub hold_seconds: u64,
}

impl Fault {
    /// For people: `kill -9 of rank 3 (pod 1, local rank 1)`.
    pub fn describe(&self, shape: &Shape) -> String {
        let (node, local) = (self.node, self.local);
        let rank = shape.rank(node, local);
        match self.kind {
            Kind::KillTrainer => {
                format!("kill -9 of rank {rank}'s trainer (pod {node}, local {local})")
            }
            Kind::StopTrainer => {
                format!("SIGSTOP of rank {rank}'s trainer (pod {node}, local {local})")
            }
            Kind::KillLauncher => format!("kill -9 of pod {node}'s launcher"),
            Kind::DeletePod => format!("pod {node} deleted"),
            Kind::EvictPod => format!("pod {node} evicted (Eviction API)"),
            Kind::KubeletEvict => format!("pod {node} evicted by its kubelet (ephemeral storage)"),
            Kind::Partition => format!("pod {node} cut off, its node's kubelet stopped"),
            Kind::OperatorDeleted => "the acting operator's pod deleted".into(),
            Kind::ApiServerDown => format!("the API server down {} s", self.hold_seconds),
            Kind::DnsDownReplace => {
                format!(
                    "DNS down {} s while pod {node} is replaced",
                    self.hold_seconds
                )
            }
        }
    }

    /// What the ledger must say about it in `shape`.
    pub fn expected(&self, shape: &Shape) -> Expected {
        let node_rank = i64::from(self.node);
        let rank = Some(i64::from(shape.rank(self.node, self.local)));
        // A job of one pod has no survivor when its pod goes: the replacement starts from the
        // checkpoint (its rank 0's on SIGTERM, or the last periodic one when nothing could
        // save).
        let pod_gone = shape.replicas == 1 && self.kind.takes_a_pod();
        let end = |reason, cause, rank, words| {
            Some(ExpectedEnd {
                reason,
                cause,
                node_rank,
                rank,
                words,
                from_checkpoint: pod_gone,
            })
        };
        let end = match self.kind {
            Kind::KillTrainer => end(reason::KILLED, EndCause::Failure, rank, None),
            Kind::StopTrainer => end(reason::FROZEN, EndCause::Failure, rank, None),
            Kind::KillLauncher | Kind::Partition => {
                end(reason::AGENT_LOST, EndCause::Failure, None, None)
            }
            Kind::DeletePod | Kind::DnsDownReplace => {
                end(reason::POD_LEAVING, EndCause::Disruption, None, None)
            }
            Kind::EvictPod => end(
                reason::DISRUPTED,
                EndCause::Disruption,
                None,
                Some(EVICTION_API_WORDS),
            ),
            Kind::KubeletEvict => end(
                reason::DISRUPTED,
                EndCause::Disruption,
                None,
                Some(KUBELET_EVICTION_WORDS),
            ),
            Kind::OperatorDeleted | Kind::ApiServerDown => None,
        };
        Expected { end }
    }
}

/// Kubernetes' words for an eviction through the API (the DisruptionTarget condition's
/// reason), which the status must quote.
pub const EVICTION_API_WORDS: &str = "EvictionByEvictionAPI";
/// The kubelet's words for a pod over its ephemeral-storage limit.
pub const KUBELET_EVICTION_WORDS: &str = "Pod ephemeral local storage usage exceeds";

/// What the ledger must say about a fault.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// The end of the round it ends; None: it ends no round.
    pub end: Option<ExpectedEnd>,
}

/// The end of a round a fault ends.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedEnd {
    pub reason: &'static str,
    pub cause: EndCause,
    /// The blamed pod.
    pub node_rank: i64,
    /// The blamed global rank, where the fault is a rank's.
    pub rank: Option<i64>,
    /// Kubernetes' words, which `lastFailure` or an event of the job must quote.
    pub words: Option<&'static str>,
    /// The next round may start from the checkpoint (and train the steps since it again).
    pub from_checkpoint: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_from_their_keys() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.key()), Ok(kind));
        }
        assert!(Kind::parse("meteor").is_err());
    }

    #[test]
    fn each_fault_blames_what_it_hit() {
        let two_by_two = Shape::parse("2x2").unwrap();
        let fault = |kind, node, local| Fault {
            kind,
            node,
            local,
            hold_seconds: 0,
        };
        let killed = fault(Kind::KillTrainer, 1, 1).expected(&two_by_two);
        let end = killed.end.expect("a round end");
        assert_eq!(
            (end.reason, end.rank, end.node_rank),
            ("Killed", Some(3), 1)
        );
        assert!(!end.from_checkpoint);
        let evicted = fault(Kind::KubeletEvict, 1, 0).expected(&two_by_two);
        assert_eq!(evicted.end.unwrap().cause, EndCause::Disruption);
        assert_eq!(
            fault(Kind::ApiServerDown, 0, 0).expected(&two_by_two).end,
            None
        );
        // The only pod gone: from the checkpoint.
        let one_pod = Shape::parse("1x2").unwrap();
        let deleted = fault(Kind::DeletePod, 0, 0).expected(&one_pod);
        assert!(deleted.end.unwrap().from_checkpoint);
        assert!(!Kind::Partition.fits(&one_pod));
    }
}
