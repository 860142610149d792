//! The NCCL path (`--features cuda`) up to the point a GPU is needed: two ranks meet through
//! the store, then fail with a clear, permanent error on a machine without a GPU, libcuda or
//! libnccl. Without the feature, `backend: nccl` fails at once with "built without".
//!
//! ```text
//! cargo test -p ferrotrain-trainer --features cuda --test dist_nccl
//! ```

use std::net::TcpListener;
use std::time::{Duration, Instant};

use ferrotrain_api::config::DistributedConfig;
use ferrotrain_trainer::dist::{self, RankEnv};
use ferrotrain_trainer::error::TrainError;
use tch::Device;

fn config() -> DistributedConfig {
    serde_json::from_str(
        r#"{"backend":"nccl","rendezvousTimeoutSeconds":10,"collectiveTimeoutSeconds":5}"#,
    )
    .unwrap()
}

fn env(rank: usize, port: u16) -> RankEnv {
    RankEnv {
        rank,
        world_size: 2,
        local_rank: rank,
        local_world_size: 2,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        attempt: 0,
        token: "nccl-test".into(),
        round: 0,
        store_hosted: false,
    }
}

#[test]
fn nccl_fails_clearly_without_a_gpu() {
    if tch::Cuda::is_available() {
        eprintln!("a GPU is visible: this test is about machines without one");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                dist::init(&env(rank, port), &config(), Device::Cuda(rank))
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
