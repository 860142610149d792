//! The rendezvous key-value store (node 0's launcher hosts it, or rank 0) and its client.
//!
//! Every connection starts with the token handshake (`auth`); after it, the client sends
//! length-prefixed request frames (u32 LE length, at most [`MAX_FRAME`] bytes) and reads one
//! response frame per request:
//!
//! ```text
//! SET  = 1 | key len (u32) | key | value        -> 0
//! GET  = 2 | timeout ms (u64) | key              -> 0 | value    or 1 (timed out)
//! ADD  = 3 | delta (i64) | key                   -> 0 | new value (i64)
//! WILL = 4 | key len (u32) | key | value        -> 0
//! ```
//!
//! A WILL is this connection's last word: when the connection ends, for whatever reason (its
//! process exits or is killed, its host is gone), the server sets `key` to `value` unless the
//! key is set by then; an empty key takes the will back. An agent's will is its report of a
//! round it did not live to report (docs/distributed.md): node 0 knows at once that the
//! agent is gone, instead of waiting for its report. A connection with a will is kept while
//! it idles; TCP keepalive ends it when its peer vanishes.
//!
//! The server spends one thread per connection, every read and write bounded by a timeout,
//! and a cap on concurrent connections; anything malformed drops that connection only.
//! `protocol` parses and encodes the frames (pure), `server` serves them, `client` asks.

mod client;
mod protocol;
mod server;

use std::net::SocketAddr;

use crate::auth::HandshakeError;

pub use client::StoreClient;
pub use protocol::MAX_FRAME;
pub use server::{StoreServer, StoreStats};

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

#[cfg(test)]
mod tests;
