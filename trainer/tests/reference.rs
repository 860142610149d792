//! docs/reference/cli-ferrotrain.md is what `ferrotrain reference cli` prints: every
//! subcommand and flag of this binary, read from its clap definition (which only the binary
//! holds: it links libtorch). `FERROTRAIN_REGENERATE=1` (scripts/gen-reference.sh) writes it.

mod common;

use std::path::Path;

use ferrotrain_api::reference::generated::current_or_regenerated;

const PAGE: &str = "docs/reference/cli-ferrotrain.md";

fn printed() -> String {
    let out = common::ferrotrain()
        .args(["reference", "cli"])
        .output()
        .expect("ferrotrain reference cli");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_command_line_reference_is_current() {
    let page = printed();
    // Every subcommand has its section, hidden ones included.
    for sub in [
        "run",
        "launch",
        "validate",
        "translate",
        "select",
        "bleu",
        "bench-collective",
        "doctor",
        "reference",
    ] {
        assert!(page.contains(&format!("## `ferrotrain {sub}`")), "{sub}");
    }
    assert!(
        page.contains("| `--nproc-per-node <NPROC_PER_NODE>` | `NPROC_PER_NODE` | `1` |"),
        "{page}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    current_or_regenerated(&root, PAGE, &page).unwrap_or_else(|e| panic!("{e}"));
}
