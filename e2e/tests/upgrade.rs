//! An upgrade from the last release while a job trains, as docs/install.md's "Upgrade" says:
//! 0.1.0's CRD and chart (e2e/fixtures/release-0.1.0, packaged from the last commit of 0.1.0),
//! a job as 0.1.0's example wrote it, then the page's own upgrade commands from a checkout
//! (read from the page, run as written): the job trains on in the same pods, no restart, and
//! its status has the new version's fields. The images are this tree's (0.1.0's were never
//! published), so until the CRD is applied the cluster is what a `helm upgrade` without the
//! CRD step leaves: a new operator under the old CRD. The test asserts what a user sees then
//! (the ranks train, the status is refused, a CrdOutOfDate event names the fix).
//!
//! Then the page's Uninstall, its first block run as written (`helm uninstall`), its output
//! compared with the page's: what the page says stays does (the CRD, the job, its pods
//! training on with no operator, the Lease). The page's other uninstall blocks delete every
//! job of the cluster and the CRD: not run.
//!
//! It takes the operator away (uninstalls the suite's release), so it runs alone
//! (.config/nextest.toml); however it ends, the suite's release is put back as scripts/e2e.sh
//! installs it (the CRD applied again, the chart installed: the uninstall keeps the CRD and
//! the namespace).

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrotrain_api::crd::Phase;
use ferrotrain_e2e::pages::{compare, image_tag, repo_root, section, steps};
use ferrotrain_e2e::{TestNamespace, WAIT, pods_of, wait_for, wait_rank0, wait_status};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// Runs `script` with bash from the repository's root; its output, or a panic saying `what`.
fn sh(what: &str, script: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{script}\n{text}");
    text
}

/// The values a user keeps for the release: the images of this suite.
fn values_file(dir: &Path) -> PathBuf {
    let tag = image_tag();
    let path = dir.join("ferrotrain-values.yaml");
    let text = format!("image:\n  tag: {tag}\n  pullPolicy: Never\ntrainerImage:\n  tag: {tag}\n");
    std::fs::write(&path, text).unwrap();
    path
}

/// docs/install.md's upgrade from a checkout: the ```sh block after "From a checkout".
fn upgrade_block() -> String {
    let page = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
    let after = page
        .split_once("From a checkout of the new version")
        .expect("docs/install.md has the upgrade from a checkout")
        .1;
    let block = after.split_once("```sh\n").expect("its commands").1;
    block
        .split_once("```")
        .expect("a closed block")
        .0
        .to_string()
}

/// docs/install.md's Uninstall: its first block and the output the page shows for it.
fn uninstall_block() -> (String, String) {
    let page = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
    let uninstall = section(&page, "Uninstall").expect("docs/install.md has an Uninstall");
    let first = steps(&uninstall).into_iter().next().expect("its commands");
    assert!(first.script.contains("helm uninstall"), "{first:?}");
    (first.script, first.expected.expect("its output").1)
}

/// The page's Uninstall as written; then what it says stays: the CRD, the job and its pods,
/// training on with no operator, and the operator's Lease.
async fn uninstall_keeps_what_the_page_says(ns: &TestNamespace, gang: &[String]) {
    let step = wait_rank0(ns, "copy-0-0", "rank 0's step", |p| Some(p.step)).await;
    let (script, shown) = uninstall_block();
    let said = sh("docs/install.md's Uninstall", &script);
    println!("{said}");
    if let Err(e) = compare(&shown, &said) {
        panic!("docs/install.md's Uninstall: {e}\n--- printed\n{said}\n--- the page\n{shown}");
    }
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let crd = crds.get_opt("distributedtrainings.ferrotrain.dev").await;
    assert!(matches!(crd, Ok(Some(_))), "the CRD stays: {crd:?}");
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), "ferrotrain-system");
    let lease = leases.get_opt("ferrotrain-operator").await;
    assert!(matches!(lease, Ok(Some(_))), "the Lease stays: {lease:?}");
    let on = wait_rank0(ns, "copy-0-0", "training on without the operator", |p| {
        (p.step > step + 100).then_some(p.step)
    })
    .await;
    println!("after the uninstall rank 0 trained on from step {step} to {on}");
    let pods: Vec<String> = pods_of(&ns.pods(), "copy")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    assert_eq!(pods, gang, "the same pods");
    assert!(
        ns.jobs().get_opt("copy").await.unwrap().is_some(),
        "the job stays"
    );
}

/// Puts the suite's release back as scripts/e2e.sh installs it, however the test ends.
struct Restore(PathBuf);

impl Drop for Restore {
    fn drop(&mut self) {
        let values = self.0.display();
        let script = format!(
            "kubectl apply --server-side --force-conflicts -f crds/distributedtrainings.yaml >/dev/null\n\
             helm upgrade --install ferrotrain charts/ferrotrain -n ferrotrain-system -f {values} --wait --timeout 5m >/dev/null\n\
             kubectl -n ferrotrain-system rollout status deployment/ferrotrain --timeout=5m >/dev/null"
        );
        let _ = Command::new("bash")
            .args(["-c", &script])
            .current_dir(repo_root())
            .status();
    }
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn a_job_started_under_0_1_0_trains_on_through_the_upgrade_to_this_tree() {
    let dir = tempfile::tempdir().unwrap();
    let values = values_file(dir.path());
    let _restore = Restore(values.clone());
    let fixture = "e2e/fixtures/release-0.1.0";
    sh(
        "installing 0.1.0",
        &format!(
            "helm uninstall ferrotrain -n ferrotrain-system --wait >/dev/null\n\
             kubectl apply --server-side --force-conflicts -f {fixture}/crd.yaml >/dev/null\n\
             helm install ferrotrain {fixture}/ferrotrain-0.1.0.tgz -n ferrotrain-system -f {} --wait --timeout 5m >/dev/null",
            values.display()
        ),
    );

    let ns = TestNamespace::create("upgrade").await;
    let example = std::fs::read_to_string(repo_root().join(fixture).join("copy-dt.yaml"))
        .unwrap()
        .replace("maxSteps: 3000", "maxSteps: 1000000");
    let manifest = dir.path().join("copy-dt.yaml");
    std::fs::write(&manifest, example).unwrap();
    sh(
        "0.1.0's example",
        &format!("kubectl apply -n {} -f {}", ns.name, manifest.display()),
    );
    // Under 0.1.0's CRD this tree's operator creates the pods, and the ranks train; its
    // status writes are refused (the old schema lacks its fields): the job says so.
    let step_at_upgrade = wait_rank0(&ns, "copy-0-0", "training under 0.1.0's CRD", |p| {
        (p.step >= 100).then_some(p.step)
    })
    .await;
    let told = wait_for("the CrdOutOfDate event", WAIT, || async {
        let events = ns.events_of("copy").await;
        let told = events
            .iter()
            .find(|(reason, _)| reason == "CrdOutOfDate")
            .map(|(_, message)| message.clone());
        (told, format!("{events:?}"))
    })
    .await;
    println!("under 0.1.0's CRD: {told}");
    assert!(
        told.contains("crds/distributedtrainings.yaml") && told.contains(".status."),
        "the event names the fields and the fix: {told}"
    );
    let uids = |pods: Vec<k8s_openapi::api::core::v1::Pod>| -> Vec<String> {
        pods.into_iter().filter_map(|p| p.metadata.uid).collect()
    };
    let gang = uids(pods_of(&ns.pods(), "copy").await);
    assert_eq!(gang.len(), 2, "{gang:?}");

    let block = upgrade_block().replace("ferrotrain-values.yaml", &values.display().to_string());
    println!(
        "{}",
        sh("docs/install.md's upgrade from a checkout", &block)
    );

    // With this version's CRD the status is written again: the same pods train on, and the
    // status has what only this version's CRD declares (the ledger's world sizes).
    let after = wait_status(
        &ns.jobs(),
        "copy",
        "training on after the upgrade",
        WAIT,
        |s| {
            s.progress
                .as_ref()
                .is_some_and(|p| p.report.step > step_at_upgrade + 200)
                && s.recovery
                    .as_ref()
                    .is_some_and(|r| !r.seconds_by_world_size.is_empty())
        },
    )
    .await;
    assert_eq!(after.phase, Phase::Running, "{after:?}");
    assert_eq!((after.attempt, after.restarts), (0, 0), "{after:?}");
    assert_eq!(
        uids(pods_of(&ns.pods(), "copy").await),
        gang,
        "the same pods"
    );
    uninstall_keeps_what_the_page_says(&ns, &gang).await;
}
