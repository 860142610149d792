//! The TCP ring as a `Collective`: CPU tensors in place (others through a CPU copy), and
//! started all-reduces run in order on a worker thread that holds the ring meanwhile.

use tch::{Device, Kind, Tensor};

use super::collective::Collective;
use super::ring::Ring;
use crate::error::{Result, TrainError};
use ferrotrain_launch::store::StoreServer;

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

    /// Rank 0's ring keeps serving the rendezvous store while it lives.
    pub(super) fn with_store(self, store: Option<StoreServer>) -> Self {
        RingCollective {
            _store: store,
            ..self
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
