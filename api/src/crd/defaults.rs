//! The defaults of the spec's fields (serde's `default = "..."` names them).

pub fn stall_timeout_seconds() -> i64 {
    1800
}
pub fn startup_timeout_seconds() -> i64 {
    600
}
pub fn checkpoint_mount_path() -> String {
    "/checkpoints".to_string()
}
pub fn data_mount_path() -> String {
    "/data".to_string()
}
pub fn yes() -> bool {
    true
}
pub fn max_restarts() -> i32 {
    crate::DEFAULT_MAX_RESTARTS as i32
}
pub fn in_place() -> bool {
    true
}
pub fn heartbeat_timeout_seconds() -> i64 {
    10
}
pub fn elastic_wait_seconds() -> i64 {
    60
}
pub fn backoff_seconds() -> i64 {
    10
}
pub fn max_backoff_seconds() -> i64 {
    300
}
pub fn permanent_exit_codes() -> Vec<i32> {
    vec![
        crate::exit::INVALID_CONFIG,
        crate::exit::INVALID_DATA,
        crate::exit::INCOMPATIBLE_CHECKPOINT,
    ]
}
