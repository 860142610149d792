//! Support shared by the operator's integration tests; each test binary uses a part of it.
#![allow(dead_code, unused_macros, unused_imports)]

pub mod fake_apiserver;
pub mod helm;

use std::path::PathBuf;

/// The repository's root: the operator crate's parent.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}
