//! The global batches: each epoch's order (shuffled by (seed, epoch), length-bucketed,
//! within the token budget), the stream that walks them and is found again from a sample
//! count, and each rank's token-balanced shard of a batch.

use super::corpus::Example;
use super::rng::{DOMAIN_EPOCH, data_rng, shuffle};
use crate::error::{Result, TrainError};

/// How many batches' worth of shuffled examples are sorted by length together: large enough
/// that batches hold sentences of nearly equal length (little padding), small enough that
/// the epoch order stays random.
const BUCKET_BATCHES: usize = 100;

/// Source and target lengths of each example (what batching needs).
fn lengths(examples: &[Example]) -> Vec<(u32, u32)> {
    examples
        .iter()
        .map(|e| (e.src.len() as u32, e.tgt.len() as u32))
        .collect()
}

/// The global batches of one epoch, each a list of indices into `examples`: shuffled by
/// (seed, epoch), length-bucketed, each with at most `max_tokens` padded tokens per side
/// (length + 2 for BOS/EOS, times sentences).
///
/// An example longer than `max_tokens` on its own still gets a batch (of one); the config
/// check (`batch.maxTokens` >= `data.maxSentenceTokens` + 2) keeps that from happening.
pub fn epoch_batches(
    examples: &[Example],
    max_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    batches_of_epoch(&lengths(examples), max_tokens, seed, epoch)
}

fn batches_of_epoch(
    lens: &[(u32, u32)],
    max_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    if lens.is_empty() {
        return Vec::new();
    }
    let mut rng = data_rng(seed, DOMAIN_EPOCH, epoch);
    let mut order: Vec<usize> = (0..lens.len()).collect();
    shuffle(&mut order, &mut rng);

    let width = |i: usize| lens[i].0.max(lens[i].1) as usize + 2;
    let mean_width = lens
        .iter()
        .enumerate()
        .map(|(i, _)| width(i))
        .sum::<usize>()
        .div_ceil(lens.len());
    let bucket = (BUCKET_BATCHES * max_tokens / mean_width.max(1)).max(1);

    let mut batches = Vec::new();
    for chunk in order.chunks_mut(bucket) {
        // Stable: equal lengths keep their shuffled order.
        chunk.sort_by_key(|&i| (lens[i].0.max(lens[i].1), lens[i].0, lens[i].1));
        let mut batch: Vec<usize> = Vec::new();
        let (mut src_width, mut tgt_width) = (0usize, 0usize);
        for &i in chunk.iter() {
            let (s, t) = (lens[i].0 as usize + 2, lens[i].1 as usize + 2);
            let (ws, wt) = (src_width.max(s), tgt_width.max(t));
            let count = batch.len() + 1;
            if !batch.is_empty() && (ws * count > max_tokens || wt * count > max_tokens) {
                batches.push(std::mem::take(&mut batch));
                (src_width, tgt_width) = (s, t);
            } else {
                (src_width, tgt_width) = (ws, wt);
            }
            batch.push(i);
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
    }
    shuffle(&mut batches, &mut rng);
    batches
}

/// Where the data stream stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPosition {
    pub epoch: u64,
    /// Index of the next batch within the epoch.
    pub batch: u64,
    /// Examples consumed over all ranks since the start (the global sample index).
    pub samples: u64,
}

/// An endless stream of global batches, epoch after epoch.
///
/// Every epoch visits every example exactly once, so `samples / examples` is the epoch and
/// the remainder is a prefix of that epoch's batches: a position is recovered from the
/// sample count alone. The position is kept normalized: after the last batch of an epoch it
/// reads (epoch + 1, batch 0), as `seek` to the same sample count does.
pub struct BatchStream {
    lens: Vec<(u32, u32)>,
    max_tokens: usize,
    seed: u64,
    /// The batches of `position.epoch`.
    batches: Vec<Vec<usize>>,
    position: DataPosition,
}

impl BatchStream {
    /// A stream at the start of epoch 0. `examples` must not be empty (`load_corpus` never
    /// returns an empty training set).
    pub fn new(examples: &[Example], max_tokens: usize, seed: u64) -> Self {
        let lens = lengths(examples);
        let batches = batches_of_epoch(&lens, max_tokens, seed, 0);
        Self {
            lens,
            max_tokens,
            seed,
            batches,
            position: DataPosition::default(),
        }
    }
    /// Positions the stream after `samples` consumed examples (resume).
    ///
    /// A checkpoint is always taken between batches, so a count that falls inside a batch
    /// means the batches differ from the ones the checkpoint was trained on (other training
    /// data, `data.maxSentenceTokens` or `batch.maxTokens`, or seed): an
    /// `IncompatibleCheckpoint` error.
    pub fn seek(&mut self, samples: u64) -> Result<()> {
        let n = self.lens.len() as u64;
        if n == 0 {
            return if samples == 0 {
                Ok(())
            } else {
                Err(TrainError::IncompatibleCheckpoint(
                    format!("data position {samples} cannot be resumed: the training set is empty")
                        .into(),
                ))
            };
        }
        let epoch = samples / n;
        let within = samples % n;
        let batches = batches_of_epoch(&self.lens, self.max_tokens, self.seed, epoch);
        let mut consumed = 0u64;
        let mut batch = 0usize;
        while consumed < within {
            consumed += batches[batch].len() as u64;
            batch += 1;
        }
        if consumed != within {
            return Err(TrainError::IncompatibleCheckpoint(
                format!(
                    "data position {samples} (epoch {epoch}, example {within} of {n}) is not on a \
                 batch boundary of this run (the nearest are {} and {}): the training data, \
                 data.maxSentenceTokens, seed or the batch (batch.maxTokens, batch.globalTokens, the number of ranks) differ from the checkpoint's",
                    samples - within + consumed - batches[batch - 1].len() as u64,
                    samples - within + consumed,
                )
                .into(),
            ));
        }
        self.batches = batches;
        self.position = DataPosition {
            epoch,
            batch: batch as u64,
            samples,
        };
        Ok(())
    }
    pub fn position(&self) -> DataPosition {
        self.position
    }
    /// The next global batch (indices into the examples) and advances the position.
    pub fn next_batch(&mut self) -> Vec<usize> {
        assert!(
            !self.lens.is_empty(),
            "BatchStream over an empty training set"
        );
        let batch = self.batches[self.position.batch as usize].clone();
        self.position.batch += 1;
        self.position.samples += batch.len() as u64;
        if self.position.batch as usize == self.batches.len() {
            self.position.epoch += 1;
            self.position.batch = 0;
            self.batches =
                batches_of_epoch(&self.lens, self.max_tokens, self.seed, self.position.epoch);
        }
        batch
    }
    /// Batches in the current epoch.
    pub fn batches_in_epoch(&self) -> usize {
        self.batches.len()
    }
}

/// This rank's share of a global batch: contiguous in length order, balanced by tokens,
/// identical on every rank for the same (batch, world_size). May be empty for tiny batches.
pub fn shard(batch: &[usize], examples: &[Example], rank: usize, world_size: usize) -> Vec<usize> {
    assert!(
        rank < world_size,
        "rank {rank} outside world size {world_size}"
    );
    let mut sorted = batch.to_vec();
    sorted.sort_by_key(|&i| {
        let e = &examples[i];
        (e.src.len().max(e.tgt.len()), e.src.len(), e.tgt.len(), i)
    });
    // prefix[j] = real tokens (with BOS/EOS) of the first j examples.
    let mut prefix = Vec::with_capacity(sorted.len() + 1);
    prefix.push(0u64);
    for &i in &sorted {
        let e = &examples[i];
        prefix.push(prefix.last().unwrap() + (e.src.len() + e.tgt.len() + 2) as u64);
    }
    let total = *prefix.last().unwrap();
    let world = world_size as u64;
    // Cut k sits where the running token count is nearest k/world of the total (integers
    // only, so every rank computes the same cuts); cuts never move backwards.
    let cut = |k: u64| -> usize {
        let target = total * k;
        // First j with prefix[j] * world >= target; exists since prefix[len] * world >= target.
        let after = prefix.partition_point(|&p| p * world < target);
        if after > 0 && target - prefix[after - 1] * world <= prefix[after] * world - target {
            after - 1
        } else {
            after
        }
    };
    sorted[cut(rank as u64)..cut(rank as u64 + 1)].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Examples with a spread of lengths (deterministic, no tokenizer needed).
    fn synthetic(n: usize) -> Vec<Example> {
        (0..n)
            .map(|i| {
                let s = 1 + (i * 7919) % 40;
                let t = 1 + (i * 104_729 + s) % 45;
                Example {
                    src: vec![5; s],
                    tgt: vec![6; t],
                }
            })
            .collect()
    }

    #[test]
    fn epoch_batches_cover_every_example_once_within_the_token_budget() {
        let examples = synthetic(3000);
        let batches = epoch_batches(&examples, 400, 1, 0);
        let mut seen = vec![0; examples.len()];
        let (mut padded, mut real) = (0usize, 0usize);
        for batch in &batches {
            assert!(!batch.is_empty());
            let ws = batch
                .iter()
                .map(|&i| examples[i].src.len() + 2)
                .max()
                .unwrap();
            let wt = batch
                .iter()
                .map(|&i| examples[i].tgt.len() + 2)
                .max()
                .unwrap();
            assert!(
                ws * batch.len() <= 400 && wt * batch.len() <= 400,
                "{ws} {wt} x {}",
                batch.len()
            );
            for &i in batch {
                seen[i] += 1;
                real += examples[i].src.len() + examples[i].tgt.len() + 4;
            }
            padded += (ws + wt) * batch.len();
        }
        assert!(seen.iter().all(|&c| c == 1));
        // Bucketing keeps padding small (unsorted batches of these lengths waste ~40%).
        let efficiency = real as f64 / padded as f64;
        assert!(efficiency > 0.8, "padding efficiency {efficiency}");
        // Batches are near the budget, not tiny.
        let mean = examples.len() as f64 / batches.len() as f64;
        assert!(mean > 8.0, "mean batch {mean}");
    }

    #[test]
    fn epoch_batches_depend_on_seed_and_epoch_only() {
        let examples = synthetic(500);
        let a = epoch_batches(&examples, 300, 1, 0);
        assert_eq!(a, epoch_batches(&examples, 300, 1, 0));
        assert_ne!(a, epoch_batches(&examples, 300, 1, 1));
        assert_ne!(a, epoch_batches(&examples, 300, 2, 0));
        // Pinned: the order must not change silently (it would move every checkpoint's data
        // position). Update only on purpose, knowing resumed runs will see other batches.
        assert_eq!(a.len(), 56);
        assert_eq!(a[0][..3], [224, 144, 424]);
    }

    #[test]
    fn stream_positions_are_recovered_by_seek_from_the_sample_count() {
        let examples = synthetic(200);
        let mut stream = BatchStream::new(&examples, 250, 3);
        let per_epoch = stream.batches_in_epoch();
        let mut history = Vec::new();
        for _ in 0..per_epoch * 2 + 5 {
            let before = stream.position();
            history.push((before, stream.next_batch()));
        }
        // Epochs roll over: positions are normalized and samples count every example.
        assert_eq!(
            history[per_epoch].0,
            DataPosition {
                epoch: 1,
                batch: 0,
                samples: 200
            }
        );
        assert_eq!(stream.position().epoch, 2);
        assert_eq!(
            stream.position().samples,
            400 + history[2 * per_epoch..]
                .iter()
                .map(|h| h.1.len() as u64)
                .sum::<u64>()
        );
        for (position, batch) in &history {
            let mut resumed = BatchStream::new(&examples, 250, 3);
            resumed.seek(position.samples).unwrap();
            assert_eq!(resumed.position(), *position);
            assert_eq!(&resumed.next_batch(), batch);
        }
        // A count inside a batch is refused as an incompatible checkpoint.
        let inside = history[3].0.samples + 1;
        assert!(history[3].1.len() > 1);
        let mut resumed = BatchStream::new(&examples, 250, 3);
        match resumed.seek(inside) {
            Err(TrainError::IncompatibleCheckpoint(message)) => {
                assert!(
                    message.to_string().contains(&inside.to_string()),
                    "{message}"
                )
            }
            other => panic!("expected IncompatibleCheckpoint, got {:?}", other.err()),
        }
        // Batches of another batch size do not line up with these positions.
        let mut other = BatchStream::new(&examples, 400, 3);
        assert!(history.iter().any(|(p, _)| other.seek(p.samples).is_err()));
    }

    #[test]
    fn shards_partition_the_batch_balanced_by_tokens() {
        let examples = synthetic(1000);
        let batches = epoch_batches(&examples, 2000, 5, 0);
        for batch in batches.iter().take(20) {
            for world in [1, 2, 3, 4, 7] {
                let shards: Vec<Vec<usize>> = (0..world)
                    .map(|r| shard(batch, &examples, r, world))
                    .collect();
                let mut union: Vec<usize> = shards.concat();
                union.sort_unstable();
                let mut expected = batch.clone();
                expected.sort_unstable();
                assert_eq!(union, expected, "world {world}");
                let cost = |s: &Vec<usize>| -> usize {
                    s.iter()
                        .map(|&i| examples[i].src.len() + examples[i].tgt.len() + 2)
                        .sum()
                };
                let biggest = batch
                    .iter()
                    .map(|&i| examples[i].src.len() + examples[i].tgt.len() + 2)
                    .max()
                    .unwrap();
                let total: usize = cost(batch);
                for s in &shards {
                    let share = cost(s) as f64;
                    let fair = total as f64 / world as f64;
                    assert!(
                        (share - fair).abs() <= biggest as f64,
                        "share {share} fair {fair} world {world}"
                    );
                }
                // Same inputs, same shard (what every rank relies on).
                assert_eq!(shard(batch, &examples, world - 1, world), shards[world - 1]);
            }
        }
        let tiny = vec![0, 1];
        let shards: Vec<_> = (0..4).map(|r| shard(&tiny, &examples, r, 4)).collect();
        assert_eq!(shards.iter().map(Vec::len).sum::<usize>(), 2);
        assert!(shards.iter().any(Vec::is_empty));
    }
}
