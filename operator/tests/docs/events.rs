//! The event reasons the operator emits, read from its source: every `.event(...)` call,
//! every `EventNote { ... }` and every `fail(...)` (whose last argument is its event), with
//! `reason::NAME` resolved through api/src/reason.rs. Where a call passes a variable, the
//! reasons it can carry are listed in [`INDIRECT`], and a new such call fails the test until
//! it is listed there.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::repo_root;

/// Calls whose reason is a variable: (file under operator/src, variable) -> the reason
/// constants it carries, read from the code around them.
const INDIRECT: &[(&str, &str, &[&str])] = &[
    // WaitCause::reason() of the causes that are problems (gang/observed.rs).
    (
        "gang/running.rs",
        "reason",
        &[
            "INVALID_IMAGE_NAME",
            "IMAGE_PULL_BACK_OFF",
            "CREATE_CONTAINER_CONFIG_ERROR",
            "UNSCHEDULABLE",
            "CONTAINER_ERROR",
        ],
    ),
    // Only for NativeApiNotServed (the `if` around it).
    ("gang/queue.rs", "why", &["NATIVE_API_NOT_SERVED"]),
    // Shrunk or WholeGang.
    ("gang/in_place.rs", "why", &["SHRUNK", "WHOLE_GANG"]),
    // fail()'s own event: its callers' last argument, collected as `fail(` calls.
    ("gang/lifecycle.rs", "event", &[]),
    // A launch no pod can come of (gang/launch.rs, `Launched::Fails`): an invalid spec, or pods
    // the API refused past the start-up timeout.
    ("gang/decider.rs", "event", &["INVALID_SPEC", "FAILED"]),
    // A launch that stopped (controller.rs, `launch` and `launch_all`): the store's Secret is
    // missing, the API refused a pod, or a name is taken.
    (
        "gang/launch.rs",
        "stop.reason",
        &[
            "POD_CREATE_REFUSED",
            "NAME_CONFLICT",
            "STORE_SECRET_MISSING",
        ],
    ),
    // event()'s EventNote: the `.event(` calls themselves.
    ("gang/draft.rs", "reason", &[]),
];

/// reason.rs: constant name -> string (`ferrotrain_api::reason::ALL`).
pub fn constants() -> BTreeMap<String, String> {
    ferrotrain_api::reason::ALL
        .iter()
        .map(|r| (r.name.to_string(), r.value.to_string()))
        .collect()
}

/// The operator's non-test sources under operator/src: (path relative to it, text).
fn sources() -> Vec<(String, String)> {
    let root = repo_root().join("operator/src");
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && name != "fixtures.rs" {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let text = std::fs::read_to_string(&path).unwrap();
                // Leave out in-file test modules.
                let text = match text.find("#[cfg(test)]\nmod tests") {
                    Some(at) => text[..at].to_string(),
                    None => text,
                };
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

/// The argument text of the call starting at `at` (just after its `(`).
fn call_args(text: &str, at: usize) -> &str {
    let mut depth = 1;
    for (i, c) in text[at..].char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return &text[at..at + i];
                }
            }
            _ => {}
        }
    }
    &text[at..]
}

/// The `reason::NAME` constants named in a text.
fn reason_constants(text: &str) -> Vec<String> {
    text.match_indices("reason::")
        .map(|(at, _)| {
            text[at + 8..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// The top-level arguments of a call (commas inside brackets and strings kept).
fn split_args(args: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut depth = 0;
    let mut in_string = false;
    let mut prev = ' ';
    for c in args.chars() {
        match c {
            '"' if prev != '\\' => in_string = !in_string,
            '(' | '{' | '[' if !in_string => depth += 1,
            ')' | '}' | ']' if !in_string => depth -= 1,
            ',' if depth == 0 && !in_string => {
                out.push(String::new());
                prev = c;
                continue;
            }
            _ => {}
        }
        out.last_mut().unwrap().push(c);
        prev = c;
    }
    out.into_iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

/// Every event reason the operator emits (strings), or the call sites it cannot resolve.
pub fn emitted() -> Result<BTreeSet<String>, Vec<String>> {
    let constants = constants();
    let mut names = BTreeSet::new();
    let mut unresolved = Vec::new();
    let mut indirect_seen = BTreeSet::new();
    for (file, text) in sources() {
        // (call, which argument is the reason: index from the start, or the last)
        for (call, index) in [(".event(", Some(1)), ("fail(", None)] {
            for (at, _) in text.match_indices(call) {
                let before = &text[..at];
                if call == ".event(" && before.ends_with("fn") {
                    continue;
                }
                // `fail(` itself (`lifecycle::fail(`, `fail(d, ...)`), not `fn fail(`,
                // `restart_or_fail(` or `job_failure(`.
                let named = before.ends_with(|c: char| c.is_alphanumeric() || c == '_');
                if call == "fail(" && (named || before.trim_end().ends_with("fn")) {
                    continue;
                }
                let args = split_args(call_args(&text, at + call.len()));
                let arg = match index {
                    Some(i) => args.get(i),
                    None => args.last(),
                };
                let Some(arg) = arg else { continue };
                let direct = reason_constants(arg);
                if !direct.is_empty() {
                    names.extend(direct);
                    continue;
                }
                let listed = INDIRECT
                    .iter()
                    .find(|(f, var, _)| *f == file && *var == arg);
                match listed {
                    Some((f, var, reasons)) => {
                        indirect_seen.insert((*f, *var));
                        names.extend(reasons.iter().map(|r| r.to_string()));
                    }
                    None => unresolved.push(format!(
                        "operator/src/{file}: `{call}` with reason `{arg}`: list what it carries in INDIRECT (operator/tests/docs/events.rs)"
                    )),
                }
            }
        }
        for (at, _) in text.match_indices("EventNote {") {
            let body = call_args(&text, at + "EventNote {".len());
            if let Some(line) = body.lines().find(|l| l.trim().starts_with("reason")) {
                let direct = reason_constants(line);
                if direct.is_empty() {
                    let var = line.trim().trim_end_matches(',');
                    match INDIRECT.iter().find(|(f, v, _)| *f == file && *v == var) {
                        Some((f, v, reasons)) => {
                            indirect_seen.insert((*f, *v));
                            names.extend(reasons.iter().map(|r| r.to_string()));
                        }
                        None => unresolved.push(format!(
                            "operator/src/{file}: EventNote with reason `{var}`: list what it carries in INDIRECT (operator/tests/docs/events.rs)"
                        )),
                    }
                }
                names.extend(direct);
            }
        }
    }
    for (f, var, _) in INDIRECT {
        if !indirect_seen.contains(&(*f, *var)) {
            unresolved.push(format!(
                "INDIRECT lists {f} `{var}`, which no event call passes any more"
            ));
        }
    }
    if !unresolved.is_empty() {
        return Err(unresolved);
    }
    names
        .into_iter()
        .map(|n| {
            constants
                .get(&n)
                .cloned()
                .ok_or_else(|| vec![format!("reason::{n} is not in api/src/reason.rs")])
        })
        .collect()
}

/// The reasons of the events table of docs/operator-events.md (first column, in backticks).
pub fn documented(operator_md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_section = false;
    for (i, line) in operator_md.lines().enumerate() {
        if line.starts_with("## ") {
            in_section = line.trim() == "## Events";
        }
        if !in_section || !line.starts_with("| `") {
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or("");
        for part in first.split('`').skip(1).step_by(2) {
            out.push((i + 1, part.to_string()));
        }
    }
    out
}
