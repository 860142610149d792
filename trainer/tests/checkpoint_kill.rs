//! kill -9 in the middle of a checkpoint save: the next run must resume from the previous
//! complete checkpoint, never from the half-written one.
//!
//! The parent tests re-run this test binary as a child (`kill_child_entry_point`, selected
//! with `--exact` and driven by environment variables). The child saves checkpoints and
//! reports on stdout how far it got; the parent SIGKILLs it and inspects the directory.
//! Every wait is bounded and the child is killed on every path (`Child` guard).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use ferrotrain_api::config::CheckpointPolicy;
use ferrotrain_trainer::checkpoint::{CheckpointStore, Named, SaveEvent, TrainerState, WriterId};
use tch::{Device, Kind, Tensor};

const ENV_ROOT: &str = "FERROTRAIN_TEST_KILL_ROOT";
const ENV_MODE: &str = "FERROTRAIN_TEST_KILL_MODE";
/// Child lines the parent listens to start with this.
const TAG: &str = "FTCHILD ";
/// 12M floats = 48 MB: big enough that a write takes a while.
const MODEL_FLOATS: i64 = 12 * 1024 * 1024;
const CHILD_TIMEOUT: Duration = Duration::from_secs(180);

fn policy() -> CheckpointPolicy {
    CheckpointPolicy {
        every_steps: 100,
        every_seconds: None,
        keep_latest: 2,
        keep_best: 1,
        store: None,
    }
}

/// Tensors whose every value is the step, so a reader can tell a checkpoint's content.
fn tensors(step: u64) -> (Named, Named) {
    let v = step as f64;
    let model = vec![
        (
            "encoder.embed.weight".to_string(),
            Tensor::full([MODEL_FLOATS], v, (Kind::Float, Device::Cpu)),
        ),
        (
            "decoder.out.bias".to_string(),
            Tensor::full([512], v, (Kind::Float, Device::Cpu)),
        ),
    ];
    let optimizer = vec![("adamw.step".to_string(), Tensor::from(step as i64))];
    (model, optimizer)
}

fn state(step: u64) -> TrainerState {
    TrainerState {
        step,
        samples: step * 10,
        epoch: 0,
        seed: 1,
        config_digest: "test".into(),
        world_size: 1,
        train_loss: None,
        eval_loss: None,
        eval_bleu: None,
        time: "2026-01-01T00:00:00Z".into(),
        train_seconds: 0.0,
        precision: None,
        loss_scale: None,
    }
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{TAG}{line}");
    let _ = out.flush();
}

/// The child's body; a no-op when run as an ordinary test.
#[test]
fn kill_child_entry_point() {
    let (Ok(root), Ok(mode)) = (std::env::var(ENV_ROOT), std::env::var(ENV_MODE)) else {
        return;
    };
    let root = Path::new(&root);
    let mut store = CheckpointStore::new(root, policy()).unwrap();
    if let Some(point) = mode.strip_prefix("hang-at:") {
        // One complete checkpoint, then a second save that stops at `point` until killed.
        let (m, o) = tensors(100);
        store.save(&m, &o, state(100)).unwrap();
        store.wait().unwrap();
        let point = point.to_string();
        store.set_save_hook(Arc::new(move |event: SaveEvent<'_>| {
            let name = match event {
                SaveEvent::Started { .. } => "started".to_string(),
                SaveEvent::FileWritten { file, .. } => format!("wrote:{file}"),
                SaveEvent::Renamed { .. } => "renamed".to_string(),
            };
            if name == point {
                say(&format!("paused {name}"));
                std::thread::sleep(CHILD_TIMEOUT);
                std::process::exit(3); // never outlive a parent that forgot us
            }
        }));
        let (m, o) = tensors(200);
        store.save(&m, &o, state(200)).unwrap();
        say("save returned");
        store.wait().unwrap();
        say("unreachable: the save completed");
    } else if mode == "loop" {
        // Saves back to back until killed. The tensors are refilled in place (cheap), so
        // most of each cycle is the background write the parent wants to interrupt.
        let (mut m, mut o) = tensors(0);
        for i in 1..=1000u64 {
            let step = i * 100;
            for (_, t) in m.iter_mut().chain(o.iter_mut()) {
                let _ = t.fill_(step as f64);
            }
            store.save(&m, &o, state(step)).unwrap();
            store.wait().unwrap();
            say(&format!("saved {step}"));
        }
    }
}

/// The child process; killed when dropped, whatever happened.
struct Child {
    child: std::process::Child,
    lines: Receiver<String>,
}

impl Child {
    fn spawn(root: &Path, mode: &str) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "kill_child_entry_point",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV_ROOT, root)
            .env(ENV_MODE, mode)
            .env("OMP_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Not a prefix: libtest may print "test kill_child_entry_point ... " first.
                if let Some(at) = line.find(TAG)
                    && tx.send(line[at + TAG.len()..].to_string()).is_err()
                {
                    break;
                }
            }
        });
        Child { child, lines }
    }

    /// The next child line, or a panic after `CHILD_TIMEOUT`.
    fn expect_line(&self, want_prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(CHILD_TIMEOUT) {
                Ok(line) if line.starts_with(want_prefix) => return line,
                Ok(line) => assert!(!line.starts_with("unreachable"), "{line}"),
                Err(e) => panic!("no {want_prefix:?} from the child within {CHILD_TIMEOUT:?}: {e}"),
            }
        }
    }

    fn kill9(&mut self) {
        // Child::kill sends SIGKILL on Unix.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Every value of the loaded model equals the step it claims.
fn assert_content_matches_step(dir: &Path) -> u64 {
    let loaded = CheckpointStore::load(dir).unwrap();
    let step = loaded.state.step;
    for (name, t) in &loaded.model {
        let (min, max) = (t.min().double_value(&[]), t.max().double_value(&[]));
        assert_eq!(
            (min, max),
            (step as f64, step as f64),
            "{name} in {}",
            dir.display()
        );
    }
    assert_eq!(loaded.model[0].1.numel() as i64, MODEL_FLOATS);
    assert_eq!(loaded.optimizer[0].1.int64_value(&[]), step as i64);
    step
}

fn killed_at(point: &str, expect_step: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("job");
    let mut child = Child::spawn(&root, &format!("hang-at:{point}"));
    child.expect_line(&format!("paused {point}"));
    child.kill9();

    let before = entries(&root);
    let leftovers = before
        .iter()
        .filter(|n| n.starts_with(".tmp-step-00000200-"))
        .count();
    assert_eq!(
        leftovers,
        usize::from(expect_step == 100),
        "{point}: {before:?}"
    );

    // The next writer (a later attempt) cleans up.
    let store = CheckpointStore::open_writer(&root, policy(), WriterId::new(1, "")).unwrap();
    let (dir, state) = store.latest().unwrap().expect("a complete checkpoint");
    assert_eq!(state.step, expect_step, "{point}: {before:?}");
    assert_eq!(assert_content_matches_step(&dir), expect_step);
    // The stale temp directory is gone after open_writer().
    assert!(
        entries(&root).iter().all(|n| !n.starts_with(".tmp-")),
        "{:?}",
        entries(&root)
    );
}

#[test]
fn killed_before_writing_resumes_from_the_previous_checkpoint() {
    killed_at("started", 100);
}

#[test]
fn killed_after_the_model_file_resumes_from_the_previous_checkpoint() {
    killed_at("wrote:model.safetensors", 100);
}

#[test]
fn killed_with_every_file_written_but_not_renamed_resumes_from_the_previous_checkpoint() {
    killed_at("wrote:trainer.json", 100);
}

#[test]
fn killed_right_after_the_rename_resumes_from_the_new_checkpoint() {
    killed_at("renamed", 200);
}

/// No hook: SIGKILL lands wherever the writer happens to be (writing, fsyncing, renaming,
/// deleting an old checkpoint for retention). Whatever latest() picks must load and hold
/// the content of the step it claims.
#[test]
fn killed_at_arbitrary_points_always_leaves_a_loadable_latest() {
    for (round, delay_ms) in [0u64, 60, 110, 130, 150, 170, 190, 220]
        .into_iter()
        .enumerate()
    {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("job");
        let mut child = Child::spawn(&root, "loop");
        let first = child.expect_line("saved ");
        assert_eq!(first, "saved 100");
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill9();
        let mut last_reported = 100;
        while let Ok(line) = child.lines.try_recv() {
            if let Some(s) = line.strip_prefix("saved ") {
                last_reported = s.parse().unwrap();
            }
        }
        let left = entries(&root);
        let store = CheckpointStore::new(&root, policy()).unwrap();
        let (dir, state) = store.latest().unwrap().expect("a complete checkpoint");
        eprintln!(
            "round {round}: killed after {delay_ms} ms, found {left:?}, resumed from {}",
            state.step
        );
        // Reported saves are durable; at most the one in flight may also have completed.
        assert!(
            state.step == last_reported || state.step == last_reported + 100,
            "round {round}: latest {} but the child last reported {last_reported}",
            state.step
        );
        assert_eq!(assert_content_matches_step(&dir), state.step);
        let complete = store.complete().unwrap();
        assert!(
            complete.len() <= 3,
            "retention keeps 2 latest + 1 best: {complete:?}"
        );
    }
}
