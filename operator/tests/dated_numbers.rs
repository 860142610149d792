//! Every number in docs/performance.md's "Current numbers" is dated: its row carries the date
//! it was measured on (YYYY-MM-DD), the commit it was measured at, and the command that
//! measures it again (in code quotes). A number without them cannot be checked or repeated,
//! and goes stale without anyone noticing; the README and the guides cite these rows instead
//! of restating figures.

mod support;

/// The rows of `section`'s first Markdown table in `page` that lack a date, a commit or a
/// command; each as `page:line: why`.
fn undated_rows(page: &str, text: &str, section: &str) -> Vec<String> {
    let Some(start) = text.find(&format!("\n## {section}\n")) else {
        return vec![format!("{page}: no section `## {section}`")];
    };
    let first_line = text[..start].lines().count() + 3;
    let body = &text[start + section.len() + 5..];
    let end = body.find("\n## ").unwrap_or(body.len());
    let rows = body[..end]
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with('|'))
        // The header and its separator.
        .skip(2);
    let mut problems = Vec::new();
    for (i, row) in rows {
        let mut missing = Vec::new();
        if !has_date(row) {
            missing.push("a date (YYYY-MM-DD)");
        }
        if !has_commit(row) {
            missing.push("a commit");
        }
        if !row.contains('`') {
            missing.push("the command that measures it (`...`)");
        }
        if !missing.is_empty() {
            problems.push(format!(
                "{page}:{}: a current number without {}: {row}",
                first_line + i,
                missing.join(", ")
            ));
        }
    }
    if problems.is_empty() && !body[..end].lines().any(|l| l.starts_with('|')) {
        problems.push(format!("{page}: `## {section}` has no table"));
    }
    problems
}

fn has_date(row: &str) -> bool {
    row.as_bytes().windows(10).any(|w| {
        w.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        }) && w.starts_with(b"20")
    })
}

/// A git commit: a word of 7 to 40 lowercase hex digits with at least one letter and one
/// digit (so neither a year nor a word).
fn has_commit(row: &str) -> bool {
    row.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
        (7..=40).contains(&w.len())
            && w.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
            && w.chars().any(|c| c.is_ascii_digit())
            && w.chars().any(|c| c.is_ascii_alphabetic())
    })
}

#[test]
fn every_current_number_carries_its_date_commit_and_command() {
    let path = "docs/performance.md";
    let text = std::fs::read_to_string(support::repo_root().join(path)).unwrap();
    let problems = undated_rows(path, &text, "Current numbers");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_undated_row_is_refused() {
    let page = "# P\n\n## Current numbers\n\n| what | number | how |\n|---|---|---|\n\
                | ring | 0.69x gloo (2026-11-23, 4e2c002) | `bench/collectives.sh` |\n\
                | restart | 0.28 s median | `bench/restart-speed.sh` |\n\
                | rss | 71.7 MB (2026-11-26) | `bench/operator-scale.sh` |\n\
                | tokens/s | 6,106 (2026-11-28, e115774) | by hand |\n\n## Next\n";
    let problems = undated_rows("docs/planted.md", page, "Current numbers");
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("docs/planted.md:8: a current number without a date"));
    assert!(problems[1].contains("without a commit"), "{}", problems[1]);
    assert!(problems[2].contains("the command"), "{}", problems[2]);
    assert!(
        !has_commit("2026 12 0.131 deadbeef"),
        "no digit in deadbeef"
    );
    assert!(has_commit("at 54cc7ed"));
}
