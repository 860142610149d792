//! No source file of any crate holds over 800 lines besides its unit tests (api, launch,
//! operator, trainer, kubectl; e2e and fuzz too: `support/source.rs`'s `ALL_CRATES`). A file's
//! lines are counted to its test module (`#[cfg(test)] mod tests`, at the bottom), comments
//! included: what a reader scrolls through. A file past it holds more than one concern.

#[path = "support/source.rs"]
mod source;

const MAX_LINES: usize = 800;

/// The lines of `text` above its test module: the `#[cfg(test)]` over `mod tests` (or the
/// `mod tests` line itself when no attribute stands over it), all of them when it has none.
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let is_test_module = |line: &str| {
        let line = line.trim_start();
        ["mod tests", "pub(super) mod tests", "pub(crate) mod tests"]
            .iter()
            .any(|m| {
                line.strip_prefix(m)
                    .is_some_and(|rest| rest.starts_with([' ', '{', ';']))
            })
    };
    let Some(at) = lines.iter().position(|l| is_test_module(l)) else {
        return lines.len();
    };
    if at > 0 && lines[at - 1].trim() == "#[cfg(test)]" {
        at - 1
    } else {
        at
    }
}

#[test]
fn no_file_is_over_800_lines_besides_its_tests() {
    let root = source::root();
    let files = source::all_files();
    let mut large = Vec::new();
    let mut largest = 0;
    for file in &files {
        let lines = non_test_lines(&std::fs::read_to_string(file).unwrap());
        largest = largest.max(lines);
        if lines > MAX_LINES {
            let shown = file.strip_prefix(&root).unwrap_or(file).display();
            large.push(format!("{shown}: {lines} lines"));
        }
    }
    assert!(large.is_empty(), "split these by concern: {large:#?}");
    // The scan saw the code (the largest today is nearly 800 lines).
    assert!(largest > 400, "{} files, largest {largest}", files.len());
}

#[test]
fn the_count_stops_at_the_test_module() {
    let code = "use std::fmt;\n\n#[cfg(test)]\nuse std::io;\n\nfn f() {}\n";
    assert_eq!(non_test_lines(code), 6);
    let tested = format!("{code}\n#[cfg(test)]\nmod tests {{\n    fn t() {{}}\n}}\n");
    assert_eq!(non_test_lines(&tested), 7);
    let declared = format!("{code}#[cfg(test)]\nmod tests;\n");
    assert_eq!(non_test_lines(&declared), 6);
    let bare = "fn f() {}\nmod tests {\n}\n";
    assert_eq!(non_test_lines(bare), 1);
    // A module whose name starts so is not the test module.
    assert_eq!(non_test_lines("mod tests_of_x;\nfn f() {}\n"), 2);
}
