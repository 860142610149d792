//! Pages whose commands run: docs/getting-started.md, docs/recovery-walkthrough.md,
//! docs/cli.md, the troubleshooting pages and docs/install.md's Verify section, their ```sh
//! blocks taken from the markdown as written and run in order against the cluster, each block's output compared
//! with the ```console block the page shows after it (e2e/src/pages/ says how). Each page
//! runs in a namespace of its own, through a copy of the kubeconfig whose context's namespace
//! is the test's, so the pages' `kubectl` commands need no `-n`; the output shows that
//! namespace as `default` and the image tag as `dev`, as the pages do. The chart is already
//! installed (scripts/e2e.sh): the getting-started page's `helm upgrade --install` keeps its
//! values and sets the same tag, so it changes nothing. cli.md runs `kubectl ferrotrain` as
//! built from this tree (on PATH). The troubleshooting pages' `Look` blocks run against their
//! job `mt` put in the state each names first (e2e/src/pages/states.rs).

use ferrotrain_e2e::TestNamespace;
use ferrotrain_e2e::pages::{
    NamespacedKubeconfig, NoStates, Page, TroubledJob, image_tag, run_page_in,
};
use ferrotrain_e2e::plugin::{binary, path_with};

/// The page at `path` run in a namespace of its own (`prefix`), its job put in each state a
/// block names by the page's `States`; `env` besides KUBECONFIG and TAG.
async fn run(path: &str, prefix: &str, env: Vec<(String, String)>, troubled: bool) {
    // Dropped last (declared first): the namespace goes also when a block fails.
    let ns = TestNamespace::create(prefix).await;
    let kubeconfig = NamespacedKubeconfig::create(&ns.name);
    let tag = image_tag();
    let mut page = Page {
        path: path.to_string(),
        section: None,
        env: vec![
            (
                "KUBECONFIG".into(),
                kubeconfig.path.to_string_lossy().into_owned(),
            ),
            // What the pages tell users to set: the tag of the images they built.
            ("TAG".into(), tag.clone()),
        ],
        renamed: Vec::new(),
        shown_as: vec![(ns.name.clone(), "default".into()), (tag, "dev".into())],
    };
    page.env.extend(env);
    if troubled {
        run_page_in(&page, &TroubledJob::new(&ns)).await;
    } else {
        run_page_in(&page, &NoStates).await;
    }
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_getting_started_page_runs_as_written() {
    run("docs/getting-started.md", "page-start", Vec::new(), false).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_recovery_guide_runs_as_written() {
    run(
        "docs/recovery-walkthrough.md",
        "page-recovery",
        Vec::new(),
        false,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_command_line_page_runs_as_written() {
    let path = path_with(&binary());
    run(
        "docs/cli.md",
        "page-cli",
        vec![("PATH".into(), path)],
        false,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_troubleshooting_pages_first_look_runs_against_a_restarted_job() {
    run("docs/troubleshooting.md", "page-trouble", Vec::new(), true).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_troubleshooting_look_blocks_of_a_job_that_does_not_start_run_in_its_states() {
    run(
        "docs/troubleshooting-start.md",
        "page-tstart",
        Vec::new(),
        true,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_troubleshooting_look_blocks_of_a_job_that_runs_badly_run_in_its_states() {
    run("docs/troubleshooting-run.md", "page-trun", Vec::new(), true).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_troubleshooting_look_blocks_of_a_job_that_has_stopped_or_ended_run_in_its_states() {
    run("docs/troubleshooting-end.md", "page-tend", Vec::new(), true).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_troubleshooting_look_blocks_of_the_operator_and_its_crd_run_as_written() {
    run(
        "docs/troubleshooting-operator.md",
        "page-toper",
        Vec::new(),
        false,
    )
    .await;
}

/// Deletes a namespace a page creates itself, however the test ends.
struct DeleteNamespace(String);

impl Drop for DeleteNamespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .args([
                "delete",
                "namespace",
                &self.0,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// install.md's Verify section, against the suite's release (installed as the page's
/// Install says, by scripts/e2e.sh); its smoke namespace is the test's own.
#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_install_pages_verify_section_runs_as_written() {
    let smoke = format!("ft-e2e-smoke-{:08x}", rand_suffix());
    let _delete = DeleteNamespace(smoke.clone());
    let tag = image_tag();
    let page = Page {
        path: "docs/install.md".into(),
        section: Some("Verify".into()),
        env: Vec::new(),
        renamed: vec![("ferrotrain-smoke".into(), smoke.clone())],
        shown_as: vec![(smoke, "ferrotrain-smoke".into()), (tag, "dev".into())],
    };
    run_page_in(&page, &NoStates).await;
}

/// A suffix of the clock's nanoseconds and the process: no two runs share it.
fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    nanos ^ std::process::id().rotate_left(16)
}
