//! `kubectl ferrotrain` as a person runs it: the plugin's binary (built from this tree), run
//! plainly for its output and exit code, or in a real terminal, a tmux session of a known size
//! whose screen is read back as text (`capture-pane`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The plugin's binary, `target/debug/kubectl-ferrotrain`: built by this call (a no-op when
/// it is current), except under FERROTRAIN_E2E_PREBUILT=1, where scripts/test.sh's
/// `cargo nextest run --workspace` has just built it (building it alone would build its
/// dependencies again with other features).
pub fn binary() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let binary = target.join("debug").join("kubectl-ferrotrain");
    if std::env::var("FERROTRAIN_E2E_PREBUILT").as_deref() != Ok("1") {
        let status = Command::new("cargo")
            .args(["build", "-q", "-p", "kubectl-ferrotrain"])
            .current_dir(&root)
            .status()
            .expect("cargo build -p kubectl-ferrotrain");
        assert!(
            status.success(),
            "cargo build -p kubectl-ferrotrain: {status}"
        );
    }
    assert!(
        binary.is_file(),
        "{} is not built (cargo build -p kubectl-ferrotrain)",
        binary.display()
    );
    binary
}

/// PATH with the plugin's directory first: what makes `kubectl ferrotrain` run it.
pub fn path_with(binary: &Path) -> String {
    let dir = binary.parent().expect("the binary's directory");
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// What a run printed and how it exited.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `kubectl ferrotrain ARGS` (kubectl finds the plugin on PATH).
pub fn kubectl_ferrotrain(binary: &Path, args: &[&str]) -> Ran {
    let out = Command::new("kubectl")
        .arg("ferrotrain")
        .args(args)
        .env("PATH", path_with(binary))
        .output()
        .expect("kubectl");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A tmux session on a server of its own, killed when dropped.
pub struct Tmux {
    socket: String,
    session: String,
}

impl Tmux {
    /// Starts `command` (a shell command line) in a detached session of `width` x `height`.
    pub fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("ferrotrain-e2e-{}-{name}", std::process::id()),
            session: name.to_string(),
        };
        let (w, h) = (width.to_string(), height.to_string());
        let status = Command::new("tmux")
            .args(["-L", &tmux.socket, "new-session", "-d", "-s", name])
            .args(["-x", &w, "-y", &h, command])
            .status()
            .expect("tmux (scripts/e2e.sh installs it)");
        assert!(status.success(), "tmux new-session: {status}");
        tmux
    }

    /// The screen's text, without the blank lines at its end.
    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "capture-pane",
                "-p",
                "-t",
                &self.session,
            ])
            .output()
            .expect("tmux capture-pane");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        let end = lines
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |i| i + 1);
        lines[..end].join("\n")
    }

    /// The screen once `done` holds for it (polled every half second), or a panic after
    /// `limit` naming `what` and the last screen.
    pub async fn wait_screen(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                started.elapsed() < limit,
                "timed out after {limit:?} waiting for the screen to show {what}; it shows:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

/// The step of a progress line on a screen (`... step 1450/3000 48% ...`).
pub fn step_on(screen: &str) -> Option<u64> {
    screen.split("step ").skip(1).find_map(|rest| {
        let (number, after) = rest.split_once('/')?;
        after
            .starts_with(|c: char| c.is_ascii_digit())
            .then_some(())?;
        number.parse().ok()
    })
}

/// What `watch --stats` printed.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchStats {
    /// API requests by kind (list, watch, ...).
    pub kinds: Vec<(String, u64)>,
    /// Seconds the command ran.
    pub seconds: f64,
    /// Changes of the job it received.
    pub changes: u64,
}

impl WatchStats {
    /// Requests in all.
    pub fn total(&self) -> u64 {
        self.kinds.iter().map(|(_, n)| n).sum()
    }
}

/// The counts of a `--stats` line: `kubectl-ferrotrain: 2 API requests in 95.1 s (0.021/s):
/// 1 list, 1 watch; 37 changes of the job received`.
pub fn stats_of(line: &str) -> Option<WatchStats> {
    let (_, rest) = line.split_once(" API request")?;
    let rest = rest.trim_start_matches('s').strip_prefix(" in ")?;
    let (seconds, rest) = rest.split_once(" s (")?;
    let (_, rest) = rest.split_once("): ")?;
    let (kinds, changes) = rest.split_once("; ")?;
    let kinds = kinds
        .split(", ")
        .filter_map(|k| {
            let (n, kind) = k.split_once(' ')?;
            Some((kind.to_string(), n.parse().ok()?))
        })
        .collect();
    Some(WatchStats {
        kinds,
        seconds: seconds.parse().ok()?,
        changes: changes.split(' ').next()?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_of_the_progress_line() {
        let screen = "copy  Running  attempt 0, round 1\n\
                      [====>  ] step 1450/3000 48%  ETA 43s\n\
                      recovery: round 1 resumed from step 303 (state from peers)";
        assert_eq!(step_on(screen), Some(1450));
        assert_eq!(step_on("resumed from step 303 (peers)"), None);
    }

    #[test]
    fn the_stats_line() {
        let line = "kubectl-ferrotrain: 2 API requests in 95.1 s (0.021/s): 1 list, 1 watch; \
                    37 changes of the job received";
        let stats = stats_of(line).unwrap();
        assert_eq!(
            stats.kinds,
            [("list".to_string(), 1), ("watch".to_string(), 1)]
        );
        assert_eq!((stats.seconds, stats.changes, stats.total()), (95.1, 37, 2));
        assert_eq!(stats_of("nothing"), None);
    }
}
