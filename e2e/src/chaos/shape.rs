//! The shapes the soak runs: pods x ranks per pod, fixed (no `elastic`: the gang trains whole
//! or waits) or elastic (trains on without a missing pod, down to `minReplicas`), each the copy
//! job of examples/copy-dt.yaml ([`copy_job`]) with only what the faults need changed.

use serde_json::{Value, json};

use crate::jobs::copy_job;

/// `resources.limits.ephemeral-storage` of the soak's pods: 200 MiB written into a pod's /tmp
/// (an emptyDir) makes its kubelet evict it.
pub const EPHEMERAL_LIMIT: &str = "100Mi";

/// A job shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub replicas: i32,
    pub procs: i32,
    /// `elastic.minReplicas`, when elastic.
    pub elastic_min: Option<i32>,
}

impl Shape {
    /// `2x1`, `2x2`, `1x2` (fixed) or `3x1` (elastic, minReplicas 2).
    pub fn parse(key: &str) -> Result<Shape, String> {
        let fixed = |replicas, procs| Shape {
            replicas,
            procs,
            elastic_min: None,
        };
        match key {
            "2x1" => Ok(fixed(2, 1)),
            "2x2" => Ok(fixed(2, 2)),
            "1x2" => Ok(fixed(1, 2)),
            "3x1" => Ok(Shape {
                replicas: 3,
                procs: 1,
                elastic_min: Some(2),
            }),
            other => Err(format!("unknown shape {other} (2x1, 2x2, 1x2, 3x1)")),
        }
    }

    /// Every shape of the soak.
    pub fn all() -> Vec<Shape> {
        ["2x1", "2x2", "1x2", "3x1"]
            .iter()
            .map(|k| Shape::parse(k).expect("known"))
            .collect()
    }

    /// As on the command line: `2x1`.
    pub fn key(&self) -> String {
        format!("{}x{}", self.replicas, self.procs)
    }

    /// For people: `2 pods x 1 rank`, `3 pods x 1 rank, elastic (min 2)`.
    pub fn name(&self) -> String {
        let plural = |n: i32, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let mut name = format!(
            "{} x {}",
            plural(self.replicas, "pod"),
            plural(self.procs, "rank")
        );
        if let Some(min) = self.elastic_min {
            name += &format!(", elastic (min {min})");
        }
        name
    }

    /// The ranks of the whole gang.
    pub fn world(&self) -> u32 {
        (self.replicas * self.procs) as u32
    }

    /// Fixed: every step trains at the whole gang's size, so a run with faults ends in the
    /// very bytes of one without.
    pub fn is_fixed(&self) -> bool {
        self.elastic_min.is_none()
    }

    /// The global rank of local rank `local` of pod `node`.
    pub fn rank(&self, node: i32, local: i32) -> i32 {
        node * self.procs + local
    }

    /// The spec of job `job`: the example's copy job of `max_steps` with its checkpoints on `claim`,
    /// in this shape, with room for `faults` restarts, an ephemeral-storage limit (the
    /// kubelet's eviction) and a rendezvous timeout long enough for Kubernetes to call a
    /// partitioned pod's node lost (about a minute) and the operator to replace the pod.
    /// The pods of job `job` prefer nodes apart (so that a pod can be cut off alone).
    pub fn spec(&self, job: &str, max_steps: u64, claim: &str, faults: usize) -> Value {
        let mut spec = copy_job(self.replicas, max_steps, Some(claim));
        spec["podTemplate"]["affinity"] = json!({"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"ferrotrain.dev/job": job}},
                    "topologyKey": "kubernetes.io/hostname"
                }
            }]
        }});
        spec["procsPerReplica"] = json!(self.procs);
        let object = spec.as_object_mut().expect("an object");
        match self.elastic_min {
            Some(min) => {
                object.insert("elastic".into(), json!({"minReplicas": min}));
            }
            None => {
                object.remove("elastic");
            }
        }
        spec["resources"]["limits"]["ephemeral-storage"] = json!(EPHEMERAL_LIMIT);
        spec["restartPolicy"]["maxRestarts"] = json!(2 * faults + 5);
        spec["trainer"]["distributed"]["rendezvousTimeoutSeconds"] = json!(600);
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::distributed_training;

    #[test]
    fn shapes_parse_and_their_specs_pass_the_trainers_validation() {
        for shape in Shape::all() {
            assert_eq!(Shape::parse(&shape.key()), Ok(shape));
            let spec = shape.spec("job", 3000, "claim", 10);
            assert_eq!(spec["procsPerReplica"], json!(shape.procs));
            assert_eq!(spec.get("elastic").is_none(), shape.is_fixed(), "{spec}");
            let dt = distributed_training("job", "ns", spec);
            let config = dt.spec.trainer.clone().expect("a trainer config");
            assert_eq!(config.validate(), Vec::new());
        }
        assert!(Shape::parse("4x4").is_err());
        assert_eq!(
            Shape::parse("3x1").unwrap().name(),
            "3 pods x 1 rank, elastic (min 2)"
        );
        assert_eq!(Shape::parse("1x2").unwrap().name(), "1 pod x 2 ranks");
    }
}
