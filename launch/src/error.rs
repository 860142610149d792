//! The launcher's failure kinds and, in one place, the exit code each maps to (the trainer's
//! `TrainError::exit_code` is the model): a launcher that cannot describe a valid gang exits
//! 2 (permanent: no restart fixes its flags); anything else it meets is retryable.
//!
//! Each error keeps what caused it as its `source()`: a store error its I/O error or
//! handshake failure, a malformed store value its JSON error.

use ferrotrain_api::{env, exit};

use crate::auth::TokenError;
use crate::store::StoreError;

/// Why the launcher could not run its ranks. The ranks' own failures are not errors of the
/// launcher: `run` returns their exit code.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The flags or the environment describe no valid gang (permanent, exit 2).
    #[error(
        "invalid gang: --nnodes {nnodes} --nproc-per-node {nproc_per_node} --node-rank {node_rank}"
    )]
    InvalidGang {
        nnodes: usize,
        nproc_per_node: usize,
        node_rank: usize,
    },
    /// `--master-port 0` (pick a free port) only works when every rank is on this node.
    #[error("--master-port 0 needs a single node")]
    EphemeralPortNeedsOneNode,
    /// Several nodes must share a rendezvous token (permanent, exit 2).
    #[error(
        "{} (or {}) must be set (the same on every node) when --nnodes > 1",
        env::FERROTRAIN_RDZV_TOKEN,
        env::FERROTRAIN_RDZV_TOKEN_FILE
    )]
    MissingToken,
    /// FERROTRAIN_RDZV_TOKEN_FILE names a file that cannot be read (permanent, exit 2).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The pod's agent could not reach or serve the rendezvous store (retryable).
    #[error("in-place restarts: {0}")]
    Store(#[from] StoreError),
    /// The launcher's own I/O failed (retryable).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl LaunchError {
    /// The launcher's exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::InvalidGang { .. }
            | LaunchError::EphemeralPortNeedsOneNode
            | LaunchError::MissingToken
            | LaunchError::Token(_) => exit::INVALID_CONFIG,
            LaunchError::Io { .. } | LaunchError::Store(_) => exit::RETRYABLE,
        }
    }

    /// `Io` with `what` the launcher was doing, for `map_err`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }
}

/// Why a pod's agent left its rounds without a verdict that says so: the store, what it
/// held, or the wait for other nodes failed. Every kind is retryable (the pod fails, and the
/// operator replaces it); the agent's termination message says which.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A value another agent wrote does not parse.
    #[error("agent: malformed {what} in the store: {source}")]
    Malformed {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The store answering at node 0's address is not the one this agent joined.
    #[error("node 0's store was replaced (node 0's pod was lost)")]
    StoreReplaced,
    /// Node 0 waited the rendezvous timeout without enough nodes.
    #[error(
        "agent: only {arrived} of {nnodes} nodes joined round {round} within {seconds} s (at least {min_nodes} needed)"
    )]
    TooFewNodes {
        round: u64,
        arrived: usize,
        nnodes: usize,
        min_nodes: usize,
        seconds: u64,
    },
    /// Waiting for node 0's replacement, only the store of the node 0 that was lost answered
    /// at its address (its DNS name still gave the old pod).
    #[error("only the lost node 0's store answered")]
    LostStoreAnswered,
    /// A survivor waited the rendezvous timeout for node 0's replacement.
    #[error(
        "node 0's replacement did not serve the rendezvous store at {server} within the rendezvous timeout: {last}"
    )]
    NoReplacement {
        server: String,
        #[source]
        last: Box<AgentError>,
    },
    /// The agent was signalled while it waited (for a round, for node 0).
    #[error("signalled while waiting for {what}")]
    Signalled { what: &'static str },
    /// The agent could not start its ranks.
    #[error("cannot start the ranks: {0}")]
    Spawn(#[source] std::io::Error),
}

impl AgentError {
    /// The pod's exit code when this error ends its agent.
    pub fn exit_code(&self) -> i32 {
        exit::RETRYABLE
    }

    /// `Malformed` for `what`, for `map_err`.
    pub fn malformed(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| AgentError::Malformed { what, source }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn launcher_errors_keep_their_source_and_map_to_one_exit_code_each() {
        let err = LaunchError::io("cannot create /tmp/x")(std::io::Error::other("disk full"));
        assert_eq!(err.to_string(), "cannot create /tmp/x: disk full");
        assert_eq!(err.source().unwrap().to_string(), "disk full");
        assert_eq!(err.exit_code(), exit::RETRYABLE);
        let token = LaunchError::from(TokenError {
            path: "/var/run/token".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(token.exit_code(), exit::INVALID_CONFIG);
        assert!(token.to_string().contains("/var/run/token"), "{token}");
        assert!(token.source().is_some(), "the io::Error is kept");
    }

    #[test]
    fn an_agent_error_keeps_the_malformed_values_cause() {
        let json = serde_json::from_slice::<u32>(b"{").unwrap_err();
        let err = AgentError::malformed("verdict")(json);
        assert!(
            err.to_string().starts_with("agent: malformed verdict"),
            "{err}"
        );
        assert!(err.source().is_some());
        assert_eq!(err.exit_code(), exit::RETRYABLE);
    }
}
