//! How ranks exchange gradients and find each other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::defaults::{self, impl_default_from_serde};

/// Which collective backend moves gradients between ranks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Backend {
    /// NCCL when the ranks have GPUs, the TCP ring otherwise.
    #[default]
    Auto,
    /// The TCP ring all-reduce (CPU tensors).
    Ring,
    /// NCCL (GPU tensors; needs a build with the `cuda` feature).
    Nccl,
}

/// Gradient exchange and rendezvous.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DistributedConfig {
    /// Collective backend.
    #[serde(default)]
    pub backend: Backend,
    /// Gradients are exchanged in buckets of about this many MiB, each started as soon as
    /// backward has completed its gradients (the first bucket is at most 1 MiB, so the
    /// exchange starts early). Smaller buckets overlap more of the exchange with backward;
    /// larger ones send fewer, bigger messages.
    #[serde(default = "defaults::bucket_mib")]
    #[schemars(range(min = 1, max = 4096))]
    pub bucket_mib: u32,
    /// A collective that does not complete in this many seconds fails the rank with a
    /// retryable exit code (a dead or hung peer never hangs the gang).
    #[serde(default = "defaults::collective_timeout")]
    #[schemars(range(min = 1))]
    pub collective_timeout_seconds: u64,
    /// How long ranks keep trying to reach each other at start-up.
    #[serde(default = "defaults::rendezvous_timeout")]
    #[schemars(range(min = 1))]
    pub rendezvous_timeout_seconds: u64,
    /// Exchange gradients in bfloat16 (NCCL only): half the bytes, slightly less precise.
    #[serde(default)]
    pub bf16_gradients: bool,
}

impl_default_from_serde!(DistributedConfig);
