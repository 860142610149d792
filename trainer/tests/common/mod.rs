//! What the trainer's integration tests build from: the binary with a clean environment,
//! child processes that are killed when their guard drops (also when the test panics) with
//! every wait bounded, the configs the tests train, fake rank programs for the launcher, and
//! the rank environment of an in-process gang.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ferrotrain_api::config::DistributedConfig;
use ferrotrain_trainer::distributed::RankEnv;

/// A small tmpfs, for a disk that fills up (root only; the trainer's unit tests share it).
#[path = "../../src/tmpfs.rs"]
pub mod tmpfs;

/// The binary under test.
pub fn ferrotrain() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrotrain"));
    cmd.env("OMP_WAIT_POLICY", "PASSIVE")
        .env("RUST_LOG", "info")
        .env_remove("FERROTRAIN_CONFIG")
        .env_remove("FERROTRAIN_JOB")
        .env_remove("FERROTRAIN_CHECKPOINT_DIR")
        .env_remove("FERROTRAIN_METRICS_PORT")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT");
    cmd
}

/// `ferrotrain run --config <config> --checkpoint-dir <ckpt>`.
pub fn run_command(config: &Path, ckpt: &Path) -> Command {
    let mut cmd = ferrotrain();
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .arg("--checkpoint-dir")
        .arg(ckpt);
    cmd
}

/// `ferrotrain launch --config <config>`: `nproc` local ranks on an ephemeral port, no
/// restarts, one OpenMP thread each, checkpoints under `ckpt`, stderr to `log` (what the
/// multi-rank tests start).
pub fn launch_command(config: &Path, nproc: usize, ckpt: &Path, log: &Path) -> Command {
    let mut cmd = ferrotrain();
    cmd.arg("launch")
        .arg("--config")
        .arg(config)
        .args(["--nproc-per-node", &nproc.to_string(), "--master-port", "0"])
        .args(["--max-restarts", "0"])
        .env("FERROTRAIN_CHECKPOINT_DIR", ckpt)
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the log file"));
    cmd
}

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct Guard(pub Option<Child>);

impl Guard {
    pub fn spawn(mut cmd: Command) -> Guard {
        cmd.stdin(Stdio::null());
        Guard(Some(cmd.spawn().expect("spawn ferrotrain")))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Waits at most `limit` for the process to exit.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.0.as_mut().expect("running");
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process started as the leader of a process group of its own (a launcher and its
/// ranks): the whole group is SIGKILLed and reaped when this drops, also when the test
/// panics.
pub struct ProcessGroup {
    child: Child,
    log: Option<PathBuf>,
}

impl ProcessGroup {
    /// Spawns `cmd` in a new process group; `log` is the file its stderr goes to, quoted
    /// when a wait times out.
    pub fn spawn(mut cmd: Command, log: Option<PathBuf>) -> ProcessGroup {
        cmd.stdin(Stdio::null()).process_group(0);
        ProcessGroup {
            child: cmd.spawn().expect("spawn"),
            log,
        }
    }

    /// The leader's pid (and so the group id).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the leader to exit; panics, quoting the log, after `within`.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the process did not finish within {within:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stderr log so far ("" without one).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Sends `signal` to the leader only.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling the process we started; it is reaped only in drop.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the process group created for this process.
        unsafe {
            libc::kill(-self.pid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Polls `cond` every 50 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// (step, loss) of every line of a job's train-log.jsonl that has a loss; a step logged
/// again after a resume replaces the earlier line.
pub fn losses(job_dir: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(job_dir.join("train-log.jsonl")).unwrap_or_default();
    let mut by_step = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue; // a line cut by SIGKILL
        };
        if let (Some(step), Some(loss)) = (v["step"].as_u64(), v["loss"].as_f64()) {
            by_step.insert(step, loss);
        }
    }
    by_step.into_iter().collect()
}

/// Every loss line in order, including steps replayed after a resume.
pub fn loss_lines(job_dir: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(job_dir.join("train-log.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64()?)))
        .collect()
}

/// A small copy-task config: trains in seconds on one thread, in fp32 (`precision: auto`
/// would follow the machine's bf16 units; a test that wants another precision replaces the
/// line).
pub fn copy_config(max_steps: u64, checkpoint_every: u64, extra: &str) -> String {
    format!(
        "task: copy\nseed: 7\nmaxSteps: {max_steps}\nthreads: 1\n\
         copy: {{symbols: 12, minLength: 2, maxLength: 8, trainSamples: 2000, validSamples: 40}}\n\
         model: {{dModel: 32, heads: 2, encoderLayers: 1, decoderLayers: 1, ffnDim: 64, dropout: 0.1, maxPositions: 16}}\n\
         batch: {{maxTokens: 256}}\n\
         optimizer: {{lr: 0.003}}\n\
         schedule: {{warmupSteps: 10}}\n\
         eval: {{everySteps: 0, maxSentences: 20}}\n\
         checkpoint: {{everySteps: {checkpoint_every}, keepLatest: 2}}\n\
         logEverySteps: 10\nprecision: fp32\n{extra}"
    )
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write test file");
    path
}

/// A parallel corpus the tests can learn: a tiny word-for-word "English -> German".
pub fn write_corpus(dir: &Path, pairs: usize) -> (String, String) {
    let en = [
        "the", "a", "red", "small", "dog", "cat", "runs", "sleeps", "in", "park", "house", "big",
    ];
    let de = [
        "der", "ein", "rote", "kleine", "Hund", "Katze", "läuft", "schläft", "im", "Park", "Haus",
        "große",
    ];
    let mut src = String::new();
    let mut tgt = String::new();
    let mut x: u64 = 12345;
    for _ in 0..pairs {
        let len = 3 + (x % 5) as usize;
        let mut s = Vec::new();
        let mut t = Vec::new();
        for _ in 0..len {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let w = (x >> 33) as usize % en.len();
            s.push(en[w]);
            t.push(de[w]);
        }
        src.push_str(&format!("{} .\n", s.join(" ")));
        tgt.push_str(&format!("{} .\n", t.join(" ")));
    }
    let (s, t) = (dir.join("train.en"), dir.join("train.de"));
    std::fs::write(&s, src).unwrap();
    std::fs::write(&t, tgt).unwrap();
    (s.display().to_string(), t.display().to_string())
}

/// The copy job the multi-rank tests train: one layer each side, no dropout and no label
/// smoothing, no evaluation. `max_tokens` is per rank; `global_tokens`, when set, is the
/// whole gang's batch (`batch.globalTokens`).
pub struct GangCopyJob {
    pub seed: u64,
    pub max_steps: u64,
    pub train_samples: u64,
    pub valid_samples: u64,
    pub max_tokens: usize,
    pub global_tokens: Option<usize>,
    pub checkpoint_every: u64,
    pub keep_latest: u32,
    pub collective_timeout_seconds: u64,
    pub log_every: u64,
}

impl GangCopyJob {
    pub fn yaml(&self) -> String {
        let GangCopyJob {
            seed,
            max_steps,
            train_samples,
            valid_samples,
            max_tokens,
            global_tokens,
            checkpoint_every,
            keep_latest,
            collective_timeout_seconds,
            log_every,
        } = self;
        let global_tokens = global_tokens
            .map(|g| format!("\n  globalTokens: {g}"))
            .unwrap_or_default();
        format!(
            "task: copy
seed: {seed}
maxSteps: {max_steps}
copy:
  symbols: 12
  minLength: 3
  maxLength: 8
  trainSamples: {train_samples}
  validSamples: {valid_samples}
model:
  dModel: 32
  heads: 2
  encoderLayers: 1
  decoderLayers: 1
  ffnDim: 64
  dropout: 0.0
  maxPositions: 16
batch:
  maxTokens: {max_tokens}{global_tokens}
optimizer:
  lr: 0.003
schedule:
  kind: inverseSqrt
  warmupSteps: 10
labelSmoothing: 0.0
eval:
  everySteps: 0
  beamSize: 1
checkpoint:
  everySteps: {checkpoint_every}
  keepLatest: {keep_latest}
distributed:
  collectiveTimeoutSeconds: {collective_timeout_seconds}
  rendezvousTimeoutSeconds: 30
logEverySteps: {log_every}
precision: fp32
"
        )
    }
}

/// The config a launcher test with fake ranks passes on (the ranks never read it).
pub const FAKE_RANKS_CONFIG: &str = "task: copy\nmaxSteps: 1\n";

/// A fake rank program, `dir/rank.sh`, for launcher tests without libtorch, and
/// `dir/job.yaml`. Each start of a rank writes `record` (shell words, expanded) to
/// `$FAKE_OUT/start-$RANK-$<start>` and its pid to `$FAKE_OUT/pid-$RANK-$<start>`, where
/// `start` names the variable that tells starts apart (FERROTRAIN_ATTEMPT,
/// FERROTRAIN_ROUND), then runs `body`.
pub fn fake_ranks(dir: &Path, record: &str, start: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("rank.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nout=\"$FAKE_OUT\"\n\
             echo \"{record}\" > \"$out/start-$RANK-${start}\"\n\
             echo $$ > \"$out/pid-$RANK-${start}\"\n{body}\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(dir, "job.yaml", FAKE_RANKS_CONFIG);
    script
}

/// A port nothing listens on (the OS's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rank `rank` of `world_size`, all on this machine, meeting at 127.0.0.1:`port` with
/// `token`, attempt 0.
pub fn rank_env(rank: usize, world_size: usize, port: u16, token: &str) -> RankEnv {
    RankEnv {
        rank,
        world_size,
        local_rank: rank,
        local_world_size: world_size,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        attempt: 0,
        token: token.into(),
        round: 0,
        store_hosted: false,
        virtual_world: None,
        batch_world: None,
        port_range: None,
        heal_dir: None,
    }
}

/// The distributed settings of a gang: `backend` ("ring", "nccl") and its timeouts.
pub fn distributed(
    backend: &str,
    rendezvous_seconds: u64,
    collective_seconds: u64,
) -> DistributedConfig {
    serde_json::from_value(serde_json::json!({
        "backend": backend,
        "rendezvousTimeoutSeconds": rendezvous_seconds,
        "collectiveTimeoutSeconds": collective_seconds,
    }))
    .unwrap()
}

/// `GET path` on 127.0.0.1:`port`: the body of a 200 answer, None for anything else.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The JSON `/progress` serves on 127.0.0.1:`port`, if it answers.
pub fn progress(port: u16) -> Option<serde_json::Value> {
    serde_json::from_str(&http_get(port, "/progress")?).ok()
}

/// The pid of launcher `launcher`'s child that is rank `rank` now (its environment has
/// `RANK=<rank>` and it is no waiting spare).
pub fn rank_pid(launcher: i32, rank: usize) -> Option<i32> {
    let want = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: i32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let mut vars = environ.split(|&b| b == 0);
        let spare = environ
            .split(|&b| b == 0)
            .any(|v| v.starts_with(b"FERROTRAIN_SPARE="));
        let ranked = vars.any(|v| v == want.as_bytes());
        (ppid == launcher && ranked && !spare).then_some(pid)
    })
}
