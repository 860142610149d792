//! Rendezvous and collectives between ranks.
//!
//! `init` reads the rank environment, meets the other ranks through rank 0's key-value store
//! and returns the collective backend: a no-op for one rank, the TCP ring on CPU, NCCL on GPU.
//! See docs/distributed.md for the protocol, the ring algorithm and the timeouts.

pub mod auth;
pub mod bench;
pub mod grads;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nccl_lib;
pub mod ring;
pub mod store;
pub mod strict;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use ferrotrain_api::config::{Backend, DistributedConfig};
use ferrotrain_api::env;
use tch::{Device, Kind, Tensor};

use crate::error::{Reason, Result, TrainError};
use auth::Auth;
pub use grads::{GradSync, broadcast_buffers};
use ring::Ring;
use store::{StoreClient, StoreServer};

/// Where this process sits in the gang (from RANK, WORLD_SIZE, ... in the env contract).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub attempt: u64,
    pub token: String,
    /// The in-place round (FERROTRAIN_ROUND; 0 without in-place restarts).
    pub round: u64,
    /// Node 0's launcher hosts the rendezvous store (FERROTRAIN_STORE_HOSTED=1): rank 0
    /// connects to it like every other rank.
    pub store_hosted: bool,
}

/// MASTER_PORT when unset (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

impl RankEnv {
    /// Reads the env contract; a process started without it is rank 0 of 1.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like `from_env`, reading variables through `var` (tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        fn parse<T: std::str::FromStr>(
            var: &impl Fn(&str) -> Option<String>,
            name: &str,
            default: T,
        ) -> Result<T> {
            match var(name) {
                None => Ok(default),
                Some(v) if v.trim().is_empty() => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    TrainError::Config(format!("{name}={v:?} is not a valid number").into())
                }),
            }
        }
        let world_size: usize = parse(&var, env::WORLD_SIZE, 1)?;
        let rank: usize = parse(&var, env::RANK, 0)?;
        let local_world_size: usize = parse(&var, env::LOCAL_WORLD_SIZE, world_size)?;
        let local_rank: usize = parse(&var, env::LOCAL_RANK, rank)?;
        let master_port: u16 = parse(&var, env::MASTER_PORT, DEFAULT_MASTER_PORT)?;
        let attempt: u64 = match var(env::FERROTRAIN_ATTEMPT) {
            Some(_) => parse(&var, env::FERROTRAIN_ATTEMPT, 0)?,
            None => parse(&var, env::TORCHELASTIC_RESTART_COUNT, 0)?,
        };
        let master_addr = var(env::MASTER_ADDR)
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let token = var(env::FERROTRAIN_RDZV_TOKEN).unwrap_or_default();
        let round: u64 = parse(&var, env::FERROTRAIN_ROUND, 0)?;
        let store_hosted = var(env::FERROTRAIN_STORE_HOSTED).is_some_and(|v| v.trim() == "1");
        if world_size == 0 {
            return Err(TrainError::Config("WORLD_SIZE must be at least 1".into()));
        }
        if rank >= world_size {
            return Err(TrainError::Config(
                format!("RANK={rank} is not below WORLD_SIZE={world_size}").into(),
            ));
        }
        if local_world_size == 0 || local_rank >= local_world_size {
            return Err(TrainError::Config(
                format!("LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}")
                    .into(),
            ));
        }
        if world_size > 1 && token.is_empty() {
            return Err(TrainError::Config(
                format!(
                    "{} must be set when WORLD_SIZE > 1: every rendezvous connection proves it \
                 knows it (`ferrotrain launch` and the operator set it)",
                    env::FERROTRAIN_RDZV_TOKEN
                )
                .into(),
            ));
        }
        Ok(RankEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            attempt,
            token,
            round,
            store_hosted,
        })
    }
}

/// Collective operations over all ranks. Every call has a timeout: a dead or hung peer
/// makes it fail with `TrainError::Distributed`, never hang.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Where the tensors handed to this collective must live: the CPU for the ring, the
    /// rank's GPU for NCCL. Call sites get their buffers from `zeros` and `upload`, never
    /// from `Tensor::from_slice` (a CPU tensor an NCCL communicator rejects).
    fn device(&self) -> Device;
    /// A flat buffer of zeros on `device()`, for collectives.
    fn zeros(&mut self, numel: i64, kind: Kind) -> Result<Tensor> {
        Ok(Tensor::f_zeros([numel], (kind, self.device()))?)
    }
    /// Host values copied onto `device()` as one flat f32 tensor, for collectives (on a GPU
    /// without waiting for the GPU: `data::to_device_queued`).
    fn upload(&mut self, values: &[f32]) -> Result<Tensor> {
        let host = Tensor::f_from_slice(values)?;
        Ok(crate::data::to_device_queued(&host, self.device()))
    }
    /// A result copied back to the host as f64 (exact for f32 values): one synchronisation
    /// on a GPU, so the trainer reads what it needs of a step at once.
    fn download(&mut self, tensor: Tensor) -> Result<Vec<f64>> {
        let host = tensor.f_to_device(Device::Cpu)?.f_to_kind(Kind::Double)?;
        Ok(Vec::try_from(&host)?)
    }
    /// Element-wise sum over ranks, in place. `tensor` is contiguous f32 on `device()`.
    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()>;
    /// Starts `all_reduce_sum` of `tensor` and may return before it is done (the gradient
    /// exchange overlaps backward with it); the sum is in `tensor` once `finish_started`
    /// returns. Until then the caller leaves `tensor` alone and calls no other collective
    /// but `start_all_reduce_sum`. By default the sum is done at once.
    fn start_all_reduce_sum(&mut self, tensor: &Tensor) -> Result<()> {
        self.all_reduce_sum(&mut tensor.shallow_clone())
    }
    /// Waits until every started all-reduce is done (on a GPU: until work queued after this
    /// call sees their results); reports the first failure among them.
    fn finish_started(&mut self) -> Result<()> {
        Ok(())
    }
    /// Copies root's tensor into every rank's, in place.
    fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()>;
    /// Returns when every rank has called it.
    fn barrier(&mut self) -> Result<()>;
}

/// The collective of a single rank: everything is a no-op.
pub struct Single {
    pub device: Device,
}

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn device(&self) -> Device {
        self.device
    }
    fn all_reduce_sum(&mut self, _: &mut Tensor) -> Result<()> {
        Ok(())
    }
    fn broadcast(&mut self, _: &mut Tensor, _: usize) -> Result<()> {
        Ok(())
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Meets the other ranks and returns the backend for `device`.
pub fn init(
    env: &RankEnv,
    config: &DistributedConfig,
    device: Device,
) -> Result<Box<dyn Collective>> {
    let use_nccl = match config.backend {
        Backend::Ring => false,
        Backend::Nccl => true,
        Backend::Auto => device.is_cuda(),
    };
    if use_nccl && !cfg!(feature = "cuda") {
        return Err(TrainError::Config(
            "distributed.backend nccl: this ferrotrain was built without the `cuda` feature \
             (rebuild with `--features cuda`, or use backend `ring`)"
                .into(),
        ));
    }
    if env.world_size == 1 {
        return Ok(Box::new(Single { device }));
    }
    let mut meeting = Rendezvous::meet(env, config)?;
    if use_nccl {
        #[cfg(feature = "cuda")]
        {
            let comm = nccl::Nccl::init(env, config, device, &mut meeting)?;
            return Ok(Box::new(comm));
        }
    }
    let ring = meeting.ring(config)?;
    let ring = Box::new(RingCollective {
        _store: meeting.server,
        ..RingCollective::new(ring)
    });
    if strict::requested() {
        // Tests only: every tensor must come from the collective's own buffers, as NCCL
        // needs them on its GPU (see dist/strict.rs).
        return Ok(Box::new(strict::Strict::new(ring, Device::Cpu)));
    }
    Ok(ring)
}

/// Broadcasts host values from rank 0 through `comm`'s device; returns rank 0's values.
pub fn broadcast_host(comm: &mut dyn Collective, values: &[f32]) -> Result<Vec<f32>> {
    let mut t = comm.upload(values)?;
    comm.broadcast(&mut t, 0)?;
    Ok(comm.download(t)?.into_iter().map(|v| v as f32).collect())
}

/// Sums host values over ranks through `comm`'s device.
pub fn all_reduce_host(comm: &mut dyn Collective, values: &[f32]) -> Result<Vec<f32>> {
    let mut t = comm.upload(values)?;
    comm.all_reduce_sum(&mut t)?;
    Ok(comm.download(t)?.into_iter().map(|v| v as f32).collect())
}

/// A rank's view of the rendezvous: its store connection and, on rank 0, the store itself.
pub struct Rendezvous {
    pub env: RankEnv,
    pub client: StoreClient,
    pub server: Option<StoreServer>,
    pub auth: Auth,
    /// When the rendezvous timeout runs out.
    pub deadline: Instant,
}

impl Rendezvous {
    /// Rank 0 starts the store (unless node 0's launcher hosts it); every rank connects to
    /// it (retrying until the rendezvous timeout). In an in-place round the ranks' keys live
    /// under `round/<r>/` and their ring connections prove the round.
    pub fn meet(env: &RankEnv, config: &DistributedConfig) -> Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(config.rendezvous_timeout_seconds);
        let store_auth = Auth::new(&env.token, env.attempt);
        let auth = store_auth.for_round(env.round);
        let server = if env.rank == 0 && !env.store_hosted {
            let listener = bind_until(
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), env.master_port),
                deadline,
            )?;
            let handshake = Duration::from_secs(config.rendezvous_timeout_seconds.min(10));
            Some(StoreServer::start(listener, store_auth.clone(), handshake)?)
        } else {
            None
        };
        // Rank 0 talks to its own store over loopback: it need not wait for its DNS name.
        let host = if env.rank == 0 {
            "127.0.0.1"
        } else {
            env.master_addr.as_str()
        };
        let client = StoreClient::connect(host, env.master_port, &store_auth, deadline)?;
        let client = if env.store_hosted {
            client.with_prefix(format!("round/{}/", env.round))
        } else {
            client
        };
        Ok(Rendezvous {
            env: env.clone(),
            client,
            server,
            auth,
            deadline,
        })
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Publishes this rank's ring address, connects to its neighbours and waits until every
    /// rank has.
    pub fn ring(&mut self, config: &DistributedConfig) -> Result<Ring> {
        let (rank, world) = (self.env.rank, self.env.world_size);
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        let port = listener.local_addr()?.port();
        // Others reach this rank at the address it reaches rank 0 from; they reach rank 0
        // where they reached its store.
        let host = self.client.local_ip()?;
        self.client.set(
            &format!("ring/{rank}"),
            SocketAddr::new(host, port).to_string().as_bytes(),
        )?;
        let next = (rank + 1) % world;
        let next_addr: SocketAddr = if next == 0 {
            let port = self.client.get("ring/0", self.left())?;
            let port: SocketAddr = parse_addr(&port)?;
            SocketAddr::new(self.client.peer_ip()?, port.port())
        } else {
            parse_addr(&self.client.get(&format!("ring/{next}"), self.left())?)?
        };
        let timeout = Duration::from_secs(config.collective_timeout_seconds);
        let mut ring = Ring::establish(
            rank,
            world,
            listener,
            next_addr,
            &self.auth,
            self.deadline,
            timeout,
        )?;
        // Every link is up once a value has gone all the way round.
        ring.set_timeout(self.left().max(Duration::from_secs(1)));
        ring.barrier()?;
        ring.set_timeout(timeout);
        tracing::debug!("rank {rank}: ring of {world} ranks established (next {next_addr})");
        Ok(ring)
    }
}

fn parse_addr(bytes: &[u8]) -> Result<SocketAddr> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TrainError::Distributed("rendezvous: malformed ring address".into()))
}

/// Binds `addr`, retrying while the port is still held (a previous attempt's rank 0 exiting).
pub(crate) fn bind_until(addr: SocketAddr, deadline: Instant) -> Result<TcpListener> {
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(TrainError::Distributed(Reason::caused(
                    format!("rendezvous: rank 0 cannot listen on {addr} (MASTER_PORT)"),
                    e,
                )));
            }
        }
    }
}

/// The TCP ring on CPU tensors (tensors elsewhere go through a CPU copy).
pub struct RingCollective {
    rank: usize,
    world: usize,
    /// None while a worker thread holds it for started all-reduces.
    ring: Option<Ring>,
    worker: Option<RingWorker>,
    /// Rank 0 keeps serving the store while the ring lives.
    _store: Option<StoreServer>,
}

/// A thread that owns the ring while started all-reduces run, one after the other, in the
/// order started; it gives the ring back when its queue is closed.
struct RingWorker {
    queue: std::sync::mpsc::Sender<Tensor>,
    thread: std::thread::JoinHandle<(Ring, Result<()>)>,
}

impl RingWorker {
    fn spawn(mut ring: Ring) -> Result<Self> {
        let (queue, jobs) = std::sync::mpsc::channel::<Tensor>();
        let thread = std::thread::Builder::new()
            .name("ring-all-reduce".into())
            .spawn(move || {
                let mut result = Ok(());
                for mut tensor in jobs {
                    // After a failure the ring stays failed: the rest are not started.
                    if result.is_ok() {
                        result = with_f32(&mut tensor, |data| ring.all_reduce_sum(data));
                    }
                }
                (ring, result)
            })?;
        Ok(RingWorker { queue, thread })
    }
}

impl RingCollective {
    pub fn new(ring: Ring) -> Self {
        RingCollective {
            rank: ring.rank(),
            world: ring.world_size(),
            ring: Some(ring),
            worker: None,
            _store: None,
        }
    }

    /// The ring, once the started all-reduces are done (their first failure, if any).
    fn ring(&mut self) -> Result<&mut Ring> {
        self.finish_started()?;
        Ok(self.ring.as_mut().expect("the worker gave the ring back"))
    }
}

/// Runs `f` on the tensor's f32 data: in place when it is a contiguous CPU f32 tensor,
/// through a copy otherwise.
fn with_f32(tensor: &mut Tensor, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    if tensor.device() == Device::Cpu && tensor.kind() == Kind::Float && tensor.is_contiguous() {
        let n = tensor.numel();
        if n == 0 {
            return f(&mut []);
        }
        // SAFETY: a contiguous CPU f32 tensor holds `n` f32s at data_ptr; we hold it
        // exclusively (&mut) for the call.
        let data = unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr().cast::<f32>(), n) };
        return f(data);
    }
    let mut copy = tensor
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?
        .f_detach_copy()?;
    with_f32(&mut copy, f)?;
    tch::no_grad(|| tensor.f_copy_(&copy))?;
    Ok(())
}

fn with_bytes(tensor: &mut Tensor, f: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
    if tensor.device() == Device::Cpu && tensor.is_contiguous() {
        let n = tensor.numel() * tensor.kind().elt_size_in_bytes();
        if n == 0 {
            return f(&mut []);
        }
        // SAFETY: as in with_f32, for the tensor's bytes.
        let data = unsafe { std::slice::from_raw_parts_mut(tensor.data_ptr().cast::<u8>(), n) };
        return f(data);
    }
    let mut copy = tensor
        .f_to_device(Device::Cpu)?
        .f_contiguous()?
        .f_detach_copy()?;
    with_bytes(&mut copy, f)?;
    tch::no_grad(|| tensor.f_copy_(&copy))?;
    Ok(())
}

impl Collective for RingCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
        let ring = self.ring()?;
        with_f32(tensor, |data| ring.all_reduce_sum(data))
    }
    fn start_all_reduce_sum(&mut self, tensor: &Tensor) -> Result<()> {
        if self.worker.is_none() {
            let ring = self.ring.take().expect("no worker holds the ring");
            self.worker = Some(RingWorker::spawn(ring)?);
        }
        let worker = self.worker.as_ref().expect("just set");
        // The worker ends only when the queue closes: a send cannot fail before that.
        let _ = worker.queue.send(tensor.shallow_clone());
        Ok(())
    }
    fn finish_started(&mut self) -> Result<()> {
        let Some(RingWorker { queue, thread }) = self.worker.take() else {
            return Ok(());
        };
        drop(queue);
        let (ring, result) = thread
            .join()
            .map_err(|_| TrainError::Other("the ring's all-reduce thread panicked".into()))?;
        self.ring = Some(ring);
        result
    }
    fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()> {
        let ring = self.ring()?;
        with_bytes(tensor, |data| ring.broadcast(data, root))
    }
    fn barrier(&mut self) -> Result<()> {
        self.ring()?.barrier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn empty_env_is_rank_zero_of_one() {
        let e = RankEnv::from_lookup(lookup(&[])).unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (0, 1, 0, 1)
        );
        assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
    }

    #[test]
    fn full_env_is_read() {
        let e = RankEnv::from_lookup(lookup(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "job-0-0.job.ns.svc"),
            ("MASTER_PORT", "1234"),
            ("FERROTRAIN_ATTEMPT", "5"),
            ("FERROTRAIN_RDZV_TOKEN", "s3cret"),
        ]))
        .unwrap();
        assert_eq!(e.rank, 3);
        assert_eq!(e.local_rank, 1);
        assert_eq!(e.master_addr, "job-0-0.job.ns.svc");
        assert_eq!(e.master_port, 1234);
        assert_eq!(e.attempt, 5);
    }

    #[test]
    fn bad_env_is_a_config_error() {
        for pairs in [
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("FERROTRAIN_RDZV_TOKEN", "t"),
            ][..],
            &[("RANK", "x")][..],
            &[("WORLD_SIZE", "2"), ("RANK", "1")][..],
            &[("MASTER_PORT", "70000")][..],
        ] {
            let err = RankEnv::from_lookup(lookup(pairs)).unwrap_err();
            assert!(matches!(err, TrainError::Config(_)), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn nccl_without_cuda_feature_is_a_clear_error() {
        if cfg!(feature = "cuda") {
            return;
        }
        let env = RankEnv::from_lookup(lookup(&[])).unwrap();
        let config = DistributedConfig {
            backend: Backend::Nccl,
            ..serde_json::from_str("{}").unwrap()
        };
        let err = init(&env, &config, Device::Cpu).err().unwrap();
        assert!(
            err.to_string().contains("built without the `cuda` feature"),
            "{err}"
        );
    }
}
