//! The data's random streams: ChaCha8 keyed by (seed, domain, index), so the data order
//! is a pure function of the seed and never changes with a `rand` upgrade.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

pub(super) const DOMAIN_COPY: u64 = 0x636f_7079; // "copy"
pub(super) const DOMAIN_EPOCH: u64 = 0x6570_6f63; // "epoc"

/// A ChaCha8 stream keyed by (seed, domain, index). Built from explicit seed bytes (not
/// `seed_from_u64`) and consumed only through `next_u64`, so the data order never changes
/// with a `rand` upgrade: checkpoints keep their meaning.
pub(super) fn data_rng(seed: u64, domain: u64, index: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&domain.to_le_bytes());
    key[16..24].copy_from_slice(&index.to_le_bytes());
    ChaCha8Rng::from_seed(key)
}

/// A number in 0..n (n > 0), by Lemire's multiply-shift (bias below 2^-40 for any n here).
pub(super) fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// Fisher-Yates.
pub(super) fn shuffle<T>(items: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..items.len()).rev() {
        items.swap(i, below(rng, i + 1));
    }
}
