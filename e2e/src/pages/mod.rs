//! Pages whose commands run: the ```sh blocks of a page ([`PAGES`]; docs/install.md's
//! Verify section) are taken from the markdown as written, run in order, each with bash, and
//! what each prints is compared with the ```console block that follows it on the page.
//!
//! - A block runs as `bash -c` with `set -euo pipefail`, stderr into stdout (a terminal shows
//!   both), from the repository's root, within [`BLOCK_LIMIT`]. Blocks share no shell: a
//!   variable a block sets is gone in the next (the environment comes from the runner).
//! - `<!-- not run by CI: why -->` on the last line before a block's fence leaves it out
//!   (and the console block after it), for the few commands the test cluster cannot run.
//! - `<!-- state: NAME -->` on the last line before a block's fence: before the block runs,
//!   the page's test puts the page's job in state NAME ([`States`]; the troubleshooting
//!   pages' `Look` blocks: a job `mt` with a configuration error, unschedulable, ...;
//!   [`states`] lists them and makes each). The block then runs as written.
//! - A block followed by no console block must print nothing.
//! - Comparison ([`compare`]): every line of the console block must be in the output, in
//!   order; a line `...` stands for any number of output lines, and `...` inside a line for
//!   any text. Without a `...` line at its start (end) the block shows the output's first
//!   (last) line. Numbers, durations and ages (`42`, `0.0118`, `1m`, `2m5s`, `1h05m`) match
//!   any other, whitespace runs match any other, blank lines are ignored. The runner's own
//!   names in the output (its namespace, its image tag) are first replaced by the page's
//!   ([`Page::shown_as`]). kubectl's own diagnostic log lines (client-go's klog format,
//!   `W1202 03:42:45.722885   123 reflector.go:561] ...`: a watch that `kubectl wait` closes
//!   may log one) are not the command's output and are left out ([`is_klog`]).
//! - A block that fails (a non-zero exit, past the limit) stops the page; one whose output
//!   differs is reported and the page goes on, so one run shows every difference.
//! - A section of a page ([`Page::section`], [`section`]): the blocks under one `## `
//!   heading alone (install.md's Verify: its other sections install or take away the suite's
//!   operator; e2e/tests/upgrade.rs runs its upgrade and uninstall blocks).
//!
//! One concern a file: [`parse`] (the blocks and markers), [`compare`] (the output against
//! the page), [`script`] (a block run with bash), [`cluster`] (the kubeconfig, the image
//! tag), [`page`] (a page run), [`states`] (the troubleshooting pages' job in each state).

pub mod cluster;
pub mod compare;
pub mod page;
pub mod parse;
pub mod script;
pub mod states;

pub use cluster::{NamespacedKubeconfig, image_tag, repo_root};
pub use compare::{compare, is_klog, normalize, shown_as};
pub use page::{BLOCK_LIMIT, NoStates, PAGES, Page, States, run_page, run_page_in};
pub use parse::{Step, section, steps};
pub use script::{Ran, run_script};
pub use states::{STATES, TroubledJob};
