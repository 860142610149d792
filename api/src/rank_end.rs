//! Why a rank's trainer ended: the typed record it leaves its launcher
//! (`FERROTRAIN_END_FILE`), which the launcher's blame reads (launch/src/blame.rs). The rank
//! that did not answer, the step and the kind of failure travel as data; the message is for
//! people only, and nothing parses it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checksummed;

/// What kind of end it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EndKind {
    /// Killed by a signal from outside (SIGKILL, the OOM killer). The process cannot say so
    /// itself: its launcher writes this kind from the exit status.
    Killed,
    /// Stopped gracefully by SIGTERM or SIGINT (after saving what it could).
    Stopped,
    /// The configuration is invalid (exit 2).
    Config,
    /// The data is missing or unusable (exit 3).
    Data,
    /// The checkpoint to resume from does not fit the configuration (exit 4).
    IncompatibleCheckpoint,
    /// The loss became NaN or infinite.
    Diverged,
    /// A peer did not answer within the collective timeout: [`RankEnd::peer`] names it when
    /// the collective knows which (the TCP ring does; NCCL does not).
    PeerSilent,
    /// A peer's link closed mid-collective (it exited or was killed), or the rendezvous
    /// failed: [`RankEnd::peer`] names the peer when known.
    PeerFailed,
    /// The round ended elsewhere: the launcher told the rank to abandon its collectives.
    Abandoned,
    /// Any other failure (I/O, libtorch, ...).
    Error,
}

impl EndKind {
    /// Whether a rank that ended so only followed another's failure (its collective broke,
    /// it was told to stop): it is not the cause of a round's end.
    pub fn follows_a_peer(self) -> bool {
        matches!(
            self,
            EndKind::PeerSilent | EndKind::PeerFailed | EndKind::Abandoned | EndKind::Stopped
        )
    }
}

/// The record a trainer leaves when it ends with a failure or a signal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankEnd {
    pub kind: EndKind,
    /// The global rank of the peer that did not answer (`PeerSilent`) or whose link closed
    /// (`PeerFailed`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<usize>,
    /// The last step this rank completed, when it had started training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// For people: what happened.
    pub message: String,
}

impl RankEnd {
    /// A record of `kind` with `message`, no peer, no step.
    pub fn new(kind: EndKind, message: impl Into<String>) -> Self {
        RankEnd {
            kind,
            peer: None,
            step: None,
            message: message.into(),
        }
    }

    /// Writes the record to `path` (sealed with its CRC-32C, then renamed into place, so a
    /// reader finds the whole record or none).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let bytes =
            checksummed::seal(self, checksummed::CRC_FIELD).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    /// The record at `path`: none when there is none, or it is damaged (a warning says why
    /// through `Err`).
    pub fn read(path: &Path) -> Result<Option<RankEnd>, String> {
        match std::fs::read(path) {
            Ok(bytes) => checksummed::open(&bytes, checksummed::CRC_FIELD)
                .map(Some)
                .map_err(|why| format!("{}: {why}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_file_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-1.end.json");
        assert_eq!(RankEnd::read(&path), Ok(None), "no file, no record");
        let end = RankEnd {
            kind: EndKind::PeerSilent,
            peer: Some(7),
            step: Some(312),
            message: "rank 7 (10.0.0.7:41000) did not answer within 30 s".into(),
        };
        end.write(&path).unwrap();
        assert_eq!(RankEnd::read(&path), Ok(Some(end.clone())));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"kind\": \"peerSilent\""), "{text}");
        std::fs::write(&path, text.replace("312", "313")).unwrap();
        let refused = RankEnd::read(&path).unwrap_err();
        assert!(refused.contains("rank-1.end.json"), "{refused}");
    }

    #[test]
    fn only_the_kinds_of_a_rank_that_followed_a_peer_follow_one() {
        use EndKind::*;
        let followers: Vec<EndKind> = [
            Killed,
            Stopped,
            Config,
            Data,
            IncompatibleCheckpoint,
            Diverged,
            PeerSilent,
            PeerFailed,
            Abandoned,
            Error,
        ]
        .into_iter()
        .filter(|k| k.follows_a_peer())
        .collect();
        assert_eq!(followers, [Stopped, PeerSilent, PeerFailed, Abandoned]);
    }
}
