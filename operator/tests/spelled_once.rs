//! Every reason and every rendezvous store key is spelled once. A reason the launcher or the
//! operator writes is a constant of `ferrotrain_api::reason` (so renaming one renames it
//! everywhere, and the operator can never stop recognising the launcher's verdicts while
//! everything still compiles); a store key comes from `ferrotrain_launch::keys`. These checks
//! read the product crates' non-test code for string literals that spell one of them.

use std::collections::BTreeMap;
use std::path::Path;

#[path = "support/source.rs"]
mod source;

/// Literals that spell a reason's value on purpose, each with why: the same word in another
/// vocabulary (Kubernetes' own, or one of the CRD's).
const OTHER_VOCABULARIES: &[(&str, &str)] = &[
    ("Running", "a pod's phase"),
    ("Failed", "a pod's phase"),
    ("Succeeded", "a pod's phase"),
    ("Unknown", "a condition's status"),
    ("Unschedulable", "the scheduler's PodScheduled reason"),
    (
        "ContainerCreating",
        "the kubelet's container waiting reason",
    ),
    ("InvalidImageName", "the kubelet's container waiting reason"),
    ("ImagePullBackOff", "the kubelet's container waiting reason"),
    (
        "CreateContainerConfigError",
        "the kubelet's container waiting reason",
    ),
];

/// Files that define another vocabulary whose words may coincide with reasons.
const VOCABULARY_FILES: &[(&str, &str)] = &[
    ("api/src/reason.rs", "the reasons themselves"),
    ("api/src/crd/status.rs", "the phases"),
    ("api/src/crd/condition.rs", "the condition types"),
    ("api/src/recovery.rs", "the causes of an attempt's end"),
];

/// `"word"` literals of a line of code.
fn literals(line: &str) -> Vec<&str> {
    line.split('"').skip(1).step_by(2).collect()
}

/// The reasons' constant names, by value (`ferrotrain_api::reason::ALL`).
fn reasons() -> BTreeMap<String, String> {
    ferrotrain_api::reason::ALL
        .iter()
        .map(|r| (r.value.to_string(), r.name.to_string()))
        .collect()
}

/// `file:line: text` of every non-test line of the product crates (but `skip`'s files) with a
/// literal `spelled` says is one.
fn spelled(skip: &[&str], spelled: impl Fn(&str) -> bool) -> Vec<String> {
    let root = source::root();
    let mut found = Vec::new();
    for file in source::product_files() {
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        if skip.iter().any(|s| rel == *s) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in source::code_lines(&text) {
            if literals(line).into_iter().any(&spelled) {
                found.push(format!("{rel}:{n}: {}", line.trim()));
            }
        }
    }
    found
}

#[test]
fn every_reason_is_spelled_only_in_api_reason() {
    let reasons = reasons();
    assert!(reasons.len() > 60, "read {} reasons", reasons.len());
    let skip: Vec<&str> = VOCABULARY_FILES.iter().map(|(f, _)| *f).collect();
    let found = spelled(&skip, |word| {
        reasons.contains_key(word) && !OTHER_VOCABULARIES.iter().any(|(w, _)| *w == word)
    });
    assert!(
        found.is_empty(),
        "reasons spelled as literals (use ferrotrain_api::reason's constant):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_store_key_is_spelled_only_in_launch_keys() {
    let found = spelled(&["launch/src/keys.rs"], |literal| {
        ["agent/", "round/", "ring/", "barrier/", "nccl/"]
            .iter()
            .any(|prefix| literal.starts_with(prefix))
    });
    assert!(
        found.is_empty(),
        "store keys spelled outside launch/src/keys.rs:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_see_a_planted_literal() {
    let planted = "        reason: \"Killed\".into(),";
    assert_eq!(literals(planted), ["Killed"]);
    assert!(reasons().contains_key("Killed"));
    assert!(literals("let k = format!(\"agent/{round}/failed\");")[0].starts_with("agent/"));
    assert!(Path::new(&source::root().join("launch/src/keys.rs")).is_file());
}
