//! Helpers shared by the end-to-end tests in tests/, one concern per module:
//! - [`namespace`]: a namespace per test ([`TestNamespace`]), deleted however the test ends;
//! - [`jobs`]: the jobs the tests run (the real trainer on the synthetic copy task, small
//!   enough for a laptop's kind cluster) and those that fail on purpose;
//! - [`wait`]: bounded waits that say what they last saw;
//! - [`pods`]: a job's pods, and commands run in them;
//! - [`processes`]: the launcher's and the trainers' processes of a pod, killed or signalled;
//! - [`rank0`]: rank 0's own `/progress` and `/metrics`, through the API server's pod proxy;
//! - [`rounds`]: the rounds of an attempt as the recovery tests see them (rank 0's first step
//!   in each, where its state came from, the steps trained again);
//! - [`partition`]: one pod cut off from the network on the cluster kit while it runs;
//! - [`s3`]: an S3 server in a test's namespace, the checkpoint bucket;
//! - [`network_policy`]: a NetworkPolicy's egress rules, read as a network plugin would;
//! - [`plugin`]: `kubectl ferrotrain` run as a person runs it, plainly or in a terminal;
//! - [`pages`]: the docs pages whose commands run;
//! - [`hollow`]: hollow nodes, a kubelet simulator; [`fleet`]: the fleet bench's parts;
//! - [`chaos`]: the chaos soak: seeded schedules of real faults in every shape, and its checks.
//!
//! The helpers most tests use are also named here (`ferrotrain_e2e::wait_for`, ...).
//!
//! Environment:
//! - `KUBECONFIG`: the cluster, with the operator installed (e2e/kind.sh sets both up).
//! - `FERROTRAIN_E2E_IMAGE`: the trainer image; unset, jobs use the operator's default
//!   (`--trainer-image`, the chart's `trainerImage`).
//! - `FERROTRAIN_E2E_PYTORCH_IMAGE`: the `ferrotrain/pytorch` image of the spec.pytorch jobs
//!   ([`jobs::pytorch_job`]; scripts/e2e.sh builds and loads it).
//! - `FERROTRAIN_E2E_S3_IMAGE`: the S3 server of the checkpoint-bucket tests ([`s3`]); unset,
//!   `ferrotrain/s3-e2e:<S3S_FS_VERSION of docker/versions.env>` (scripts/e2e.sh builds and
//!   loads it).
//! - `FERROTRAIN_E2E_KEEP=1`: keep each test's namespace for a post-mortem.

pub mod chaos;
pub mod fleet;
pub mod hollow;
pub mod jobs;
pub mod namespace;
pub mod network_policy;
pub mod pages;
pub mod partition;
pub mod plugin;
pub mod pods;
pub mod processes;
pub mod rank0;
pub mod rounds;
pub mod s3;
pub mod wait;

pub use jobs::{
    CHECKPOINT_EVERY, at_json_path, config_error_job, copy_job, distributed_training,
    missing_data_job, pytorch_image, pytorch_job, trainer_image,
};
pub use namespace::TestNamespace;
pub use pods::{exec, exec_bytes, exec_in, pod_names, pods_of, volume_at};
pub use processes::{
    kill_launcher_from_host, launcher_pid, launchers_of, signal_local_rank, signal_python_rank,
    signal_trainer, trainers_of, wait_spare,
};
pub use rank0::{rank0_get, rank0_progress, wait_rank0};
pub use wait::{TRAIN_WAIT, WAIT, wait_first_checkpoint, wait_for, wait_phase, wait_status};
