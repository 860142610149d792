//! A failure's story flows one way: rank -> its launcher -> node 0's launcher -> operator.
//! docs/architecture.md ("What a failure's story crosses") lists every file one process
//! writes for another; this keeps that table and the code in step: each file the launcher
//! names in its ranks' environment (launch/src/spawn.rs) has a row, each row's writer names
//! the variable in its code, and no row carries data from a launcher back into a rank.

mod support;

use support::repo_root;

/// One row: what crosses, the variable, data or control, who writes, who reads.
#[derive(Debug, PartialEq)]
struct Crossing {
    variable: String,
    kind: String,
    writer: String,
    reader: String,
}

fn crossings(architecture_md: &str) -> Vec<Crossing> {
    let section = architecture_md
        .split("\n## ")
        .find(|s| s.starts_with("What a failure's story crosses"))
        .expect("docs/architecture.md has the section `What a failure's story crosses`");
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| what "))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            Crossing {
                variable: cells[1].trim_matches('`').to_string(),
                kind: cells[2].to_string(),
                writer: cells[3].to_string(),
                reader: cells[4].to_string(),
            }
        })
        .collect()
}

/// The variables naming a file or directory (`FERROTRAIN_*_FILE`, `_DIR`, `_LOG`) that
/// `code` names.
fn file_variables(code: &str) -> Vec<String> {
    let mut out: Vec<String> = code
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("FERROTRAIN_"))
        .filter(|w| w.ends_with("_FILE") || w.ends_with("_DIR") || w.ends_with("_LOG"))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What is wrong with `rows` against the launcher's env contract `spawn_rs` and the crates'
/// code (`code_of(crate)`).
fn problems(rows: &[Crossing], spawn_rs: &str, code_of: &dyn Fn(&str) -> String) -> Vec<String> {
    let mut out = Vec::new();
    for var in file_variables(spawn_rs) {
        if !rows.iter().any(|r| r.variable == var) {
            out.push(format!(
                "{var}: the launcher names it for its ranks, the table has no row"
            ));
        }
    }
    for r in rows {
        let rank = ["trainer", "python"].contains(&r.reader.as_str());
        if r.kind == "data" && r.writer == "launcher" && rank {
            out.push(format!(
                "{}: data from a launcher back into a rank",
                r.variable
            ));
        }
        // The rank's side of the contract that the launch crate holds runs in the trainer.
        let dirs: &[&str] = match r.writer.as_str() {
            "trainer" => &["trainer/src", "launch/src/termination.rs"],
            // A PyTorch script's side: the runner and the package.
            "python" => &["python/ferrotrain", "launch/src/python/rank.py"],
            "launcher" => &["launch/src"],
            "operator" => &["operator/src"],
            other => {
                out.push(format!("{}: unknown writer {other}", r.variable));
                continue;
            }
        };
        let named = dirs.iter().any(|d| code_of(d).contains(&r.variable));
        if r.variable.starts_with("FERROTRAIN_") && !named {
            out.push(format!(
                "{}: {} never names it",
                r.variable,
                dirs.join(", ")
            ));
        }
    }
    out
}

/// Every .rs and .py file's text under `dir` of the repository (or the file `dir` names),
/// concatenated.
fn code_of(dir: &str) -> String {
    let path = repo_root().join(dir);
    if path.is_file() {
        return std::fs::read_to_string(path).unwrap();
    }
    let mut text = String::new();
    let mut dirs = vec![path];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "py") {
                text += &std::fs::read_to_string(&p).unwrap();
            }
        }
    }
    text
}

#[test]
fn failure_and_progress_data_flow_one_way_as_the_architecture_says() {
    let root = repo_root();
    let md = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let spawn = std::fs::read_to_string(root.join("launch/src/spawn.rs")).unwrap();
    let rows = crossings(&md);
    assert!(rows.len() >= 5, "{rows:?}");
    assert!(
        file_variables(&spawn).len() >= 3,
        "{:?}",
        file_variables(&spawn)
    );
    let found = problems(&rows, &spawn, &code_of);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_file_the_table_lacks_or_data_sent_back_into_a_rank_fails_the_check() {
    let rows = vec![
        Crossing {
            variable: "FERROTRAIN_PROGRESS_FILE".into(),
            kind: "data".into(),
            writer: "trainer".into(),
            reader: "launcher".into(),
        },
        // What rounds.json was: the launcher's rounds read back by rank 0.
        Crossing {
            variable: "FERROTRAIN_ROUNDS_FILE".into(),
            kind: "data".into(),
            writer: "launcher".into(),
            reader: "trainer".into(),
        },
    ];
    let spawn = "(env::FERROTRAIN_PROGRESS_FILE, a), (env::FERROTRAIN_END_FILE, b)";
    let code = |_: &str| "FERROTRAIN_PROGRESS_FILE FERROTRAIN_ROUNDS_FILE".to_string();
    let found = problems(&rows, spawn, &code);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("FERROTRAIN_END_FILE"), "{}", found[0]);
    assert!(found[1].contains("back into a rank"), "{}", found[1]);
}
