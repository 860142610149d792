//! Damaged copies of a file, as a disk that filled up, a node that lost power or a bad copy
//! leaves them: cut short, a bit flipped, 16 bytes zeroed, each at ten offsets spread over the
//! file (its first bytes, where headers and lengths sit, its quarters, its last bytes). Every
//! test of state read back from disk sweeps the same copies.

use std::fmt;

/// What happened to a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Cut short at the offset: the offset is its new length.
    Truncated,
    /// One bit of the byte at the offset flipped.
    BitFlipped,
    /// 16 bytes from the offset (fewer at the end) set to zero.
    Zeroed,
}

impl Damage {
    pub const ALL: [Damage; 3] = [Damage::Truncated, Damage::BitFlipped, Damage::Zeroed];
}

/// One damaged copy of a file and how it was damaged.
#[derive(Clone, Debug)]
pub struct Damaged {
    pub damage: Damage,
    pub at: usize,
    pub bytes: Vec<u8>,
}

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {}", self.damage, self.at)
    }
}

/// The ten offsets a file of `len` bytes is damaged at (fewer for a file under 41 bytes).
pub fn offsets(len: usize) -> Vec<usize> {
    let mut at: Vec<usize> = [
        0,
        3,
        8,
        9,
        40,
        len / 4,
        len / 2,
        3 * len / 4,
        len.saturating_sub(9),
        len.saturating_sub(1),
    ]
    .into_iter()
    .filter(|&at| at < len)
    .collect();
    at.sort_unstable();
    at.dedup();
    at
}

/// `good` with `damage` at `at` (which must be inside it).
pub fn damaged(good: &[u8], damage: Damage, at: usize) -> Vec<u8> {
    let mut bad = good.to_vec();
    match damage {
        Damage::Truncated => bad.truncate(at),
        Damage::BitFlipped => bad[at] ^= 1 << (at % 8),
        Damage::Zeroed => bad[at..(at + 16).min(good.len())].fill(0),
    }
    bad
}

/// Every damaged copy of `good`: each [`Damage`] at each of its [`offsets`].
pub fn copies(good: &[u8]) -> Vec<Damaged> {
    offsets(good.len())
        .into_iter()
        .flat_map(|at| {
            Damage::ALL.map(|damage| Damaged {
                damage,
                at,
                bytes: damaged(good, damage, at),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_differs_from_the_file_where_it_says() {
        let good: Vec<u8> = (1..=200u8).collect();
        let all = copies(&good);
        assert_eq!(all.len(), 30);
        for copy in &all {
            assert_ne!(copy.bytes, good, "{copy}");
            match copy.damage {
                Damage::Truncated => assert_eq!(copy.bytes.len(), copy.at),
                _ => {
                    assert_eq!(copy.bytes.len(), good.len());
                    assert_ne!(copy.bytes[copy.at], good[copy.at], "{copy}");
                }
            }
        }
        assert_eq!(offsets(5), [0, 1, 2, 3, 4]);
        assert_eq!(offsets(1000), [0, 3, 8, 9, 40, 250, 500, 750, 991, 999]);
    }
}
