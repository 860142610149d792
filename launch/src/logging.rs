//! The binaries' log set-up (`ferrotrain-launch`, and `ferrotrain` for every subcommand):
//! RUST_LOG, else `default`; to stderr, coloured only on a terminal (not in pod logs, files or
//! pipes), without module paths.

use std::io::IsTerminal;

/// Installs the subscriber once (a second call changes nothing).
pub fn init(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
