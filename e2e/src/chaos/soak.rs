//! A whole soak: for each shape, its schedule drawn from the seed, the job run without faults
//! (fixed shapes) and with them, the checks; and the commit it ran at.

use crate::chaos::checks::check;
use crate::chaos::kit::{restarted, supervise};
use crate::chaos::report::ShapeRun;
use crate::chaos::run::{run_chaos, run_reference};
use crate::chaos::schedule::{Mix, plan};
use crate::chaos::shape::Shape;

/// One shape's soak of `mix` drawn from `seed`; `compare`: run the job without faults too and
/// compare the bytes (fixed shapes).
pub async fn soak_shape(seed: u64, shape: Shape, mix: &Mix, compare: bool) -> ShapeRun {
    let compare = compare && shape.is_fixed();
    let plan = plan(seed, shape, mix);
    eprintln!(
        "[{}] {}: {} faults in {} events, {} steps; the job without faults first{}",
        shape.key(),
        shape.name(),
        plan.faults(),
        plan.events.len(),
        plan.max_steps,
        if compare { "" } else { " (skipped)" }
    );
    let reference = if compare {
        let reference = run_reference(&plan).await;
        eprintln!(
            "[{}] without faults: {:?} in {:.0} s",
            shape.key(),
            reference.status.phase,
            reference.seconds
        );
        Some(reference)
    } else {
        None
    };
    // The control plane's processes restarted when they crash, as a real cluster's kubelet
    // restarts its static pods (said in the report).
    let supervisor = tokio::spawn(supervise());
    let chaos = run_chaos(&plan).await;
    supervisor.abort();
    let kit_restarts = restarted();
    let findings = check(&chaos, reference.as_ref());
    eprintln!(
        "[{}] with faults: {:?} in {:.0} s, {} finding(s)",
        shape.key(),
        chaos.status.phase,
        chaos.seconds,
        findings.len()
    );
    ShapeRun {
        plan,
        chaos,
        reference,
        findings,
        kit_restarts,
    }
}

/// The commit of this tree (`git describe`: `-dirty` when it has changes), and the images'
/// tag the kit runs (scripts/e2e.sh writes it).
pub fn commit() -> String {
    let git = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let tag = std::fs::read_to_string(crate::chaos::kit::kit_dir().join("run/ferrotrain-e2e-tag"))
        .map(|t| format!(", images {}", t.trim()))
        .unwrap_or_default();
    format!("{git}{tag}")
}
