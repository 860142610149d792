//! No two files of a crate (api, launch, operator, trainer, kubectl; e2e and fuzz too: the list is
//! `support/source.rs`'s `ALL_CRATES`) import each other, directly or through others:
//! a file's imports lead only to files below it, so each can be read (and changed) knowing
//! only what it imports. An import is a path to another file's module in a `use` or in the code
//! (`crate::gang::decide`, `super::failure::Failure`, `decider::Decider` from gang/mod.rs); a
//! `mod` declaration is not one, so a folder's mod.rs may re-export its files as long as they
//! import each other directly and never through it. Test code is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "support/graph.rs"]
mod graph;
#[path = "support/source.rs"]
mod source;
use graph::{cycles, paths};
use source::code_of;

/// The module path of a file of a crate whose root is `src`: `lib.rs` is `[]`, `gang/mod.rs`
/// and `gang.rs` are `["gang"]`, `gang/census.rs` is `["gang", "census"]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

/// The file a path leads to: `crate::`, `super::`, `self::` or a child module's name start it;
/// it leads to the deepest module of the path that is a file. None for other crates.
fn target(
    from: &[String],
    path: &[String],
    files: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut module: Vec<String> = match path[0].as_str() {
        "crate" => Vec::new(),
        "self" => from.to_vec(),
        "super" => from[..from.len().checked_sub(1)?].to_vec(),
        child => {
            let mut m = from.to_vec();
            m.push(child.to_string());
            if !files.contains_key(&m) {
                return None;
            }
            return Some(deepest(m, &path[1..], files));
        }
    };
    let mut rest = &path[1..];
    while rest.first().is_some_and(|s| s == "super") {
        module.pop();
        rest = &rest[1..];
    }
    Some(deepest(module, rest, files))
}

fn deepest(
    mut module: Vec<String>,
    rest: &[String],
    files: &BTreeMap<Vec<String>, PathBuf>,
) -> Vec<String> {
    for segment in rest {
        module.push(segment.clone());
        if !files.contains_key(&module) {
            module.pop();
            break;
        }
    }
    module
}

/// The import graph of the crate at `src`: file -> the files it imports.
fn imports(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut list = Vec::new();
    source::rust_files(src, false, &mut list);
    let files: BTreeMap<Vec<String>, PathBuf> = list
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &files {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let edges: BTreeSet<PathBuf> = paths(&code)
            .iter()
            .filter_map(|p| target(module, p, &files))
            .filter(|m| m != module)
            .map(|m| files[&m].clone())
            .collect();
        graph.insert(file.clone(), edges);
    }
    graph
}

/// Folders whose files still import each other, each with why. A cycle among files of one
/// of them is tolerated; any other cycle fails. Once a folder has no cycle left its line must
/// go, so the exception never outlives its reason.
const UNTIED: &[(&str, &str)] = &[];

#[test]
fn no_file_imports_itself_through_others() {
    let root = source::root();
    let mut untied_seen = Vec::new();
    let mut found: Vec<Vec<String>> = Vec::new();
    for src in source::ALL_CRATES {
        let graph = imports(&root.join(src));
        let edges: usize = graph.values().map(BTreeSet::len).sum();
        // The scan saw the imports (fuzz/, the smallest crate, has 4).
        assert!(edges > 3, "{src}: {edges} imports");
        let crate_cycles = cycles(&graph);
        let shown = crate_cycles
            .iter()
            .map(|c| {
                let shown = c.iter().map(|f| f.strip_prefix(&root).unwrap_or(f));
                shown.map(|f| f.display().to_string()).collect()
            })
            .filter(|c: &Vec<String>| {
                let folder = UNTIED
                    .iter()
                    .find(|(folder, _)| c.iter().all(|f| f.starts_with(folder)));
                if let Some((folder, _)) = folder {
                    untied_seen.push(*folder);
                }
                folder.is_none()
            });
        found.extend(shown);
    }
    assert!(found.is_empty(), "files that import each other: {found:#?}");
    for (folder, why) in UNTIED {
        assert!(
            untied_seen.contains(folder),
            "{folder} has no cycle left: remove it from UNTIED ({why})"
        );
    }
}

#[test]
fn the_scan_finds_a_cycle_through_a_folder_and_its_files() {
    let dir = std::env::temp_dir().join(format!("import-cycles-{}", std::process::id()));
    let write = |path: &str, text: &str| {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    };
    write("lib.rs", "pub mod config;\npub mod gang;\npub mod apart;\n");
    write("apart.rs", "use crate::gang::f;\n");
    write("config.rs", "use crate::gang::Timing;\n");
    write("gang/mod.rs", "mod a;\nmod b;\npub use a::Timing;\n");
    write(
        "gang/a.rs",
        "use super::b::{self as bee, Y};\npub struct Timing;\n",
    );
    write("gang/b.rs", "pub fn g() { let _ = crate::config::C; }\n");
    let graph = imports(&dir);
    let name = |p: &PathBuf| p.strip_prefix(&dir).unwrap().display().to_string();
    let mut found: Vec<Vec<String>> = cycles(&graph)
        .iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(name).collect();
            names.sort();
            names
        })
        .collect();
    found.sort();
    std::fs::remove_dir_all(&dir).unwrap();
    // config -> gang/mod.rs (through its re-export) -> a -> b -> config.
    assert_eq!(
        found,
        [["config.rs", "gang/a.rs", "gang/b.rs", "gang/mod.rs"]]
    );
}
