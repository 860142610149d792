//! helm for tests: the binary (scripts/setup-helm.sh's cache, $HELM_BIN or PATH), running it,
//! and the rendered documents.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::repo_root;

pub fn helm() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("HELM_BIN") {
        let path = PathBuf::from(path);
        // scripts/setup-helm.sh prints the binary; accept its directory too.
        return Some(if path.is_dir() {
            path.join("helm")
        } else {
            path
        });
    }
    let cache = std::env::var("FERROTRAIN_CACHE")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("XDG_CACHE_HOME").map(|c| Path::new(&c).join("ferrotrain")))
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache/ferrotrain")))
        .ok()?;
    let cached = cache.join("helm/helm");
    if cached.is_file() {
        return Some(cached);
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("helm"))
}

macro_rules! helm_or_skip_impl {
    () => {
        match $crate::support::helm::helm() {
            Some(h) => h,
            None => {
                eprintln!(
                    "\n!!!!!!!! SKIPPED: no helm binary. Run scripts/setup-helm.sh (or set HELM_BIN) to test the chart. !!!!!!!!\n"
                );
                return;
            }
        }
    };
}

pub fn run(helm: &Path, args: &[&str]) -> String {
    let out = Command::new(helm)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rendered documents, parsed.
pub fn documents(rendered: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in rendered.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if current
                .lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
            {
                docs.push(
                    serde_saphyr::from_str::<Value>(&current)
                        .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{current}")),
                );
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name_suffix: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(name_suffix))
        })
        .unwrap_or_else(|| panic!("no {kind} *{name_suffix} rendered"))
}

pub(crate) use helm_or_skip_impl as helm_or_skip;
