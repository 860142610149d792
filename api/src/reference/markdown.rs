//! The markdown the reference pages are written in: tables whose cells are one line each,
//! and prose wrapped for reading the file as it is.

/// Where prose outside tables wraps.
pub const WIDTH: usize = 100;

/// A table: a header row, then one row per item.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row of cells, each already markdown (see [`cell`] and [`code`]).
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len(), "{cells:?}");
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table's markdown, ending with a newline.
    pub fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let rule = vec!["---".to_string(); self.header.len()];
        let mut out = line(&self.header);
        out.push_str(&line(&rule));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// Text for a table cell: one line (paragraphs apart by `<br><br>`, kept line breaks `<br>`),
/// `|` escaped, and a `<` that would open an HTML tag outside code written `&lt;`.
pub fn cell(text: &str) -> String {
    let text = escape_tags(text.trim()).replace('|', "\\|");
    text.split("\n\n")
        .map(|p| p.lines().map(str::trim).collect::<Vec<_>>().join("<br>"))
        .collect::<Vec<_>>()
        .join("<br><br>")
}

/// `text` as a code span (for a table cell: `|` escaped).
pub fn code(text: &str) -> String {
    let ticks = if text.contains('`') { "``" } else { "`" };
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{ticks}{pad}{}{pad}{ticks}", text.replace('|', "\\|"))
}

/// Prose outside a table: each paragraph of `text` wrapped at [`WIDTH`] (a code span is
/// never cut), paragraphs apart by a blank line, ending with a newline.
pub fn prose(text: &str) -> String {
    let text = escape_tags(text.trim());
    let mut out = String::new();
    for paragraph in text.split("\n\n") {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&wrap(paragraph));
    }
    out
}

/// One paragraph wrapped at [`WIDTH`]; lines it had on purpose (indented, list items) kept.
fn wrap(paragraph: &str) -> String {
    let laid_out = paragraph
        .lines()
        .skip(1)
        .any(|l| l.starts_with(char::is_whitespace) || l.starts_with("- "));
    if laid_out {
        return format!("{paragraph}\n");
    }
    let mut out = String::new();
    let mut line = String::new();
    for word in words(paragraph) {
        if !line.is_empty() && line.len() + 1 + word.len() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// The words of a paragraph, a code span with spaces in it one word.
fn words(paragraph: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for word in paragraph.split_whitespace() {
        match out.last_mut() {
            Some(last) if open => {
                last.push(' ');
                last.push_str(word);
            }
            _ => out.push(word.to_string()),
        }
        if word.matches('`').count() % 2 == 1 {
            open = !open;
        }
    }
    out
}

/// `<name>` outside code spans becomes `&lt;name>`, which markdown shows as written instead
/// of taking it for an HTML tag.
fn escape_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' => in_code = !in_code,
            '<' if !in_code
                && chars
                    .peek()
                    .is_some_and(|n| n.is_ascii_alphabetic() || *n == '/') =>
            {
                out.push_str("&lt;");
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_rule_under_its_header_and_one_line_a_row() {
        let mut t = Table::new(&["A", "B"]);
        t.row(vec![code("x|y"), cell("one\ntwo\n\nthree | four")]);
        assert_eq!(
            t.render(),
            "| A | B |\n| --- | --- |\n| `x\\|y` | one<br>two<br><br>three \\| four |\n"
        );
    }

    #[test]
    fn prose_wraps_between_code_spans_and_keeps_tags_visible() {
        let long = format!("{} `a b c` end <job> and `<job>`", "word ".repeat(19));
        let wrapped = prose(&long);
        assert!(wrapped.lines().all(|l| l.len() <= WIDTH), "{wrapped}");
        assert!(wrapped.contains("`a b c`"), "{wrapped}");
        assert!(wrapped.contains("&lt;job> and `<job>`"), "{wrapped}");
        assert_eq!(prose("a\n\nb"), "a\n\nb\n");
        assert_eq!(code("`x`"), "`` `x` ``");
    }
}
