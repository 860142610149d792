//! A rank's state left in its pod for the next round: its parameters and optimizer moments
//! (the optimizer's flat buffers, byte for byte) and where training stood, in the pod's heal
//! directory (`FERROTRAIN_HEAL_DIR`, which the launcher gives its ranks).
//!
//! ```text
//! <heal dir>/state-00001234/state.bin    the buffers, back to back
//! <heal dir>/state-00001234/meta.json    HealState: step, samples, clock, loss scale,
//!                                        config digest, the buffers' kinds and sizes, crc32c;
//!                                        its own CRC-32C in metaCrc32c
//! ```
//!
//! Written to a temporary directory and renamed, so a `state-*` directory is complete; read
//! back only when its meta matches its own CRC-32C, its layout is this replica's and its bytes
//! hash to its crc32c: a half-written or damaged snapshot is skipped, never trained from. Not fsynced:
//! it lives as long as the pod (the next round reads it from the page cache), durability is
//! the checkpoints' job. The ranks of one pod hold the same state at the same step, so one
//! copy per step is written (the first rank to claim it), and older ones are removed.
//!
//! A directory too full for the new snapshot (a memory-backed volume at its size limit)
//! gives up the older ones, which the new one supersedes, and is written to again when that
//! makes room for it: the directory needs room for one snapshot, not two. When it does not
//! fit, the write fails, what it wrote is removed, the older ones stay, and the next round
//! starts from the freshest state left: another rank's, an older one, or the checkpoint.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ferrotrain_api::checksummed::{self, Seal};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Reason, Result, TrainError};
use crate::loss_scale::ScaleState;

const PREFIX: &str = "state-";
const TEMP_PREFIX: &str = ".tmp-state-";
const BYTES_FILE: &str = "state.bin";
const META_FILE: &str = "meta.json";
/// meta.json's own CRC-32C ([`sealed`]; `crc32c` is its buffers').
const META_CRC_FIELD: &str = "metaCrc32c";

/// Where training stood when a snapshot was taken, besides the tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealState {
    /// Optimizer steps taken (the step the next round starts after).
    pub step: u64,
    /// Examples consumed over all ranks (the data position).
    pub samples: u64,
    /// AdamW's own update count (its bias correction).
    pub optimizer_steps: u64,
    /// Training seconds of the job so far (rank 0's clock, which every rank learns).
    pub train_seconds: f64,
    /// `fp16`: the dynamic loss scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<ScaleState>,
    /// The gang's config (every field: a rank with another one would diverge).
    pub config: u64,
    /// Each buffer's kind (libtorch's name) and elements, in order.
    pub layout: Vec<(String, i64)>,
    /// CRC-32C of every buffer's bytes, in order.
    pub crc32c: u32,
}

/// The kind and size of each of `buffers`: a snapshot fits a replica with the same.
pub fn layout_of(buffers: &[Tensor]) -> Vec<(String, i64)> {
    buffers
        .iter()
        .map(|b| (format!("{:?}", b.kind()), b.numel() as i64))
        .collect()
}

/// The bytes of `buffers`, back to back (copied to the host; a GPU buffer included).
fn bytes_of(buffers: &[Tensor]) -> Result<Vec<u8>> {
    let total: usize = buffers
        .iter()
        .map(|b| b.numel() * b.kind().elt_size_in_bytes())
        .sum();
    let mut out = vec![0u8; total];
    let mut at = 0;
    let _guard = tch::no_grad_guard();
    for b in buffers {
        let n = b.numel() * b.kind().elt_size_in_bytes();
        b.f_copy_data_u8(&mut out[at..at + n], b.numel())?;
        at += n;
    }
    Ok(out)
}

/// CRC-32C of `buffers`' bytes: the same on every rank that holds the same state.
pub fn digest(buffers: &[Tensor]) -> Result<u32> {
    Ok(crc32c::crc32c(&bytes_of(buffers)?))
}

fn heal_err(what: &str, path: &Path, e: std::io::Error) -> TrainError {
    TrainError::Io(std::io::Error::new(
        e.kind(),
        format!("heal: {what} {}: {e}", path.display()),
    ))
}

/// The pod's snapshots, by step, newest first.
fn snapshots(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix(PREFIX)?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|s| std::cmp::Reverse(s.0));
    found
}

/// Leaves `state` and `buffers` in `dir` as the snapshot of `state.step`, unless one of that
/// step (or a later one) is there or being written by another rank of the pod. Removes older
/// snapshots. Returns whether this call wrote it.
pub fn write(dir: &Path, state: &HealState, buffers: &[Tensor]) -> Result<bool> {
    fs::create_dir_all(dir).map_err(|e| heal_err("creating", dir, e))?;
    if snapshots(dir)
        .first()
        .is_some_and(|(s, _)| *s >= state.step)
    {
        return Ok(false);
    }
    let temp = dir.join(format!("{TEMP_PREFIX}{:08}", state.step));
    // The claim: the first rank of the pod to create it writes this step.
    match fs::create_dir(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(heal_err("creating", &temp, e)),
    }
    let mut written = write_into(&temp, state, buffers);
    if written.as_ref().is_err_and(full) && older_make_room(dir, state.step, &temp, buffers) {
        remove_older(dir, state.step);
        tracing::info!(
            step = state.step,
            "heal: no room for this step's state; older states removed to make room"
        );
        written = write_into(&temp, state, buffers);
    }
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&temp);
        return Err(e);
    }
    let done = dir.join(format!("{PREFIX}{:08}", state.step));
    fs::rename(&temp, &done).map_err(|e| heal_err("renaming", &temp, e))?;
    remove_older(dir, state.step);
    remove_stale_claims(dir, state.step);
    Ok(true)
}

/// The directory has no room (full, or over its quota).
fn full(e: &TrainError) -> bool {
    use std::io::ErrorKind;
    matches!(e, TrainError::Io(io) if matches!(io.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded))
}

/// Removes the snapshots older than `step`.
fn remove_older(dir: &Path, step: u64) {
    for (s, path) in snapshots(dir) {
        if s < step {
            let _ = fs::remove_dir_all(path);
        }
    }
}

/// Whether removing the snapshots older than `step` from `dir` leaves room for a snapshot of
/// `buffers`, `temp` holding what a write of it that ran out of room wrote.
fn older_make_room(dir: &Path, step: u64, temp: &Path, buffers: &[Tensor]) -> bool {
    const PAGE: u64 = 4096;
    let older: u64 = snapshots(dir)
        .iter()
        .filter(|(s, _)| *s < step)
        .map(|(_, path)| usage(path))
        .sum();
    let bytes: u64 = buffers
        .iter()
        .map(|b| (b.numel() * b.kind().elt_size_in_bytes()) as u64)
        .sum();
    // state.bin in whole pages, and a page for meta.json.
    let needed = bytes.div_ceil(PAGE) * PAGE + PAGE;
    older > 0 && free_bytes(dir) + usage(temp) + older >= needed
}

/// Bytes the files of the directory `dir` take on its disk.
fn usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Bytes free for this process under `dir` (0 when it cannot be told).
fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: a NUL-terminated path and a zeroed statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}

/// Removes what ranks killed mid-write left of snapshots older than `step`.
fn remove_stale_claims(dir: &Path, step: u64) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = name
            .strip_prefix(TEMP_PREFIX)
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| s < step);
        if stale {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn write_into(temp: &Path, state: &HealState, buffers: &[Tensor]) -> Result<()> {
    let bytes = bytes_of(buffers)?;
    let state = HealState {
        crc32c: crc32c::crc32c(&bytes),
        layout: layout_of(buffers),
        ..state.clone()
    };
    let path = temp.join(BYTES_FILE);
    fs::write(&path, &bytes).map_err(|e| heal_err("writing", &path, e))?;
    let meta = checksummed::seal(&state, META_CRC_FIELD).map_err(|e| {
        TrainError::Other(Reason::caused("heal: encoding the snapshot's meta.json", e))
    })?;
    let path = temp.join(META_FILE);
    let mut file = fs::File::create(&path).map_err(|e| heal_err("creating", &path, e))?;
    file.write_all(&meta)
        .map_err(|e| heal_err("writing", &path, e))
}

/// The newest snapshot in `dir` that fits a replica whose buffers have `layout`, trained with
/// config digest `config`: its state (not its bytes). Anything else is skipped with a warning.
pub fn newest(dir: &Path, layout: &[(String, i64)], config: u64) -> Option<(PathBuf, HealState)> {
    for (step, path) in snapshots(dir) {
        match fitting(&path, step, layout, config) {
            Ok(state) => return Some((path, state)),
            Err(why) => tracing::warn!(dir = %path.display(), "heal: skipping a snapshot: {why}"),
        }
    }
    None
}

fn fitting(
    path: &Path,
    step: u64,
    layout: &[(String, i64)],
    config: u64,
) -> std::result::Result<HealState, String> {
    let meta = fs::read(path.join(META_FILE)).map_err(|e| format!("{META_FILE}: {e}"))?;
    match checksummed::verify(&meta, META_CRC_FIELD) {
        Ok(Seal::Intact) => {}
        Ok(Seal::Absent) => return Err(format!("{META_FILE} has no {META_CRC_FIELD}")),
        Err(why) => return Err(format!("{META_FILE} {why}")),
    }
    let state: HealState =
        serde_json::from_slice(&meta).map_err(|e| format!("{META_FILE}: {e}"))?;
    if state.step != step {
        return Err(format!(
            "{META_FILE} says step {}, its name {step}",
            state.step
        ));
    }
    if state.config != config {
        return Err(format!(
            "written with config {:016x}, this rank has {config:016x}",
            state.config
        ));
    }
    if state.layout != layout {
        return Err("its buffers do not fit this model".into());
    }
    let expected: i64 = layout
        .iter()
        .map(|(kind, n)| n * kind_size(kind).unwrap_or(0) as i64)
        .sum();
    let size = fs::metadata(path.join(BYTES_FILE))
        .map_err(|e| format!("{BYTES_FILE}: {e}"))?
        .len();
    if size != expected as u64 {
        return Err(format!(
            "{BYTES_FILE} holds {size} bytes, its layout {expected}"
        ));
    }
    Ok(state)
}

fn kind_size(kind: &str) -> Option<usize> {
    [Kind::Float, Kind::Double, Kind::Half, Kind::BFloat16]
        .into_iter()
        .find(|k| format!("{k:?}") == kind)
        .map(Kind::elt_size_in_bytes)
}

/// Loads the snapshot at `path` (found by [`newest`]) into `buffers`, checking its bytes
/// against its crc32c first: on a mismatch nothing is changed.
pub fn load(path: &Path, state: &HealState, buffers: &[Tensor]) -> Result<()> {
    let file = path.join(BYTES_FILE);
    let mut bytes = Vec::new();
    fs::File::open(&file)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| heal_err("reading", &file, e))?;
    if crc32c::crc32c(&bytes) != state.crc32c {
        return Err(TrainError::Other(
            format!("heal: {} does not match its crc32c", file.display()).into(),
        ));
    }
    let _guard = tch::no_grad_guard();
    let mut at = 0;
    for b in buffers {
        let n = b.numel() * b.kind().elt_size_in_bytes();
        let host = Tensor::f_from_data_size(&bytes[at..at + n], &[b.numel() as i64], b.kind())?;
        b.shallow_clone().f_copy_(&host)?;
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffers(v: f32) -> Vec<Tensor> {
        vec![
            Tensor::from_slice(&[v, v + 1.0, v + 2.0]),
            Tensor::from_slice(&[v * 10.0; 5]),
        ]
    }

    fn state(step: u64) -> HealState {
        HealState {
            step,
            samples: step * 32,
            optimizer_steps: step,
            train_seconds: 1.5,
            loss_scale: Some(ScaleState {
                scale: 1024.0,
                growth_tracker: 7,
            }),
            config: 0xabc,
            layout: Vec::new(),
            crc32c: 0,
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_the_newest_fitting_one_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let layout = layout_of(&buffers(0.0));
        assert!(write(dir.path(), &state(5), &buffers(1.0)).unwrap());
        assert!(
            !write(dir.path(), &state(5), &buffers(9.0)).unwrap(),
            "one copy a step"
        );
        assert!(write(dir.path(), &state(7), &buffers(2.0)).unwrap());
        assert!(
            !write(dir.path(), &state(6), &buffers(3.0)).unwrap(),
            "an older step"
        );
        let (path, found) = newest(dir.path(), &layout, 0xabc).unwrap();
        assert_eq!(
            (found.step, found.samples, found.loss_scale),
            (7, 224, state(7).loss_scale)
        );
        assert_eq!(snapshots(dir.path()).len(), 1, "the older one is removed");
        let into = buffers(0.0);
        load(&path, &found, &into).unwrap();
        assert_eq!(Vec::<f32>::try_from(&into[0]).unwrap(), [2.0, 3.0, 4.0]);
        assert_eq!(digest(&into).unwrap(), digest(&buffers(2.0)).unwrap());
        assert_ne!(digest(&into).unwrap(), digest(&buffers(2.5)).unwrap());
    }

    #[test]
    fn another_config_another_model_or_damaged_bytes_are_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let layout = layout_of(&buffers(0.0));
        write(dir.path(), &state(3), &buffers(1.0)).unwrap();
        assert!(
            newest(dir.path(), &layout, 0xdef).is_none(),
            "another config"
        );
        let other = layout_of(&[Tensor::from_slice(&[1.0f32; 4])]);
        assert!(newest(dir.path(), &other, 0xabc).is_none(), "another model");
        let (path, found) = newest(dir.path(), &layout, 0xabc).unwrap();
        let bin = path.join(BYTES_FILE);
        let mut bytes = fs::read(&bin).unwrap();
        bytes[4] ^= 0xff;
        fs::write(&bin, &bytes).unwrap();
        let into = buffers(0.0);
        let err = load(&path, &found, &into).unwrap_err();
        assert!(err.to_string().contains("crc32c"), "{err}");
        assert_eq!(
            Vec::<f32>::try_from(&into[0]).unwrap(),
            [0.0, 1.0, 2.0],
            "untouched"
        );
        fs::write(&bin, &bytes[..8]).unwrap();
        assert!(
            newest(dir.path(), &layout, 0xabc).is_none(),
            "a truncated one"
        );
        // A half-written one (the temporary directory of a rank killed mid-write) is no
        // snapshot, and claims its step.
        fs::create_dir(dir.path().join(format!("{TEMP_PREFIX}00000009"))).unwrap();
        assert!(newest(dir.path(), &layout, 0xabc).is_none());
        assert!(!write(dir.path(), &state(9), &buffers(1.0)).unwrap());
    }

    /// Buffers of about `kib` KiB.
    fn big(kib: i64, v: f32) -> Vec<Tensor> {
        vec![Tensor::full(
            [kib * 256],
            f64::from(v),
            (Kind::Float, tch::Device::Cpu),
        )]
    }

    /// A memory-backed heal directory (a tmpfs, so root) with room for one state, not two:
    /// the new state takes the old one's place. Before, the old one stayed, every later
    /// write failed for want of room, and each round healed from that ever older state.
    #[test]
    fn a_heal_directory_with_room_for_one_state_takes_the_new_one_in_place_of_the_old() {
        let test = "a_heal_directory_with_room_for_one_state_takes_the_new_one_in_place_of_the_old";
        let Some(volume) = crate::tmpfs::Tmpfs::mount(600 << 10, test) else {
            return;
        };
        let dir = volume.path();
        let layout = layout_of(&big(400, 0.0));
        assert!(write(dir, &state(5), &big(400, 1.0)).unwrap());
        assert!(write(dir, &state(7), &big(400, 2.0)).unwrap());
        let (path, found) = newest(dir, &layout, 0xabc).unwrap();
        assert_eq!(found.step, 7);
        let into = big(400, 0.0);
        load(&path, &found, &into).unwrap();
        assert_eq!(digest(&into).unwrap(), digest(&big(400, 2.0)).unwrap());
        assert_eq!(snapshots(dir).len(), 1);
    }

    /// A heal directory too small for one state: the write fails with the disk's error and
    /// leaves nothing, neither a snapshot nor its half-written temporary directory; a state
    /// left earlier stays (the next round may start from it, or from another rank's or the
    /// checkpoint).
    #[test]
    fn a_state_the_full_heal_directory_refuses_leaves_nothing_half_written() {
        let test = "a_state_the_full_heal_directory_refuses_leaves_nothing_half_written";
        let Some(volume) = crate::tmpfs::Tmpfs::mount(256 << 10, test) else {
            return;
        };
        let dir = volume.path();
        let layout = layout_of(&big(400, 0.0));
        let err = write(dir, &state(5), &big(400, 1.0)).unwrap_err();
        assert!(err.disk_refused(), "{err}");
        assert_eq!(fs::read_dir(dir).unwrap().count(), 0, "nothing left");
        assert!(newest(dir, &layout, 0xabc).is_none());
        assert!(
            write(dir, &state(5), &big(100, 1.0)).unwrap(),
            "a small one fits"
        );
        let small = layout_of(&big(100, 0.0));
        assert!(write(dir, &state(7), &big(400, 1.0)).is_err());
        let names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["state-00000005"]);
        assert_eq!(newest(dir, &small, 0xabc).unwrap().1.step, 5);
    }

    /// Issue 44: meta.json or state.bin truncated, bit-flipped or zeroed at ten offsets: the
    /// snapshot is skipped (the round takes a peer's state or the checkpoint) or its load is
    /// refused naming state.bin with the buffers untouched, never loaded. Before meta.json
    /// had a CRC of its own, a flipped digit of its sample count or clock was taken as is.
    #[test]
    fn a_damaged_snapshot_is_skipped_or_refused_never_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let layout = layout_of(&buffers(0.0));
        write(dir.path(), &state(5), &buffers(1.0)).unwrap();
        let (path, pristine) = newest(dir.path(), &layout, 0xabc).unwrap();
        let (mut skipped, mut refused) = (0, 0);
        for file in [META_FILE, BYTES_FILE] {
            let good = fs::read(path.join(file)).unwrap();
            for copy in ferrotrain_fuzz::damage::copies(&good) {
                fs::write(path.join(file), &copy.bytes).unwrap();
                let Some((found, state)) = newest(dir.path(), &layout, 0xabc) else {
                    skipped += 1;
                    continue;
                };
                assert_eq!(state, pristine, "{file} {copy}");
                let into = buffers(0.0);
                let err = load(&found, &state, &into).err().map(|e| e.to_string());
                assert!(
                    err.as_deref().is_some_and(|e| e.contains(BYTES_FILE)),
                    "{file} {copy}: loaded ({err:?})"
                );
                assert_eq!(Vec::<f32>::try_from(&into[0]).unwrap(), [0.0, 1.0, 2.0]);
                refused += 1;
            }
            fs::write(path.join(file), &good).unwrap();
        }
        println!("{skipped} damaged snapshots skipped, {refused} refused at load");
        assert_eq!(newest(dir.path(), &layout, 0xabc).unwrap().1, pristine);
    }
}
