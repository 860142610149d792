//! One writer at a time: `fence.json` names the writer that owns a job directory, and a
//! writer of an older attempt of the same job is refused before it claims the directory, and
//! before each commit and each retention while it runs.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use ferrotrain_api::checksummed;
use serde::{Deserialize, Serialize};

use super::io::{io_err, sync_dir, write_synced};
use super::layout::TEMP_PREFIX;
use crate::distributed::RankEnv;
use crate::error::{Reason, Result, TrainError};
use crate::rfc3339::{self, Resolution};

/// The fence: which writer owns the job directory (see [`WriterId`]).
pub const FENCE_FILE: &str = "fence.json";

/// Who writes a job directory's checkpoints. Writers are ordered by attempt within one
/// incarnation of the job; a writer of another incarnation (the job object was recreated, or
/// a new `ferrotrain launch`) takes over, since nothing orders it against the old one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WriterId {
    /// The gang's attempt (FERROTRAIN_ATTEMPT): grows with every restart of the job.
    pub attempt: u64,
    /// A digest of the job's rendezvous token: the operator's Secret lives as long as the
    /// job object, `ferrotrain launch` draws one per invocation. Never the token itself.
    pub incarnation: String,
}

impl WriterId {
    /// The writer identity of a rank from its env contract.
    pub fn of_rank(rank: &RankEnv) -> WriterId {
        WriterId::new(rank.attempt, &rank.token)
    }

    pub fn new(attempt: u64, rendezvous_token: &str) -> WriterId {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"ferrotrain checkpoint fence v1\0")
            .chain_update(rendezvous_token.as_bytes())
            .finalize();
        let incarnation = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        WriterId {
            attempt,
            incarnation,
        }
    }

    /// A writer of a later attempt of the same incarnation: `self` must stop writing.
    pub(super) fn superseded_by(&self, other: &WriterId) -> bool {
        other.incarnation == self.incarnation && other.attempt > self.attempt
    }
}

/// `fence.json`: the writer plus where it ran, for humans reading the directory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fence {
    #[serde(flatten)]
    writer: WriterId,
    #[serde(default)]
    host: String,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    time: String,
}

/// `.tmp-step-XXXXXXXX-a<attempt>-<pid>` (`-<pid>` alone for an unfenced store): the
/// attempt tells a human whose save it was.
pub(super) fn temp_dir_name(step: u64, writer: Option<&WriterId>) -> String {
    let pid = std::process::id();
    match writer {
        Some(w) => format!("{TEMP_PREFIX}{step:08}-a{}-{pid}", w.attempt),
        None => format!("{TEMP_PREFIX}{step:08}-{pid}"),
    }
}

/// The fence, checked against its CRC-32C: a damaged one names no writer anyone can trust, so
/// it is refused (fail closed) with the way out, rather than taken over or obeyed.
fn read_fence(root: &Path) -> Result<Option<Fence>> {
    let path = root.join(FENCE_FILE);
    match fs::read(&path) {
        Ok(bytes) => checksummed::open(&bytes, checksummed::CRC_FIELD)
            .map(Some)
            .map_err(|why: String| damaged_fence(&path, &why)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("reading", &path, e)),
    }
}

fn damaged_fence(path: &Path, why: &str) -> TrainError {
    TrainError::Other(
        format!(
            "checkpoint: {} is not a valid fence ({why}); no writer can be trusted to own the              directory: once no older rank 0 of this job runs, remove the file and the next              attempt claims it",
            path.display()
        )
        .into(),
    )
}

fn stale_writer_error(root: &Path, ours: &WriterId, fence: &Fence) -> TrainError {
    TrainError::Other(
        format!(
            "checkpoint: attempt {} of this job took over {} (host {}, pid {}, {}); this rank 0 \
         of attempt {} is stale and writes no checkpoint",
            fence.writer.attempt,
            root.display(),
            fence.host,
            fence.pid,
            fence.time,
            ours.attempt
        )
        .into(),
    )
}

/// Writes the fence for `writer` unless a later attempt holds it. The file is replaced
/// atomically (temporary file, fsync, rename, fsync of the directory), then read back: when
/// two writers race, the later attempt rewrites it, the earlier one sees it and gives up.
pub(super) fn claim_fence(root: &Path, writer: &WriterId) -> Result<()> {
    for _ in 0..3 {
        if let Some(fence) = read_fence(root)? {
            if writer.superseded_by(&fence.writer) {
                return Err(stale_writer_error(root, writer, &fence));
            }
            if fence.writer.incarnation != writer.incarnation {
                tracing::info!(
                    attempt = writer.attempt,
                    "taking over checkpoints written by another incarnation of the job"
                );
            }
        }
        let fence = Fence {
            writer: writer.clone(),
            host: hostname(),
            pid: std::process::id(),
            time: rfc3339::format(SystemTime::now(), Resolution::Second),
        };
        let json = checksummed::seal(&fence, checksummed::CRC_FIELD)
            .map_err(|e| TrainError::Other(Reason::caused("checkpoint: encoding the fence", e)))?;
        let temp = root.join(format!(".{FENCE_FILE}.{}", std::process::id()));
        write_synced(&temp, |w| w.write_all(&json))?;
        let path = root.join(FENCE_FILE);
        fs::rename(&temp, &path).map_err(|e| io_err("renaming", &temp, e))?;
        sync_dir(root)?;
        match read_fence(root)? {
            Some(now) if now.writer == *writer => return Ok(()),
            Some(now) if writer.superseded_by(&now.writer) => {
                return Err(stale_writer_error(root, writer, &now));
            }
            // An older writer overwrote ours between its check and its rename: claim again.
            _ => continue,
        }
    }
    Err(TrainError::Other(
        format!(
            "checkpoint: cannot claim {}: other writers keep replacing {FENCE_FILE}",
            root.display()
        )
        .into(),
    ))
}

/// Ok while `writer` holds the fence; the error names the writer that took over.
pub(super) fn still_owner(root: &Path, writer: &WriterId) -> Result<()> {
    match read_fence(root)? {
        Some(fence) if fence.writer == *writer => Ok(()),
        Some(fence) => Err(stale_writer_error(root, writer, &fence)),
        None => Err(TrainError::Other(
            format!(
                "checkpoint: {} vanished from {}; not committing",
                FENCE_FILE,
                root.display()
            )
            .into(),
        )),
    }
}

/// Removes every `.tmp-step-*` directory: the caller now owns the fence, so they belong to
/// crashed saves or to stale writers. Each is renamed first (still under the temporary
/// prefix): a stale writer's later rename of its directory then fails, where a directory
/// being removed under it could have been committed half empty.
pub(super) fn sweep_temporaries(root: &Path, writer: &WriterId) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut swept = Vec::new();
    for (i, entry) in entries.flatten().enumerate() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(TEMP_PREFIX) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let aside = root.join(format!(
            "{TEMP_PREFIX}swept-a{}-{}-{i}",
            writer.attempt,
            std::process::id()
        ));
        tracing::info!(dir = %entry.path().display(), "removing an incomplete checkpoint left by an earlier writer");
        match fs::rename(entry.path(), &aside) {
            Ok(()) => swept.push(aside),
            // Committed or removed by its writer in the meantime.
            Err(e) => {
                tracing::warn!(dir = %entry.path().display(), error = %e, "cannot move an incomplete checkpoint aside")
            }
        }
    }
    for dir in swept {
        if let Err(e) = fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an incomplete checkpoint");
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::checkpoint::fixtures::*;
    use crate::checkpoint::layout::step_dir_name;
    use crate::checkpoint::store::CheckpointStore;
    use crate::lock::lock;

    #[test]
    fn a_stale_writer_cannot_commit_after_a_newer_attempt_fenced_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut old = CheckpointStore::open_writer(root, policy(3, 0), writer(1)).unwrap();
        save_now(&mut old, 100, None);
        // The old rank 0 starts a save (its SIGTERM save, or it runs on behind a partition)...
        let (release, log) = gate(&mut old, 200);
        old.save(&model(1), &optimizer(), state(200, None)).unwrap();
        while !lock(&log).iter().any(|l| l == "started 200") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(temp_dirs(root).len(), 1, "{:?}", names(root));
        assert!(temp_dirs(root)[0].contains("-a1-"), "{:?}", names(root));
        // ...and attempt 2 starts: it takes the fence and moves the old save aside.
        let new = CheckpointStore::open_writer(root, policy(3, 0), writer(2)).unwrap();
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
        release.send(()).unwrap();
        let err = old.wait().unwrap_err().to_string();
        assert!(err.contains("checkpoint"), "{err}");
        assert!(!root.join(step_dir_name(200)).exists());
        // A later save of the stale writer is refused at the fence, and leaves nothing.
        old.save(&model(1), &optimizer(), state(300, None)).unwrap();
        let err = old.wait().unwrap_err().to_string();
        assert!(
            err.contains("attempt 2 of this job took over") && err.contains("stale"),
            "{err}"
        );
        assert!(!root.join(step_dir_name(300)).exists());
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
        assert_eq!(new.latest().unwrap().unwrap().1.step, 100);
        // Nor can a stale rank 0 that starts late open the directory at all.
        let late = CheckpointStore::open_writer(root, policy(3, 0), writer(1));
        let err = late.err().expect("a stale writer is refused").to_string();
        assert!(err.contains("attempt 2 of this job took over"), "{err}");
        assert!(err.contains("attempt 1 is stale"), "{err}");
    }

    #[test]
    fn the_newer_attempts_save_in_flight_is_untouched_by_the_old_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut old = CheckpointStore::open_writer(root, policy(5, 0), writer(4)).unwrap();
        let mut new = CheckpointStore::open_writer(root, policy(5, 0), writer(5)).unwrap();
        let (release, log) = gate(&mut new, 500);
        new.save(&model(2), &optimizer(), state(500, None)).unwrap();
        while !lock(&log).iter().any(|l| l == "started 500") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let in_flight = temp_dirs(root);
        assert_eq!(in_flight.len(), 1);
        assert!(in_flight[0].contains("-a5-"), "{in_flight:?}");
        // The old writer saves the same step: refused, and only its own temp dir goes.
        old.save(&model(1), &optimizer(), state(500, None)).unwrap();
        assert!(old.wait().is_err());
        assert_eq!(temp_dirs(root), in_flight);
        release.send(()).unwrap();
        assert_eq!(new.wait().unwrap().map(|i| i.step), Some(500));
        let loaded = CheckpointStore::load(&root.join(step_dir_name(500))).unwrap();
        assert_same(&model(2), &loaded.model);
    }

    #[test]
    fn the_fence_orders_attempts_of_one_job_and_lets_a_new_job_take_over() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(3)).unwrap());
        let fence: serde_json::Value =
            serde_json::from_slice(&fs::read(root.join(FENCE_FILE)).unwrap()).unwrap();
        assert_eq!(fence["attempt"], 3);
        assert_eq!(fence["incarnation"], writer(3).incarnation.as_str());
        assert_eq!(fence["pid"], std::process::id());
        // Never the token itself.
        assert!(
            !fs::read_to_string(root.join(FENCE_FILE))
                .unwrap()
                .contains("token")
        );
        // The same attempt again (its rank 0 restarted in place), a later one: fine.
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(3)).unwrap());
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(4)).unwrap());
        assert!(CheckpointStore::open_writer(root, policy(1, 0), writer(2)).is_err());
        // A recreated job (another rendezvous token) starts at attempt 0 and takes over; the
        // old job's writer is then stale whatever its attempt.
        let mut recreated =
            CheckpointStore::open_writer(root, policy(1, 0), WriterId::new(0, "new token"))
                .unwrap();
        save_now(&mut recreated, 10, None);
        let mut old = CheckpointStore::new(root, policy(1, 0)).unwrap();
        old.writer = Some(writer(4));
        old.save(&model(1), &optimizer(), state(20, None)).unwrap();
        assert!(old.wait().is_err());
        assert_eq!(recreated.latest().unwrap().unwrap().1.step, 10);
        // Writers of an older trainer's temp dir names are swept too.
        fs::create_dir(root.join(".tmp-step-00000030-4242")).unwrap();
        drop(recreated);
        drop(
            CheckpointStore::open_writer(root, policy(1, 0), WriterId::new(1, "new token"))
                .unwrap(),
        );
        assert!(temp_dirs(root).is_empty(), "{:?}", names(root));
    }

    /// Issue 44: a fence truncated, bit-flipped or zeroed at ten offsets is refused naming
    /// the file, by a new attempt's claim and by the owner's next commit: never obeyed (a
    /// flipped attempt could fence out every later attempt, or let a stale writer in), never
    /// taken over silently. The checkpoints stay as they were.
    #[test]
    fn a_damaged_fence_is_refused_naming_it_never_obeyed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut owner = CheckpointStore::open_writer(root, policy(3, 0), writer(3)).unwrap();
        save_now(&mut owner, 100, None);
        let path = root.join(FENCE_FILE);
        let good = fs::read(&path).unwrap();
        let copies = ferrotrain_fuzz::damage::copies(&good);
        for copy in &copies {
            fs::write(&path, &copy.bytes).unwrap();
            let claim = CheckpointStore::open_writer(root, policy(3, 0), writer(4));
            let err = claim.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(FENCE_FILE), "{copy}: the claim says {err:?}");
            owner
                .save(&model(1), &optimizer(), state(200, None))
                .unwrap();
            let err = owner
                .wait()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(FENCE_FILE), "{copy}: the commit says {err:?}");
            assert_eq!(names(root), ["fence.json", "step-00000100"], "{copy}");
            assert_eq!(fs::read(&path).unwrap(), copy.bytes, "{copy}: rewritten");
        }
        println!("{} damaged fences refused", copies.len());
        // Put back, the owner commits again.
        fs::write(&path, &good).unwrap();
        save_now(&mut owner, 200, None);
    }

    #[test]
    fn a_fence_whose_attempt_changed_is_refused_and_an_unsealed_one_still_obeyed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(3)).unwrap());
        let path = root.join(FENCE_FILE);
        let sealed = fs::read_to_string(&path).unwrap();
        assert!(sealed.contains("\"crc32c\""), "{sealed}");
        // Before the CRC, attempt 9 here fenced out attempts 4 to 9 of the job.
        fs::write(&path, sealed.replace("\"attempt\": 3", "\"attempt\": 9")).unwrap();
        let err = CheckpointStore::open_writer(root, policy(1, 0), writer(4))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("fence.json is not a valid fence") && err.contains("CRC-32C"),
            "{err}"
        );
        // A fence written before the CRC (no crc32c field) is obeyed as it was.
        let old = serde_json::json!({"attempt": 3, "incarnation": writer(3).incarnation});
        fs::write(&path, old.to_string()).unwrap();
        let err = CheckpointStore::open_writer(root, policy(1, 0), writer(2))
            .err()
            .expect("stale")
            .to_string();
        assert!(err.contains("attempt 3 of this job took over"), "{err}");
        drop(CheckpointStore::open_writer(root, policy(1, 0), writer(4)).unwrap());
    }
}
