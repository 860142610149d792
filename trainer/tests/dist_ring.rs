//! The TCP ring on 127.0.0.1: exact sums for every world size and awkward buffer sizes,
//! broadcast, and failures (a peer that dies or hangs mid-collective) within the timeout.

use std::time::{Duration, Instant};

use ferrotrain_launch::auth::Auth;
use ferrotrain_trainer::distributed::ring::{Ring, local_rings};

fn rings(world: usize, timeout: Duration) -> Vec<Ring> {
    local_rings(world, &Auth::new("ring-test-token", 0), timeout).expect("ring setup")
}

/// Runs `f(rank, ring)` on one thread per rank and returns the results in rank order.
fn on_each<T: Send + 'static>(
    rings: Vec<Ring>,
    f: impl Fn(usize, &mut Ring) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = rings
        .into_iter()
        .enumerate()
        .map(|(rank, mut ring)| {
            let f = f.clone();
            std::thread::spawn(move || f(rank, &mut ring))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

/// Integer-valued inputs, so float sums are exact whatever the order of addition.
fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + rank * 13) % 101) as f32 - 50.0)
        .collect()
}

#[test]
fn all_reduce_is_exact_for_worlds_2_to_4_and_awkward_sizes() {
    for world in [2usize, 3, 4] {
        let sizes = [0usize, 1, 2, 3, 5, 7, 1000, 12_345, 100_003];
        let out = on_each(rings(world, Duration::from_secs(20)), move |rank, ring| {
            // Small segments so that even modest buffers are pipelined in many pieces.
            ring.set_segment_bytes(4096);
            sizes
                .iter()
                .map(|&n| {
                    let mut v = input(rank, n);
                    ring.all_reduce_sum(&mut v).expect("all-reduce");
                    v
                })
                .collect::<Vec<_>>()
        });
        for (k, &n) in sizes.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
            let expected: Vec<f32> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
            for (rank, results) in out.iter().enumerate() {
                assert_eq!(results[k], expected, "world {world}, n {n}, rank {rank}");
            }
        }
    }
}

#[test]
fn repeated_all_reduces_with_default_segments() {
    let out = on_each(rings(3, Duration::from_secs(20)), |rank, ring| {
        let mut last = Vec::new();
        for round in 0..5 {
            let mut v = vec![(rank + round) as f32; 300_001];
            ring.all_reduce_sum(&mut v).unwrap();
            last = v;
        }
        ring.barrier().unwrap();
        last
    });
    for v in out {
        assert!(v.iter().all(|&x| x == (1 + 2 + 3 * 4) as f32));
    }
}

#[test]
fn broadcast_from_every_root() {
    for world in [2usize, 4] {
        let out = on_each(rings(world, Duration::from_secs(20)), move |rank, ring| {
            ring.set_segment_bytes(1000);
            (0..world)
                .map(|root| {
                    let mut v: Vec<u8> = (0..10_007).map(|i| (i * (rank + 1)) as u8).collect();
                    ring.broadcast(&mut v, root).unwrap();
                    v
                })
                .collect::<Vec<_>>()
        });
        for (rank, per_root) in out.iter().enumerate() {
            for (root, got) in per_root.iter().enumerate() {
                let expected: Vec<u8> = (0..10_007).map(|i| (i * (root + 1)) as u8).collect();
                assert_eq!(got, &expected, "world {world} root {root} rank {rank}");
            }
        }
    }
}

#[test]
fn a_peer_that_dies_mid_collective_fails_the_others_quickly() {
    let timeout = Duration::from_secs(10);
    let start = Instant::now();
    let out = on_each(rings(3, timeout), |rank, ring| {
        let mut v = vec![1.0f32; 2_000_000];
        if rank == 1 {
            // Take part in one collective, then vanish in the middle of the next: the
            // others have started sending; this rank closes its sockets.
            ring.all_reduce_sum(&mut v).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            return Ok(Duration::ZERO);
        }
        ring.all_reduce_sum(&mut v).unwrap();
        let t = Instant::now();
        ring.all_reduce_sum(&mut v).map(|_| t.elapsed())
    });
    // Rank 1's thread returned and dropped its ring (both sockets closed).
    for (rank, r) in out.iter().enumerate() {
        if rank == 1 {
            continue;
        }
        let err = r
            .as_ref()
            .expect_err("a dead peer must fail the collective");
        let msg = err.to_string();
        assert!(msg.contains("rank "), "rank {rank}: {msg}");
    }
    // Dying is noticed at once (EOF), not after the collective timeout.
    assert!(start.elapsed() < timeout, "took {:?}", start.elapsed());
    let msg = out[2].as_ref().unwrap_err().to_string();
    assert!(msg.contains("rank 1 (127.0.0.1:"), "{msg}");
    assert!(msg.contains("closed the connection"), "{msg}");
}

#[test]
fn a_hung_peer_fails_the_others_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    let out = on_each(rings(3, timeout), move |rank, ring| {
        let mut v = vec![1.0f32; 1000];
        if rank == 1 {
            // Alive (sockets open) but never joins the collective: a hang, like SIGSTOP.
            std::thread::sleep(timeout + Duration::from_secs(3));
            return Ok(Duration::ZERO);
        }
        let t = Instant::now();
        ring.all_reduce_sum(&mut v)
            .map(|_| t.elapsed())
            .map_err(|e| (e.to_string(), t.elapsed()))
    });
    for rank in [0, 2] {
        let (msg, took) = out[rank]
            .clone()
            .expect_err("a hung peer must fail the collective");
        assert!(
            took < timeout + Duration::from_secs(2),
            "rank {rank} took {took:?}"
        );
        assert!(msg.contains("rank "), "{msg}");
    }
    // Rank 2 waits on rank 1 and names it; rank 0 hears from rank 2 (which gave up) first
    // or times out on it itself.
    let (msg, took) = out[2].clone().unwrap_err();
    assert!(
        msg.contains("rank 1 (127.0.0.1:") && msg.contains("did not answer within 2 s"),
        "{msg}"
    );
    assert!(took >= timeout - Duration::from_millis(100), "{took:?}");
}

#[test]
fn after_a_failure_the_ring_stays_failed() {
    let out = on_each(rings(2, Duration::from_millis(500)), |rank, ring| {
        if rank == 1 {
            std::thread::sleep(Duration::from_secs(1));
            return (true, true);
        }
        let first = ring.all_reduce_sum(&mut [1.0]).is_err();
        let second = ring.all_reduce_sum(&mut [1.0]).unwrap_err().to_string();
        (first, second.contains("broken by an earlier failure"))
    });
    assert_eq!(out[0], (true, true));
}
