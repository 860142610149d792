//! No two files of a folder call each other, directly or through others, in any crate
//! (`support/source.rs`'s `ALL_CRATES`). Imports are checked by import_cycles.rs; a method
//! call is no import (`self.evaluate()` in one file of `impl Decider`, defined in another), so
//! this check reads calls: `.name(` of a method a sibling file defines, `sibling::name(`, and
//! `name(` of a function imported from a sibling. What it cannot resolve (a method a sibling
//! and this file both define, a type's associated function) draws no edge. A folder whose
//! files call one another both ways has no order to read it in: the gang policy's files each
//! call only the leaves below them, and its conductor (gang/decider.rs) calls them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "support/graph.rs"]
mod graph;
#[path = "support/source.rs"]
mod source;
use graph::{cycles, paths};
use source::code_of;

/// What a file defines: its functions' names, and the methods of each type it implements
/// (inherent `impl T` blocks).
#[derive(Default)]
struct Defined {
    functions: BTreeSet<String>,
    methods: BTreeMap<String, BTreeSet<String>>,
}

/// The names of the functions `fn NAME` in `code`.
fn function_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("fn ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    names
}

/// Each inherent `impl T { ... }` block of `code`: the type's name and the block's text.
fn impl_blocks(code: &str) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("impl") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(open) = code[at..].find('{').map(|o| at + o) else {
            continue;
        };
        let head = &code[at + 4..open];
        if head.contains(" for ") || head.contains(';') {
            continue;
        }
        // `impl<'a, 'o> Decider<'a, 'o>`: the type is the first word after the generics.
        let head = match head.trim_start().strip_prefix('<') {
            Some(rest) => rest.split_once('>').map_or("", |(_, t)| t),
            None => head,
        };
        let name: String = head
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut end) = (0, code.len());
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        if !name.is_empty() {
            out.push((name, &code[open..end]));
        }
    }
    out
}

/// What `code` defines.
fn defined(code: &str) -> Defined {
    let mut d = Defined {
        functions: function_names(code),
        ..Defined::default()
    };
    for (ty, block) in impl_blocks(code) {
        d.methods
            .entry(ty)
            .or_default()
            .extend(function_names(block));
    }
    d
}

/// Each `name(` in `code` with what comes right before it: `self.` (a method of the type
/// being implemented), the path before `::`, or nothing (a plain call); other method calls
/// (`x.name(`) are left out: without types, `.len(` would tie every file to any that defines
/// a `len`.
fn calls(code: &str) -> Vec<(Option<String>, String)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    for (i, c) in chars.iter().enumerate() {
        if *c != '(' || i == 0 || !word(chars[i - 1]) {
            continue;
        }
        let mut start = i;
        while start > 0 && word(chars[start - 1]) {
            start -= 1;
        }
        let name: String = chars[start..i].iter().collect();
        let before = chars[..start].iter().collect::<String>();
        let before = before.trim_end();
        let how = if let Some(receiver) = before.strip_suffix('.') {
            if !receiver.ends_with("self") || receiver.ends_with("_self") {
                continue;
            }
            Some("self".to_string())
        } else if let Some(path) = before.strip_suffix("::") {
            let segment: String = path.chars().rev().take_while(|c| word(*c)).collect();
            Some(segment.chars().rev().collect())
        } else if before.ends_with("fn") || before.ends_with(|c: char| word(c)) {
            continue;
        } else {
            None
        };
        out.push((how, name));
    }
    out
}

/// The module name a sibling file is known by: its stem (`census.rs` -> `census`).
fn stem(file: &Path) -> String {
    file.file_stem().unwrap().to_string_lossy().into_owned()
}

/// Names `code` imports from a sibling module of `siblings` (`use super::x::{a, b}`), each
/// with that sibling's stem.
fn imported(code: &str, siblings: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for path in paths(code) {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        let rest = match path.first() {
            Some(&"super") => &path[1..],
            _ => &path[..],
        };
        if let [module, name] = rest
            && siblings.contains(*module)
            && *name != "self"
        {
            out.insert(name.to_string(), module.to_string());
        }
    }
    out
}

/// The call graph of the files directly in `dir`: file -> the sibling files whose functions
/// it calls.
fn call_graph(dir: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    source::rust_files(dir, false, &mut files);
    files.retain(|f| f.parent() == Some(dir));
    let code: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|f| (f.clone(), code_of(&std::fs::read_to_string(f).unwrap())))
        .collect();
    let defs: BTreeMap<&PathBuf, Defined> = code.iter().map(|(f, c)| (f, defined(c))).collect();
    let by_stem: BTreeMap<String, &PathBuf> = files.iter().map(|f| (stem(f), f)).collect();
    let stems: BTreeSet<String> = by_stem.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (file, text) in &code {
        let own = &defs[file];
        let imports = imported(text, &stems);
        let mut edges = BTreeSet::new();
        for (how, name) in calls(text) {
            let targets: Vec<&PathBuf> = match how.as_deref() {
                // A method of a type this file implements, defined by another of its files.
                Some("self") => defs
                    .iter()
                    .filter(|(f, d)| {
                        **f != file
                            && own.methods.iter().any(|(ty, mine)| {
                                !mine.contains(&name)
                                    && d.methods.get(ty).is_some_and(|m| m.contains(&name))
                            })
                    })
                    .map(|(f, _)| *f)
                    .collect(),
                Some(module) if stems.contains(module) => by_stem
                    .get(module)
                    .filter(|f| defs[**f].functions.contains(&name))
                    .map(|f| vec![*f])
                    .unwrap_or_default(),
                None if !own.functions.contains(&name) => imports
                    .get(&name)
                    .and_then(|m| by_stem.get(m))
                    .map(|f| vec![*f])
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            edges.extend(targets.into_iter().filter(|f| *f != file).cloned());
        }
        graph.insert(file.clone(), edges);
    }
    graph
}

/// Every folder of `src` holding Rust files, `src` included.
fn folders(src: &Path, out: &mut Vec<PathBuf>) {
    out.push(src.to_path_buf());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() && path.file_name().is_some_and(|n| n != "tests") {
            folders(&path, out);
        }
    }
}

#[test]
fn no_two_files_of_a_folder_call_each_other() {
    let root = source::root();
    let mut found = Vec::new();
    let mut calls_seen = 0;
    for src in source::ALL_CRATES {
        let mut dirs = Vec::new();
        folders(&root.join(src), &mut dirs);
        for dir in dirs {
            let graph = call_graph(&dir);
            calls_seen += graph.values().map(BTreeSet::len).sum::<usize>();
            for cycle in cycles(&graph) {
                let names: Vec<String> = cycle
                    .iter()
                    .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
                    .collect();
                found.push(names);
            }
        }
    }
    // The scan saw calls between files (the gang's conductor alone makes dozens).
    assert!(calls_seen > 50, "{calls_seen} calls between files");
    assert!(found.is_empty(), "files that call each other: {found:#?}");
}

#[test]
fn the_scan_sees_method_calls_module_calls_and_imported_functions() {
    let dir = std::env::temp_dir().join(format!("call-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("mod.rs", "mod a;\nmod b;\nmod c;\nmod d;\n");
    // a -> b by a method, b -> a by a module path: a cycle no import shows.
    write(
        "a.rs",
        "impl X { pub fn run(&mut self) { self.evaluate(); } }\npub fn finish() {}\n",
    );
    write(
        "b.rs",
        "impl X { pub fn evaluate(&mut self) { super::a::finish(); } }\n",
    );
    // c -> d by an imported function; d calls nothing of c's: no cycle.
    write("c.rs", "use super::d::helper;\nfn f() { helper(1); }\n");
    write("d.rs", "pub fn helper(x: i32) -> i32 { x.max(0) }\n");
    let graph = call_graph(&dir);
    let name = |p: &PathBuf| stem(p);
    let edges: BTreeSet<(String, String)> = graph
        .iter()
        .flat_map(|(f, to)| to.iter().map(move |t| (name(f), name(t))))
        .collect();
    let want: BTreeSet<(String, String)> = [("a", "b"), ("b", "a"), ("c", "d")]
        .into_iter()
        .map(|(x, y)| (x.to_string(), y.to_string()))
        .collect();
    assert_eq!(edges, want);
    let found: Vec<Vec<String>> = cycles(&graph)
        .iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(name).collect();
            names.sort();
            names
        })
        .collect();
    assert_eq!(found, [["a", "b"]]);
    std::fs::remove_dir_all(&dir).unwrap();
}
