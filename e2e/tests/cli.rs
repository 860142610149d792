//! `kubectl ferrotrain` used as a person would, against the real cluster: the example job
//! submitted through it (a bad flag refused before anything is sent), `watch` in a real
//! terminal (tmux) while a trainer is killed, its screens read back before, right after the
//! kill, once the recovery shows and at the end, and its exit code; the same watch where
//! stdout is no terminal (a line per change); `logs` of the killed rank's round once the next
//! round trains; `recovery`; `list`; and what the watch cost the API server (`--stats`:
//! requests by kind, against the changes it received).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use ferrotrain_api::crd::{FailureInfo, Phase};
use ferrotrain_e2e::plugin::{
    Ran, Tmux, WatchStats, binary, kubectl_ferrotrain, path_with, stats_of, step_on,
};
use ferrotrain_e2e::{
    TRAIN_WAIT, TestNamespace, WAIT, copy_job, distributed_training, signal_local_rank, wait_spare,
    wait_status,
};
use serde_json::json;

const JOB: &str = "copy";
/// Long enough to see the bar move before the kill and after the recovery (10-60 steps/s on
/// the kit's two nodes), short enough for CI.
const MAX_STEPS: u64 = 600;
/// The killed rank and its pod.
const KILLED_POD: &str = "copy-0-1";

fn show(what: &str, text: &str) {
    println!("==== {what} ====\n{text}\n");
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The example's job (two pods of one rank) as a manifest file in `dir`. Ranks but 0 write
/// only warnings unless told otherwise: rank 1's own lines are what `logs` is to show once its
/// round was replaced, so the pods get RUST_LOG=info.
fn manifest(ns: &TestNamespace, dir: &Path, claim: &str) -> PathBuf {
    let mut spec = copy_job(2, MAX_STEPS, Some(claim));
    spec["podTemplate"] = json!({"env": [{"name": "RUST_LOG", "value": "info"}]});
    let job = distributed_training(JOB, &ns.name, spec);
    let path = dir.join("copy.json");
    std::fs::write(&path, serde_json::to_string_pretty(&job).unwrap()).unwrap();
    path
}

/// `submit`: a flag out of range is refused before anything is sent, naming the field and the
/// flag; then the job is created.
async fn submit(ns: &TestNamespace, plugin: &Path, file: &str) {
    let refused = kubectl_ferrotrain(
        plugin,
        &["submit", "-f", file, "-n", &ns.name, "--replicas", "0"],
    );
    show("submit --replicas 0", &refused.stderr);
    assert_eq!(refused.code, 3, "{refused:?}");
    let named = "spec.replicas (--replicas): must be at least 1, got 0";
    assert!(refused.stderr.contains(named), "{refused:?}");
    let created = ns.jobs().get_opt(JOB).await.unwrap();
    assert!(created.is_none(), "nothing was created");
    let submitted = kubectl_ferrotrain(plugin, &["submit", "-f", file, "-n", &ns.name]);
    show("submit", &submitted.stdout);
    assert_eq!(submitted.code, 0, "{submitted:?}");
    let said = "distributedtraining.ferrotrain.dev/copy created";
    assert!(submitted.stdout.contains(said), "{submitted:?}");
}

/// `watch` where stdout is a file: a line per change.
fn watch_into_a_file(ns: &TestNamespace, plugin: &Path, out: &Path) -> Child {
    Command::new("kubectl")
        .args(["ferrotrain", "watch", JOB, "-n", &ns.name])
        .env("PATH", path_with(plugin))
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl ferrotrain watch")
}

/// `logs --round 0 --rank 1` while round 1 trains: the killed rank's own lines of its round,
/// its last one the last of the status' `lastFailure.lastLines`; and `logs --rank 1`: both
/// rounds, from the container log.
fn logs_of_the_replaced_round(ns: &TestNamespace, plugin: &Path, failure: &FailureInfo) {
    let args = ["logs", JOB, "-n", &ns.name, "--round", "0", "--rank", "1"];
    let logs: Ran = kubectl_ferrotrain(plugin, &args);
    show(
        "logs --round 0 --rank 1 (its last 15 lines)",
        &last_lines(&logs.stdout, 15),
    );
    assert_eq!(logs.code, 0, "{logs:?}");
    assert!(!logs.stdout.is_empty(), "{logs:?}");
    assert!(
        logs.stdout.lines().all(|l| l.starts_with("[0.1] ")),
        "{}",
        logs.stdout
    );
    let last = failure
        .last_lines
        .last()
        .expect("the blamed rank's last lines");
    assert!(
        logs.stdout.lines().any(|l| l == format!("[0.1] {last}")),
        "its last line as status.lastFailure.lastLines keeps it ({last:?}) is in its round's \
         output:\n{}",
        last_lines(&logs.stdout, 15)
    );
    let both = kubectl_ferrotrain(plugin, &["logs", JOB, "-n", &ns.name, "--rank", "1"]);
    show(
        "logs --rank 1 (the last 8 lines)",
        &last_lines(&both.stdout, 8),
    );
    assert!(
        both.stdout.contains("[0.1] ") && both.stdout.contains("[1.1] "),
        "{both:?}"
    );
}

/// `recovery`: a row for the killed round, blaming rank 1's pod, and round 1's state from
/// the peers.
fn the_ledger(ns: &TestNamespace, plugin: &Path, failure: &FailureInfo) {
    let ledger = kubectl_ferrotrain(plugin, &["recovery", JOB, "-n", &ns.name]);
    show("recovery", &ledger.stdout);
    assert_eq!(ledger.code, 0, "{ledger:?}");
    let row = ledger
        .stdout
        .lines()
        .find(|l| l.contains(&format!("Failure {}", failure.reason)))
        .unwrap_or_else(|| panic!("a row for the failure:\n{}", ledger.stdout));
    assert!(row.contains(KILLED_POD), "{row}");
    assert!(
        ledger.stdout.contains("peers"),
        "round 1's state came from the peers"
    );
    let list = kubectl_ferrotrain(plugin, &["list", "-n", &ns.name]);
    show("list", &list.stdout);
    assert!(list.stdout.contains("Succeeded"), "{list:?}");
}

/// What the watch cost: one list and one watch (renewed every 290 s, kube's default; one more
/// pair should the API server end a watch early), fewer requests than changes, no GET.
fn the_watch_cost(stats_text: &str, restarts: i32) {
    show("watch --stats", stats_text);
    let stats: WatchStats = stats_text
        .lines()
        .find_map(stats_of)
        .unwrap_or_else(|| panic!("no --stats line in {stats_text:?}"));
    let (total, seconds, changes) = (stats.total(), stats.seconds, stats.changes);
    println!(
        "watch: {total} API requests in {seconds:.1} s = {:.4}/s, for {changes} changes of the \
         job ({:.3}/s); the status had {restarts} restarts",
        total as f64 / seconds,
        changes as f64 / seconds,
    );
    assert!(
        stats.kinds.iter().all(|(k, _)| k == "list" || k == "watch"),
        "a watch, not GETs: {:?}",
        stats.kinds
    );
    let bound = 2 + 2 * (seconds / 290.0).ceil() as u64;
    assert!(
        total <= bound,
        "{total} requests in {seconds:.0} s (at most {bound})"
    );
    assert!(
        changes > total,
        "{changes} changes received for {total} requests"
    );
}

#[tokio::test]
#[ignore = "needs a cluster with the operator and the trainer image (scripts/e2e.sh)"]
async fn watch_shows_a_recovery_and_logs_keep_the_replaced_round() {
    let ns = TestNamespace::create("cli").await;
    let plugin = binary();
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let claim = "copy-checkpoints";
    ns.create_checkpoint_claim(claim).await;
    let file = manifest(&ns, &dir, claim);
    submit(&ns, &plugin, file.to_str().unwrap()).await;

    let (stats, exit, lines) = (dir.join("stats"), dir.join("exit"), dir.join("lines"));
    let command = format!(
        "env PATH='{}' kubectl ferrotrain watch {JOB} -n {} --stats 2>'{}'; echo $? >'{}'; \
         sleep 3600",
        path_with(&plugin),
        ns.name,
        stats.display(),
        exit.display()
    );
    let tmux = Tmux::start("watch", 160, 30, &command);
    let mut piped = watch_into_a_file(&ns, &plugin, &lines);

    let before = tmux
        .wait_screen("training under way", TRAIN_WAIT, |s| {
            step_on(s).is_some_and(|n| n >= 50)
        })
        .await;
    show("watch: before the kill", &before);
    assert!(
        before.contains("Running") && before.contains("restarts 0/5"),
        "{before}"
    );
    assert!(!before.contains("last failure"), "{before}");

    wait_spare(&ns.pods(), KILLED_POD).await;
    signal_local_rank(&ns.pods(), KILLED_POD, None, "KILL").await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    show("watch: a second after the kill", &tmux.screen());
    let recovered = wait_status(&ns.jobs(), JOB, "round 1 counted", WAIT, |s| s.round >= 1).await;
    let failure = recovered.last_failure.clone().expect("the failure");
    let during = tmux
        .wait_screen("the failure and its recovery", WAIT, |s| {
            s.contains("last failure: rank 1") && s.contains("steps trained twice")
        })
        .await;
    show("watch: the failure and its recovery", &during);
    assert!(
        during.contains("round 1") && during.contains("restarts 1/5"),
        "{during}"
    );
    let blamed = format!("(pod {KILLED_POD}) {}", failure.reason);
    assert!(during.contains(&blamed), "{during}");
    assert!(
        during.contains("recovery: round 1 resumed from step"),
        "{during}"
    );

    logs_of_the_replaced_round(&ns, &plugin, &failure);

    let end = tmux
        .wait_screen("the job's end", TRAIN_WAIT, |_| exit.is_file())
        .await;
    show("watch: the end", &end);
    let code = std::fs::read_to_string(&exit).unwrap();
    assert_eq!(code.trim(), "0", "watch exits 0 for a job that Succeeded");
    assert!(end.contains(&format!("{JOB} Succeeded")), "{end}");
    let (first, last) = (step_on(&before).unwrap(), step_on(&end).unwrap());
    assert!(last > first, "the bar advanced: {first} -> {last}");
    assert_eq!(last, MAX_STEPS);

    let piped_exit = piped.wait().unwrap();
    let lines_text = std::fs::read_to_string(&lines).unwrap();
    show("watch > file: a line per change", &lines_text);
    assert!(piped_exit.success(), "{piped_exit}");
    assert!(
        !lines_text.contains('\x1b') && lines_text.contains("last failure: rank 1"),
        "{lines_text}"
    );

    let finished = wait_status(&ns.jobs(), JOB, "Succeeded", WAIT, |s| {
        s.phase == Phase::Succeeded
    })
    .await;
    the_ledger(&ns, &plugin, &failure);
    the_watch_cost(&std::fs::read_to_string(&stats).unwrap(), finished.restarts);
}
