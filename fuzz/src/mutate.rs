//! Inputs made from the corpus: mutations stacked on an entry, splices, random bytes.

/// A small, fast, seeded generator (xorshift64*): the same seed gives the same run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// FNV-1a, for naming files and seeding per target.
pub(crate) fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Integers that sit on the edges parsers get wrong: zero, one, the signed and unsigned
/// limits of each width, powers of two around them.
const INTERESTING: [u64; 14] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
    1 << 20,
];

/// The next input: one time in 16 random bytes, else 1 to 8 mutations of a pool entry.
pub(crate) fn next_input(rng: &mut Rng, pool: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(16) == 0 {
        let n = rng.below(256);
        return rng.bytes(n);
    }
    let mut input = pool[rng.below(pool.len())].clone();
    for _ in 0..1 + rng.below(8) {
        mutate(rng, &mut input, pool);
    }
    input
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(9) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = rng.next_u64() as u8;
        }
        2 => overwrite_integer(rng, input),
        3 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let bytes = rng.bytes(n);
            input.splice(at..at, bytes);
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            input.drain(at..at + n);
        }
        5 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            let copy = input[at..at + n].to_vec();
            let to = rng.below(len + 1);
            input.splice(to..to, copy);
        }
        6 if len > 0 => input.truncate(rng.below(len)),
        7 => {
            let other = &pool[rng.below(pool.len())];
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        _ => {
            let n = 1 + rng.below(8);
            let bytes = rng.bytes(n);
            input.extend_from_slice(&bytes);
        }
    }
}

/// Writes one of [`INTERESTING`] (plus or minus one, either endianness) over 1, 2, 4 or 8
/// bytes, where a length or a count may sit.
fn overwrite_integer(rng: &mut Rng, input: &mut [u8]) {
    let width = 1 << rng.below(4);
    if input.len() < width {
        return;
    }
    let value = INTERESTING[rng.below(INTERESTING.len())]
        .wrapping_add(rng.below(3) as u64)
        .wrapping_sub(1);
    let bytes = if rng.below(2) == 0 {
        value.to_le_bytes()
    } else {
        value.to_be_bytes()
    };
    let at = rng.below(input.len() - width + 1);
    let take = if rng.below(2) == 0 {
        &bytes[..width]
    } else {
        &bytes[8 - width..]
    };
    input[at..at + width].copy_from_slice(take);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_inputs() {
        let pool = vec![b"hello world".to_vec(), vec![0u8; 40]];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..200)
                .map(|_| next_input(&mut rng, &pool))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }
}
