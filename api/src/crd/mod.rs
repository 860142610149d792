//! The `DistributedTraining` custom resource (group `ferrotrain.dev`, version `v1alpha1`,
//! short name `dt`): one object = one data-parallel training job run as a gang of pods.
//!
//! The spec embeds [`TrainerConfig`], the very type the trainer parses, so the operator and the
//! trainer cannot drift. Every field carries a doc comment because the generated schema's
//! descriptions are what `kubectl explain dt.spec...` prints. Validation lives in the schema
//! (ranges, enums, CEL rules) so a bad object is refused at `kubectl apply`, naming the field.

pub mod condition;
mod defaults;
pub mod labels;
mod network;
mod pod_template;
mod restart;
mod scheduling;
mod schema;
mod spec;
mod status;
mod storage;

pub use network::{NetworkPolicySpec, PortRange};
pub use pod_template::PodTemplateOverrides;
pub use restart::{ElasticSpec, RestartPolicy};
pub use scheduling::{GangScheduler, SchedulingSpec};
pub use schema::{custom_resource_definition, custom_resource_definition_yaml};
pub use spec::{
    DistributedTraining, DistributedTrainingSpec, GROUP, MAX_NAME_LENGTH, PullPolicy, PyTorchSpec,
    VERSION,
};
pub use status::{
    Departure, DistributedTrainingStatus, FailureInfo, Phase, Placement, TrainingProgress,
};
pub use storage::{CheckpointSpec, DataSpec, STORE_SECRET_KEYS, STORE_SECRET_SESSION_KEY};
