//! Rendezvous and collectives between ranks.
//!
//! `init` reads the rank environment, meets the other ranks through rank 0's key-value store
//! and returns the collective backend: a no-op for one rank, the TCP ring on CPU, NCCL on GPU.
//! See docs/rendezvous.md for the protocol, docs/distributed.md for the ring algorithm and the timeouts.
//!
//! Files: `rank` (the env contract), `collective` (the `Collective` trait every backend
//! implements, the single rank's, and host-value helpers), `rendezvous` (rank 0's store and
//! the ring's wiring), `ring` (the TCP ring algorithm) and `ring_collective` (the ring as a
//! `Collective`), `nccl`/`nccl_lib` (the GPU backend), `grads` (the gradient exchange in
//! buckets during backward), `ports` (listeners inside the NetworkPolicy's port range),
//! `strict` (the device-strict twin for tests), `bench`. The rendezvous store, its handshake
//! and the count of refused connections are `ferrotrain_launch`'s `store`, `auth` and
//! `refused`.

pub mod bench;
mod collective;
pub mod grads;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nccl_lib;
pub mod ports;
mod rank;
mod rendezvous;
pub mod ring;
mod ring_accept;
mod ring_collective;
pub mod strict;
pub mod watchdog;

use ferrotrain_api::config::{Backend, DistributedConfig};
use tch::Device;

use crate::error::{Result, TrainError};
pub use collective::{Collective, Single, all_reduce_host, broadcast_host};
pub(crate) use collective::{
    all_gather_u64s, broadcast_bytes, broadcast_u64s, broadcast_u64s_from,
};
pub use grads::{GradSync, broadcast_buffers};
pub use rank::RankEnv;
pub use rendezvous::Rendezvous;
pub use ring_collective::RingCollective;

/// `FERROTRAIN_GANG_OF_ONE=1`: a single rank on a GPU trains through a real NCCL
/// communicator of one, as a gang's ranks do (gradient buckets during backward, the
/// per-collective waits, the GPU-timed exchange), so a machine with one GPU checks that path
/// (bench/gpu-validate.sh). Results are a single rank's; it only costs the exchange.
pub const GANG_OF_ONE_ENV: &str = "FERROTRAIN_GANG_OF_ONE";

/// Meets the other ranks and returns the backend for `device`.
pub fn init(
    env: &RankEnv,
    config: &DistributedConfig,
    device: Device,
) -> Result<Box<dyn Collective>> {
    let gang_of_one = std::env::var(GANG_OF_ONE_ENV).is_ok_and(|v| v.trim() == "1");
    init_with(env, config, device, gang_of_one)
}

/// `init`; with `nccl_alone`, one rank whose backend is NCCL gets a communicator of one
/// instead of the no-op backend.
pub(crate) fn init_with(
    env: &RankEnv,
    config: &DistributedConfig,
    device: Device,
    nccl_alone: bool,
) -> Result<Box<dyn Collective>> {
    let use_nccl = match config.backend {
        Backend::Ring => false,
        Backend::Nccl => true,
        Backend::Auto => device.is_cuda(),
    };
    if use_nccl && !cfg!(feature = "cuda") {
        return Err(TrainError::Config(
            "distributed.backend nccl: this ferrotrain was built without the `cuda` feature \
             (rebuild with `--features cuda`, or use backend `ring`)"
                .into(),
        ));
    }
    if env.world_size == 1 && !(nccl_alone && use_nccl) {
        return Ok(Box::new(Single { device }));
    }
    // A round abandoned while this rank meets its gang ends the process (crate::ending).
    let _meeting = crate::ending::Meeting::start();
    let mut meeting = Rendezvous::meet(env, config)?;
    if use_nccl {
        #[cfg(feature = "cuda")]
        {
            let comm = nccl::Nccl::init(env, config, device, &mut meeting)?;
            return Ok(Box::new(comm));
        }
    }
    let ring = meeting.ring(config)?;
    let ring = Box::new(RingCollective::new(ring).with_store(meeting.server));
    if strict::requested() {
        // Tests only: every tensor must come from the collective's own buffers, as NCCL
        // needs them on its GPU (see dist/strict.rs).
        return Ok(Box::new(strict::Strict::new(ring, Device::Cpu)));
    }
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_of_one_is_nccls_alone_a_cpu_rank_stays_single_and_exchanges_nothing() {
        let env = RankEnv::from_lookup(|_| None).unwrap();
        let config: DistributedConfig = serde_json::from_str("{}").unwrap();
        let comm = init_with(&env, &config, Device::Cpu, true).unwrap();
        assert_eq!(comm.world_size(), 1);
        assert!(!comm.exchanges(), "one CPU rank trains without a GradSync");
    }

    #[test]
    fn nccl_without_cuda_feature_is_a_clear_error() {
        if cfg!(feature = "cuda") {
            return;
        }
        let env = RankEnv::from_lookup(|_| None).unwrap();
        let config = DistributedConfig {
            backend: Backend::Nccl,
            ..serde_json::from_str("{}").unwrap()
        };
        let err = init(&env, &config, Device::Cpu).err().unwrap();
        assert!(
            err.to_string().contains("built without the `cuda` feature"),
            "{err}"
        );
    }
}
