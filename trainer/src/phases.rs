//! Where a training step's time goes, for `bench/profile.sh`: with `FERROTRAIN_PHASE_TIMES=1`
//! every step prints one line to stderr,
//!
//! `phases step=12 src=41x27 tgt=41x29 real=1001 tokens=2104 data=0.31 forward=80.2 loss=40.1 backward=150.3 optimizer=9.8 other=0.4 total=281.1`
//!
//! (milliseconds; `src`/`tgt` the padded shapes of the micro-batches' tensors, summed rows,
//! `real` the target tokens the loss reads). A phase is the wall time from the previous mark
//! to its own, so on a CPU (synchronous kernels) the phases add up to the step. Unset, each
//! mark is one load of a flag set at the first call.

use std::cell::RefCell;
use std::sync::LazyLock;
use std::time::Instant;

/// The variable that turns the per-step lines on.
pub const PHASE_TIMES_ENV: &str = "FERROTRAIN_PHASE_TIMES";

static ON: LazyLock<bool> =
    LazyLock::new(|| std::env::var(PHASE_TIMES_ENV).is_ok_and(|v| !v.is_empty() && v != "0"));

#[derive(Default)]
struct Step {
    start: Option<Instant>,
    last: Option<Instant>,
    /// (phase, milliseconds), in the order first seen.
    spent: Vec<(&'static str, f64)>,
    /// (rows, source width, target width, real target tokens) per micro-batch.
    shapes: Vec<(i64, i64, i64, i64)>,
}

thread_local! {
    static STEP: RefCell<Step> = RefCell::new(Step::default());
}

/// Whether the per-step lines are on.
pub fn enabled() -> bool {
    *ON
}

/// A step starts now.
pub fn begin() {
    if !enabled() {
        return;
    }
    STEP.with_borrow_mut(|s| {
        let now = Instant::now();
        *s = Step {
            start: Some(now),
            last: Some(now),
            ..Step::default()
        };
    });
}

/// The time since the previous mark was spent in `phase` (added to what it had).
pub fn mark(phase: &'static str) {
    if !enabled() {
        return;
    }
    STEP.with_borrow_mut(|s| {
        let now = Instant::now();
        let Some(last) = s.last.replace(now) else {
            return;
        };
        let ms = (now - last).as_secs_f64() * 1e3;
        match s.spent.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, total)) => *total += ms,
            None => s.spent.push((phase, ms)),
        }
    });
}

/// A micro-batch's padded shape: `rows` sentences, `src`/`tgt` tokens wide, `real` target
/// tokens scored.
pub fn shape(rows: i64, src: i64, tgt: i64, real: i64) {
    if !enabled() {
        return;
    }
    STEP.with_borrow_mut(|s| s.shapes.push((rows, src, tgt, real)));
}

/// The step `step` of `tokens` source and target tokens ended now: prints its line (the time
/// since the last mark is `other`).
pub fn end(step: u64, tokens: i64) {
    if !enabled() {
        return;
    }
    mark("other");
    STEP.with_borrow_mut(|s| {
        let Some(start) = s.start.take() else {
            return;
        };
        let total = start.elapsed().as_secs_f64() * 1e3;
        let dims = |f: fn(&(i64, i64, i64, i64)) -> String| {
            s.shapes.iter().map(f).collect::<Vec<_>>().join("+")
        };
        let mut line = format!(
            "phases step={step} src={} tgt={} real={} tokens={tokens}",
            dims(|(b, l, _, _)| format!("{b}x{l}")),
            dims(|(b, _, l, _)| format!("{b}x{l}")),
            s.shapes.iter().map(|x| x.3).sum::<i64>(),
        );
        for (phase, ms) in &s.spent {
            line.push_str(&format!(" {phase}={ms:.2}"));
        }
        line.push_str(&format!(" total={total:.2}"));
        eprintln!("{line}");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_cost_nothing_and_print_nothing_when_off() {
        // The test environment does not set the variable.
        if enabled() {
            return;
        }
        begin();
        mark("forward");
        shape(2, 3, 4, 5);
        end(1, 9);
        STEP.with_borrow(|s| assert!(s.spent.is_empty() && s.shapes.is_empty()));
    }
}
