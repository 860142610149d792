//! The rendezvous: rank 0's key-value store (or node 0's launcher's), every rank's
//! connection to it, and the ring's addresses published and wired through it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferrotrain_api::config::DistributedConfig;
use ferrotrain_launch::auth::Auth;
use ferrotrain_launch::keys;
use ferrotrain_launch::listen::bind_until;
use ferrotrain_launch::store::{StoreClient, StoreServer};

use super::rank::RankEnv;
use super::ring::Ring;
use crate::error::{Result, TrainError};

/// A rank's view of the rendezvous: its store connection and, on rank 0, the store itself.
pub struct Rendezvous {
    pub env: RankEnv,
    pub client: StoreClient,
    pub server: Option<StoreServer>,
    pub auth: Auth,
    /// When the rendezvous timeout runs out.
    pub deadline: Instant,
}

impl Rendezvous {
    /// Rank 0 starts the store (unless node 0's launcher hosts it); every rank connects to
    /// it (retrying until the rendezvous timeout). In an in-place round the ranks' keys live
    /// under `round/<r>/` and their ring connections prove the round.
    pub fn meet(env: &RankEnv, config: &DistributedConfig) -> Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(config.rendezvous_timeout_seconds);
        let store_auth = Auth::new(&env.token, env.attempt);
        let auth = store_auth.for_round(env.round);
        let server = if env.rank == 0 && !env.store_hosted {
            let listener = bind_until(
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), env.master_port),
                deadline,
            )?;
            let handshake = Duration::from_secs(config.rendezvous_timeout_seconds.min(10));
            Some(StoreServer::start(listener, store_auth.clone(), handshake)?)
        } else {
            None
        };
        // Rank 0 talks to its own store over loopback: it need not wait for its DNS name.
        let host = if env.rank == 0 {
            "127.0.0.1"
        } else {
            env.master_addr.as_str()
        };
        let client = StoreClient::connect(host, env.master_port, &store_auth, deadline)?;
        let client = if env.store_hosted {
            client.with_prefix(keys::round_prefix(env.round))
        } else {
            client
        };
        Ok(Rendezvous {
            env: env.clone(),
            client,
            server,
            auth,
            deadline,
        })
    }

    pub(super) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Publishes this rank's ring address, connects to its neighbours and waits until every
    /// rank has.
    pub fn ring(&mut self, config: &DistributedConfig) -> Result<Ring> {
        let (rank, world) = (self.env.rank, self.env.world_size);
        let listener = super::ports::listen(self.env.port_range)?;
        let port = listener.local_addr()?.port();
        // Others reach this rank at the address it reaches rank 0 from; they reach rank 0
        // where they reached its store.
        let host = self.client.local_ip()?;
        self.client.set(
            &keys::ring(rank),
            SocketAddr::new(host, port).to_string().as_bytes(),
        )?;
        let next = (rank + 1) % world;
        let next_addr: SocketAddr = if next == 0 {
            let port = self.client.get(&keys::ring(0), self.left())?;
            let port: SocketAddr = parse_addr(&port)?;
            SocketAddr::new(self.client.peer_ip()?, port.port())
        } else {
            parse_addr(&self.client.get(&keys::ring(next), self.left())?)?
        };
        let timeout = Duration::from_secs(config.collective_timeout_seconds);
        let mut ring = Ring::establish(
            rank,
            world,
            listener,
            next_addr,
            &self.auth,
            self.deadline,
            timeout,
        )?;
        // Every link is up once a value has gone all the way round.
        ring.set_timeout(self.left().max(Duration::from_secs(1)));
        ring.barrier()?;
        ring.set_timeout(timeout);
        tracing::debug!("rank {rank}: ring of {world} ranks established (next {next_addr})");
        Ok(ring)
    }
}

fn parse_addr(bytes: &[u8]) -> Result<SocketAddr> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TrainError::Distributed("rendezvous: malformed ring address".into()))
}
