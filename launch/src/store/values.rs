//! What the store holds, bounded whoever writes it: the token admits a job's own ranks and
//! agents, but a rank running someone else's code holds the token too, and must not be able
//! to grow node 0's launcher (or rank 0) without bound. A write past a limit is refused with
//! an answer that names the limit; nothing already stored changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest key: the store's keys are paths of a few dozen bytes (`agent/12/report/3`).
pub const MAX_KEY_BYTES: usize = 1024;
/// Most keys held: a round of a gang of N nodes adds about 6N, so this holds hundreds of
/// rounds of a thousand nodes.
pub const MAX_KEYS: usize = 1 << 20;
/// Most bytes of keys and values held (a value is at most a frame, `MAX_FRAME`).
pub const MAX_STORED_BYTES: usize = 256 << 20;

/// Which limit a write would pass; its text is the client's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error("a key of {0} bytes is over the store's limit of {MAX_KEY_BYTES} bytes a key")]
    KeyTooLong(usize),
    #[error("the store holds {MAX_KEYS} keys, its limit")]
    TooManyKeys,
    #[error("the store would hold over its limit of {MAX_STORED_BYTES} bytes of keys and values")]
    TooManyBytes,
}

/// Whether a refusal was logged yet: the first is a warning, the rest debug lines (a client
/// that keeps writing must not flood the log).
static WARNED: AtomicBool = AtomicBool::new(false);

/// The keys and values, with the bytes they hold.
#[derive(Default)]
pub(super) struct Values {
    map: HashMap<String, Vec<u8>>,
    bytes: usize,
}

impl Values {
    pub(super) fn get(&self, key: &str) -> Option<&Vec<u8>> {
        self.map.get(key)
    }

    /// Sets `key` to `value` unless that would pass a limit.
    pub(super) fn insert(&mut self, key: String, value: Vec<u8>) -> Result<(), Full> {
        check_key(&key)?;
        let old = self.map.get(&key).map(|v| key.len() + v.len());
        if old.is_none() && self.map.len() >= MAX_KEYS {
            return Err(refused(Full::TooManyKeys));
        }
        let bytes = self.bytes - old.unwrap_or(0) + key.len() + value.len();
        if bytes > MAX_STORED_BYTES {
            return Err(refused(Full::TooManyBytes));
        }
        self.bytes = bytes;
        self.map.insert(key, value);
        Ok(())
    }

    /// Sets `key` to `value` unless it is set (or a limit would be passed); whether it did.
    pub(super) fn insert_if_vacant(&mut self, key: String, value: Vec<u8>) -> bool {
        !self.map.contains_key(&key) && self.insert(key, value).is_ok()
    }
}

/// Refuses a key over [`MAX_KEY_BYTES`].
pub(super) fn check_key(key: &str) -> Result<(), Full> {
    match key.len() {
        n if n > MAX_KEY_BYTES => Err(refused(Full::KeyTooLong(n))),
        _ => Ok(()),
    }
}

fn refused(full: Full) -> Full {
    if WARNED.swap(true, Ordering::Relaxed) {
        tracing::debug!("rendezvous store: refused a write: {full}");
    } else {
        tracing::warn!(
            "rendezvous store: refused a write (further refusals are debug lines): {full}"
        );
    }
    full
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_each_limit_are_refused_and_change_nothing() {
        let mut v = Values::default();
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            v.insert(long.clone(), vec![]),
            Err(Full::KeyTooLong(MAX_KEY_BYTES + 1))
        );
        assert_eq!(check_key(&long), Err(Full::KeyTooLong(MAX_KEY_BYTES + 1)));
        // 255 values of 1 MiB fit beside their keys; the 256th does not.
        let mib = vec![7u8; 1 << 20];
        for i in 0..255 {
            v.insert(format!("big/{i}"), mib.clone()).unwrap();
        }
        let err = v.insert("big/255".into(), mib.clone()).unwrap_err();
        assert_eq!(err, Full::TooManyBytes);
        assert!(err.to_string().contains("268435456 bytes"), "{err}");
        // Replacing a value counts only the difference.
        v.insert("big/0".into(), mib.clone()).unwrap();
        v.insert("big/0".into(), vec![1]).unwrap();
        v.insert("big/255".into(), mib.clone()).unwrap();
        assert_eq!(v.get("big/255").map(Vec::len), Some(1 << 20));
        let mut v = Values::default();
        for i in 0..MAX_KEYS {
            v.insert(i.to_string(), vec![]).unwrap();
        }
        assert_eq!(v.insert("one more".into(), vec![]), Err(Full::TooManyKeys));
        assert!(!v.insert_if_vacant("one more".into(), vec![]));
        // An existing key may still change.
        v.insert("7".into(), vec![1, 2]).unwrap();
        assert_eq!(v.get("7"), Some(&vec![1, 2]));
    }
}
