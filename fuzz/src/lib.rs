//! ferrotrain's fuzz driver, on stable Rust (cargo-fuzz needs a nightly toolchain).
//!
//! A target is a function of arbitrary bytes that parses them the way ferrotrain parses what
//! it reads from a peer or a disk, and returns a short label of what happened (`"ok"`, or the
//! kind of refusal), or `Err` when a property broke (accepted what it must refuse, allocated
//! past its limit). The driver feeds it, in order:
//!
//! 1. every file of the target's corpus (`fuzz/corpus/<target>/`, kept in the repository:
//!    valid inputs and the inputs of earlier findings, so that each stays fixed);
//! 2. then, until the budget is spent, mutations of corpus entries (bit flips, interesting
//!    integers written over 1, 2, 4 or 8 bytes, bytes inserted, removed, duplicated,
//!    truncation, splices of two entries) and, one time in 16, plain random bytes.
//!
//! An input whose label was not seen before joins the in-memory corpus: a cheap stand-in for
//! coverage feedback, which stable Rust does not offer. A panic or an `Err` is a finding; its
//! input is written to `target/fuzz-findings/<target>/` and the run goes on.
//!
//! The budget is [`Budget::from_env`]: `FERROTRAIN_FUZZ_SECONDS` per target (the test suite
//! runs each for a couple of seconds; `bench/fuzz.sh` for minutes) and `FERROTRAIN_FUZZ_SEED`.
//! [`CountingAlloc`] lets a target's test binary measure the largest single allocation an
//! input caused.

mod alloc;
mod corpus;
pub mod damage;
mod mutate;

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use alloc::{CountingAlloc, largest_allocation_since, reset_largest_allocation};
pub use corpus::{corpus_dir, load_corpus};
pub use mutate::Rng;

/// What a target says about one input: a label of the path it took, or a broken property.
pub type Verdict = Result<String, String>;

/// How long a target runs.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub time: Duration,
    /// At most this many executions (after the corpus), whichever comes first.
    pub executions: u64,
    pub seed: u64,
}

impl Budget {
    /// `FERROTRAIN_FUZZ_SECONDS` (else `default_seconds`), `FERROTRAIN_FUZZ_SEED` (else a
    /// fixed one, so that the test suite's short run is the same every time).
    pub fn from_env(default_seconds: f64) -> Budget {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
        let seconds = var("FERROTRAIN_FUZZ_SECONDS").unwrap_or(default_seconds);
        Budget {
            time: Duration::from_secs_f64(seconds.max(0.0)),
            executions: u64::MAX,
            seed: var("FERROTRAIN_FUZZ_SEED").map_or(0x5eed_f022, |s| s as u64),
        }
    }
}

/// One input that broke a target.
#[derive(Clone, Debug)]
pub struct Finding {
    pub message: String,
    pub input: Vec<u8>,
    /// Where the input was written, when it could be.
    pub saved: Option<PathBuf>,
}

/// What one run did.
#[derive(Debug)]
pub struct Report {
    pub target: String,
    pub executions: u64,
    /// Inputs in the kept corpus (on disk).
    pub corpus: usize,
    /// Distinct labels seen: the paths through the parser the run reached.
    pub labels: usize,
    pub findings: Vec<Finding>,
    pub seconds: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz {}: {} executions in {:.1} s ({:.0}/s), corpus {}, {} distinct outcomes, {} findings",
            self.target,
            self.executions,
            self.seconds,
            self.executions as f64 / self.seconds.max(1e-9),
            self.corpus,
            self.labels,
            self.findings.len()
        )?;
        for finding in &self.findings {
            let at = finding.saved.as_ref().map(|p| p.display().to_string());
            write!(
                f,
                "\n  finding: {} (input {} bytes{})",
                finding.message,
                finding.input.len(),
                at.map(|p| format!(", saved as {p}")).unwrap_or_default()
            )?;
        }
        Ok(())
    }
}

/// Runs `target` on its corpus, then on mutations of it until `budget` is spent.
pub fn run(name: &str, budget: Budget, target: impl Fn(&[u8]) -> Verdict) -> Report {
    let kept = load_corpus(&corpus_dir(name));
    let started = Instant::now();
    let quiet = QuietPanics::install();
    let mut state = RunState {
        pool: kept.clone(),
        labels: HashSet::new(),
        findings: Vec::new(),
        messages: HashSet::new(),
        executions: 0,
    };
    for input in &kept {
        state.execute(name, &target, input.clone());
    }
    if state.pool.is_empty() {
        state.pool.push(Vec::new());
    }
    let mut rng = Rng::new(budget.seed ^ mutate::hash(name.as_bytes()));
    let mut done = 0u64;
    while done < budget.executions && started.elapsed() < budget.time {
        // Check the clock every 64 inputs: a parse takes microseconds.
        for _ in 0..64 {
            let input = mutate::next_input(&mut rng, &state.pool);
            state.execute(name, &target, input);
            done += 1;
        }
    }
    drop(quiet);
    Report {
        target: name.to_string(),
        executions: state.executions,
        corpus: kept.len(),
        labels: state.labels.len(),
        findings: state.findings,
        seconds: started.elapsed().as_secs_f64(),
    }
}

struct RunState {
    pool: Vec<Vec<u8>>,
    labels: HashSet<String>,
    findings: Vec<Finding>,
    /// A finding's message once: the same bug found again is not a new finding.
    messages: HashSet<String>,
    executions: u64,
}

/// Keeps the in-memory corpus from growing past this many inputs.
const MAX_POOL: usize = 4096;

impl RunState {
    fn execute(&mut self, name: &str, target: &impl Fn(&[u8]) -> Verdict, input: Vec<u8>) {
        self.executions += 1;
        let verdict = catch_unwind(AssertUnwindSafe(|| target(&input)))
            .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))));
        match verdict {
            Ok(label) => {
                if self.labels.insert(label) && self.pool.len() < MAX_POOL {
                    self.pool.push(input);
                }
            }
            Err(message) => {
                if self.messages.insert(without_digits(&message)) {
                    let saved = corpus::save_finding(name, &input);
                    self.findings.push(Finding {
                        message,
                        input,
                        saved,
                    });
                }
            }
        }
    }
}

/// A finding's message with its numbers (lines, columns, sizes) left out: the same bug at
/// another offset is the same finding.
fn without_digits(message: &str) -> String {
    message.chars().filter(|c| !c.is_ascii_digit()).collect()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Silences the default panic hook while a run catches panics (a finding is reported once,
/// not printed for every input that hits it).
struct QuietPanics {
    previous: Option<PanicHook>,
}

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

impl QuietPanics {
    fn install() -> Self {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        QuietPanics {
            previous: Some(previous),
        }
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            std::panic::set_hook(previous);
        }
    }
}

/// Runs `target` with the budget from the environment (`default_seconds` unless
/// `FERROTRAIN_FUZZ_SECONDS` says), prints the report and panics when it found anything:
/// what a test calls.
pub fn check(name: &str, default_seconds: f64, target: impl Fn(&[u8]) -> Verdict) -> Report {
    let report = run(name, Budget::from_env(default_seconds), target);
    println!("{report}");
    assert!(report.findings.is_empty(), "{report}");
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_target_is_a_finding_reported_once() {
        let budget = Budget {
            time: Duration::from_secs(5),
            executions: 20_000,
            seed: 1,
        };
        let report = run("driver-self-test", budget, |input| {
            if input.len() > 3 && input[0] == 0xab {
                panic!("found it");
            }
            Ok(format!("len {}", input.len().min(8)))
        });
        assert!(report.executions >= 20_000, "{report}");
        assert_eq!(report.findings.len(), 1, "{report}");
        assert_eq!(report.findings[0].message, "panicked: found it");
        assert!(report.labels >= 8, "{report}");
    }

    #[test]
    fn a_broken_property_is_a_finding_too() {
        let budget = Budget {
            time: Duration::from_secs(5),
            executions: 1000,
            seed: 2,
        };
        let report = run("driver-self-test", budget, |input| {
            if input.is_empty() {
                Ok("empty".into())
            } else {
                Err("accepted junk".into())
            }
        });
        assert_eq!(report.findings.len(), 1, "{report}");
    }
}
