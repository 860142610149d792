//! What the structure checks read of code as a graph: the paths a file names (`use` trees and
//! `a::b::c` in its code) and the cycles of a graph of files. A test binary includes it with
//! `#[path = "support/graph.rs"] mod graph;`.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Every path of `use` trees and of the code, as segments: `use a::{b, c::d};` gives
/// `a::b` and `a::c::d`; `x::y::z(...)` in the code gives `x::y::z`.
pub fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let tree = statement
            .strip_prefix("use ")
            .or_else(|| statement.strip_prefix("pub use "))
            .or_else(|| statement.strip_prefix("pub(crate) use "))
            .or_else(|| statement.strip_prefix("pub(super) use "));
        if let Some(tree) = tree {
            // `a::{b as c}` -> `a::{b@c}`, then no whitespace.
            let words: Vec<&str> = tree.split_whitespace().collect();
            let tree = words.join(" ").replace(" as ", "@").replace(' ', "");
            expand(&tree, &mut Vec::new(), &mut found);
        }
    }
    // Paths in the code: identifiers joined by `::`.
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = (chars[i].is_alphabetic() || chars[i] == '_')
            && (i == 0
                || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            segments.push(chars[start..j].iter().collect::<String>());
            if j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && chars[j + 2].is_alphabetic()
            {
                j += 2;
            } else {
                break;
            }
        }
        if segments.len() > 1 {
            found.push(segments);
        }
        i = j.max(i + 1);
    }
    found
}

/// Expands one `use` tree (no whitespace, `@` for ` as `) under `prefix`.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let mut path = prefix.clone();
        path.extend(
            tree.split("::")
                .filter(|s| !s.is_empty())
                .map(|s| s.split('@').next().unwrap().to_string()),
        );
        out.push(path);
        return;
    };
    let depth = prefix.len();
    prefix.extend(
        tree[..open]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let (mut level, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => level += 1,
            '}' => level -= 1,
            ',' if level == 0 => {
                expand(&inner[start..k], prefix, out);
                start = k + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        expand(&inner[start..], prefix, out);
    }
    prefix.truncate(depth);
}

/// The cycles of `graph`: its strongly connected components of more than one file (Tarjan).
pub fn cycles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'g PathBuf, (usize, usize)>,
        stack: Vec<&'g PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'g>(w: &mut Walk<'g>, v: &'g PathBuf) {
        let n = w.index.len();
        w.index.insert(v, (n, n));
        w.stack.push(v);
        for u in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(u) {
                visit(w, u);
                let low = w.index[u].1.min(w.index[v].1);
                w.index.get_mut(v).unwrap().1 = low;
            } else if w.stack.contains(&u) {
                let low = w.index[u].0.min(w.index[v].1);
                w.index.get_mut(v).unwrap().1 = low;
            }
        }
        if w.index[v].0 == w.index[v].1 {
            let at = w.stack.iter().rposition(|x| *x == v).unwrap();
            let component: Vec<PathBuf> = w.stack.drain(at..).cloned().collect();
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let mut w = Walk {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    w.found
}
