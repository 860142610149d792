//! The binary as a shell runs it, without a cluster: its exit codes, `submit --dry-run client`
//! on the examples (the namespace from the kubeconfig's context, as kubectl takes it), a bad
//! file refused naming its field, completion and the man page. The kubeconfig names a server
//! that is never reached.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_kubectl-ferrotrain");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A kubeconfig whose context's namespace is `ml`, of a server nothing listens on.
fn kubeconfig() -> PathBuf {
    let path = std::env::temp_dir().join(format!("kubectl-ferrotrain-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u, namespace: ml}}]\n\
         current-context: x\n",
    )
    .unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    let config = kubeconfig();
    Command::new(BINARY)
        .args(args)
        .arg("--kubeconfig")
        .arg(&config)
        .current_dir(root())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_dry_run_prints_the_job_in_the_context_s_namespace() {
    let out = run(&[
        "submit",
        "-f",
        "examples/copy-dt.yaml",
        "--dry-run",
        "client",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("name: copy") && stdout.contains("namespace: ml"),
        "{stdout}"
    );
    assert!(
        stderr.contains("PersistentVolumeClaim copy-checkpoints left out"),
        "{stderr}"
    );
}

#[test]
fn a_trainer_config_with_the_flags_becomes_a_job() {
    let out = run(&[
        "submit",
        "-f",
        "examples/copy.yaml",
        "--dry-run",
        "client",
        "--replicas",
        "3",
        "--procs",
        "2",
        "-n",
        "other",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for expected in [
        "name: copy",
        "namespace: other",
        "replicas: 3",
        "procsPerReplica: 2",
        "task: copy",
    ] {
        assert!(stdout.contains(expected), "{expected}: {stdout}");
    }
}

#[test]
fn a_bad_file_is_refused_with_exit_code_3_naming_its_fields() {
    let config = std::fs::read_to_string(root().join("examples/copy.yaml")).unwrap();
    let bad = config.replace("task: copy", "task: copy\nmaxStep: 10\nthreads: many");
    let path = std::env::temp_dir().join(format!("bad-{}.yaml", std::process::id()));
    std::fs::write(&path, bad).unwrap();
    let out = run(&[
        "submit",
        "-f",
        path.to_str().unwrap(),
        "--dry-run",
        "client",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("maxStep: unknown field (did you mean maxSteps?)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("threads: must be an integer, got \"many\""),
        "{stderr}"
    );
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn an_unreachable_cluster_is_an_error_and_a_bad_command_line_a_usage_error() {
    let out = run(&["watch", "copy"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("error: "),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["logs", "copy", "--round", "0", "--previous"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn completion_and_the_man_page_come_from_the_definition() {
    let out = run(&["completion", "bash"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("kubectl-ferrotrain"));
    let out = run(&["man"]);
    assert!(
        text(&out.stdout).contains(".TH kubectl-ferrotrain"),
        "{}",
        text(&out.stdout)
    );
    let out = run(&["--help"]);
    assert!(
        text(&out.stdout).contains("kubectl ferrotrain"),
        "{}",
        text(&out.stdout)
    );
}
