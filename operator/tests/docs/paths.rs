//! Repository paths a page names (`launch/src/spare.rs`, `scripts/e2e.sh`,
//! `gang/*/tests.rs`), source files named alone (`census.rs`), and links with their anchors
//! (`[rendezvous.md](rendezvous.md#store-protocol-and-limits)`): each must exist.

use std::collections::BTreeSet;
use std::path::Path;

use super::corpus::{Doc, Kind, anchors, links, spans};
use crate::support::repo_root;

/// Every file and directory of the repository (relative, `/`-separated; no target/, .git/).
pub struct Tree {
    pub entries: BTreeSet<String>,
    basenames: BTreeSet<String>,
    tops: BTreeSet<String>,
}

impl Tree {
    pub fn read() -> Tree {
        let root = repo_root();
        let mut entries = BTreeSet::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if ["target", ".git", "runs"].contains(&rel.as_str()) {
                    continue;
                }
                if path.is_dir() {
                    dirs.push(path);
                }
                entries.insert(rel);
            }
        }
        let basenames = entries
            .iter()
            .map(|e| e.rsplit('/').next().unwrap().to_string())
            .collect();
        let tops = entries
            .iter()
            .filter(|e| !e.contains('/'))
            .cloned()
            .collect();
        Tree {
            entries,
            basenames,
            tops,
        }
    }

    /// Whether a path (with `*` wildcards, `{a,b}` alternatives) names something.
    fn exists(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        if let (Some(open), Some(close)) = (path.find('{'), path.find('}')) {
            return open < close
                && path[open + 1..close].split(',').all(|alt| {
                    self.exists(&format!("{}{alt}{}", &path[..open], &path[close + 1..]))
                });
        }
        if path.contains('*') {
            return self.entries.iter().any(|e| glob(path, e));
        }
        self.entries.contains(path)
    }

    /// A repository path in a word: `scripts/e2e.sh`, `trainer/src/x.rs:12`, `docs/a.md#b`.
    fn repo_path<'a>(&self, word: &'a str) -> Option<&'a str> {
        let word = word.trim_matches(|c: char| "()[],;:'\"`.".contains(c));
        let word = word.strip_prefix("./").unwrap_or(word);
        let top = word.split('/').next()?;
        if !word.contains('/') || !self.tops.contains(top) || word.contains('<') {
            return None;
        }
        if word.contains("://") || word.contains('$') || word.contains('=') {
            return None;
        }
        // file:line, file#anchor
        let word = word.split(['#']).next()?;
        let word = match word.split_once(':') {
            Some((p, line)) if line.chars().all(|c| c.is_ascii_digit() || c == '-') => p,
            _ => word,
        };
        Some(word)
    }

    /// Problems with the paths and links of a page: `file:line: ...`.
    pub fn check(&self, doc: &Doc, all_docs: &[Doc]) -> Vec<String> {
        let mut problems = Vec::new();
        // Prose lines hold their code spans, so paths are read from prose and code blocks.
        for span in spans(doc) {
            // `[text](path)` and `path`'s: the path alone.
            let text = span.text.replace("](", " ").replace("'s", " ");
            let words: Vec<&str> = text
                .split(|c: char| c.is_whitespace() || c == '[' || c == ')')
                .collect();
            for word in words.into_iter().filter(|_| span.kind != Kind::Inline) {
                if let Some(path) = self.repo_path(word)
                    && !self.exists(path)
                {
                    problems.push(format!(
                        "{}:{}: `{path}` does not exist in the repository",
                        span.file, span.line
                    ));
                }
            }
            // A source file named alone in a code span: some file of the repository.
            let alone = span.kind == Kind::Inline
                && !span.text.contains('/')
                && [".rs", ".sh", ".py"].iter().any(|e| span.text.ends_with(e))
                && !span.text.contains(' ');
            if alone && !self.basenames.contains(&span.text) {
                problems.push(format!(
                    "{}:{}: no file of the repository is named `{}`",
                    span.file, span.line, span.text
                ));
            }
        }
        let dir = Path::new(&doc.path).parent().unwrap_or(Path::new(""));
        for (line, target) in links(doc) {
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                doc.path.clone()
            } else {
                normalize(&dir.join(file))
            };
            if resolved.starts_with("../") {
                continue; // outside the repository (../shared)
            }
            if !self.exists(&resolved) {
                problems.push(format!(
                    "{}:{line}: the link to `{target}` leads nowhere ({resolved} does not exist)",
                    doc.path
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                let text = all_docs
                    .iter()
                    .find(|d| d.path == resolved)
                    .map(|d| d.text.clone())
                    .or_else(|| std::fs::read_to_string(repo_root().join(&resolved)).ok())
                    .unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == anchor) {
                    problems.push(format!(
                        "{}:{line}: `{resolved}` has no heading for the anchor #{anchor}",
                        doc.path
                    ));
                }
            }
        }
        problems
    }
}

/// `a/b/../c` -> `a/c`.
fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part.as_os_str().to_string_lossy().as_ref() {
            "." => {}
            ".." if parts.last().is_some_and(|p| p != "..") => {
                parts.pop();
            }
            p => parts.push(p.to_string()),
        }
    }
    parts.join("/")
}

/// A glob with `*` (any characters but `/`) against a path.
fn glob(pattern: &str, path: &str) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    let q: Vec<&str> = path.split('/').collect();
    p.len() == q.len() && p.iter().zip(&q).all(|(a, b)| glob_part(a, b))
}

fn glob_part(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            text.starts_with(head)
                && (0..=text.len() - head.len()).any(|i| glob_part(tail, &text[head.len() + i..]))
        }
    }
}
