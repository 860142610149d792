//! The collective operations every backend implements (`Collective`), the single rank's
//! no-op backend, and host values sent through a collective: floats summed or broadcast,
//! integers and byte strings broadcast exactly from rank 0.

use tch::{Device, Kind, Tensor};

use crate::error::Result;

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
    /// on a GPU, so the trainer reads what it needs of a step at once. `tensor` lives on
    /// `device()`: one of this collective's buffers (or a part of one).
    fn download(&mut self, tensor: Tensor) -> Result<Vec<f64>> {
        let host = tensor.f_to_device(Device::Cpu)?.f_to_kind(Kind::Double)?;
        Ok(Vec::try_from(&host)?)
    }
    /// A tensor of the model's device (a gradient norm, a loss) on `device()`, to be read
    /// with this collective's results: itself under NCCL, a host copy under the TCP ring on
    /// a GPU (whose buffers live on the CPU: concatenating the two would mix devices).
    fn adopt(&mut self, tensor: &Tensor) -> Result<Tensor> {
        Ok(tensor.f_to_device(self.device())?)
    }
    /// Several results read at once, in order (one synchronisation): each one of this
    /// collective's buffers or [`adopt`](Collective::adopt)ed.
    fn download_parts(&mut self, parts: &[Tensor]) -> Result<Vec<f64>> {
        let doubles = parts
            .iter()
            .map(|p| p.f_to_kind(Kind::Double))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let host = Tensor::f_cat(&doubles, 0)?.f_to_device(Device::Cpu)?;
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

/// Broadcasts unsigned integers from rank 0, exactly: each travels as four 16-bit limbs,
/// which f32 represents without rounding.
pub fn broadcast_u64s(comm: &mut dyn Collective, values: &[u64]) -> Result<Vec<u64>> {
    let limbs: Vec<f32> = values
        .iter()
        .flat_map(|v| (0..4).map(move |i| ((v >> (16 * i)) & 0xffff) as f32))
        .collect();
    let back = broadcast_host(comm, &limbs)?;
    Ok(back
        .chunks(4)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |acc, (i, &l)| acc | ((l as u64) << (16 * i)))
        })
        .collect())
}

/// Broadcasts a byte string from rank 0 (each byte as one f32).
pub fn broadcast_bytes(comm: &mut dyn Collective, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
    let len = broadcast_u64s(comm, &[bytes.as_ref().map_or(0, |b| b.len() as u64)])?[0] as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    let floats: Vec<f32> = match bytes {
        Some(b) => b.into_iter().map(f32::from).collect(),
        None => vec![0.0; len],
    };
    let back = broadcast_host(comm, &floats)?;
    Ok(back.into_iter().map(|f| f as u8).collect())
}
