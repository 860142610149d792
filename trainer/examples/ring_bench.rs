//! Ring all-reduce throughput on loopback: `world` ranks as threads of one process.
//!
//! ```text
//! cargo run --release -p ferrotrain-trainer --example ring_bench -- [world] [MB] [iters] [segment KiB]
//! ```
//!
//! Prints the algorithm bandwidth (buffer bytes / time per all-reduce), the figure
//! nccl-tests and gloo's benchmark call "algbw"; bus bandwidth is algbw * 2(world-1)/world.
//! This is a benchmark, not a test: it asserts only that the sums are right.

use std::time::{Duration, Instant};

use ferrotrain_launch::auth::Auth;
use ferrotrain_trainer::distributed::ring::local_rings;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let world = arg(1, 2.0) as usize;
    let megabytes = arg(2, 25.0);
    let iters = arg(3, 20.0) as usize;
    let segment_kib = arg(4, 0.0) as usize;
    let n = (megabytes * 1e6 / 4.0) as usize;
    let rings = local_rings(world, &Auth::new("bench", 0), Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = rings
        .into_iter()
        .map(|mut ring| {
            std::thread::spawn(move || {
                if segment_kib > 0 {
                    ring.set_segment_bytes(segment_kib << 10);
                }
                let mut v = vec![1.0f32; n];
                // Warm-up: page in the buffers and grow the socket windows.
                ring.all_reduce_sum(&mut v).unwrap();
                ring.barrier().unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    v.fill(1.0);
                    ring.all_reduce_sum(&mut v).unwrap();
                }
                let took = start.elapsed();
                assert!(v.iter().all(|&x| x == world as f32));
                took
            })
        })
        .collect();
    let took = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap();
    let per = took.as_secs_f64() / iters as f64;
    let algbw = (n * 4) as f64 / per / 1e9;
    let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
    println!(
        "world {world}  {:.1} MB  {:.2} ms/all-reduce  algbw {algbw:.2} GB/s  busbw {busbw:.2} GB/s",
        (n * 4) as f64 / 1e6,
        per * 1e3
    );
}
