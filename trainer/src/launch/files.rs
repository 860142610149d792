//! The files a launcher and its ranks share in the launcher's scratch directory.

/// Where rank 0 keeps its progress report for the launcher.
pub const PROGRESS_FILE: &str = "rank-0.progress.json";
/// Where the agent of node 0 keeps the rounds' ends for rank 0, which serves them in its
/// progress report (`Progress.roundEnds`): how the operator learns of in-place restarts.
pub const ROUNDS_FILE: &str = "rounds.json";
