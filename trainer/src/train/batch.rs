//! The step's global batch: the plan's `accumulate` micro-batches of the stream, which every
//! rank draws in the same order (each trains on its shard of each).

use crate::data::{BatchStream, Example};
use crate::error::Result;

/// The run's batches: the stream and how many of its micro-batches make a step.
pub(super) struct Batches {
    stream: BatchStream,
    /// Micro-batches per optimizer step (`batch.plan`).
    accumulate: u32,
}

/// One step's global batch.
pub(super) struct GlobalBatch {
    pub(super) micro: Vec<Vec<usize>>,
    /// Target tokens (with EOS): the loss is per target token of the global batch.
    pub(super) target_tokens: i64,
    pub(super) samples: u64,
    /// Source and target tokens, each with its EOS (tokens/s).
    pub(super) tokens: i64,
}

impl Batches {
    /// The stream of `train` in micro-batches of `micro_tokens`, past the job's `samples`.
    pub(super) fn start(
        train: &[Example],
        micro_tokens: usize,
        accumulate: u32,
        seed: u64,
        samples: u64,
    ) -> Result<Self> {
        let mut stream = BatchStream::new(train, micro_tokens, seed);
        stream.seek(samples)?;
        Ok(Batches { stream, accumulate })
    }

    /// The stream's epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.stream.position().epoch
    }

    /// The step's micro-batches, drawn from the stream of `train`.
    pub(super) fn next(&mut self, train: &[Example]) -> GlobalBatch {
        let micro: Vec<Vec<usize>> = (0..self.accumulate)
            .map(|_| self.stream.next_batch())
            .collect();
        let targets: i64 = micro.iter().map(|b| target_tokens(train, b)).sum();
        let samples: u64 = micro.iter().map(|b| b.len() as u64).sum();
        let tokens: i64 = micro
            .iter()
            .map(|b| {
                b.iter()
                    .map(|&j| (train[j].src.len() + train[j].tgt.len() + 2) as i64)
                    .sum::<i64>()
            })
            .sum();
        GlobalBatch {
            micro,
            target_tokens: targets,
            samples,
            tokens,
        }
    }
}

fn target_tokens(examples: &[Example], batch: &[usize]) -> i64 {
    batch
        .iter()
        .map(|&i| examples[i].tgt.len() as i64 + 1)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_batch_counts_its_micro_batches_examples_and_tokens() {
        let train: Vec<Example> = (1..=12u32)
            .map(|n| Example {
                src: vec![5; n as usize],
                tgt: vec![6; (n % 4 + 1) as usize],
            })
            .collect();
        let mut batches = Batches::start(&train, 16, 3, 7, 0).unwrap();
        let batch = batches.next(&train);
        assert_eq!(batch.micro.len(), 3);
        let drawn: Vec<usize> = batch.micro.concat();
        assert_eq!(batch.samples, drawn.len() as u64);
        let tgt: usize = drawn.iter().map(|&i| train[i].tgt.len() + 1).sum();
        let src: usize = drawn.iter().map(|&i| train[i].src.len() + 1).sum();
        assert_eq!(batch.target_tokens, tgt as i64);
        assert_eq!(batch.tokens, (src + tgt) as i64);
    }
}
