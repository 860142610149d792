//! Issue 12's goal, kept: no non-test function in operator/, api/ or trainer/ over 120 lines
//! (`scripts/longest-fns.py` prints the longest ones).

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 120;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// (lines, name, line number) of every function outside `mod tests`, from its `fn` line to
/// the closing brace at the same indentation (rustfmt layout).
fn functions(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut test_mod: Option<usize> = None;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        match test_mod {
            None if trimmed.starts_with("mod tests {") => test_mod = Some(indent(line)),
            Some(at) if trimmed == "}" && indent(line) == at => test_mod = None,
            _ => {}
        }
        if test_mod.is_some() || trimmed.ends_with(';') {
            continue;
        }
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let prefix = &trimmed[..at];
        let is_fn = prefix
            .split_whitespace()
            .all(|w| w.starts_with("pub") || matches!(w, "async" | "const" | "unsafe"));
        if !is_fn {
            continue;
        }
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{}}}", &line[..indent(line)]);
        let end = (i..lines.len())
            .find(|&j| lines[j] == close)
            .unwrap_or(lines.len() - 1);
        found.push((end - i + 1, name, i + 1));
    }
    found
}

#[test]
fn no_function_in_operator_api_or_trainer_is_over_120_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["operator/src", "api/src", "trainer/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut long = Vec::new();
    let mut longest = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (lines, name, at) in functions(&text) {
            longest = longest.max(lines);
            if lines > MAX_LINES {
                long.push(format!("{}:{at} {name}: {lines} lines", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "split these: {long:#?}");
    // The scan saw the code (the longest today is about 100 lines).
    assert!(longest > 40, "{} files, longest {longest}", files.len());
}

#[test]
fn the_measure_counts_a_long_function_and_skips_tests() {
    let body = "    let x = 1;\n".repeat(130);
    let text = format!(
        "pub async fn long() {{\n{body}}}\n\nfn short() {{\n}}\n\n#[cfg(test)]\nmod tests {{\n    fn t() {{\n{body}    }}\n}}\n"
    );
    let found = functions(&text);
    assert_eq!(
        found,
        vec![(132, "long".to_string(), 1), (2, "short".to_string(), 134)]
    );
}
