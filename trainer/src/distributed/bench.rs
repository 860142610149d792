//! `ferrotrain bench-collective`: all-reduce time and bandwidth between the ranks of a gang,
//! through the same backend and code path training uses (bench/collectives.sh runs it next to
//! torch.distributed's gloo and NCCL).
//!
//! Each rank runs it with the usual env contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//! FERROTRAIN_RDZV_TOKEN); rank 0 prints one JSON line per size. Bandwidths follow
//! nccl-tests: algorithm bandwidth = bytes / time, bus bandwidth = algbw * 2(n-1)/n (what
//! each link carries in a ring all-reduce; comparable across world sizes).

use std::time::Instant;

use ferrotrain_api::config::DistributedConfig;
use serde::Serialize;
use tch::{Device, Kind};

use super::collective::Collective;
use super::rank::RankEnv;
use crate::error::Result;

/// One size's result.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub backend: String,
    pub world: usize,
    pub bytes: u64,
    /// Median seconds of one all-reduce.
    pub seconds: f64,
    /// Fastest of the timed runs.
    pub min_seconds: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

/// Times `iters` all-reduces of f32 buffers of each size in `sizes_bytes` (after `warmup`
/// untimed ones), every timed call started together (a barrier before each).
pub fn all_reduce(
    comm: &mut dyn Collective,
    sizes_bytes: &[u64],
    warmup: usize,
    iters: usize,
) -> Result<Vec<BenchRow>> {
    let world = comm.world_size();
    let backend = match (comm.device().is_cuda(), world) {
        (true, _) => "nccl",
        (false, 1) => "none",
        (false, _) => "ring",
    };
    let mut rows = Vec::new();
    for &bytes in sizes_bytes {
        let numel = (bytes / 4).max(1) as i64;
        let mut t = comm.zeros(numel, Kind::Float)?;
        let _ = t.f_fill_(1.0)?;
        let mut times = Vec::with_capacity(iters);
        for i in 0..warmup + iters.max(1) {
            comm.barrier()?;
            let t0 = Instant::now();
            comm.all_reduce_sum(&mut t)?;
            if comm.device().is_cuda() {
                // The timing covers the collective's completion, not its launch.
                let _ = comm.download(t.f_narrow(0, 0, 1)?)?;
            }
            if i >= warmup {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let seconds = times[times.len() / 2];
        let algbw = bytes as f64 / seconds / 1e9;
        rows.push(BenchRow {
            backend: backend.into(),
            world,
            bytes,
            seconds,
            min_seconds: times[0],
            algbw_gbps: algbw,
            busbw_gbps: algbw * 2.0 * (world as f64 - 1.0) / world as f64,
        });
    }
    Ok(rows)
}

/// Every collective once, with values that show a wrong result: the sum of ones is the world
/// size, a broadcast from rank 0 gives rank 0's value, a barrier returns.
pub fn check(comm: &mut dyn Collective) -> Result<()> {
    let world = comm.world_size() as f64;
    let mut ones = comm.upload(&[1.0; 1000])?;
    comm.all_reduce_sum(&mut ones)?;
    let sums = comm.download(ones)?;
    let mut mine = comm.upload(&[comm.rank() as f32 + 7.0; 10])?;
    comm.broadcast(&mut mine, 0)?;
    let got = comm.download(mine)?;
    comm.barrier()?;
    if sums.iter().any(|&v| v != world) || got.iter().any(|&v| v != 7.0) {
        return Err(crate::error::TrainError::Distributed(
            format!(
                "collective check failed: all-reduce of ones gave {:?} (want {world}), broadcast \
             gave {:?} (want 7)",
                &sums[..3],
                &got[..3]
            )
            .into(),
        ));
    }
    Ok(())
}

/// The subcommand: meets the other ranks on `device`, checks every collective, and prints
/// rank 0's rows as JSON lines.
pub fn run(
    device: Device,
    config: &DistributedConfig,
    sizes_bytes: &[u64],
    warmup: usize,
    iters: usize,
) -> Result<()> {
    let env = RankEnv::from_env()?;
    // One rank on a GPU gets a real NCCL communicator (training would skip it), so a
    // single-GPU machine still runs NCCL's init and every collective.
    let mut comm = super::init_with(&env, config, device, device.is_cuda())?;
    check(comm.as_mut())?;
    if env.rank == 0 {
        eprintln!(
            "bench-collective: all-reduce, broadcast and barrier correct on {} rank(s), {:?}",
            env.world_size,
            comm.device()
        );
    }
    let rows = all_reduce(comm.as_mut(), sizes_bytes, warmup, iters)?;
    comm.barrier()?;
    if env.rank == 0 {
        for row in rows {
            println!("{}", serde_json::to_string(&row).expect("a row serialises"));
        }
    }
    Ok(())
}
