//! The trainer's failure kinds and the exit code each maps to (see `ferrotrain_api::exit`).

use ferrotrain_api::exit;

/// Why a rank stopped. The variant decides the exit code, and so whether the operator or
/// the launcher restarts the gang.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration is invalid (permanent, exit 2).
    #[error("{0}")]
    Config(String),
    /// The data is missing, empty or unusable (permanent, exit 3).
    #[error("{0}")]
    Data(String),
    /// The checkpoint does not fit this configuration (permanent, exit 4).
    #[error("{0}")]
    IncompatibleCheckpoint(String),
    /// A peer died or hung, the rendezvous failed, ... (retryable).
    #[error("{0}")]
    Distributed(String),
    /// A libtorch call failed (retryable); the source is kept for the error chain.
    #[error("libtorch: {0}")]
    Torch(#[source] tch::TchError),
    /// An I/O call failed (retryable); the source is kept for the error chain.
    #[error("I/O: {0}")]
    Io(#[source] std::io::Error),
    /// Anything else (retryable).
    #[error("{0}")]
    Other(String),
}

impl TrainError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            TrainError::Config(_) => exit::INVALID_CONFIG,
            TrainError::Data(_) => exit::INVALID_DATA,
            TrainError::IncompatibleCheckpoint(_) => exit::INCOMPATIBLE_CHECKPOINT,
            TrainError::Distributed(_)
            | TrainError::Torch(_)
            | TrainError::Io(_)
            | TrainError::Other(_) => exit::RETRYABLE,
        }
    }
}

impl From<tch::TchError> for TrainError {
    fn from(e: tch::TchError) -> Self {
        TrainError::Torch(e)
    }
}

impl From<std::io::Error> for TrainError {
    fn from(e: std::io::Error) -> Self {
        TrainError::Io(e)
    }
}

impl From<ferrotrain_api::ConfigError> for TrainError {
    fn from(e: ferrotrain_api::ConfigError) -> Self {
        TrainError::Config(e.to_string())
    }
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Writes the one-line reason Kubernetes shows as the container's termination message.
/// Best effort: a missing or read-only /dev/termination-log is not an error.
pub fn write_termination_message(message: &str) {
    let path = std::env::var(ferrotrain_api::env::FERROTRAIN_TERMINATION_LOG)
        .unwrap_or_else(|_| ferrotrain_api::env::TERMINATION_LOG.to_string());
    let mut line: String = message.replace('\n', " ");
    // Kubernetes keeps at most 4096 bytes of the termination message.
    if line.len() > 4000 {
        let mut cut = 4000;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    let _ = std::fs::write(path, line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn wrapped_errors_keep_their_source_and_exit_class() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = TrainError::from(io);
        assert_eq!(e.to_string(), "I/O: gone");
        assert_eq!(e.exit_code(), exit::RETRYABLE);
        let source = e.source().expect("the io::Error is the source");
        assert_eq!(source.to_string(), "gone");

        let t = tch::Tensor::from_slice(&[1.0f32]).f_view([2]).unwrap_err();
        let e = TrainError::from(t);
        assert!(e.to_string().starts_with("libtorch: "), "{e}");
        assert!(e.source().is_some());
        assert_eq!(e.exit_code(), exit::RETRYABLE);
    }
}
