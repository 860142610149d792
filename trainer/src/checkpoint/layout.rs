//! A job directory's checkpoints on disk: the file and directory names, and which `step-*`
//! directories are complete (every file there, trainer.json naming the same step, both
//! safetensors headers describing exactly the bytes their files hold).

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::io::io_err;
use super::safetensors::{read_header, verify_data};
use super::state::TrainerState;
use crate::error::Result;

/// The model's weights, by variable path.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's state tensors, by name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// [`TrainerState`] as JSON.
pub const STATE_FILE: &str = "trainer.json";
/// Prefix of every directory this module writes before it is complete (or while it is being
/// deleted); `CheckpointStore::new` removes leftovers.
pub const TEMP_PREFIX: &str = ".tmp-step-";

const STEP_PREFIX: &str = "step-";

/// `step-00000042`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:08}")
}

/// The step of a `step-XXXXXXXX` directory name (at least 8 digits, nothing else).
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(super) fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| io_err("listing", root, e))? {
        let entry = entry.map_err(|e| io_err("listing", root, e))?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step_dir_name) else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push((step, entry.path()));
        }
    }
    Ok(out)
}

/// The newest complete checkpoint in `root`, every byte checked (what a resume trusts);
/// incomplete or damaged ones are skipped with a warning.
pub(super) fn newest_complete(root: &Path) -> Result<Option<(PathBuf, TrainerState)>> {
    let mut steps = step_dirs(root)?;
    steps.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (step, dir) in steps {
        match inspect(&dir, step, true) {
            Ok(state) => return Ok(Some((dir, state))),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), reason = %why, "skipping an incomplete or corrupt checkpoint")
            }
        }
    }
    Ok(None)
}

pub(super) fn complete_checkpoints(root: &Path) -> Result<Vec<(PathBuf, TrainerState)>> {
    let mut steps = step_dirs(root)?;
    steps.sort_by_key(|s| s.0);
    Ok(steps
        .into_iter()
        .filter_map(|(step, dir)| inspect(&dir, step, false).ok().map(|state| (dir, state)))
        .collect())
}

/// Completeness check: reads trainer.json (checked against its CRC-32C) and the two
/// safetensors headers; with `verify_tensors`, their data against its CRC-32C too (reads
/// every byte: what a resume trusts, not what retention counts).
pub(super) fn inspect(dir: &Path, step: u64, verify_tensors: bool) -> Result<TrainerState, String> {
    let state = read_state(dir)?;
    if state.step != step {
        return Err(format!(
            "trainer.json says step {}, the directory says {step}",
            state.step
        ));
    }
    for file in [MODEL_FILE, OPTIMIZER_FILE] {
        let path = dir.join(file);
        let mut f = File::open(&path).map_err(|e| format!("{file}: {e}"))?;
        let len = f.metadata().map_err(|e| format!("{file}: {e}"))?.len();
        let header = read_header(&mut f, len).map_err(|e| format!("{file}: {e}"))?;
        if verify_tensors {
            verify_data(&mut f, &header).map_err(|e| format!("{file}: {e}"))?;
        }
    }
    Ok(state)
}

pub(super) fn read_state(dir: &Path) -> Result<TrainerState, String> {
    let path = dir.join(STATE_FILE);
    let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    TrainerState::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

pub(super) fn dir_size(dir: &Path) -> u64 {
    [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE]
        .iter()
        .filter_map(|f| fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::fixtures::*;
    use crate::checkpoint::store::CheckpointStore;

    #[test]
    fn step_dir_names_round_trip() {
        assert_eq!(step_dir_name(0), "step-00000000");
        assert_eq!(step_dir_name(1234), "step-00001234");
        assert_eq!(step_dir_name(123_456_789), "step-123456789");
        assert_eq!(parse_step_dir_name("step-00001234"), Some(1234));
        assert_eq!(parse_step_dir_name("step-123456789"), Some(123_456_789));
        for bad in [
            "step-1234",
            "step-0000123a",
            "step--0000123",
            "step-+0001234",
            "xstep-00001234",
            ".tmp-step-00001234-7",
        ] {
            assert_eq!(parse_step_dir_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn half_written_checkpoints_are_never_chosen() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let mut store = CheckpointStore::new(root, policy(100, 0)).unwrap();
        for step in [100, 200, 300, 400, 500, 600, 700] {
            save_now(&mut store, step, None);
        }
        drop(store);
        let dir = |s: u64| root.join(step_dir_name(s));
        // A crash before the rename: a complete-looking temp dir with a higher step.
        let temp = root.join(".tmp-step-00000800-4242");
        copy_dir(&dir(700), &temp);
        fs::rename(&temp, root.join("ignored")).unwrap();
        copy_dir(&dir(700), &temp);
        // A step dir without optimizer.safetensors.
        fs::remove_file(dir(700).join(OPTIMIZER_FILE)).unwrap();
        // Truncated trainer.json.
        truncate_by(&dir(600).join(STATE_FILE), 10);
        // Truncated safetensors: tensor data cut short.
        truncate_by(&dir(500).join(MODEL_FILE), 4);
        // Truncated inside the header.
        fs::write(
            dir(400).join(OPTIMIZER_FILE),
            &fs::read(dir(400).join(OPTIMIZER_FILE)).unwrap()[..20],
        )
        .unwrap();
        // Extra bytes after the data.
        let mut padded = fs::read(dir(300).join(MODEL_FILE)).unwrap();
        padded.extend_from_slice(&[0; 8]);
        fs::write(dir(300).join(MODEL_FILE), padded).unwrap();
        // trainer.json from another step.
        fs::write(
            dir(200).join(STATE_FILE),
            serde_json::to_vec(&state(900, None)).unwrap(),
        )
        .unwrap();
        // Not step directories at all.
        fs::create_dir(root.join("step-999")).unwrap();
        fs::write(root.join("step-00000999"), b"a file, not a directory").unwrap();
        fs::create_dir(root.join("tokenizer")).unwrap();

        let store = CheckpointStore::new(root, policy(100, 0)).unwrap();
        assert!(temp.exists(), "a reader removes nothing");
        let store = {
            drop(store);
            CheckpointStore::open_writer(root, policy(100, 0), writer(0)).unwrap()
        };
        assert!(!temp.exists(), "the writer removes stale temp dirs");
        assert!(root.join("tokenizer").exists() && root.join("ignored").exists());
        let (latest, st) = store.latest().unwrap().unwrap();
        assert_eq!(latest, dir(100));
        assert_eq!(st.step, 100);
        assert_eq!(store.last_completed().map(|i| i.step), Some(100));
        assert_eq!(store.complete().unwrap().len(), 1);

        for (step, needle) in [
            (500, "truncated"),
            (400, "header"),
            (300, "padded"),
            (200, "step 900"),
            (600, "trainer.json"),
            (700, "optimizer"),
        ] {
            let err = match CheckpointStore::load(&dir(step)) {
                Ok(_) => panic!("step {step} loaded"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains(needle) || err.contains("No such file"),
                "step {step}: {err}"
            );
        }
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    fn truncate_by(path: &Path, n: u64) {
        let f = fs::OpenOptions::new().write(true).open(path).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len - n).unwrap();
    }
}
