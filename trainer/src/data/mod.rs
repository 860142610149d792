//! Training data: parallel corpora (or the synthetic copy task), the subword vocabulary,
//! token-count batches and the global data position.
//!
//! The data order is a pure function of (seed, epoch): every rank computes the same global
//! batches and takes its own shard of each, so the position is one number, the count of
//! training examples consumed over all ranks, valid at any world size.

mod batches;
mod corpus;
mod files;
mod rng;
mod tensors;
mod vocab;

#[cfg(test)]
mod fixtures;

pub use batches::{BatchStream, DataPosition, epoch_batches, shard};
pub use corpus::{Corpus, Example, TokenStats, load_corpus, token_stats};
pub use files::{preflight_data, read_lines};
pub use tensors::{TensorBatch, to_device_queued, to_tensors};
pub use vocab::{BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Vocabulary};
