//! The fault catalogue of docs/fault-catalogue.md holds each row to a test: the last column names
//! tests (`in_place::a_killed_trainer_*`: a module and a function, `*` for any ending), test
//! files (`tests/launch_disk_full.rs`) or benches (`bench/chaos.sh`). Each must exist, so a
//! row cannot outlive the test that keeps it true, nor name one that never was.

mod support;

use std::path::Path;

use support::repo_root;

/// The rows of the catalogue: (fault, what holds it).
fn rows(recovery_md: &str) -> Vec<(String, String)> {
    let section = recovery_md
        .split("\n## ")
        .find(|s| s.starts_with("The fault catalogue"))
        .expect("docs/fault-catalogue.md has a section `## The fault catalogue`");
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| fault "))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
            let first = cells.first().copied().unwrap_or("").trim().to_string();
            let last = cells.last().copied().unwrap_or("").trim().to_string();
            (first, last)
        })
        .collect()
}

/// The backticked names of a cell.
fn names(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Every Rust file's text under the crates' folders, with its path.
fn sources() -> Vec<(String, String)> {
    let root = repo_root();
    let mut out = Vec::new();
    let mut dirs: Vec<_> = [
        "api", "launch", "operator", "trainer", "kubectl", "e2e", "fuzz",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&path).unwrap_or_default()));
            }
        }
    }
    out
}

/// Whether `name` names something of the repository: a file (`bench/chaos.sh`, `bench/x.py`,
/// `tests/launch_disk_full.rs`), or a test `module::function` (`*`: any ending; `module::*`:
/// a module of that name).
fn exists(name: &str, sources: &[(String, String)], root: &Path) -> bool {
    if [".rs", ".sh", ".py"].iter().any(|e| name.ends_with(e)) {
        return root.join(name).exists() || sources.iter().any(|(p, _)| p.ends_with(name));
    }
    let segments: Vec<&str> = name.split("::").collect();
    let (last, modules) = segments.split_last().expect("a name");
    let in_module = |path: &str| {
        modules.iter().all(|m| {
            path.contains(&format!("/{m}/"))
                || path.contains(&format!("/{m}.rs"))
                || path.ends_with(&format!("{m}/tests.rs"))
        })
    };
    if *last == "*" {
        return sources.iter().any(|(p, _)| in_module(p));
    }
    let prefix = last.trim_end_matches('*');
    let whole = !last.ends_with('*');
    sources
        .iter()
        .filter(|(p, _)| in_module(p))
        .any(|(_, text)| {
            text.match_indices(&format!("fn {prefix}")).any(|(at, m)| {
                let next = text[at + m.len()..].chars().next();
                !whole || next.is_some_and(|c| c == '(' || c == '<')
            })
        })
}

/// What of `recovery_md`'s catalogue names nothing.
fn unheld(recovery_md: &str) -> Vec<String> {
    let sources = sources();
    let root = repo_root();
    let mut problems = Vec::new();
    for (fault, held) in rows(recovery_md) {
        let named = names(&held);
        if named.is_empty() {
            problems.push(format!("{fault}: no test holds it"));
        }
        for name in named {
            if !exists(name, &sources, &root) {
                problems.push(format!(
                    "{fault}: `{name}` names no test, test file or bench"
                ));
            }
        }
    }
    problems
}

#[test]
fn every_row_of_the_fault_catalogue_is_held_by_a_test_that_exists() {
    let text = std::fs::read_to_string(repo_root().join("docs/fault-catalogue.md")).unwrap();
    let rows = rows(&text);
    assert!(rows.len() >= 18, "{} rows", rows.len());
    let problems = unheld(&text);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_row_naming_a_test_that_does_not_exist_fails_the_check() {
    let planted = "\n## The fault catalogue\n\n| fault | what | held by |\n|---|---|---|\n\
        | a trainer killed | restarts | e2e `in_place::a_killed_trainer_*` |\n\
        | a meteor | nothing | e2e `in_place::a_meteor_strikes_*` |\n\
        | a flood | nothing | `bench/flood.sh` |\n\
        | a fire | nothing | nobody |\n";
    let problems = unheld(planted);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].contains("a_meteor_strikes_*"),
        "{}",
        problems[0]
    );
}
