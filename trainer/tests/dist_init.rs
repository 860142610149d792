//! `distributed::init` end to end in one process (one thread per rank): rendezvous through rank 0's
//! store, the ring on tensors, and GradSync's bucketed gradient sums and parameter broadcast.

mod common;

use std::time::Duration;

use ferrotrain_api::config::{DistributedConfig, OptimizerConfig};
use ferrotrain_trainer::distributed::{self, Collective, GradSync, RankEnv};
use ferrotrain_trainer::optim::AdamW;
use tch::{Device, Kind, Tensor};

fn gang<T: Send + 'static>(
    world: usize,
    f: impl Fn(usize, Box<dyn Collective>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let port = common::free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let env = RankEnv {
                    master_addr: "localhost".into(),
                    ..common::rank_env(rank, world, port, "init-test")
                };
                let config = common::distributed("ring", 20, 10);
                let comm = distributed::init(&env, &config, Device::Cpu).expect("init");
                assert_eq!((comm.rank(), comm.world_size()), (rank, world));
                f(rank, comm)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn tensors_are_summed_and_broadcast_in_place() {
    let out = gang(3, |rank, mut comm| {
        let mut t = Tensor::full([4, 5], rank as f64 + 1.0, (Kind::Float, Device::Cpu));
        comm.all_reduce_sum(&mut t).unwrap();
        // A non-contiguous view goes through a copy and still lands in place.
        let base = Tensor::full([5, 4], rank as f64, (Kind::Float, Device::Cpu));
        let mut view = base.tr();
        comm.all_reduce_sum(&mut view).unwrap();
        let mut b = Tensor::full([3], rank as f64 * 10.0, (Kind::Int64, Device::Cpu));
        comm.broadcast(&mut b, 2).unwrap();
        comm.barrier().unwrap();
        (
            Vec::<f32>::try_from(t.flatten(0, -1)).unwrap(),
            Vec::<f32>::try_from(base.flatten(0, -1)).unwrap(),
            Vec::<i64>::try_from(b).unwrap(),
        )
    });
    for (sum, viewed, b) in out {
        assert!(sum.iter().all(|&x| x == 6.0));
        assert!(viewed.iter().all(|&x| x == 3.0));
        assert_eq!(b, vec![20, 20, 20]);
    }
}

#[test]
fn grad_sync_sums_in_buckets_during_backward_and_treats_unused_parameters_as_zeros() {
    let out = gang(3, |rank, mut comm| {
        let sizes = [7i64, 100, 3, 50];
        let params: Vec<(String, Tensor)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let t = Tensor::full([n], rank as f64, (Kind::Float, Device::Cpu))
                    .set_requires_grad(true);
                (format!("p{i}.weight"), t)
            })
            .collect();
        let config: OptimizerConfig = serde_json::from_str("{}").unwrap();
        let order = [3usize, 2, 1, 0];
        let mut alloc = |n: i64, kind: Kind, _: Device| comm.zeros(n, kind);
        let opt = AdamW::with_layout(&params, &order, &config, &mut alloc).unwrap();
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        // Small buckets: several all-reduces per exchange, started in completion order.
        let completion = [3, 2, 1, 0];
        let mut sync = GradSync::new(&tensors, &opt.grad_layout(), 256, &completion).unwrap();
        assert!(sync.bucket_sizes().len() >= 3, "{:?}", sync.bucket_sizes());
        distributed::broadcast_buffers(comm.as_mut(), &opt.state_buffers(), 64, 0).unwrap();
        // Rank 1 does not use parameter 2 this step: its gradient stays zero there.
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (i, p) in tensors.iter().enumerate() {
            if rank == 1 && i == 2 {
                continue;
            }
            loss += (p * (rank as f64 + 1.0)).sum(Kind::Float);
        }
        sync.arm(comm.as_mut());
        loss.backward();
        let seconds = sync.finish(comm.as_mut()).unwrap();
        assert!(seconds >= 0.0);
        let first: Vec<Vec<f32>> = tensors
            .iter()
            .map(|p| Vec::<f32>::try_from(p.grad()).unwrap())
            .collect();
        // A second step without arming: everything starts at `finish`.
        let mut opt = opt;
        opt.zero_grad();
        (&tensors[0] * 2.0).sum(Kind::Float).backward();
        sync.finish(comm.as_mut()).unwrap();
        let second = Vec::<f32>::try_from(tensors[0].grad()).unwrap();
        let values: Vec<Vec<f32>> = tensors
            .iter()
            .map(|p| Vec::<f32>::try_from(p.detach()).unwrap())
            .collect();
        (first, second, values)
    });
    for (first, second, values) in &out {
        for (i, grad) in first.iter().enumerate() {
            let expected = if i == 2 { 1.0 + 3.0 } else { 1.0 + 2.0 + 3.0 };
            assert!(grad.iter().all(|&g| g == expected), "param {i}: {grad:?}");
        }
        assert!(second.iter().all(|&g| g == 6.0), "{second:?}");
        for (i, value) in values.iter().enumerate() {
            // Rank 0's parameters (zeros) everywhere.
            assert!(value.iter().all(|&x| x == 0.0), "param {i}");
        }
    }
}

#[test]
fn a_rank_that_never_arrives_fails_the_rendezvous_at_the_timeout() {
    let port = common::free_port();
    let config: DistributedConfig =
        serde_json::from_str(r#"{"backend":"ring","rendezvousTimeoutSeconds":2}"#).unwrap();
    let env = common::rank_env(0, 2, port, "t");
    let start = std::time::Instant::now();
    let err = distributed::init(&env, &config, Device::Cpu).err().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(
        err,
        ferrotrain_trainer::error::TrainError::Distributed(_)
    ));
    assert!(err.to_string().contains("ring/1"), "{err}");
}
