//! What can go wrong with the store: a request, a connection to it, the store itself.

use std::net::SocketAddr;

use crate::auth::HandshakeError;

/// Why a store request, a connection to the store or the store itself failed. Retryable
/// wherever it surfaces (a rank exits with the retryable code; an agent ends its rounds).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection could be made before the deadline; `last` says why the last try failed.
    #[error(
        "rendezvous: could not reach the store at {server} in {attempts} attempts before the rendezvous timeout: {last}"
    )]
    Unreachable {
        server: String,
        attempts: u32,
        #[source]
        last: ConnectError,
    },
    /// A request or its answer broke off.
    #[error("rendezvous store at {server}: {what}: {source} (did rank 0 exit?)")]
    Io {
        server: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A write would pass one of the store's limits (keys, their size, the bytes held).
    #[error("rendezvous store at {server} refused a write: {limit}")]
    Refused { server: String, limit: String },
    /// The store answered something this client did not ask for.
    #[error("rendezvous store at {server}: malformed {what} reply")]
    MalformedReply { server: String, what: &'static str },
    /// A key did not appear in time.
    #[error("rendezvous: `{key}` was not published within {seconds} s (a rank did not join)")]
    NotPublished { key: String, seconds: f64 },
    /// Not every client entered a barrier in time.
    #[error(
        "rendezvous: barrier `{name}` incomplete after {seconds} s: not all {world} ranks arrived"
    )]
    Barrier {
        name: String,
        world: usize,
        seconds: f64,
    },
    /// MASTER_PORT cannot be listened on.
    #[error("rendezvous: cannot listen on {addr} (MASTER_PORT)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The server could not start (its listener or its thread).
    #[error("rendezvous store: cannot start: {0}")]
    Start(#[source] std::io::Error),
}

/// Why one try to connect to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{host} resolved to no address")]
    NoAddress { host: String },
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: HandshakeError,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
