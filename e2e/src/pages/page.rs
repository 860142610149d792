//! A page run: its blocks in order, each compared with what the page shows, the job of a
//! `<!-- state: NAME -->` block put in that state first; every mismatch reported at the end.

use std::fmt::Write as _;
use std::time::Duration;

use super::cluster::repo_root;
use super::compare::{compare, shown_as};
use super::parse::{Step, section, steps};
use super::script::run_script;

/// The most one block may take (the pages' own `kubectl wait`s are bounded below it: the
/// longest, install.md's wait for the smoke job to succeed, at 10 minutes).
pub const BLOCK_LIMIT: Duration = Duration::from_secs(660);

/// The pages CI runs (e2e/tests/pages.rs; install.md's Verify section alone).
pub const PAGES: [&str; 8] = [
    "docs/getting-started.md",
    "docs/recovery-walkthrough.md",
    "docs/cli.md",
    "docs/troubleshooting.md",
    "docs/troubleshooting-start.md",
    "docs/troubleshooting-run.md",
    "docs/troubleshooting-end.md",
    "docs/troubleshooting-operator.md",
];

/// A page to run: its path in the repository and what its blocks run with.
pub struct Page {
    /// Repository-relative path, e.g. `docs/getting-started.md`.
    pub path: String,
    /// Only the blocks under this `## ` heading (install.md's `Verify`); None: the whole page.
    pub section: Option<String>,
    /// Environment variables of every block (KUBECONFIG, what the page documents).
    pub env: Vec<(String, String)>,
    /// Names of the page the blocks run with another name (install.md's namespace
    /// `ferrotrain-smoke`, made the test's own): (the page's, the test's). The output shows
    /// the page's again (add the pair reversed to `shown_as`).
    pub renamed: Vec<(String, String)>,
    /// The runner's names in the output and what the page shows instead: (namespace,
    /// `default`), (image tag, `dev`).
    pub shown_as: Vec<(String, String)>,
}

/// What puts a page's job in the state a `<!-- state: NAME -->` block names, before the block
/// runs: the page's test knows its states; the block then looks at the job as the page says.
pub trait States {
    /// Puts the job in `state` and returns once it is there (bounded: it panics past its wait).
    fn enter(&self, state: &str) -> impl Future<Output = ()>;
}

/// A page without states: a `state` marker on it is an error.
pub struct NoStates;

impl States for NoStates {
    async fn enter(&self, state: &str) {
        panic!("the block's state `{state}`: this page's test puts no job in a state");
    }
}

/// Runs the page's blocks in order (see [`run_page_in`]); a page without states.
pub async fn run_page(page: &Page) {
    run_page_in(page, &NoStates).await;
}

/// The steps of the page (of its section, when it names one).
fn page_steps(page: &Page) -> Vec<Step> {
    let text = std::fs::read_to_string(repo_root().join(&page.path))
        .unwrap_or_else(|e| panic!("reading {}: {e}", page.path));
    let text = match &page.section {
        Some(heading) => section(&text, heading)
            .unwrap_or_else(|| panic!("{}: no section `## {heading}`", page.path)),
        None => text,
    };
    let steps = steps(&text);
    assert!(
        steps.iter().any(|s| s.not_run.is_none()),
        "{}: no ```sh block to run",
        page.path
    );
    steps
}

/// Runs the page's blocks in order, each after its job was put in its block's state
/// (`states`). A block that fails (a non-zero exit, the time limit) stops the page: what
/// follows may depend on it; a block whose output the page does not show is reported and the
/// page goes on. At the end it panics with every problem, naming the page, the block's line,
/// the commands, what they printed and what the page shows.
pub async fn run_page_in(page: &Page, states: &impl States) {
    let root = repo_root();
    let mut problems = Vec::new();
    for step in &page_steps(page) {
        let at = format!("{}:{}", page.path, step.line);
        if let Some(why) = &step.not_run {
            eprintln!("[pages] {at}: not run ({why})");
            continue;
        }
        if let Some(state) = &step.state {
            eprintln!("[pages] {at}: putting the job in state {state}");
            states.enter(state).await;
        }
        let script = shown_as(&step.script, &page.renamed);
        let ran = run_script(&script, &root, &page.env, BLOCK_LIMIT).await;
        let output = shown_as(&ran.output, &page.shown_as);
        eprintln!(
            "[pages] {at}: exit {:?} after {:.1} s",
            ran.status, ran.seconds
        );
        let (expected_at, expected) = match &step.expected {
            Some((line, text)) => (format!("{}:{line}", page.path), text.as_str()),
            None => ("(no console block: nothing)".to_string(), ""),
        };
        let problem = match ran.status {
            None => Some(format!("the block ran past {BLOCK_LIMIT:?}")),
            Some(0) => compare(expected, &output)
                .err()
                .map(|e| format!("the block's output is not what the page shows: {e}")),
            Some(code) => Some(format!("the block exited with status {code}")),
        };
        let Some(problem) = problem else { continue };
        let mut report = format!("{at}: {problem}\n");
        let _ = writeln!(report, "--- the block ({at})\n{}", step.script.trim_end());
        let _ = writeln!(report, "--- its output\n{}", output.trim_end());
        let _ = writeln!(
            report,
            "--- what the page shows ({expected_at})\n{}",
            expected.trim_end()
        );
        eprintln!("[pages] {report}");
        problems.push(report);
        if ran.status != Some(0) {
            break;
        }
    }
    assert!(
        problems.is_empty(),
        "{} block(s) of {} not as the page shows:\n\n{}",
        problems.len(),
        page.path,
        problems.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::super::states::STATES;
    use super::*;

    /// What CI runs: every page has blocks to run, each shows what it prints (or prints
    /// nothing on purpose), and every block left out says why.
    #[test]
    fn the_pages_ci_runs_have_blocks_with_their_output() {
        for page in PAGES {
            let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
            let steps = steps(&text);
            let run: Vec<&Step> = steps.iter().filter(|s| s.not_run.is_none()).collect();
            // The walk-throughs run many; troubleshooting.md its first look.
            let least = if page.contains("troubleshooting") {
                1
            } else {
                4
            };
            assert!(run.len() >= least, "{page}: {} blocks run", run.len());
            for step in &steps {
                if let Some(why) = &step.not_run {
                    assert!(why.len() > 10, "{page}:{}: say why", step.line);
                }
            }
            assert!(
                run.iter().filter(|s| s.expected.is_some()).count() >= run.len() - 1,
                "{page}: blocks without their output"
            );
        }
        // The pages that start their own job clean it up themselves.
        for page in [
            "docs/getting-started.md",
            "docs/recovery-walkthrough.md",
            "docs/cli.md",
        ] {
            let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
            let steps = steps(&text);
            // A block deletes what the last block that creates a job created (cli.md ends
            // with the plugin's completion, which creates nothing).
            let run: Vec<&Step> = steps.iter().filter(|s| s.not_run.is_none()).collect();
            let at = |word: &str| run.iter().rposition(|s| s.script.contains(word));
            let created = at("apply -f").max(at("submit -f")).unwrap();
            assert!(
                at("delete").is_some_and(|d| d >= created),
                "{page}: the last blocks clean up"
            );
        }
    }

    /// install.md's Verify section runs on its own: its blocks, each with its output, the
    /// last one the smoke namespace's deletion.
    #[test]
    fn install_mds_verify_section_runs_and_cleans_up() {
        let text = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
        let verify = section(&text, "Verify").expect("install.md's Verify");
        let steps = steps(&verify);
        assert!(steps.len() >= 5, "{steps:?}");
        assert!(steps.iter().all(|s| s.not_run.is_none()));
        assert!(
            steps
                .last()
                .unwrap()
                .script
                .contains("kubectl delete namespace"),
            "{steps:?}"
        );
    }

    /// The pages name the states the test makes (e2e/src/pages/states.rs), every one.
    #[test]
    fn the_states_the_pages_name_are_the_ones_the_test_makes() {
        let mut named = std::collections::BTreeSet::new();
        for page in PAGES {
            let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
            named.extend(steps(&text).into_iter().filter_map(|s| s.state));
        }
        let made: std::collections::BTreeSet<String> =
            STATES.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            named, made,
            "the states the pages name, the states the test makes"
        );
    }

    /// Records the states it is asked for, in order.
    struct Recorded(std::sync::Mutex<Vec<String>>);

    impl States for Recorded {
        async fn enter(&self, state: &str) {
            self.0.lock().unwrap().push(state.to_string());
        }
    }

    #[tokio::test]
    async fn states_come_first_and_every_difference_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("page.md");
        let text = "<!-- state: first -->\n```sh\necho one\n```\n\n```console\ntwo\n```\n\n\
                    <!-- state: second -->\n```sh\necho three\n```\n\n```console\nthree\n```\n\n\
                    ```sh\necho four\n```\n\n```console\nfive\n```\n";
        std::fs::write(&path, text).unwrap();
        let page = Page {
            path: path.display().to_string(),
            section: None,
            env: Vec::new(),
            renamed: Vec::new(),
            shown_as: Vec::new(),
        };
        let states = Recorded(std::sync::Mutex::new(Vec::new()));
        let run = std::panic::AssertUnwindSafe(run_page_in(&page, &states));
        let failed = futures::FutureExt::catch_unwind(run).await.unwrap_err();
        let said = failed.downcast_ref::<String>().unwrap();
        assert!(said.starts_with("2 block(s) of"), "{said}");
        assert!(
            said.contains("page.md:2:") && said.contains("page.md:19:"),
            "{said}"
        );
        assert_eq!(*states.0.lock().unwrap(), ["first", "second"]);
    }
}
