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
    /// Whether training exchanges its gradients and step scalars through this backend (a
    /// `GradSync` and the gang's step read): with other ranks, or through NCCL's
    /// communicator of one that `FERROTRAIN_GANG_OF_ONE=1` asks for (the gang's GPU path,
    /// checked on a machine with one GPU).
    fn exchanges(&self) -> bool {
        self.world_size() > 1
    }
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
    /// collective's buffers or [`adopt`](Collective::adopt)ed. Joined on `device()`, then
    /// read through [`download`](Collective::download), so that a backend whose host reads
    /// wait on their own terms (NCCL's bounded, abortable wait) gets them here too.
    fn download_parts(&mut self, parts: &[Tensor]) -> Result<Vec<f64>> {
        let doubles = parts
            .iter()
            .map(|p| p.f_to_kind(Kind::Double))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.download(Tensor::f_cat(&doubles, 0)?)
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
    /// The exchange that backward did not hide in the last host read, as the device timed
    /// it (NCCL: CUDA events from the end of the step's compute to the read), or None where
    /// the host's clock is the measure (the ring, whose collectives run on the host). On a
    /// GPU the host runs ahead of the device, so its clock would count compute as exchange.
    fn device_exchange_seconds(&self) -> Option<f64> {
        None
    }
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
    broadcast_host_from(comm, values, 0)
}

/// Broadcasts host values from rank `root` through `comm`'s device; returns its values.
fn broadcast_host_from(comm: &mut dyn Collective, values: &[f32], root: usize) -> Result<Vec<f32>> {
    let mut t = comm.upload(values)?;
    comm.broadcast(&mut t, root)?;
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
    broadcast_u64s_from(comm, values, 0)
}

/// [`broadcast_u64s`] from rank `root`.
pub fn broadcast_u64s_from(
    comm: &mut dyn Collective,
    values: &[u64],
    root: usize,
) -> Result<Vec<u64>> {
    let back = broadcast_host_from(comm, &limbs(values), root)?;
    Ok(from_limbs(&back))
}

/// Every rank's `values` (the same number on each), by rank, exactly: each rank fills its
/// own slots of one sum.
pub fn all_gather_u64s(comm: &mut dyn Collective, values: &[u64]) -> Result<Vec<Vec<u64>>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let per = values.len() * 4;
    let mut slots = vec![0.0f32; per * world];
    slots[rank * per..(rank + 1) * per].copy_from_slice(&limbs(values));
    let summed = if world > 1 {
        all_reduce_host(comm, &slots)?
    } else {
        slots
    };
    Ok(summed.chunks(per.max(1)).map(from_limbs).collect())
}

/// Each value as four 16-bit limbs, low first.
fn limbs(values: &[u64]) -> Vec<f32> {
    values
        .iter()
        .flat_map(|v| (0..4).map(move |i| ((v >> (16 * i)) & 0xffff) as f32))
        .collect()
}

fn from_limbs(limbs: &[f32]) -> Vec<u64> {
    limbs
        .chunks(4)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |acc, (i, &l)| acc | ((l as u64) << (16 * i)))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend with host reads of its own (as NCCL's, which wait bounded and abortable):
    /// counts them.
    struct OwnReads {
        inner: Single,
        reads: usize,
    }

    impl Collective for OwnReads {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn device(&self) -> Device {
            self.inner.device()
        }
        fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
            self.inner.all_reduce_sum(tensor)
        }
        fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()> {
            self.inner.broadcast(tensor, root)
        }
        fn barrier(&mut self) -> Result<()> {
            self.inner.barrier()
        }
        fn download(&mut self, tensor: Tensor) -> Result<Vec<f64>> {
            self.reads += 1;
            self.inner.download(tensor)
        }
    }

    #[test]
    fn reading_several_parts_goes_through_the_backends_own_read() {
        // The step's one read (the summed scalars and the gradient norm): before, the
        // default read the parts with a plain copy, which on NCCL waited without a limit
        // for a collective that may hang.
        let mut comm = OwnReads {
            inner: Single {
                device: Device::Cpu,
            },
            reads: 0,
        };
        let scalars = comm.upload(&[1.0, 2.5]).unwrap();
        let norm = comm.adopt(&Tensor::from_slice(&[4.0f32])).unwrap();
        let values = comm.download_parts(&[scalars, norm]).unwrap();
        assert_eq!(values, [1.0, 2.5, 4.0]);
        assert_eq!(comm.reads, 1, "one read, the backend's own");
    }
}
