//! Faults that tests inject into a debug build of the trainer, to prove a recovery path that
//! no timing can hit reliably (the source of a heal dying between its header and its state).
//! `FERROTRAIN_FAULT_<NAME>=<marker file>` arms fault NAME: it fires once, creating the
//! marker, so that the run it breaks can recover. Release builds have no faults.

/// Whether armed fault `name` fires now (once per marker file; never in a release build).
pub fn fire_once(name: &str) -> bool {
    if !cfg!(debug_assertions) {
        return false;
    }
    let Ok(marker) = std::env::var(format!("FERROTRAIN_FAULT_{name}")) else {
        return false;
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(marker)
        .is_ok()
}

/// The source of a heal dies after it sent the resume header, before its state.
pub const HEAL_SOURCE_DIES: &str = "HEAL_SOURCE_DIES";

/// A rank stops answering inside a step (a deadlock, a stuck kernel): before the step's
/// exchange it sleeps for ever, deaf to signals, its process runnable rather than stopped (so
/// its launcher cannot see it frozen; only its peers' collective timeout can). Armed by
/// `FERROTRAIN_FAULT_RANK_HANGS=<marker>`, for the rank and step of [`rank_fault`]. The
/// marker's modification time is when the hang began.
pub const RANK_HANGS: &str = "RANK_HANGS";

/// A rank dies (SIGKILL, as the OOM killer does) before the step's exchange: at a step a test
/// chooses, where a kill from outside would land at any step. Armed by
/// `FERROTRAIN_FAULT_RANK_DIES=<marker>`, for the rank and step of [`rank_fault`].
pub const RANK_DIES: &str = "RANK_DIES";

/// The faults of one rank at one step ([`RANK_HANGS`], [`RANK_DIES`]): armed for the rank
/// `FERROTRAIN_FAULT_RANK` (rank 1 by default) once it has completed
/// `FERROTRAIN_FAULT_AFTER_STEP` steps (0 by default). Called before each step's exchange
/// with this rank and the steps it completed.
pub fn rank_fault(rank: usize, step: u64) {
    if !cfg!(debug_assertions) {
        return;
    }
    let number = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    if rank as u64 != number("FERROTRAIN_FAULT_RANK", 1)
        || step < number("FERROTRAIN_FAULT_AFTER_STEP", 0)
    {
        return;
    }
    if fire_once(RANK_DIES) {
        tracing::warn!(
            rank,
            step,
            "fault {RANK_DIES}: this rank dies before its exchange"
        );
        // SAFETY: signalling this very process.
        unsafe {
            libc::kill(std::process::id() as i32, libc::SIGKILL);
        }
    }
    if fire_once(RANK_HANGS) {
        tracing::warn!(
            rank,
            step,
            "fault {RANK_HANGS}: this rank hangs before its exchange"
        );
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_fault_fires_once_and_an_unarmed_one_never() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("fired");
        // SAFETY: this test alone reads these variables.
        unsafe { std::env::set_var("FERROTRAIN_FAULT_TEST_ONCE", &marker) };
        assert!(fire_once("TEST_ONCE"));
        assert!(!fire_once("TEST_ONCE"), "once");
        assert!(marker.exists());
        assert!(!fire_once("TEST_NEVER_ARMED"));
    }
}
