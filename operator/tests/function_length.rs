//! Issue 12's goal, kept: no non-test function of any crate over 120 lines (api, launch,
//! operator, trainer, kubectl; e2e and fuzz too: `support/source.rs`'s `ALL_CRATES`).
//! `scripts/longest-fns.py` prints the longest ones.

#[path = "support/source.rs"]
mod source;

const MAX_LINES: usize = 120;

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
fn no_function_is_over_120_lines() {
    let files = source::all_files();
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
