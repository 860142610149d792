//! The pages a user reads, split into what the checks look at: inline code spans, the logical
//! lines of code blocks (a trailing `\` joins the next), YAML blocks whole, prose, and links.

use std::path::Path;

use crate::support::repo_root;

/// One page: README.md, docs/*.md, docs/reference/*.md (generated from the code),
/// examples/*.{md,yaml}, the chart's README.
pub struct Doc {
    /// Repository-relative path.
    pub path: String,
    pub text: String,
}

/// Where a piece of text sits on its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `code` in prose.
    Inline,
    /// A logical line of a fenced block (or of a YAML file), prompts and comment marks kept.
    Code,
    /// A line of prose (code spans included).
    Prose,
}

/// A piece of a page with its line (1-based).
pub struct Span {
    pub file: String,
    pub line: usize,
    pub kind: Kind,
    pub text: String,
}

/// A fenced block with its language (or a whole YAML file).
pub struct Block {
    pub file: String,
    pub line: usize,
    pub lang: String,
    pub text: String,
}

/// Every page the checks read, in a stable order.
pub fn docs() -> Vec<Doc> {
    let root = repo_root();
    let mut paths = vec![
        "README.md".to_string(),
        "charts/ferrotrain/README.md".into(),
    ];
    for dir in ["docs", "docs/reference", "examples"] {
        let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md") || n.ends_with(".yaml"))
            .collect();
        names.sort();
        paths.extend(names.into_iter().map(|n| format!("{dir}/{n}")));
    }
    paths
        .into_iter()
        .filter(|p| root.join(p).is_file())
        .map(|path| Doc {
            text: std::fs::read_to_string(root.join(&path)).unwrap(),
            path,
        })
        .collect()
}

/// A page given as text (for the checks' own tests).
pub fn doc(path: &str, text: &str) -> Doc {
    Doc {
        path: path.into(),
        text: text.into(),
    }
}

fn is_yaml_file(path: &str) -> bool {
    Path::new(path).extension().is_some_and(|e| e == "yaml")
}

/// The page with every fenced block blanked out (line numbers kept), and its blocks.
fn split(doc: &Doc) -> (String, Vec<Block>) {
    if is_yaml_file(&doc.path) {
        let block = Block {
            file: doc.path.clone(),
            line: 1,
            lang: "yaml".into(),
            text: doc.text.clone(),
        };
        return (String::new(), vec![block]);
    }
    let mut prose = String::new();
    let mut blocks = Vec::new();
    let mut open: Option<(String, Block)> = None;
    for (i, line) in doc.text.lines().enumerate() {
        let trimmed = line.trim_start();
        let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        match (&mut open, fence) {
            (None, Some(f)) => {
                let block = Block {
                    file: doc.path.clone(),
                    line: i + 2,
                    lang: trimmed[f.len()..].trim().to_string(),
                    text: String::new(),
                };
                open = Some((f.to_string(), block));
            }
            (Some((f, _)), Some(g)) if *f == g && trimmed[g.len()..].trim().is_empty() => {
                blocks.push(open.take().unwrap().1);
            }
            (Some((_, block)), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => prose.push_str(line),
        }
        prose.push('\n');
    }
    (prose, blocks)
}

/// The fenced blocks of a page (a YAML file is one block).
pub fn blocks(doc: &Doc) -> Vec<Block> {
    split(doc).1
}

/// Inline code spans, code lines and prose lines of a page.
pub fn spans(doc: &Doc) -> Vec<Span> {
    let (prose, blocks) = split(doc);
    let mut out = Vec::new();
    for (i, line) in prose.lines().enumerate() {
        if !line.trim().is_empty() {
            out.push(Span {
                file: doc.path.clone(),
                line: i + 1,
                kind: Kind::Prose,
                text: line.to_string(),
            });
        }
    }
    // Code spans may wrap onto the next line, never across a paragraph.
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let body_start = start + ticks;
        let closing = "`".repeat(ticks);
        let Some(len) = rest[body_start..].find(&closing) else {
            break;
        };
        let body = &rest[body_start..body_start + len];
        if !body.contains("\n\n") {
            out.push(Span {
                file: doc.path.clone(),
                line: prose[..offset + start].matches('\n').count() + 1,
                kind: Kind::Inline,
                text: body.replace('\n', " ").trim().to_string(),
            });
        }
        let next = body_start + len + ticks;
        offset += next;
        rest = &rest[next..];
    }
    for block in blocks {
        let mut logical = String::new();
        let mut first = block.line;
        for (i, line) in block.text.lines().enumerate() {
            if logical.is_empty() {
                first = block.line + i;
            }
            match line.strip_suffix('\\') {
                Some(head) => logical.push_str(head),
                None => {
                    logical.push_str(line);
                    out.push(Span {
                        file: block.file.clone(),
                        line: first,
                        kind: Kind::Code,
                        text: std::mem::take(&mut logical),
                    });
                }
            }
        }
    }
    out
}

/// Markdown links `[text](target)` of a page: (line, target), external ones left out.
pub fn links(doc: &Doc) -> Vec<(usize, String)> {
    if is_yaml_file(&doc.path) {
        return Vec::new();
    }
    let (prose, _) = split(doc);
    let mut out = Vec::new();
    for (i, line) in prose.lines().enumerate() {
        // A `](` inside a code span is code (a regular expression's `[a-z](/.*)?`), no link.
        let line: String = line
            .split('`')
            .enumerate()
            .map(|(n, part)| if n % 2 == 0 { part } else { "" })
            .collect::<Vec<_>>()
            .join("``");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = tail[..end].trim();
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|p| target.starts_with(p));
            if !external && !target.is_empty() {
                out.push((i + 1, target.to_string()));
            }
            rest = &tail[end..];
        }
    }
    out
}

/// GitHub's anchors of a page's headings (`## In-place restarts` -> `in-place-restarts`).
pub fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim().to_lowercase();
        let slug: String = title
            .chars()
            .filter_map(|c| match c {
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                ' ' => Some('-'),
                _ => None,
            })
            .collect();
        out.push(slug);
    }
    out
}
