//! SIGTERM and SIGINT: remembered, not fatal, so the launcher can stop its ranks and a rank
//! can save a checkpoint before it exits. And [`ABANDON`] (SIGUSR1), which an agent sends its
//! ranks when the round ended elsewhere: a rank stops waiting in its collectives at once
//! ([`abandoned`]) and leaves its state for the next round, instead of waiting there until
//! its collective timeout or its SIGKILL.
//!
//! A rank installs the handlers with `install(ExitUnlessArmed)`: until the training loop
//! arms it (`arm()`), a signal ends the process at once (there is nothing to save while it
//! learns its vocabulary or waits for peers), and a second signal always does. The launcher
//! installs them with `install(Remember)`: it polls `take()` and stops the ranks itself.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The last SIGTERM or SIGINT received (0 = none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether a rank's training loop will see `received()` and stop cleanly.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Whether an unarmed (or second) signal ends the process.
static EXIT_UNLESS_ARMED: AtomicBool = AtomicBool::new(false);
/// Set once [`ABANDON`] arrived.
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// The signal that tells a rank its round ended elsewhere: abandon the collectives.
pub const ABANDON: i32 = libc::SIGUSR1;

extern "C" fn on_abandon(_: i32) {
    ABANDONED.store(true, Ordering::SeqCst);
}

/// What a signal does before the training loop arms the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only remember it (the launcher).
    Remember,
    /// End the process with 128 + signal unless armed, or when a signal is already pending
    /// (a rank).
    ExitUnlessArmed,
}

extern "C" fn on_signal(signal: i32) {
    let earlier = SIGNAL.swap(signal, Ordering::SeqCst);
    let armed = ARMED.load(Ordering::SeqCst);
    if EXIT_UNLESS_ARMED.load(Ordering::SeqCst) && (!armed || earlier != 0) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(128 + signal) };
    }
}

/// Installs the SIGTERM and SIGINT handlers, and a rank's [`ABANDON`] handler.
pub fn install(mode: Mode) {
    EXIT_UNLESS_ARMED.store(mode == Mode::ExitUnlessArmed, Ordering::SeqCst);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        handle(signal, on_signal);
    }
    if mode == Mode::ExitUnlessArmed {
        handle(ABANDON, on_abandon);
    }
}

fn handle(signal: i32, handler: extern "C" fn(i32)) {
    // SAFETY: the handlers only touch atomics and call _exit, both async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = libc::SA_RESTART;
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Whether this rank was told its round ended elsewhere ([`ABANDON`]).
pub fn abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

/// From now on a (first) signal is left to the caller, which polls `received()`. A signal
/// that arrived before is still pending and is seen by the first poll.
pub fn arm() {
    ARMED.store(true, Ordering::SeqCst);
}

/// The pending signal, 0 when none.
pub fn received() -> i32 {
    SIGNAL.load(Ordering::SeqCst)
}

/// The pending signal, cleared.
pub fn take() -> i32 {
    SIGNAL.swap(0, Ordering::SeqCst)
}

/// "SIGTERM", "SIGINT", ... for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGUSR1 => "SIGUSR1",
        _ => "signal",
    }
}
