//! The project's own source, as the house checks read it (import cycles, function length, file
//! size, strings spelled once): its crates' folders, their non-test files, and a file's code
//! without its test module and comments. A test binary includes it with
//! `#[path = "support/source.rs"] mod source;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The source folders of the workspace's product crates, from the repository's root.
pub const CRATES: [&str; 5] = [
    "api/src",
    "launch/src",
    "operator/src",
    "trainer/src",
    "kubectl/src",
];

/// The source folders of the crates that try the product rather than ship it: the end-to-end
/// tests' helpers and binaries, and the fuzz driver (bench/ holds scripts, no Rust). They are
/// held to the product's rules of structure ([`ALL_CRATES`]), not to its vocabulary.
pub const TOOL_CRATES: [&str; 2] = ["e2e/src", "fuzz/src"];

/// Every crate's source folder the structure checks read (import cycles, function length, file
/// size): the product's and the tools'.
pub const ALL_CRATES: [&str; 7] = [
    CRATES[0],
    CRATES[1],
    CRATES[2],
    CRATES[3],
    CRATES[4],
    TOOL_CRATES[0],
    TOOL_CRATES[1],
];

/// The repository's root: the operator crate's parent.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every non-test .rs file under `dir`: no `tests/` folder, no `tests.rs` or `fixtures.rs`.
/// A `main.rs` beside a `lib.rs` is kept only when `binaries` (the binary is a crate of its
/// own, which reaches the library by its name, never `crate::`).
pub fn rust_files(dir: &Path, binaries: bool, out: &mut Vec<PathBuf>) {
    let binary_beside_library = dir.join("lib.rs").is_file();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                rust_files(&path, binaries, out);
            }
        } else if name.ends_with(".rs")
            && name != "tests.rs"
            && name != "fixtures.rs"
            && (binaries || !(name == "main.rs" && binary_beside_library))
        {
            out.push(path);
        }
    }
}

/// Every non-test .rs file of the product crates ([`CRATES`]), binaries included.
pub fn product_files() -> Vec<PathBuf> {
    files_of(&CRATES)
}

/// Every non-test .rs file of every crate ([`ALL_CRATES`]), binaries included.
pub fn all_files() -> Vec<PathBuf> {
    files_of(&ALL_CRATES)
}

fn files_of(dirs: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root().join(dir), true, &mut files);
    }
    files
}

/// The text of a file without its test module (`#[cfg(test)] mod tests { ... }` at the end,
/// or a `mod tests;` declaration) and without comments.
pub fn code_of(text: &str) -> String {
    code_lines(text)
        .into_iter()
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

/// [`code_of`] line by line, each with its line number in the file (from 1).
pub fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("mod tests {") || trimmed.starts_with("pub(super) mod tests") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push((i + 1, line));
    }
    out
}
