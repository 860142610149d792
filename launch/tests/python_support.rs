//! What launch_python.rs builds on: `ferrotrain-launch` started with its log kept, the ranks'
//! pids from it, the example's DDP script and its per-step log, what a fault cost.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Wall-clock seconds (what the script's log lines carry).
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The example's text: Multi30k's English captions (../shared/data).
pub fn data() -> PathBuf {
    repo().join("../shared/data/multi30k/train.en.gz")
}

/// The directory of torch for Python (scripts/setup-pytorch.sh), or None, said loudly: the
/// tests that need it (and the example's text) pass without running.
pub fn pytorch() -> Option<PathBuf> {
    match std::env::var_os("FERROTRAIN_PYTORCH") {
        Some(d) if Path::new(&d).join("torch").is_dir() && data().exists() => {
            Some(PathBuf::from(d))
        }
        _ => {
            eprintln!(
                "SKIPPED: FERROTRAIN_PYTORCH does not name torch for Python (scripts/setup-pytorch.sh; scripts/test.sh sets it), or ../shared/data/multi30k is missing"
            );
            None
        }
    }
}

/// A `ferrotrain-launch` of one node to start.
pub struct Launcher {
    cmd: Command,
    command: Vec<String>,
}

impl Launcher {
    pub fn new(nproc: usize) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotrain-launch"));
        cmd.args(["--nproc-per-node", &nproc.to_string(), "--master-port", "0"])
            .env("RUST_LOG", "debug")
            .env_remove("FERROTRAIN_JOB")
            .env_remove("FERROTRAIN_PORT_RANGE")
            .env_remove("FERROTRAIN_METRICS_PORT")
            .env("PYTHONPATH", repo().join("python"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Launcher {
            cmd,
            command: Vec::new(),
        }
    }

    pub fn env(mut self, k: &str, v: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn flags(mut self, flags: &[&str]) -> Self {
        self.cmd.args(flags);
        self
    }

    pub fn command(mut self, argv: &[&str]) -> Self {
        self.command = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn start(mut self) -> Run {
        self.cmd.args(&self.command);
        let mut child = self.cmd.spawn().expect("ferrotrain-launch");
        let log: Arc<Mutex<String>> = Arc::default();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        Run { child, log }
    }
}

/// A running launcher.
pub struct Run {
    pub child: Child,
    log: Arc<Mutex<String>>,
}

impl Run {
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The pid of global rank `rank` in round `round`, from the launcher's debug lines.
    pub fn pid_of(&self, round: u64, rank: usize) -> Option<u32> {
        let log = self.log();
        let marker = format!("agent: round {round}: started");
        // `started rank N (pid P)` lines come right before their round's `round R: started`.
        let end = log.find(&marker)?;
        let start = log[..end]
            .rfind("agent: round ")
            .filter(|_| round > 0)
            .map_or(0, |at| at);
        let want = format!("started rank {rank} (pid ");
        let at = log[start..end].rfind(&want)? + start + want.len();
        log[at..].split(')').next()?.parse().ok()
    }

    /// Waits for the launcher to exit; its exit code (killed after `limit`).
    pub fn wait(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the launcher ran past {limit:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the script's log has step `step`; the time it saw it.
    pub fn wait_for_step(&mut self, log: &Path, step: u64, limit: Duration) -> f64 {
        let deadline = Instant::now() + limit;
        loop {
            if read_steps(log).iter().any(|s| s.step >= step) {
                return now();
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the launcher ended:\n{}",
                self.log()
            );
            assert!(Instant::now() < deadline, "no step {step}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line of the example's per-step log.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Step {
    pub step: u64,
    pub loss: f64,
    pub time: f64,
}

pub fn read_steps(path: &Path) -> Vec<Step> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn distinct(steps: &[Step]) -> usize {
    steps
        .iter()
        .map(|s| s.step)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// The example's arguments: `steps` steps, its log at `log`, a small batch.
pub fn gpt_args(log: &Path, steps: u64) -> Vec<String> {
    let data = data();
    [
        "--data",
        data.to_str().unwrap(),
        "--steps",
        &steps.to_string(),
        "--log-file",
        log.to_str().unwrap(),
        "--eval-every",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The example under `ferrotrain-launch`, 2 ranks.
pub fn gpt(torch: &Path, log: &Path, steps: u64, extra: &[&str]) -> Launcher {
    let script = repo().join("examples/pytorch/gpt.py");
    let mut argv = vec!["python3".to_string(), script.to_string_lossy().into_owned()];
    argv.extend(gpt_args(log, steps));
    argv.extend(extra.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Launcher::new(2)
        .env("PYTHONPATH", pythonpath(torch))
        .env("OMP_NUM_THREADS", "1")
        .command(&argv)
}

pub fn pythonpath(torch: &Path) -> String {
    format!("{}:{}", torch.display(), repo().join("python").display())
}

/// torchrun (`python3 -m torch.distributed.run`) of `nproc` workers.
pub fn torchrun(torch: &Path, nproc: usize) -> Command {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        &nproc.to_string(),
    ])
    .env("PYTHONPATH", pythonpath(torch))
    .env("OMP_NUM_THREADS", "1")
    .stdout(Stdio::null());
    cmd
}

/// What a fault cost, from the script's log.
pub struct Faulted {
    pub next_step_seconds: f64,
    pub trained_twice: usize,
    pub last: u64,
    pub log: String,
    pub losses: Vec<(u64, f64)>,
}

impl Faulted {
    pub fn of(steps: &[Step], failed_at: f64, log: String) -> Self {
        let next = steps
            .iter()
            .find(|s| s.time > failed_at)
            .expect("a step after the fault");
        Faulted {
            next_step_seconds: next.time - failed_at,
            trained_twice: steps.len() - distinct(steps),
            last: steps.last().map_or(0, |s| s.step),
            losses: steps.iter().map(|s| (s.step, s.loss)).collect(),
            log,
        }
    }

    /// In place (one launcher, a round 1 of spares), healed from a peer, no step trained
    /// twice, the next step within 5 s (0.3-1.4 s here; the limit is for a loaded CI
    /// machine), and every step's loss that of the run without a fault.
    pub fn assert_healed(self, what: &str, unfaulted: &std::collections::BTreeMap<u64, f64>) {
        eprintln!(
            "{what}: next step {:.2} s after the fault, {} steps trained twice",
            self.next_step_seconds, self.trained_twice
        );
        let spares = "round 1: started 2 rank(s), 2 of them spares";
        assert!(self.log.contains(spares), "{what}: {}", self.log);
        assert!(
            self.log.contains("resuming from a peer's state"),
            "{what}: {}",
            self.log
        );
        assert_eq!(self.trained_twice, 0, "{what}: {}", self.log);
        assert_eq!(self.last, 80, "{what}");
        assert!(
            self.next_step_seconds < 5.0,
            "{what}: {}",
            self.next_step_seconds
        );
        for (step, loss) in &self.losses {
            assert_eq!(
                Some(loss),
                unfaulted.get(step),
                "{what}: step {step}'s loss"
            );
        }
    }
}
