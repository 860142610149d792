use super::*;

fn run_all<T: Send + 'static>(
    rings: Vec<Ring>,
    f: impl Fn(&mut Ring) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = rings
        .into_iter()
        .map(|mut r| {
            let f = f.clone();
            std::thread::spawn(move || f(&mut r))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn chunks_cover_the_buffer() {
    for n in 0..20 {
        for w in 1..6 {
            let mut next = 0;
            for c in 0..w {
                let (s, e) = chunk(n, w, c);
                assert_eq!(s, next);
                assert!(e >= s);
                next = e;
            }
            assert_eq!(next, n);
        }
    }
}

#[test]
fn plans_send_and_receive_the_same_bytes_around_the_ring() {
    for w in 2..6 {
        for n in [0, 1, 3, 7, 100] {
            let plans: Vec<Plan> = (0..w).map(|r| all_reduce_plan(r, w, n, 8)).collect();
            for r in 0..w {
                let sent: usize = plans[r]
                    .sends
                    .iter()
                    .filter_map(|u| match u.what {
                        Target::Data(p) => Some(p.len),
                        _ => None,
                    })
                    .sum();
                let got: usize = plans[(r + 1) % w]
                    .recvs
                    .iter()
                    .filter_map(|u| match u.what {
                        Target::Data(p) => Some(p.len),
                        _ => None,
                    })
                    .sum();
                assert_eq!(sent, got, "w={w} n={n} r={r}");
                for u in &plans[r].sends {
                    assert!(u.after <= plans[r].recvs.len());
                }
            }
        }
    }
}

#[test]
fn all_reduce_small_world_two() {
    let rings = local_rings(2, &Auth::new("t", 0), Duration::from_secs(10)).unwrap();
    let out = run_all(rings, |r| {
        let mut v = vec![r.rank() as f32 + 1.0; 5];
        r.all_reduce_sum(&mut v).unwrap();
        v
    });
    for v in out {
        assert_eq!(v, vec![3.0; 5]);
    }
}

#[test]
fn broadcast_and_barrier() {
    let rings = local_rings(3, &Auth::new("t", 0), Duration::from_secs(10)).unwrap();
    let out = run_all(rings, |r| {
        let mut v = vec![r.rank() as u8; 1001];
        r.broadcast(&mut v, 1).unwrap();
        r.barrier().unwrap();
        v
    });
    for v in out {
        assert!(v.iter().all(|&b| b == 1));
    }
}

#[test]
fn mismatched_collectives_fail_loudly() {
    let rings = local_rings(2, &Auth::new("t", 0), Duration::from_secs(5)).unwrap();
    let out = run_all(rings, |r| {
        if r.rank() == 0 {
            r.all_reduce_sum(&mut [1.0; 4]).map_err(|e| e.to_string())
        } else {
            r.all_reduce_sum(&mut [1.0; 5]).map_err(|e| e.to_string())
        }
    });
    for o in out {
        let e = o.unwrap_err();
        assert!(e.contains("disagree") || e.contains("closed"), "{e}");
    }
}
