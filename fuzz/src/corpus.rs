//! The kept corpus (`fuzz/corpus/<target>/`, one input a file) and where findings go.

use std::path::{Path, PathBuf};

/// `fuzz/corpus/<target>` in this repository.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Every file of `dir`, in name order (none when it does not exist).
pub fn load_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Writes a finding's input to `$FERROTRAIN_FUZZ_FINDINGS/<target>/` (else the temporary
/// directory's `ferrotrain-fuzz-findings/`), named by its hash; the path, when it could.
pub(crate) fn save_finding(target: &str, input: &[u8]) -> Option<PathBuf> {
    let root = std::env::var_os("FERROTRAIN_FUZZ_FINDINGS")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ferrotrain-fuzz-findings"));
    let dir = root.join(target);
    std::fs::create_dir_all(&dir).ok()?;
    let path = dir.join(format!("{:016x}", crate::mutate::hash(input)));
    std::fs::write(&path, input).ok()?;
    Some(path)
}
