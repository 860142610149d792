//! Losing node 0 (its pod deleted, evicted or drained) without losing the gang. Node 0's
//! agent hosts the rendezvous store, so its replacement starts an empty one under the same
//! address (the pod's DNS name); the surviving agents wait for it and tell it where they left
//! off, so that the round numbers go on and every agent joins the same next round.
//!
//! ```text
//! agent/store              SET by node 0 at start: its identity (the pod's UID); a survivor
//!                          waiting for a replacement ignores the store it lost
//! agent/resume/<node>      SET by every other agent before it joins: the round it would
//!                          start next (0 for a new gang)
//! ```
//!
//! Node 0 waits for every other node's `resume` (up to the elastic wait, else the rendezvous
//! timeout) and starts at the highest: a new gang at round 0, a replacement at the round
//! after the one it left.

use std::time::{Duration, Instant};

use crate::auth::Auth;
use crate::error::AgentError;
use crate::keys::{self, STORE_ID};
use crate::store::{self, StoreClient};

/// How often a survivor tries to reach node 0's replacement.
const RETRY: Duration = Duration::from_millis(200);

/// Tells node 0 the round this node would start next.
pub fn post(client: &mut StoreClient, node: usize, next: u64) -> store::Result<()> {
    client.set(&keys::resume(node), next.to_string().as_bytes())
}

/// Where node 0's first round starts, and who is coming to it.
#[derive(Debug, PartialEq, Eq)]
pub struct First {
    /// The highest round posted, 0 when none did.
    pub round: u64,
    /// The nodes that posted: their agents run and arrive in a moment.
    pub coming: Vec<usize>,
}

/// Node 0: the round to start, once every other node said where it left off or `wait`
/// passed.
pub fn first_round(
    client: &mut StoreClient,
    nnodes: usize,
    wait: Duration,
) -> store::Result<First> {
    let deadline = Instant::now() + wait;
    loop {
        let mut posted = Vec::new();
        let mut coming = Vec::new();
        for node in 1..nnodes {
            if let Some(b) = client.try_get(&keys::resume(node), Duration::ZERO)? {
                posted.push(String::from_utf8_lossy(&b).parse::<u64>().unwrap_or(0));
                coming.push(node);
            }
        }
        if posted.len() + 1 >= nnodes || Instant::now() >= deadline {
            if posted.len() + 1 < nnodes {
                tracing::warn!(
                    "agent: {} of {} other node(s) said where they left off within {:.0} s",
                    posted.len(),
                    nnodes - 1,
                    wait.as_secs_f64()
                );
            }
            let round = posted.into_iter().max().unwrap_or(0);
            return Ok(First { round, coming });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A survivor: a connection to a store at `host:port` other than the one identified by
/// `lost` (any store when `lost` is none), retried until `deadline`.
pub fn reach(
    host: &str,
    port: u16,
    auth: &Auth,
    lost: Option<&[u8]>,
    deadline: Instant,
) -> Result<StoreClient, AgentError> {
    // What the tries found: the lost store answering says more than a try that timed out.
    let mut last: Option<AgentError> = None;
    loop {
        if crate::signals::received() != 0 {
            return Err(AgentError::Signalled { what: "node 0" });
        }
        // Short tries: the pod's DNS name may still give the lost pod's address, where a
        // connection hangs instead of being refused.
        let now = Instant::now();
        let slice = deadline
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), Duration::from_secs(1));
        let found = match StoreClient::connect(host, port, auth, now + slice) {
            Ok(mut client) => match client.try_get(STORE_ID, Duration::ZERO) {
                Ok(id) if lost.is_none() || id.as_deref() != lost => return Ok(client),
                Ok(_) => AgentError::LostStoreAnswered,
                Err(e) => e.into(),
            },
            Err(e) => e.into(),
        };
        if !matches!(last, Some(AgentError::LostStoreAnswered)) {
            last = Some(found);
        }
        if Instant::now() >= deadline {
            return Err(AgentError::NoReplacement {
                server: format!("{host}:{port}"),
                last: Box::new(last.unwrap_or(AgentError::LostStoreAnswered)),
            });
        }
        std::thread::sleep(RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;
    use std::net::TcpListener;

    fn store() -> (StoreServer, u16, Auth) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let auth = Auth::new("tok", 1);
        let srv = StoreServer::start(l, auth.clone(), Duration::from_secs(2)).unwrap();
        (srv, port, auth)
    }

    #[test]
    fn node_0_starts_after_the_highest_round_a_survivor_left() {
        let (_srv, port, auth) = store();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect("127.0.0.1", port, &auth, deadline).unwrap();
        post(&mut c, 1, 4).unwrap();
        post(&mut c, 2, 6).unwrap();
        let first = first_round(&mut c, 3, Duration::from_secs(5)).unwrap();
        assert_eq!(
            first,
            First {
                round: 6,
                coming: vec![1, 2]
            }
        );
    }

    #[test]
    fn node_0_starts_without_the_silent_nodes_after_the_wait() {
        let (_srv, port, auth) = store();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect("127.0.0.1", port, &auth, deadline).unwrap();
        post(&mut c, 2, 3).unwrap();
        let started = Instant::now();
        let first = first_round(&mut c, 3, Duration::from_millis(300)).unwrap();
        assert_eq!((first.round, first.coming), (3, vec![2]));
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(first_round(&mut c, 1, Duration::ZERO).unwrap().round, 0);
    }

    #[test]
    fn a_survivor_ignores_the_store_it_lost_and_gives_up_at_the_deadline() {
        let (_srv, port, auth) = store();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c = StoreClient::connect("127.0.0.1", port, &auth, deadline).unwrap();
        c.set(STORE_ID, b"old-pod").unwrap();
        let short = Instant::now() + Duration::from_millis(500);
        let e = reach("127.0.0.1", port, &auth, Some(b"old-pod"), short)
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("only the lost node 0's store"),
            "{e}"
        );
        c.set(STORE_ID, b"new-pod").unwrap();
        assert!(reach("127.0.0.1", port, &auth, Some(b"old-pod"), deadline).is_ok());
    }
}
