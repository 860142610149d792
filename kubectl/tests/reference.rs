//! docs/reference/cli-kubectl-ferrotrain.md is the plugin's clap definition (src/cli.rs) as a
//! page: every command and flag, the connection flags kubectl shares included.
//! `FERROTRAIN_REGENERATE=1` (scripts/gen-reference.sh) writes it.

use std::path::Path;

use clap::CommandFactory;
use ferrotrain_api::reference::{cli, generated::current_or_regenerated};
use kubectl_ferrotrain::cli::Cli;

const PAGE: &str = "docs/reference/cli-kubectl-ferrotrain.md";

const SOURCE: &str = "Generated from the clap definition of the `kubectl-ferrotrain` plugin \
    (kubectl/src/cli.rs) by kubectl/tests/reference.rs, which scripts/gen-reference.sh runs: \
    do not edit. kubectl runs the plugin as `kubectl ferrotrain`; \
    [docs/cli.md](../cli.md) is the guide.";

#[test]
fn the_plugins_command_line_reference_is_current() {
    let page = cli::page(&Cli::command(), SOURCE);
    for sub in [
        "submit",
        "watch",
        "logs",
        "recovery",
        "list",
        "suspend",
        "resume",
        "delete",
        "completion",
        "man",
    ] {
        assert!(
            page.contains(&format!("## `kubectl-ferrotrain {sub}`")),
            "{sub}:\n{page}"
        );
    }
    assert!(page.contains("`--kubeconfig <FILE>`"), "{page}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    current_or_regenerated(&root, PAGE, &page).unwrap_or_else(|e| panic!("{e}"));
}
