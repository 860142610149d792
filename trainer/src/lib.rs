//! ferrotrain's trainer: an encoder-decoder transformer on libtorch, trained data-parallel.
//!
//! Modules by concept: `data` (corpus, tokenizer, batches), `model`, `optim` (AdamW and
//! schedules), `decode` (greedy and beam search), `bleu`, `checkpoint`, `metrics` (HTTP),
//! `dist` (rendezvous and collectives), `train` (the training loop), `launch` (the local
//! process supervisor), `signals` (SIGTERM/SIGINT handling for both).

pub mod bleu;
pub mod checkpoint;
pub mod data;
pub mod decode;
pub mod dist;
pub mod error;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod signals;
pub mod train;
