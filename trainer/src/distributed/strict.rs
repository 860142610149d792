//! A device-strict twin of the NCCL backend for machines without a GPU.
//!
//! NCCL only accepts contiguous tensors on its GPU; a call site that hands it a host tensor
//! (`Tensor::from_slice`) fails every multi-GPU job at start. On a CPU-only build every tensor
//! is a CPU tensor, so checking the device alone would catch nothing. The twin therefore
//! tracks *residency*: a tensor is "on the device" only if the collective itself allocated it
//! (`zeros`, `upload`), exactly the tensors that would be on the GPU under NCCL. Anything else
//! (a host tensor built by a call site, a parameter or optimizer moment handed over directly)
//! is rejected with the error NCCL's `check_tensor` gives, so CI catches that class of bug.
//!
//! Like `Nccl`, the twin also checks the declared device and contiguity, refuses kinds NCCL
//! cannot exchange, and stays failed after the first error (NCCL aborts its communicator).
//! It holds started all-reduces to their contract: it keeps a copy of each tensor when it is
//! started and sums it at `finish_started` only if nothing wrote to it in between (under
//! NCCL the side stream reads it while the caller goes on: a write would be summed
//! half-done), and it refuses any other collective or host read while some are started.
//! It counts collectives and host reads (`download`, one host synchronisation each on a GPU)
//! and logs the counts when dropped, so tests can check it was in the path.
//!
//! `distributed::init` wraps the TCP ring in it when `FERROTRAIN_STRICT_COLLECTIVES=1` (tests only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tch::{Device, Kind, Tensor};

use super::collective::Collective;
use crate::error::{Result, TrainError};

/// Test hook: set to 1, `distributed::init` wraps the ring in the strict twin.
pub const STRICT_ENV: &str = "FERROTRAIN_STRICT_COLLECTIVES";

/// Whether the strict twin was asked for.
pub fn requested() -> bool {
    std::env::var(STRICT_ENV).is_ok_and(|v| v.trim() == "1")
}

/// What the twin saw (shared so a test can read it while the twin is boxed).
#[derive(Debug, Default)]
pub struct Counters {
    /// All-reduces, broadcasts and barriers that passed the checks.
    pub collectives: AtomicU64,
    /// Host reads of collective results.
    pub downloads: AtomicU64,
    /// All-reduces started (`start_all_reduce_sum`), summed later by `finish_started`.
    pub started: AtomicU64,
}

/// The device-strict collective: checks, then delegates to `inner`.
pub struct Strict {
    inner: Box<dyn Collective>,
    device: Device,
    /// The buffers this collective allocated: (tensor kept alive, first byte, bytes).
    resident: Vec<(Tensor, usize, usize)>,
    broken: Option<String>,
    counters: Arc<Counters>,
    /// Started all-reduces, each with a copy of its tensor as it was when started: summed
    /// at `finish_started`, after checking nothing wrote to them in between (on a GPU the
    /// side stream reads them while the caller goes on).
    started: Vec<(Tensor, Tensor)>,
}

impl Strict {
    /// `device` is what the twin declares (`Collective::device`); its buffers physically live
    /// on the CPU, so the declared device must be the CPU for it to run collectives.
    pub fn new(inner: Box<dyn Collective>, device: Device) -> Self {
        Strict {
            inner,
            device,
            resident: Vec::new(),
            broken: None,
            counters: Arc::default(),
            started: Vec::new(),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    fn register(&mut self, t: &Tensor) {
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        self.resident
            .push((t.shallow_clone(), t.data_ptr() as usize, bytes));
    }

    fn is_resident(&self, t: &Tensor) -> bool {
        let start = t.data_ptr() as usize;
        let bytes = t.numel() * t.kind().elt_size_in_bytes();
        self.resident
            .iter()
            .any(|&(_, s, n)| start >= s && start + bytes <= s + n)
    }

    /// The same refusals as `Nccl::check_tensor` and `nccl::data_type`, plus residency.
    fn check_tensor(&mut self, t: &Tensor) -> Result<()> {
        if let Some(b) = &self.broken {
            return Err(TrainError::Distributed(
                format!("the strict communicator was aborted by an earlier failure: {b}").into(),
            ));
        }
        let problem = if t.device() != self.device {
            Some(format!(
                "a tensor on {:?}, the communicator's device is {:?}",
                t.device(),
                self.device
            ))
        } else if !t.is_contiguous() {
            Some("a non-contiguous tensor".to_string())
        } else if !matches!(
            t.kind(),
            Kind::Float
                | Kind::Double
                | Kind::Half
                | Kind::BFloat16
                | Kind::Int
                | Kind::Int64
                | Kind::Uint8
                | Kind::Bool
                | Kind::Int8
        ) {
            Some(format!("a {:?} tensor", t.kind()))
        } else if t.numel() > 0 && !self.is_resident(t) {
            Some(
                "a tensor the communicator did not allocate (a host tensor: NCCL would see \
                 CPU memory); get buffers from Collective::zeros/upload"
                    .to_string(),
            )
        } else {
            None
        };
        match problem {
            Some(p) => {
                let message = format!("NCCL collectives need contiguous CUDA tensors: got {p}");
                self.broken = Some(message.clone());
                Err(TrainError::Distributed(message.into()))
            }
            None => Ok(()),
        }
    }

    /// A host read of a tensor this collective neither allocated nor adopted: under the ring
    /// on a GPU it would be on CUDA while the collective's buffers are on the CPU (a
    /// device mix that fails the first step), under NCCL the other way round.
    fn foreign(&mut self, t: &Tensor, what: &str) -> TrainError {
        let message = format!(
            "{what} of a tensor ({:?}, {} elements) the communicator did not allocate: a \
             tensor of the model's device mixed into the collective's host read (with the \
             ring on a GPU: CUDA and CPU tensors in one cat); pass it through Collective::adopt",
            t.kind(),
            t.numel()
        );
        self.broken = Some(message.clone());
        TrainError::Distributed(message.into())
    }

    /// Fails (and stays failed) when all-reduces are started and not finished: the
    /// contract allows nothing but more starts until `finish_started`.
    fn check_nothing_started(&mut self, what: &str) -> Result<()> {
        if self.started.is_empty() {
            return Ok(());
        }
        let message = format!(
            "{what} called with {} started all-reduce(s) not finished (call finish_started \
             first)",
            self.started.len()
        );
        self.broken = Some(message.clone());
        Err(TrainError::Distributed(message.into()))
    }

    fn done(&mut self, result: Result<()>) -> Result<()> {
        match result {
            Ok(()) => {
                self.counters.collectives.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.broken = Some(e.to_string());
                Err(e)
            }
        }
    }
}

impl Collective for Strict {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn device(&self) -> Device {
        self.device
    }
    fn zeros(&mut self, numel: i64, kind: Kind) -> Result<Tensor> {
        let t = Tensor::f_zeros([numel], (kind, self.device))?;
        self.register(&t);
        Ok(t)
    }
    fn upload(&mut self, values: &[f32]) -> Result<Tensor> {
        let t = Tensor::from_slice(values).f_to_device(self.device)?;
        self.register(&t);
        Ok(t)
    }
    fn adopt(&mut self, tensor: &Tensor) -> Result<Tensor> {
        let t = tensor.f_to_device(self.device)?.f_detach_copy()?;
        self.register(&t);
        Ok(t)
    }
    fn download_parts(&mut self, parts: &[Tensor]) -> Result<Vec<f64>> {
        self.check_nothing_started("download")?;
        if let Some(p) = parts.iter().find(|p| p.numel() > 0 && !self.is_resident(p)) {
            return Err(self.foreign(p, "download_parts"));
        }
        self.counters.downloads.fetch_add(1, Ordering::Relaxed);
        for p in parts {
            let ptr = p.data_ptr() as usize;
            self.resident.retain(|(_, s, _)| *s != ptr);
        }
        let doubles = parts
            .iter()
            .map(|p| p.f_to_kind(Kind::Double))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Vec::try_from(&Tensor::f_cat(&doubles, 0)?)?)
    }
    fn download(&mut self, tensor: Tensor) -> Result<Vec<f64>> {
        self.check_nothing_started("download")?;
        if tensor.numel() > 0 && !self.is_resident(&tensor) {
            return Err(self.foreign(&tensor, "download"));
        }
        if tensor.device() != self.device {
            return Err(TrainError::Distributed(
                format!(
                    "download of a tensor on {:?}, the communicator's device is {:?}",
                    tensor.device(),
                    self.device
                )
                .into(),
            ));
        }
        self.counters.downloads.fetch_add(1, Ordering::Relaxed);
        // An upload's buffer is done with once read back.
        let ptr = tensor.data_ptr() as usize;
        self.resident.retain(|(_, s, _)| *s != ptr);
        let host = tensor.f_to_kind(Kind::Double)?;
        Ok(Vec::try_from(&host)?)
    }
    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
        self.check_nothing_started("all_reduce_sum")?;
        self.check_tensor(tensor)?;
        let r = self.inner.all_reduce_sum(tensor);
        self.done(r)
    }
    fn start_all_reduce_sum(&mut self, tensor: &Tensor) -> Result<()> {
        self.check_tensor(tensor)?;
        let snapshot = tensor.f_detach_copy()?;
        self.started.push((tensor.shallow_clone(), snapshot));
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn finish_started(&mut self) -> Result<()> {
        for (i, (mut tensor, snapshot)) in std::mem::take(&mut self.started).into_iter().enumerate()
        {
            if !tensor.equal(&snapshot) {
                let message = format!(
                    "started all-reduce {i} ({} elements): its tensor changed before \
                     finish_started (on a GPU the side stream would have read it mid-write)",
                    tensor.numel()
                );
                self.broken = Some(message.clone());
                return Err(TrainError::Distributed(message.into()));
            }
            let r = self.inner.all_reduce_sum(&mut tensor);
            self.done(r)?;
        }
        Ok(())
    }
    fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()> {
        self.check_nothing_started("broadcast")?;
        self.check_tensor(tensor)?;
        let r = self.inner.broadcast(tensor, root);
        self.done(r)
    }
    fn barrier(&mut self) -> Result<()> {
        // `Nccl::barrier` all-reduces a buffer it allocates itself: nothing to check but the
        // communicator's state.
        if let Some(b) = &self.broken {
            return Err(TrainError::Distributed(
                format!("the strict communicator was aborted by an earlier failure: {b}").into(),
            ));
        }
        self.check_nothing_started("barrier")?;
        let r = self.inner.barrier();
        self.done(r)
    }
}

impl Drop for Strict {
    fn drop(&mut self) {
        tracing::info!(
            collectives = self.counters.collectives.load(Ordering::Relaxed),
            downloads = self.counters.downloads.load(Ordering::Relaxed),
            started = self.counters.started.load(Ordering::Relaxed),
            "strict collectives checked"
        );
    }
}

/// `world` ranks holding identical values, in one process (unit tests): an all-reduce
/// multiplies by `world`, a broadcast changes nothing.
pub struct Loopback {
    pub world: usize,
}

impl Collective for Loopback {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
        let world = self.world as f64;
        let _ = tch::no_grad(|| tensor.f_mul_(&Tensor::from(world)))?;
        Ok(())
    }
    fn broadcast(&mut self, _: &mut Tensor, _: usize) -> Result<()> {
        Ok(())
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::{GradSync, all_reduce_host, broadcast_host};

    fn strict() -> Strict {
        Strict::new(Box::new(Loopback { world: 2 }), Device::Cpu)
    }

    #[test]
    fn a_tensor_on_another_device_is_rejected() {
        // Declared as NCCL would be on GPU 0: the CPU tensor a call site built is refused.
        let mut comm = Strict::new(Box::new(Loopback { world: 2 }), Device::Cuda(0));
        let mut host = Tensor::from_slice(&[1.0f32, 2.0]);
        let err = comm.all_reduce_sum(&mut host).unwrap_err();
        assert!(matches!(err, TrainError::Distributed(_)), "{err}");
        assert!(
            err.to_string().contains("need contiguous CUDA tensors"),
            "{err}"
        );
        assert!(err.to_string().contains("Cuda(0)"), "{err}");
    }

    #[test]
    fn a_host_tensor_is_rejected_even_on_the_cpu() {
        let mut comm = strict();
        let mut host = Tensor::from_slice(&[1.0f32, 2.0]);
        let err = comm.broadcast(&mut host, 0).unwrap_err();
        assert!(err.to_string().contains("did not allocate"), "{err}");
        // Like an aborted NCCL communicator, it stays failed.
        let mut ok = comm.upload(&[1.0]).unwrap();
        assert!(comm.all_reduce_sum(&mut ok).is_err());
    }

    #[test]
    fn parameters_handed_over_directly_are_rejected() {
        let mut comm = strict();
        let mut param = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        assert!(comm.all_reduce_sum(&mut param).is_err());
    }

    #[test]
    fn a_model_tensor_in_a_host_read_is_rejected_unless_adopted() {
        // The ring on a GPU: its scalars on the CPU, the gradient norm on CUDA. Here both
        // are CPU tensors; residency tells them apart, as under NCCL.
        let mut comm = strict();
        let scalars = comm.upload(&[1.0, 2.0]).unwrap();
        let norm = Tensor::from_slice(&[3.0f32]);
        let cat = Tensor::cat(&[scalars.shallow_clone(), norm.shallow_clone()], 0);
        let e = comm.download(cat).unwrap_err().to_string();
        assert!(e.contains("did not allocate"), "{e}");
        let mut comm = strict();
        let scalars = comm.upload(&[1.0, 2.0]).unwrap();
        let e = comm
            .download_parts(&[scalars.shallow_clone(), norm.shallow_clone()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Collective::adopt"), "{e}");
        let mut comm = strict();
        let scalars = comm.upload(&[1.0, 2.0]).unwrap();
        let adopted = comm.adopt(&norm).unwrap();
        assert_eq!(
            comm.download_parts(&[scalars, adopted]).unwrap(),
            [1.0, 2.0, 3.0]
        );
    }

    #[test]
    fn device_buffers_pass_and_reduce() {
        let mut comm = strict();
        assert_eq!(
            all_reduce_host(&mut comm, &[1.0, 3.0]).unwrap(),
            vec![2.0, 6.0]
        );
        assert_eq!(broadcast_host(&mut comm, &[5.0]).unwrap(), vec![5.0]);
        comm.barrier().unwrap();
        // A view inside a device buffer is on the device too.
        let flat = comm.zeros(8, Kind::Float).unwrap();
        let mut view = flat.narrow(0, 2, 4);
        comm.all_reduce_sum(&mut view).unwrap();
        let c = comm.counters();
        assert_eq!(c.collectives.load(Ordering::Relaxed), 4);
        assert_eq!(c.downloads.load(Ordering::Relaxed), 2);
    }

    fn adamw_on(comm: &mut Strict, params: &[(String, Tensor)]) -> crate::optim::AdamW {
        let config: ferrotrain_api::config::OptimizerConfig = serde_json::from_str("{}").unwrap();
        let order: Vec<usize> = (0..params.len()).collect();
        let mut alloc = |n: i64, kind: Kind, _: Device| comm.zeros(n, kind);
        crate::optim::AdamW::with_layout(params, &order, &config, &mut alloc).unwrap()
    }

    #[test]
    fn grad_sync_runs_on_the_optimizers_device_buffers_without_copies() {
        let mut comm = strict();
        let params: Vec<(String, Tensor)> = [3i64, 5]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let t = Tensor::ones([n], (Kind::Float, Device::Cpu)).set_requires_grad(true);
                (format!("p{i}.weight"), t)
            })
            .collect();
        let opt = adamw_on(&mut comm, &params);
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        let mut sync = GradSync::new(&tensors, &opt.grad_layout(), 16, &[0, 1]).unwrap();
        assert_eq!(sync.bucket_sizes(), vec![3, 5]);
        sync.arm(&mut comm);
        let loss = tensors[0].sum(Kind::Float) * 2.0 + tensors[1].sum(Kind::Float);
        loss.backward();
        sync.finish(&mut comm).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&tensors[0].grad()).unwrap(),
            vec![4.0; 3]
        );
        assert_eq!(
            Vec::<f32>::try_from(&tensors[1].grad()).unwrap(),
            vec![2.0; 5]
        );
        crate::distributed::broadcast_buffers(&mut comm, &opt.state_buffers(), 8, 0).unwrap();
        assert_eq!(Vec::<f32>::try_from(&tensors[1]).unwrap(), vec![1.0; 5]);
    }

    #[test]
    fn gradients_in_buffers_the_collective_did_not_allocate_are_rejected() {
        let mut comm = strict();
        let w = Tensor::ones([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let params = vec![("w".to_string(), w.shallow_clone())];
        let config: ferrotrain_api::config::OptimizerConfig = serde_json::from_str("{}").unwrap();
        // Host buffers, as a call site that forgot `Collective::zeros` would make.
        let opt = crate::optim::AdamW::new(&params, &config);
        let mut sync = GradSync::new(&[w], &opt.grad_layout(), 1 << 20, &[0]).unwrap();
        let err = sync.finish(&mut comm).unwrap_err();
        assert!(err.to_string().contains("did not allocate"), "{err}");
    }

    #[test]
    fn a_started_tensor_written_before_finish_is_caught() {
        let mut comm = strict();
        let flat = comm.zeros(4, Kind::Float).unwrap();
        comm.start_all_reduce_sum(&flat.narrow(0, 0, 2)).unwrap();
        comm.start_all_reduce_sum(&flat.narrow(0, 2, 2)).unwrap();
        // Another collective before finish_started breaks the contract.
        let mut other = strict();
        let t = other.zeros(2, Kind::Float).unwrap();
        other.start_all_reduce_sum(&t).unwrap();
        let err = other.download(t.shallow_clone()).unwrap_err();
        assert!(err.to_string().contains("not finished"), "{err}");
        // Written after its start: refused at finish.
        let _ = flat.shallow_clone().fill_(1.0);
        let err = comm.finish_started().unwrap_err();
        assert!(
            err.to_string().contains("changed before finish_started"),
            "{err}"
        );
        // Left alone: summed at finish (Loopback doubles).
        let mut fresh = strict();
        let flat = fresh.zeros(4, Kind::Float).unwrap();
        let _ = flat.shallow_clone().fill_(1.0);
        fresh.start_all_reduce_sum(&flat.narrow(0, 1, 2)).unwrap();
        fresh.finish_started().unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&flat).unwrap(),
            vec![1.0, 2.0, 2.0, 1.0]
        );
    }
}
