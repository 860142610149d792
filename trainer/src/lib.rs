//! ferrotrain's trainer: an encoder-decoder transformer on libtorch, trained data-parallel.
//!
//! Modules by concept: `data` (corpus, tokenizer, batches), `model`, `optim` (AdamW and
//! schedules), `decode` (greedy and beam search), `bleu`, `checkpoint`, `metrics` (HTTP and the
//! per-step reporter), `tensorboard` (event files), `resources` (CPU and memory of the process),
//! `device` (where a rank computes), `omp` (OpenMP's wait policy), `allocator` (jemalloc, for
//! libtorch too), `dist` (rendezvous and collectives), `train` (the training loop), `rfc3339`
//! (times as the trainer writes them). The launcher (`ferrotrain launch`), the rendezvous
//! store, its handshake and the signal handling are the crate `ferrotrain-launch`, which needs
//! no libtorch. Each of `checkpoint`, `data`, `dist`, `metrics`,
//! `model` and `train` is a folder of files by concern; its mod.rs names them and re-exports
//! what others use.

pub mod allocator;
pub mod attention;
pub mod autograd;
pub mod bleu;
pub mod checkpoint;
pub mod checkpoint_selection;
pub mod data;
pub mod decode;
pub mod device;
pub mod distributed;
pub mod doctor;
pub mod ending;
pub mod error;
pub mod fault;
pub mod heal;
pub mod lock;
pub mod loss_scale;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod omp;
pub mod optim;
pub mod phases;
pub mod precision;
pub mod resources;
pub mod rfc3339;
pub mod tensorboard;
#[cfg(test)]
mod tmpfs;
pub mod train;
pub mod translate;
