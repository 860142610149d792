//! Pages whose commands run: docs/getting-started.md and docs/recovery.md, their ```sh blocks
//! taken from the markdown as written and run in order against the cluster, each block's
//! output compared with the ```console block the page shows after it (e2e/src/pages/ says
//! how). Each page runs in a namespace of its own, through a copy of the kubeconfig whose
//! context's namespace is the test's, so the pages' `kubectl` commands need no `-n`; the
//! output shows that namespace as `default` and the image tag as `dev`, as the pages do.
//! The chart is already installed (scripts/e2e.sh): the getting-started page's
//! `helm upgrade --install` keeps its values and sets the same tag, so it changes nothing.

use ferrotrain_e2e::TestNamespace;
use ferrotrain_e2e::pages::{NamespacedKubeconfig, Page, image_tag, run_page};

async fn run(path: &str, prefix: &str) {
    // Dropped last (declared first): the namespace goes also when a block fails.
    let ns = TestNamespace::create(prefix).await;
    let kubeconfig = NamespacedKubeconfig::create(&ns.name);
    let tag = image_tag();
    let page = Page {
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
        shown_as: vec![(ns.name.clone(), "default".into()), (tag, "dev".into())],
    };
    run_page(&page).await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_getting_started_page_runs_as_written() {
    run("docs/getting-started.md", "page-start").await;
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (e2e/kind.sh)"]
async fn the_recovery_guide_runs_as_written() {
    run("docs/recovery.md", "page-recovery").await;
}
