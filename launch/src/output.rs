//! Every rank's output, kept per round. Each line a rank writes (stdout or stderr) goes on to
//! the launcher's stderr prefixed with the round and the rank it belongs to (`[round 1 rank
//! 3] ...`), so that a pod's log tells its rounds and ranks apart; into a file per round and
//! rank in the output directory ([`dir`]: `round-<r>/rank-<n>.log`, the last
//! [`MAX_FILE_BYTES`] of it), which `kubectl ferrotrain logs` reads through the pod after the
//! round was replaced; and its last [`TAIL_LINES`] lines stay in memory for the report of a
//! round the rank ended (its verdict, the job's `lastFailure`). A spare's output, before it
//! is handed a rank, is labelled as the spare's.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrotrain_api::env;
use ferrotrain_api::output::{DEFAULT_DIR_NAME, OutputLabel as Label};

/// The most a round's file of one rank keeps: its last MiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Lines of a rank's output kept for its round's report.
pub const TAIL_LINES: usize = 10;
/// The longest line kept for a report (a longer one is cut, on a character boundary).
pub const TAIL_LINE_BYTES: usize = 240;
/// How long a rank that exited may take to flush its last lines through the pipes.
const DRAIN: Duration = Duration::from_millis(200);

/// Where ranks' output is kept: FERROTRAIN_OUTPUT_DIR, else `ferrotrain-output` in the
/// temporary directory (`/tmp/ferrotrain-output` in a pod).
pub fn dir() -> PathBuf {
    std::env::var_os(env::FERROTRAIN_OUTPUT_DIR)
        .filter(|d| !d.is_empty())
        .map_or_else(
            || std::env::temp_dir().join(DEFAULT_DIR_NAME),
            PathBuf::from,
        )
}

/// The file of rank `rank` in round `round` (none: a launcher without rounds).
pub fn file_of(dir: &Path, round: Option<u64>, rank: usize) -> PathBuf {
    let file = Label::Rank { round, rank }.file();
    dir.join(file.expect("a rank has a file"))
}

struct State {
    label: Label,
    file: Option<(File, PathBuf)>,
    written: u64,
    tail: VecDeque<String>,
}

impl State {
    fn line(&mut self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{} {line}", self.label);
        drop(err);
        if let Some((file, path)) = &mut self.file {
            if writeln!(file, "{line}").is_ok() {
                self.written += line.len() as u64 + 1;
            }
            if self.written > 2 * MAX_FILE_BYTES {
                self.written = keep_last(file, path).unwrap_or(self.written);
            }
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(cut(line, TAIL_LINE_BYTES));
    }
}

/// Rewrites `path` (open for appending as `file`) with its last [`MAX_FILE_BYTES`]; returns
/// its new size.
fn keep_last(file: &mut File, path: &Path) -> std::io::Result<u64> {
    let mut read = File::open(path)?;
    let size = read.metadata()?.len();
    read.seek(SeekFrom::Start(size.saturating_sub(MAX_FILE_BYTES)))?;
    let mut last = Vec::new();
    read.read_to_end(&mut last)?;
    // From the first whole line.
    let from = last.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &last[from..])?;
    std::fs::rename(&tmp, path)?;
    *file = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((last.len() - from) as u64)
}

fn cut(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    let mut at = max;
    while !line.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}...", &line[..at])
}

/// One process's output: its forwarding threads and where its lines go.
pub struct Output {
    state: Arc<Mutex<State>>,
    readers: Vec<JoinHandle<()>>,
}

impl Output {
    /// Forwards `child`'s piped stdout and stderr as rank `rank`'s of round `round`, into
    /// `dir`.
    pub fn of_rank(child: &mut Child, dir: &Path, round: Option<u64>, rank: usize) -> Self {
        let mut out = Self::new(Label::Rank { round, rank });
        out.assign(dir, round, rank);
        out.read_from(child);
        out
    }

    /// Forwards a spare's output (local rank `local_rank`) until it is handed a rank.
    pub fn of_spare(child: &mut Child, local_rank: usize) -> Self {
        let mut out = Self::new(Label::Spare { local_rank });
        out.read_from(child);
        out
    }

    fn new(label: Label) -> Self {
        let state = Arc::new(Mutex::new(State {
            label,
            file: None,
            written: 0,
            tail: VecDeque::new(),
        }));
        Output {
            state,
            readers: Vec::new(),
        }
    }

    /// Starts the threads that read `child`'s piped stdout and stderr.
    fn read_from(&mut self, child: &mut Child) {
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for pipe in pipes.into_iter().flatten() {
            let state = self.state.clone();
            let spawned = std::thread::Builder::new()
                .name("rank-output".into())
                .spawn(move || {
                    for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
                        let line = String::from_utf8_lossy(&line);
                        state
                            .lock()
                            .expect("output lock")
                            .line(line.trim_end_matches('\r'));
                    }
                });
            match spawned {
                Ok(handle) => self.readers.push(handle),
                Err(e) => tracing::warn!("launch: a rank's output is not forwarded: {e}"),
            }
        }
    }

    /// From now on the lines are rank `rank`'s of round `round`, kept in their file in `dir`.
    pub fn assign(&self, dir: &Path, round: Option<u64>, rank: usize) {
        let path = file_of(dir, round, rank);
        let file = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| File::create(&path))
            .inspect_err(|e| tracing::warn!("launch: {}: {e}", path.display()))
            .ok();
        let mut state = self.state.lock().expect("output lock");
        state.label = Label::Rank { round, rank };
        state.file = file.map(|f| (f, path));
        state.written = 0;
        state.tail.clear();
    }

    /// The last lines of its current rank, once what the exited process wrote has come
    /// through (bounded: [`DRAIN`]).
    pub fn last_lines(&self) -> Vec<String> {
        let deadline = Instant::now() + DRAIN;
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.state
            .lock()
            .expect("output lock")
            .tail
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn run(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_ranks_lines_go_to_its_rounds_file_and_its_last_ones_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        // stdout and stderr are read by a thread each: their lines interleave as they come.
        let mut child = run("echo from stdout; sleep 0.3; \
                             for i in $(seq 1 25); do echo line $i >&2; done; echo oops >&2; exit 3");
        let out = Output::of_rank(&mut child, dir.path(), Some(2), 5);
        child.wait().unwrap();
        let last = out.last_lines();
        let expected: Vec<String> = (17..=25)
            .map(|i| format!("line {i}"))
            .chain(["oops".to_string()])
            .collect();
        assert_eq!(last, expected);
        let kept = std::fs::read_to_string(dir.path().join("round-2/rank-5.log")).unwrap();
        assert_eq!(kept.lines().filter(|l| l.starts_with("line ")).count(), 25);
        assert_eq!(kept.lines().next(), Some("from stdout"));
    }

    #[test]
    fn a_spare_handed_a_rank_keeps_only_that_rounds_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = run("echo starting; read x; echo trained $x");
        let mut stdin = child.stdin.take().unwrap();
        let out = Output::of_spare(&mut child, 1);
        // The spare's first line comes before it is a rank.
        std::thread::sleep(Duration::from_millis(100));
        out.assign(dir.path(), Some(7), 3);
        writeln!(stdin, "round 7").unwrap();
        drop(stdin);
        child.wait().unwrap();
        let last = out.last_lines();
        assert_eq!(last, ["trained round 7"], "{last:?}");
        let kept = std::fs::read_to_string(file_of(dir.path(), Some(7), 3)).unwrap();
        assert_eq!(kept, "trained round 7\n");
    }

    #[test]
    fn a_file_keeps_its_last_mib_from_a_whole_line_and_a_long_line_is_cut_for_reports() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.log");
        let line = "x".repeat(999);
        let mut file = File::create(&path).unwrap();
        for _ in 0..3000 {
            writeln!(file, "{line}").unwrap();
        }
        let size = keep_last(&mut file, &path).unwrap();
        assert!(
            size <= MAX_FILE_BYTES && size > MAX_FILE_BYTES - 2000,
            "{size}"
        );
        let kept = std::fs::read_to_string(&path).unwrap();
        assert!(kept.lines().all(|l| l.len() == 999));
        assert_eq!(cut(&"é".repeat(200), 241).len(), 240 + 3);
    }
}
