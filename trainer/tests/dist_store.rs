//! Hostile connections to rank 0's rendezvous port while real ranks meet through it: a wrong
//! token, a wrong attempt, junk and a half-open connection do not disturb the rendezvous
//! (launch/tests/store.rs: each is dropped by the store).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ferrotrain_launch::auth::{Auth, Channel};
use ferrotrain_trainer::distributed::{self, RankEnv};
use tch::{Device, Kind, Tensor};

const TOKEN: &str = "the-real-token";

#[test]
fn hostile_connections_do_not_disturb_a_real_rendezvous() {
    let port = common::free_port();
    let config = common::distributed("ring", 20, 10);
    let env = |rank: usize| RankEnv {
        attempt: 4,
        ..common::rank_env(rank, 2, port, TOKEN)
    };
    let start = Instant::now();
    let rank0 = {
        let (env, config) = (env(0), config.clone());
        std::thread::spawn(move || -> Result<f32, String> {
            let mut comm =
                distributed::init(&env, &config, Device::Cpu).map_err(|e| e.to_string())?;
            let mut t = Tensor::from_slice(&[1.0f32, 2.0]);
            comm.all_reduce_sum(&mut t).map_err(|e| e.to_string())?;
            // Keep the store up a little longer so late hostile connections reach it.
            std::thread::sleep(Duration::from_millis(500));
            Ok(t.sum(Kind::Float).double_value(&[]) as f32)
        })
    };
    // Wait for rank 0's store, then open hostile connections before rank 1 arrives.
    let mut hostile = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let half_open = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    hostile.push(half_open);
    for auth in [Auth::new("wrong", 4), Auth::new(TOKEN, 5)] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let r = auth.connect(&mut s, Channel::Store, 0, Duration::from_secs(5));
        assert!(r.is_err(), "a wrong token or attempt was accepted");
    }
    let mut junk = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _ = junk.write_all(&[0xAB; 5000]);
    hostile.push(junk);

    let rank1 = {
        let (env, config) = (env(1), config.clone());
        std::thread::spawn(move || -> Result<f32, String> {
            let mut comm =
                distributed::init(&env, &config, Device::Cpu).map_err(|e| e.to_string())?;
            let mut t = Tensor::from_slice(&[10.0f32, 20.0]);
            comm.all_reduce_sum(&mut t).map_err(|e| e.to_string())?;
            Ok(t.sum(Kind::Float).double_value(&[]) as f32)
        })
    };
    assert_eq!(rank1.join().unwrap().unwrap(), 33.0);
    assert_eq!(rank0.join().unwrap().unwrap(), 33.0);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}
