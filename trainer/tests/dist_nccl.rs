//! The NCCL path (`--features cuda`) up to the point a GPU is needed: two ranks meet through
//! the store, then fail with a clear, permanent error on a machine without a GPU, libcuda or
//! libnccl. Without the feature, `backend: nccl` fails at once with "built without".
//!
//! ```text
//! cargo test -p ferrotrain-trainer --features cuda --test dist_nccl
//! ```

mod common;

use std::time::{Duration, Instant};

use ferrotrain_trainer::distributed;
use ferrotrain_trainer::error::TrainError;
use tch::Device;

#[test]
fn nccl_fails_clearly_without_a_gpu() {
    if tch::Cuda::is_available() {
        eprintln!("a GPU is visible: this test is about machines without one");
        return;
    }
    let port = common::free_port();
    let start = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let env = common::rank_env(rank, 2, port, "nccl-test");
                let config = common::distributed("nccl", 10, 5);
                distributed::init(&env, &config, Device::Cuda(rank))
                    .err()
                    .expect("no GPU here")
            })
        })
        .collect();
    for h in handles {
        let err = h.join().unwrap();
        let msg = err.to_string();
        eprintln!("rank error: {msg}");
        if cfg!(feature = "cuda") {
            // Permanent: restarting cannot conjure a GPU.
            assert!(matches!(err, TrainError::Config(_)), "{msg}");
            assert!(
                msg.contains("libcuda") || msg.contains("GPU") || msg.contains("libnccl"),
                "{msg}"
            );
        } else {
            assert!(msg.contains("built without the `cuda` feature"), "{msg}");
        }
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}
