//! A pod agent's connection to node 0's rendezvous store, and which store that is: a store
//! that node 0's replacement serves at the same address is not the one the agent joined, and
//! the agent must join it anew (rejoin.rs).

use std::time::{Duration, Instant};

use crate::auth::Auth;
use crate::error::AgentError;
use crate::keys::STORE_ID;
use crate::rejoin;
use crate::store::{self, StoreClient};

/// How long a fresh connection to a store that answers may take.
const FRESH_WITHIN: Duration = Duration::from_secs(10);

/// The agent's way to node 0's store.
pub struct Link {
    /// Node 0's address: its pod's DNS name (127.0.0.1 on node 0 itself).
    pub host: String,
    pub port: u16,
    pub auth: Auth,
    pub client: StoreClient,
    /// The identity of the store this agent joined (node 0's pod UID), once it has.
    joined: Option<Vec<u8>>,
}

impl Link {
    /// Connects to the store at `host:port`, retrying until `deadline`.
    pub fn connect(host: &str, port: u16, auth: &Auth, deadline: Instant) -> store::Result<Self> {
        Ok(Link {
            host: host.to_string(),
            port,
            auth: auth.clone(),
            client: StoreClient::connect(host, port, auth, deadline)?,
            joined: None,
        })
    }

    /// A fresh connection (the store drops one idle for 10 minutes, and a training round is
    /// usually longer) to the store this agent joined.
    pub fn fresh(&mut self) -> Result<(), AgentError> {
        self.fresh_within(FRESH_WITHIN)
    }

    /// [`Self::fresh`], trying for at most `within`: a store that does not answer soon went
    /// with node 0 (a connection to its vanished address would hang). One that node 0's
    /// replacement serves is [`AgentError::StoreReplaced`].
    pub fn fresh_within(&mut self, within: Duration) -> Result<(), AgentError> {
        let deadline = Instant::now() + within;
        let mut client = StoreClient::connect(&self.host, self.port, &self.auth, deadline)?;
        if let Some(joined) = &self.joined
            && client.try_get(STORE_ID, Duration::ZERO)?.as_ref() != Some(joined)
        {
            return Err(AgentError::StoreReplaced);
        }
        self.client = client;
        Ok(())
    }

    /// Remembers the store this agent now takes part in.
    pub fn joined_this_store(&mut self) -> store::Result<()> {
        self.joined = self.client.try_get(STORE_ID, Duration::ZERO)?;
        Ok(())
    }

    /// Waits until `deadline` for a store at node 0's address: any store, or when `lost`
    /// (node 0 said it leaves) one other than the store this agent joined.
    pub fn reach_replacement(&mut self, lost: bool, deadline: Instant) -> Result<(), AgentError> {
        let lost = self.joined.take().filter(|_| lost);
        self.client = rejoin::reach(&self.host, self.port, &self.auth, lost.as_deref(), deadline)?;
        Ok(())
    }
}
