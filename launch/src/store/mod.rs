//! The rendezvous key-value store (node 0's launcher hosts it, or rank 0) and its client.
//!
//! Every connection starts with the token handshake (`auth`); after it, the client sends
//! length-prefixed request frames (u32 LE length, at most [`MAX_FRAME`] bytes) and reads one
//! response frame per request:
//!
//! ```text
//! SET  = 1 | key len (u32) | key | value        -> 0                          or 2 | limit
//! GET  = 2 | timeout ms (u64) | key              -> 0 | value    or 1 (timed out)
//! ADD  = 3 | delta (i64) | key                   -> 0 | new value (i64)    or 2 | limit
//! WILL = 4 | key len (u32) | key | value        -> 0                          or 2 | limit
//! ```
//!
//! Whoever writes, the store holds at most [`MAX_KEYS`] keys of at most [`MAX_KEY_BYTES`]
//! bytes and [`MAX_STORED_BYTES`] bytes of keys and values (`values`): a write past one is
//! answered 2 and the limit in words, which the client returns as [`StoreError::Refused`].
//!
//! A WILL is this connection's last word: when the connection ends, for whatever reason (its
//! process exits or is killed, its host is gone), the server sets `key` to `value` unless the
//! key is set by then; an empty key takes the will back. An agent's will is its report of a
//! round it did not live to report (docs/in-place-restarts.md, "Wills"): node 0 knows at once that the
//! agent is gone, instead of waiting for its report. A connection with a will is kept while
//! it idles; TCP keepalive ends it when its peer vanishes.
//!
//! The server spends one thread per connection, every read and write bounded by a timeout,
//! and a cap on concurrent connections; anything malformed drops that connection only.
//! `protocol` parses and encodes the frames (pure), `server` serves them, `client` asks.

mod client;
mod error;
mod protocol;
mod server;
mod values;

pub use client::StoreClient;
pub use error::{ConnectError, Result, StoreError};
pub use protocol::{MAX_FRAME, Request, read_frame, write_frame};
pub use server::{StoreServer, StoreStats};
pub use values::{MAX_KEY_BYTES, MAX_KEYS, MAX_STORED_BYTES};

#[cfg(test)]
mod tests;
