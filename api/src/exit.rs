//! Trainer exit codes. 2, 3 and 4 are permanent (the operator fails the job, no restart);
//! any other non-zero code or a signal is retryable.

/// Training finished.
pub const SUCCESS: i32 = 0;
/// A retryable failure (peer died, collective timed out, I/O error, ...).
pub const RETRYABLE: i32 = 1;
/// The configuration is invalid.
pub const INVALID_CONFIG: i32 = 2;
/// The data is invalid or missing.
pub const INVALID_DATA: i32 = 3;
/// The checkpoint to resume from does not fit this configuration.
pub const INCOMPATIBLE_CHECKPOINT: i32 = 4;

/// True for codes that a restart cannot fix.
pub fn is_permanent(code: i32) -> bool {
    matches!(
        code,
        INVALID_CONFIG | INVALID_DATA | INCOMPATIBLE_CHECKPOINT
    )
}
