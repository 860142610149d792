//! The flags that exist: `ferrotrain-operator`'s and the kubectl plugin's from clap itself, `ferrotrain`'s read from its
//! clap derive structs (trainer/src/main.rs, which links libtorch, so its `Command` is out of
//! this test's reach, and launch/src/args.rs, `launch`'s), the repository scripts' from their
//! text. And the check: a flag after `ferrotrain <sub>` must be that subcommand's, after a
//! repository script that script's, and one named alone some program's of this repository.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;
use ferrotrain_operator::config::Cli;

use super::corpus::{Doc, Kind, spans};
use crate::support::repo_root;

/// Programs whose flags are not this repository's to check.
const EXTERNAL: &[&str] = &[
    "apt-get",
    "cargo",
    "crane",
    "curl",
    "docker",
    "gcc",
    "git",
    "go",
    "helm",
    "jq",
    "kind",
    "kubectl",
    "ld",
    "nsys",
    "npm",
    "nvidia-smi",
    "pip",
    "pip3",
    "podman",
    "promtool",
    "prometheus",
    "python",
    "python3",
    "sacrebleu",
    "ssh",
    "tar",
    "tensorboard",
    "torchrun",
    "zcat",
    "grep",
    "sed",
    "watch",
    "nccl-tests",
    "all_reduce_perf",
    "rustup",
    "grafana-cli",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
];

/// Words that only prefix a command.
const PREFIXES: &[&str] = &[
    "sudo", "env", "exec", "time", "then", "do", "!", "$", "#", ">",
];

/// Every flag of every program of the repository.
pub struct Flags {
    /// "ferrotrain launch", "ferrotrain-operator run", ... -> its long flags.
    pub commands: BTreeMap<String, BTreeSet<String>>,
    /// "scripts/e2e.sh", ... -> the flags its text names.
    pub scripts: BTreeMap<String, BTreeSet<String>>,
}

impl Flags {
    pub fn read() -> Flags {
        let mut commands = BTreeMap::new();
        let operator = Cli::command();
        for sub in operator.get_subcommands() {
            let flags = sub
                .get_arguments()
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .collect();
            commands.insert(format!("ferrotrain-operator {}", sub.get_name()), flags);
        }
        commands.insert("ferrotrain-operator".into(), BTreeSet::new());
        for (sub, flags) in trainer_flags() {
            commands.insert(format!("ferrotrain {sub}"), flags);
        }
        commands.insert("ferrotrain".into(), BTreeSet::new());
        commands.insert("ferrotrain-launch".into(), command_launcher_flags());
        commands.extend(plugin_flags());
        for flags in commands.values_mut() {
            flags.extend(["--help".to_string(), "--version".to_string()]);
        }
        Flags {
            commands,
            scripts: script_flags(),
        }
    }

    fn all(&self) -> BTreeSet<&str> {
        self.commands
            .values()
            .chain(self.scripts.values())
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// Problems with the flags a page names: `file:line: ...`.
    pub fn check(&self, doc: &Doc) -> Vec<String> {
        let all = self.all();
        let mut problems = Vec::new();
        // Flags in code spans and code blocks (prose names none outside backticks).
        for span in spans(doc).into_iter().filter(|s| s.kind != Kind::Prose) {
            for segment in segments(&span.text) {
                for (program, flag) in self.flags_in(&segment) {
                    let known = match &program {
                        Owner::Command(c) => self.commands[c].contains(&flag),
                        Owner::Script(s) => self.scripts[s].contains(&flag),
                        Owner::External => true,
                        Owner::Alone => all.contains(flag.as_str()),
                    };
                    if !known {
                        let whose = match program {
                            Owner::Command(c) => format!("`{c}` has no flag {flag}"),
                            Owner::Script(s) => format!("{s} takes no flag {flag}"),
                            _ => format!(
                                "{flag} is no flag of ferrotrain, ferrotrain-operator, kubectl ferrotrain or a script of this repository"
                            ),
                        };
                        problems.push(format!("{}:{}: {whose}", span.file, span.line));
                    }
                }
            }
        }
        problems
    }

    /// The flags of one command segment, each with the program it belongs to.
    fn flags_in(&self, segment: &str) -> Vec<(Owner, String)> {
        let words: Vec<&str> = segment.split_whitespace().collect();
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            let assignment = w.contains('=') && !w.starts_with('-');
            if PREFIXES.contains(&w) || assignment {
                i += 1;
            } else if ["nice", "timeout", "flock"].contains(&w) {
                // nice -n 5, timeout 10m, flock FILE
                i += 1;
                while i < words.len() && (words[i].starts_with('-') || words[i].len() <= 4) {
                    i += 1;
                }
                if w == "flock" {
                    i += 1;
                }
            } else {
                break;
            }
        }
        let program = words.get(i).map_or("", |p| p.trim_start_matches("./"));
        let base = program.rsplit('/').next().unwrap_or(program);
        // `kubectl ferrotrain SUB` runs the plugin `kubectl-ferrotrain SUB`.
        let plugin = base == "kubectl" && words.get(i + 1) == Some(&"ferrotrain");
        let (i, base) = if plugin { (i + 1, PLUGIN) } else { (i, base) };
        let mut owner = if base == PLUGIN {
            let sub = words[i + 1..].iter().find(|w| !w.starts_with('-'));
            let name = sub.map(|s| format!("{PLUGIN} {s}"));
            match name.filter(|n| self.commands.contains_key(n)) {
                Some(n) => Owner::Command(n),
                None => Owner::Command(PLUGIN.to_string()),
            }
        } else if base == "ferrotrain" || base == "ferrotrain-operator" {
            // The subcommand is the first word after the program that is no flag (or the
            // program alone: `ferrotrain --version`).
            let sub = words[i + 1..].iter().find(|w| !w.starts_with('-'));
            let name = sub.map(|s| format!("{base} {s}"));
            match name.filter(|n| self.commands.contains_key(n)) {
                Some(n) => Owner::Command(n),
                None => Owner::Command(base.to_string()),
            }
        } else if self.commands.contains_key(&format!("ferrotrain {program}")) && i == 0 {
            // `launch --nproc-per-node 2` in prose: the subcommand named alone.
            Owner::Command(format!("ferrotrain {program}"))
        } else if self.scripts.contains_key(program) {
            Owner::Script(program.to_string())
        } else if EXTERNAL.contains(&base) || program.ends_with(".py") {
            Owner::External
        } else {
            Owner::Alone
        };
        let mut out = Vec::new();
        for w in &words[i.min(words.len())..] {
            if *w == "--" {
                // What follows is the rank program's (ferrotrain launch ... -- ARGS).
                owner = Owner::External;
                continue;
            }
            if let Some(flag) = flag_of(w) {
                out.push((owner.clone(), flag));
            }
        }
        out
    }
}

#[derive(Clone, Debug)]
enum Owner {
    Command(String),
    Script(String),
    External,
    Alone,
}

/// The kubectl plugin's binary: `kubectl ferrotrain` runs it.
const PLUGIN: &str = "kubectl-ferrotrain";

/// `kubectl-ferrotrain` and each of its commands (`kubectl-ferrotrain watch`) with their long
/// flags, from its clap definition (the connection flags are every command's).
fn plugin_flags() -> BTreeMap<String, BTreeSet<String>> {
    let mut plugin = kubectl_ferrotrain::cli::Cli::command();
    plugin.build();
    let longs = |c: &clap::Command| -> BTreeSet<String> {
        c.get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    };
    let mut out = BTreeMap::from([(PLUGIN.to_string(), longs(&plugin))]);
    for sub in plugin.get_subcommands() {
        out.insert(format!("{PLUGIN} {}", sub.get_name()), longs(sub));
    }
    out
}

/// `--foo-bar` of a word such as `--foo-bar=1`, `(--foo-bar,` or `--foo-bar)`.
fn flag_of(word: &str) -> Option<String> {
    let w = word.trim_start_matches(['(', '[', '"', '\'', '`', '*']);
    let rest = w.strip_prefix("--")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .collect();
    let name = name.trim_end_matches('-');
    (name.len() > 1 && name.starts_with(|c: char| c.is_ascii_lowercase()))
        .then(|| format!("--{name}"))
}

/// A line cut into commands at `|`, `;`, `&&`, `$(`, `(` and `` ` ``.
fn segments(text: &str) -> Vec<String> {
    let mut parts = vec![text.to_string()];
    for sep in ["&&", "||", "$(", "|", ";", "(", ")", "`", "<<"] {
        parts = parts
            .iter()
            .flat_map(|p| p.split(sep).map(str::to_string).collect::<Vec<_>>())
            .collect();
    }
    parts
}

/// The flags of the repository's scripts: every `--flag` their text names.
fn script_flags() -> BTreeMap<String, BTreeSet<String>> {
    let root = repo_root();
    let mut out = BTreeMap::new();
    for dir in ["scripts", "bench", "e2e"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".sh") {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap();
            let flags = text.split_whitespace().filter_map(flag_of_any).collect();
            out.insert(format!("{dir}/{name}"), flags);
        }
    }
    out
}

/// Flags inside a script's case patterns and strings (`--only)`, `"--repeat"`, `--a|--b`).
fn flag_of_any(word: &str) -> Option<String> {
    let at = word.find("--")?;
    flag_of(&word[at..])
}

/// `ferrotrain`'s subcommands and their long flags, read from the derive structs.
/// `ferrotrain-launch`'s flags, from its clap definition (the launch crate has no libtorch).
pub fn command_launcher_flags() -> BTreeSet<String> {
    ferrotrain_launch::CommandLaunchArgs::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

pub fn trainer_flags() -> BTreeMap<String, BTreeSet<String>> {
    let root = repo_root();
    let main = std::fs::read_to_string(root.join("trainer/src/main.rs")).unwrap();
    let launch = std::fs::read_to_string(root.join("launch/src/args.rs")).unwrap();
    let sources = format!("{main}\n{launch}");
    let body = item_body(&sources, "enum Command").expect("enum Command in trainer/src/main.rs");
    let mut out = BTreeMap::new();
    for (variant, fields) in variants(&body) {
        let flags = match fields {
            Fields::Inline(text) => struct_flags(&sources, &text),
            Fields::Type(ty) => {
                let ty = ty.rsplit("::").next().unwrap().to_string();
                let body = item_body(&sources, &format!("struct {ty}"))
                    .unwrap_or_else(|| panic!("struct {ty} of subcommand {variant}"));
                struct_flags(&sources, &body)
            }
            Fields::None => BTreeSet::new(),
        };
        out.insert(kebab(&variant), flags);
    }
    out
}

enum Fields {
    Inline(String),
    Type(String),
    None,
}

/// The text between the braces after `head` (`enum Command`, `struct RunArgs`).
fn item_body(source: &str, head: &str) -> Option<String> {
    let at = source.find(&format!("{head} {{"))? + head.len() + 1;
    let mut depth = 0;
    for (i, c) in source[at..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(source[at + 1..at + i].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// The variants of an enum body: `Name(Type)`, `Name { fields }`, `Name`.
fn variants(body: &str) -> Vec<(String, Fields)> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        rest = skip_attributes_and_comments(rest);
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            return out;
        }
        rest = rest[name.len()..].trim_start();
        let (fields, after) = if let Some(r) = rest.strip_prefix('(') {
            let end = r.find(')').unwrap();
            (Fields::Type(r[..end].trim().to_string()), &r[end + 1..])
        } else if rest.starts_with('{') {
            let inner = item_body(&format!("X {rest}"), "X").unwrap();
            let end = rest.find(&inner).unwrap() + inner.len() + 1;
            (Fields::Inline(inner), &rest[end..])
        } else {
            (Fields::None, rest)
        };
        out.push((name, fields));
        rest = after.trim_start().trim_start_matches(',');
    }
}

fn skip_attributes_and_comments(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if s.starts_with("//") {
            s = s.split_once('\n').map_or("", |(_, r)| r);
        } else if s.starts_with("#[") {
            s = &s[attribute_len(s)..];
        } else {
            return s;
        }
    }
}

/// The length of the attribute `#[...]` at the start of `s` (brackets balanced).
fn attribute_len(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// The long flags of a struct body (or a variant's inline fields): each field with
/// `#[arg(long...)]`, and those of `#[command(flatten)]` fields' types.
fn struct_flags(sources: &str, body: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut rest = body;
    while !rest.trim().is_empty() {
        let mut long = None;
        let mut flatten = false;
        loop {
            rest = rest.trim_start();
            if rest.starts_with("//") {
                rest = rest.split_once('\n').map_or("", |(_, r)| r);
            } else if rest.starts_with("#[") {
                let len = attribute_len(rest);
                let attr = &rest[..len];
                if attr.starts_with("#[arg(") {
                    long = long.or_else(|| long_of(attr));
                }
                flatten |= attr.starts_with("#[command(") && attr.contains("flatten");
                rest = &rest[len..];
            } else {
                break;
            }
        }
        let field = rest
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ");
        let Some((name, tail)) = field.split_once(':') else {
            break;
        };
        let end = tail.find(",\n").map_or(tail.len(), |e| e + 1);
        let ty = tail[..end].trim().trim_end_matches(',');
        match long {
            Some(Some(explicit)) => {
                flags.insert(format!("--{explicit}"));
            }
            Some(None) => {
                flags.insert(format!("--{}", name.trim().replace('_', "-")));
            }
            None if flatten => {
                let body = item_body(sources, &format!("struct {ty}")).unwrap();
                flags.extend(struct_flags(sources, &body));
            }
            None => {}
        }
        rest = &tail[end..];
    }
    flags
}

/// For an `#[arg(...)]`: None without `long`, Some(None) for `long`, Some(Some(x)) for
/// `long = "x"`.
fn long_of(attr: &str) -> Option<Option<String>> {
    let inner = &attr["#[arg(".len()..attr.len() - 2];
    inner.split(',').map(str::trim).find_map(|part| {
        if part == "long" {
            Some(None)
        } else {
            part.strip_prefix("long")
                .map(str::trim_start)
                .and_then(|p| p.strip_prefix('='))
                .map(|v| Some(v.trim().trim_matches('"').to_string()))
        }
    })
}

fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}
