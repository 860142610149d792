//! What the config's tests start from.

/// The smallest valid config: every other field takes its default.
pub(super) const MINIMAL: &str = "task: copy\nmaxSteps: 10\n";
