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
