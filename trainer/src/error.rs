//! The trainer's failure kinds and the exit code each maps to (see `ferrotrain_api::exit`).

use ferrotrain_api::{EndKind, RankEnd, exit};

/// An error the caller could have caused.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in words, and the error that caused it when there is one: it is the
/// `source()` of the `TrainError` (and its text follows the words in `Display`).
#[derive(Debug)]
pub struct Reason {
    message: String,
    cause: Option<Cause>,
}

impl Reason {
    /// `message` caused by `cause`, e.g. `Reason::caused("cannot read x.gz", io_error)`.
    pub fn caused(message: impl Into<String>, cause: impl Into<Cause>) -> Self {
        Reason {
            message: message.into(),
            cause: Some(cause.into()),
        }
    }

    /// An error that says it all itself: its text is the reason's.
    pub fn of(cause: impl Into<Cause>) -> Self {
        Reason::caused(String::new(), cause)
    }

    /// The words alone, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(cause) if self.message.is_empty() => write!(f, "{cause}"),
            Some(cause) => write!(f, "{}: {cause}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Reason {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for Reason {
    fn from(message: String) -> Self {
        Reason {
            message,
            cause: None,
        }
    }
}

impl From<&str> for Reason {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

/// Why a rank stopped. The variant decides the exit code, and so whether the operator or
/// the launcher restarts the gang; the error that caused it, if any, is its `source()`.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration is invalid (permanent, exit 2).
    #[error(transparent)]
    Config(Reason),
    /// The data is missing, empty or unusable (permanent, exit 3).
    #[error(transparent)]
    Data(Reason),
    /// The checkpoint does not fit this configuration (permanent, exit 4).
    #[error(transparent)]
    IncompatibleCheckpoint(Reason),
    /// The rendezvous failed, the store went away, ... (retryable).
    #[error(transparent)]
    Distributed(Reason),
    /// A collective broke: a peer did not answer, its link closed, the round was abandoned
    /// (retryable). Which peer, and how, as data for the launcher's blame.
    #[error(transparent)]
    Collective(CollectiveFault),
    /// The loss became NaN or infinite (retryable: the next round starts from the last step
    /// that was fine).
    #[error(transparent)]
    Diverged(Reason),
    /// A libtorch call failed (retryable); the source is kept for the error chain.
    #[error("libtorch: {0}")]
    Torch(#[source] tch::TchError),
    /// An I/O call failed (retryable); the source is kept for the error chain.
    #[error("I/O: {0}")]
    Io(#[source] std::io::Error),
    /// Anything else (retryable).
    #[error(transparent)]
    Other(Reason),
}

impl TrainError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            TrainError::Config(_) => exit::INVALID_CONFIG,
            TrainError::Data(_) => exit::INVALID_DATA,
            TrainError::IncompatibleCheckpoint(_) => exit::INCOMPATIBLE_CHECKPOINT,
            TrainError::Distributed(_)
            | TrainError::Collective(_)
            | TrainError::Diverged(_)
            | TrainError::Torch(_)
            | TrainError::Io(_)
            | TrainError::Other(_) => exit::RETRYABLE,
        }
    }
}

impl TrainError {
    /// The disk refused a write somewhere in this error's chain: full (ENOSPC), over quota
    /// (EDQUOT), read-only (EROFS) or failing (EIO). What space or an administrator can fix,
    /// unlike a fence that names a later writer or a libtorch error.
    pub fn disk_refused(&self) -> bool {
        if matches!(self, TrainError::Torch(_)) {
            return false;
        }
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = next {
            if e.downcast_ref::<std::io::Error>().is_some_and(refused) {
                return true;
            }
            next = e.source();
        }
        false
    }
}

/// `e` is a disk refusing a write (see [`TrainError::disk_refused`]).
pub fn refused(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO)
    ) || matches!(
        e.kind(),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::ReadOnlyFilesystem
    )
}

impl TrainError {
    /// The record this rank leaves its launcher when it ends with this error, having
    /// completed `step` (none: it had not started training).
    pub fn rank_end(&self, step: Option<u64>) -> RankEnd {
        let (kind, peer) = match self {
            TrainError::Config(_) => (EndKind::Config, None),
            TrainError::Data(_) => (EndKind::Data, None),
            TrainError::IncompatibleCheckpoint(_) => (EndKind::IncompatibleCheckpoint, None),
            TrainError::Distributed(_) => (EndKind::PeerFailed, None),
            TrainError::Collective(f) => (f.kind, f.peer),
            TrainError::Diverged(_) => (EndKind::Diverged, None),
            TrainError::Torch(_) | TrainError::Io(_) | TrainError::Other(_) => {
                (EndKind::Error, None)
            }
        };
        RankEnd {
            kind,
            peer,
            step,
            message: self.to_string(),
        }
    }
}

/// How a collective broke, as its caller and the launcher's blame need it: the kind
/// (`PeerSilent`, `PeerFailed`, `Abandoned`, or `Error` for this rank's own fault), the peer
/// (a global rank) when the collective knows it, and the words for people.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveFault {
    pub kind: EndKind,
    pub peer: Option<usize>,
    pub message: String,
}

impl CollectiveFault {
    /// `peer` did not answer within the collective's timeout.
    pub fn silent(peer: Option<usize>, message: String) -> Self {
        CollectiveFault {
            kind: EndKind::PeerSilent,
            peer,
            message,
        }
    }

    /// `peer`'s link closed or failed.
    pub fn failed(peer: Option<usize>, message: String) -> Self {
        CollectiveFault {
            kind: EndKind::PeerFailed,
            peer,
            message,
        }
    }

    /// The launcher ended the round elsewhere and told this rank to give up waiting.
    pub fn abandoned(message: String) -> Self {
        CollectiveFault {
            kind: EndKind::Abandoned,
            peer: None,
            message,
        }
    }

    /// This rank's own fault in a collective (a bad tensor, a disagreement, a poll error).
    pub fn own(message: String) -> Self {
        CollectiveFault {
            kind: EndKind::Error,
            peer: None,
            message,
        }
    }

    /// The same fault, told again by a later call on the broken collective.
    pub fn again(&self, prefix: &str) -> Self {
        CollectiveFault {
            message: format!("{prefix}: {}", self.message),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for CollectiveFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CollectiveFault {}

impl From<CollectiveFault> for TrainError {
    fn from(f: CollectiveFault) -> Self {
        TrainError::Collective(f)
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

impl From<ferrotrain_launch::store::StoreError> for TrainError {
    fn from(e: ferrotrain_launch::store::StoreError) -> Self {
        TrainError::Distributed(Reason::of(e))
    }
}

impl From<ferrotrain_launch::auth::TokenError> for TrainError {
    fn from(e: ferrotrain_launch::auth::TokenError) -> Self {
        TrainError::Config(Reason::of(e))
    }
}

impl From<ferrotrain_api::ConfigError> for TrainError {
    fn from(e: ferrotrain_api::ConfigError) -> Self {
        TrainError::Config(Reason::of(e))
    }
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

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

        // A reason keeps what caused it as the source, and its text.
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = TrainError::Data(Reason::caused("cannot read train.en", io));
        assert_eq!(e.to_string(), "cannot read train.en: no such file");
        assert_eq!(e.exit_code(), exit::INVALID_DATA);
        assert_eq!(e.source().expect("the cause").to_string(), "no such file");
        let plain = TrainError::Config("distributed.bucketMib: must be at least 1".into());
        assert!(plain.source().is_none());

        let t = tch::Tensor::from_slice(&[1.0f32]).f_view([2]).unwrap_err();
        let e = TrainError::from(t);
        assert!(e.to_string().starts_with("libtorch: "), "{e}");
        assert!(e.source().is_some());
        assert_eq!(e.exit_code(), exit::RETRYABLE);
    }

    #[test]
    fn a_disk_that_refuses_a_write_is_told_apart_anywhere_in_the_chain() {
        let os = std::io::Error::from_raw_os_error;
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EIO] {
            let wrapped = TrainError::Other(Reason::caused("checkpoint: writing x", os(errno)));
            assert!(wrapped.disk_refused(), "{wrapped}");
            assert!(TrainError::Io(os(errno)).disk_refused());
            // Two levels down: a save's error wrapped again by its caller.
            let again = TrainError::Other(Reason::caused("the final save", wrapped));
            assert!(again.disk_refused(), "{again}");
        }
        // An error rebuilt from the kind alone (no errno) still tells a full disk.
        let kind = std::io::Error::new(std::io::ErrorKind::StorageFull, "heal: writing x");
        assert!(TrainError::Io(kind).disk_refused());
        for other in [
            TrainError::Io(os(libc::ENOENT)),
            TrainError::Io(os(libc::EACCES)),
            TrainError::Other("checkpoint: attempt 4 of this job took over".into()),
        ] {
            assert!(!other.disk_refused(), "{other}");
        }
        let torch = tch::Tensor::from_slice(&[1.0f32]).f_view([2]).unwrap_err();
        assert!(!TrainError::from(torch).disk_refused());
    }

    #[test]
    fn each_error_leaves_the_record_of_its_kind_with_the_peer_as_a_number() {
        let silent = TrainError::from(CollectiveFault::silent(
            Some(3),
            "rank 3 (10.0.0.3:40000) did not answer within 2 s during all-reduce".into(),
        ));
        let end = silent.rank_end(Some(41));
        assert_eq!(
            (end.kind, end.peer, end.step),
            (EndKind::PeerSilent, Some(3), Some(41))
        );
        assert!(end.message.contains("did not answer"), "{}", end.message);
        let kinds = [
            (TrainError::Config("x".into()), EndKind::Config),
            (TrainError::Data("x".into()), EndKind::Data),
            (
                TrainError::IncompatibleCheckpoint("x".into()),
                EndKind::IncompatibleCheckpoint,
            ),
            (TrainError::Diverged("x".into()), EndKind::Diverged),
            (TrainError::Distributed("x".into()), EndKind::PeerFailed),
            (
                CollectiveFault::abandoned("x".into()).into(),
                EndKind::Abandoned,
            ),
            (TrainError::Other("x".into()), EndKind::Error),
        ];
        for (error, kind) in kinds {
            let end = error.rank_end(None);
            assert_eq!(
                (end.kind, end.peer, end.step),
                (kind, None, None),
                "{error}"
            );
        }
    }
}
