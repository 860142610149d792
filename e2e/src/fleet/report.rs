//! What the fleet bench tells: the rows of its table (what was measured, the value, the goal)
//! and its progress lines on stderr.

use super::bench::Bench;
use super::window::Window;

/// A row of the table.
pub struct Row {
    pub what: String,
    pub value: String,
    pub goal: String,
}

pub(super) fn row(what: impl Into<String>, value: impl Into<String>, goal: &str) -> Row {
    Row {
        what: what.into(),
        value: value.into(),
        goal: goal.to_string(),
    }
}

pub(super) fn say(b: &Bench, what: &str) {
    eprintln!("[fleet {:5.0}s] {what}", b.started.elapsed().as_secs_f64());
}

/// What the control plane did in a window `what`: the API server's request rate (every
/// client) and write latency, its CPU and etcd's, the machine's busy cores.
pub(super) fn server_row(what: &str, w: &Window) -> Row {
    row(
        format!(
            "{what} ({:.1} s): API server requests/s by verb; write p99; CPU of the API server, etcd, the operator (leader); busy cores of 2",
            w.seconds
        ),
        format!(
            "{:.0}/s ({}); {}; {:.2}, {:.2}, {:.2}; {:.2}",
            w.api_total_rate(),
            w.api_rates_by_verb(),
            w.api_write_p99.map_or("-".into(), |p| format!("<= {p} s")),
            w.api_cpu_cores,
            w.usage_of("etcd").cores,
            w.usage_of("fleet-a").cores,
            w.machine_cores
        ),
        "",
    )
}
