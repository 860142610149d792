//! Processes the fleet bench starts (the operators, the hollow nodes) and the CPU and memory of
//! any process on this machine, read from /proc.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Clock ticks per second of /proc/<pid>/stat's times (100 on every Linux this runs on).
const TICKS: f64 = 100.0;

/// CPU seconds (user + system) and resident bytes of a process, None when it is gone.
pub fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((ticks / TICKS, rss_kb * 1024))
}

/// The whole machine's busy CPU seconds (all cores) from /proc/stat.
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return 0.0;
    };
    let v: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
    let busy: f64 =
        v.iter().take(8).sum::<f64>() - v.get(3).unwrap_or(&0.0) - v.get(4).unwrap_or(&0.0);
    busy / TICKS
}

/// The pid in a cluster kit pid file (`<FTC_DIR>/run/<name>.pid`: "PID STARTTIME").
pub fn kit_pid(name: &str) -> Option<u32> {
    let dir = std::env::var("FTC_DIR").unwrap_or_else(|_| "/var/lib/ferrotrain-cluster".into());
    let text =
        std::fs::read_to_string(Path::new(&dir).join("run").join(format!("{name}.pid"))).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// A child process: its stdout lines arrive on a channel and, with its stderr, in a file; killed
/// (SIGKILL) when dropped unless it already exited.
pub struct Proc {
    pub name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `program args...` with these extra environment variables; stderr to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: &Path,
    ) -> Result<Proc, String> {
        // One file, appended to by the child's stderr and by the copy of its stdout below.
        let opened = |log: &Path| {
            std::fs::File::create(log)?;
            std::fs::OpenOptions::new().append(true).open(log)
        };
        let stderr = opened(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut copy = stderr
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .stdin(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let stdout = child.stdout.take().expect("a piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // Every line goes to the log too (the operator logs to stdout); the channel only
            // while someone may still wait for a line.
            let mut listening = true;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(copy, "{line}");
                listening = listening && tx.send(line).is_ok();
            }
        });
        Ok(Proc {
            name: name.to_string(),
            child,
            lines,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for a stdout line starting with `prefix`; returns the rest of it.
    pub fn wait_line(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let started = Instant::now();
        loop {
            let left = limit.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{}: no line '{prefix}' within {limit:?}",
                        self.name
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    return Err(format!("{} exited ({status}) before '{prefix}'", self.name));
                }
            }
        }
    }

    /// SIGTERM (kill(1): no unsafe code here).
    pub fn terminate(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
    }

    /// Waits (bounded) for the process to exit; true when it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        self.terminate();
        if !self.wait_exit(grace) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A process's CPU and memory between two readings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// CPU seconds per second over the window (1.0 = one core).
    pub cores: f64,
    /// Resident memory at the end, bytes.
    pub rss: u64,
}

/// Reads `usage` now; call `.since(earlier)` on a later reading.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    at: Instant,
    cpu: f64,
    rss: u64,
}

impl Reading {
    pub fn of(pid: u32) -> Option<Reading> {
        let (cpu, rss) = usage(pid)?;
        Some(Reading {
            at: Instant::now(),
            cpu,
            rss,
        })
    }

    pub fn since(&self, earlier: &Reading) -> Usage {
        let seconds = (self.at - earlier.at).as_secs_f64().max(1e-9);
        Usage {
            cores: (self.cpu - earlier.cpu) / seconds,
            rss: self.rss,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let (cpu, rss) = usage(std::process::id()).unwrap();
        assert!(cpu >= 0.0);
        assert!(rss > 1 << 20, "{rss}");
        assert!(machine_busy_seconds() > 0.0);
        assert_eq!(usage(u32::MAX), None);
    }
}
