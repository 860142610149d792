//! Taking a mutex whose holder panicked: the data behind it (a progress report, a save's
//! result, an upload queue) is still the best there is, so it is used rather than propagated
//! as a second panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, poisoned or not.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
