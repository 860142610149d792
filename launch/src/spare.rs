//! Spare ranks: an in-place restart without the trainer's start-up. A trainer process spends
//! about 0.4 s of CPU before `main` runs (libtorch registers its thousands of operators; here
//! `ferrotrain --version` takes 0.40-0.56 s), a third of a whole in-place restart on an idle
//! machine and more on a busy one. So while a round trains, the agent starts one spare per
//! local rank for the next round ([`Spares::start`], a few seconds into the round, so that it
//! does not slow the round's own start): `ferrotrain run` with the next round's likely
//! environment and [`env::FERROTRAIN_SPARE`] set. The spare loads libtorch and its config,
//! picks OpenMP's wait policy (which may start it again), then waits on its stdin
//! ([`become_rank_if_spare`], process name `ft-spare`). When the round ends, the next one
//! hands each spare the round's real environment as one JSON line ([`Spare::go`]) and
//! supervises it as the rank; a spare that is gone is replaced by a fresh process. EOF on its
//! stdin (the agent dropped it: the job ended) ends a spare quietly, and like every rank it
//! dies with its launcher (PR_SET_PDEATHSIG).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

use ferrotrain_api::env;

use crate::output::Output;
use crate::spawn::{Spawn, rank_command, rank_env};

/// A spare's process name while it waits (`ps`, `pgrep`; at most 15 bytes).
pub const SPARE_NAME: &str = "ft-spare";

/// How long into a round (or a single node's attempt) its spares start: after its own
/// start-up, which they would slow down (a restart sooner than this starts fresh processes).
const SPARES_AFTER: Duration = Duration::from_secs(3);

/// Starts the next round's spares once, [`SPARES_AFTER`] into a round.
pub struct SpareStart {
    wanted: bool,
    round_started: Instant,
    pub started: Option<Spares>,
}

impl SpareStart {
    pub fn new(wanted: bool) -> Self {
        SpareStart {
            wanted,
            round_started: Instant::now(),
            started: None,
        }
    }

    pub fn when_due(&mut self, next: &Spawn<'_>) {
        if !self.wanted || self.round_started.elapsed() < SPARES_AFTER {
            return;
        }
        self.wanted = false;
        match Spares::start(next) {
            Ok(spares) => self.started = Some(spares),
            Err(e) => tracing::warn!("launch: no spare ranks for the next restart: {e}"),
        }
    }
}

/// A trainer process waiting to become a rank of the next round.
pub struct Spare {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    /// Its output, labelled as the spare's until the round hands it a rank.
    output: Option<Output>,
}

/// One spare per local rank (by local rank), or none where starting one failed.
pub struct Spares(Vec<Option<Spare>>);

impl Spares {
    /// A spare for every local rank the group `next` would start, with its environment.
    pub fn start(next: &Spawn<'_>) -> std::io::Result<Spares> {
        let mut spares = Vec::new();
        for local_rank in 0..next.args.nproc_per_node {
            let (_, _, vars) = rank_env(next, local_rank);
            let mut cmd = rank_command(next, &vars);
            // Its own termination log until it is handed a rank: whatever a spare says before
            // then is not the running rank's message.
            let log = next
                .logs
                .join(format!("spare-{local_rank}.termination-log"));
            cmd.env(env::FERROTRAIN_SPARE, "1")
                .env(env::FERROTRAIN_TERMINATION_LOG, log)
                .stdin(Stdio::piped());
            let mut child = cmd.spawn()?;
            let stdin = child.stdin.take();
            let output = Output::of_spare(&mut child, local_rank);
            tracing::debug!(
                "launch: spare for local rank {local_rank} (pid {})",
                child.id()
            );
            spares.push(Some(Spare {
                child: Some(child),
                stdin,
                output: Some(output),
            }));
        }
        Ok(Spares(spares))
    }

    /// Waits until every spare trainer is ready (it names itself [`SPARE_NAME`] once libtorch
    /// is loaded; a script's spare does so before its imports) or `deadline`; whether they
    /// all were.
    /// A spare that ended counts as ready: the round starts a fresh process for it.
    pub fn wait_ready(&mut self, deadline: Instant) -> bool {
        loop {
            let ready = self.0.iter_mut().flatten().all(Spare::ready);
            if ready || Instant::now() >= deadline || crate::signals::received() != 0 {
                return ready;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The spare of local rank `local_rank`, if there is one.
    pub fn take(&mut self, local_rank: usize) -> Option<Spare> {
        self.0.get_mut(local_rank).and_then(Option::take)
    }
}

impl Spare {
    /// Done starting: waiting on its stdin under [`SPARE_NAME`], or gone.
    fn ready(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        std::fs::read(format!("/proc/{}/comm", child.id()))
            .map_or(true, |comm| comm.trim_ascii_end() == SPARE_NAME.as_bytes())
    }

    /// Hands the spare the round's environment (`vars`): it becomes the rank, whose output
    /// the caller assigns to its round. An error when it is gone (it exited, or its stdin is
    /// closed); it is killed then.
    pub fn go(mut self, vars: &[(&'static str, String)]) -> std::io::Result<(Child, Output)> {
        let mut child = self.child.take().expect("a spare has its process");
        let mut stdin = self.stdin.take().expect("a spare has its stdin");
        let output = self.output.take().expect("a spare has its output");
        let handed = match child.try_wait()? {
            Some(status) => Err(std::io::Error::other(format!("the spare ended: {status}"))),
            None => {
                let map: BTreeMap<&str, &str> =
                    vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let mut line = serde_json::to_string(&map).map_err(std::io::Error::other)?;
                line.push('\n');
                stdin.write_all(line.as_bytes())
            }
        };
        drop(stdin);
        match handed {
            Ok(()) => Ok((child, output)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// In a rank process: when it was started as a spare, names itself [`SPARE_NAME`], waits for
/// the round's environment on stdin, sets it and returns true; EOF (no round for it) exits
/// the process with 0. False for a rank started directly.
pub fn become_rank_if_spare() -> std::io::Result<bool> {
    if std::env::var_os(env::FERROTRAIN_SPARE).is_none() {
        return Ok(false);
    }
    set_process_name(SPARE_NAME);
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        std::process::exit(0);
    }
    let vars: BTreeMap<String, String> = serde_json::from_str(&line)
        .map_err(|e| std::io::Error::other(format!("the spare's round environment: {e}")))?;
    // SAFETY: no other thread of this process reads the environment: nothing has started one
    // yet (logging writes on this thread; libtorch's and OpenMP's pools start with the first
    // parallel work, after this).
    unsafe {
        for (name, value) in &vars {
            std::env::set_var(name, value);
        }
        std::env::remove_var(env::FERROTRAIN_SPARE);
    }
    set_process_name("ferrotrain");
    Ok(true)
}

/// This process's name (/proc/self/comm): what `ps` and `pgrep` show.
fn set_process_name(name: &str) {
    #[cfg(target_os = "linux")]
    {
        let mut bytes = [0u8; 16];
        let n = name.len().min(15);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, bytes.as_ptr());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = name;
}
