//! NCCL between GPUs, through cudarc (libcuda and libnccl are loaded at run time).
//!
//! Rank 0 creates the NCCL unique id and publishes it in the rendezvous store; every rank
//! joins the communicator on the GPU libtorch picked for it (`local_rank % visible GPUs`). Collectives are enqueued on the CUDA legacy
//! default stream (libtorch's current stream unless the caller set another), then this rank
//! polls the stream and NCCL's asynchronous error until done or the collective timeout, when
//! it aborts the communicator so a dead or hung peer never hangs the gang.

use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use cudarc::driver::sys as cu;
use cudarc::nccl::sys as nc;
use ferrotrain_api::config::DistributedConfig;
use tch::{Device, Kind, Tensor};

use super::nccl_lib::{NcclLib, nccl};
use super::{Collective, RankEnv, Rendezvous};
use crate::error::{Result, TrainError};

const ID_KEY: &str = "nccl/unique-id";

/// Fails with a clear message unless libcuda, GPU `ordinal` and libnccl are present; returns
/// the loaded NCCL.
pub fn check_available(ordinal: usize) -> Result<&'static NcclLib> {
    // SAFETY: only probes whether the shared libraries can be loaded.
    if !unsafe { cu::is_culib_present() } {
        return Err(TrainError::Config(
            "distributed.backend nccl: the CUDA driver library (libcuda.so) cannot be loaded: \
             no GPU driver on this node (use backend `ring` on CPU nodes)"
                .into(),
        ));
    }
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        let r = cu::cuInit(0);
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(TrainError::Config(format!(
                "distributed.backend nccl: the CUDA driver failed to initialize ({r:?}): no \
                 usable GPU"
            )));
        }
        let mut count = 0;
        let r = cu::cuDeviceGetCount(&mut count);
        if r != cu::CUresult::CUDA_SUCCESS || (count as usize) <= ordinal {
            return Err(TrainError::Config(format!(
                "distributed.backend nccl: this rank's device is GPU {ordinal} but {count} \
                 GPU(s) are visible"
            )));
        }
    }
    nccl()
}

fn nccl_error(what: &str, r: nc::ncclResult_t) -> TrainError {
    // SAFETY: ncclGetErrorString returns a static C string.
    let text = unsafe {
        let p = match nccl() {
            Ok(lib) => (lib.get_error_string)(r),
            Err(_) => std::ptr::null(),
        };
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    TrainError::Distributed(format!("NCCL {what} failed: {r:?} {text}"))
}

fn data_type(kind: Kind) -> Result<nc::ncclDataType_t> {
    Ok(match kind {
        Kind::Float => nc::ncclDataType_t::ncclFloat32,
        Kind::Double => nc::ncclDataType_t::ncclFloat64,
        Kind::Half => nc::ncclDataType_t::ncclFloat16,
        Kind::BFloat16 => nc::ncclDataType_t::ncclBfloat16,
        Kind::Int => nc::ncclDataType_t::ncclInt32,
        Kind::Int64 => nc::ncclDataType_t::ncclInt64,
        Kind::Uint8 | Kind::Bool => nc::ncclDataType_t::ncclUint8,
        Kind::Int8 => nc::ncclDataType_t::ncclInt8,
        other => {
            return Err(TrainError::Distributed(format!(
                "NCCL cannot exchange {other:?} tensors"
            )));
        }
    })
}

/// An NCCL communicator over all ranks.
pub struct Nccl {
    lib: &'static NcclLib,
    comm: nc::ncclComm_t,
    rank: usize,
    world: usize,
    device: Device,
    bf16: bool,
    timeout: Duration,
    broken: Option<String>,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time (&mut self).
unsafe impl Send for Nccl {}

impl Nccl {
    pub fn init(
        env: &RankEnv,
        config: &DistributedConfig,
        device: Device,
        meeting: &mut Rendezvous,
    ) -> Result<Self> {
        if !device.is_cuda() {
            return Err(TrainError::Config(
                "distributed.backend nccl needs a CUDA device (device: cuda or auto on a GPU \
                 node)"
                    .into(),
            ));
        }
        // The GPU libtorch picked for this rank (`train::select_device`): NCCL must use the
        // same one, or the tensors it is handed live on another device.
        let ordinal = match device {
            Device::Cuda(i) => i,
            _ => unreachable!("checked above"),
        };
        let lib = check_available(ordinal)?;
        tracing::info!(
            rank = env.rank,
            gpu = ordinal,
            library = %lib.name,
            "NCCL {}",
            lib.version().as_deref().unwrap_or("(version unknown)")
        );
        let id = if env.rank == 0 {
            let mut id = std::mem::MaybeUninit::<nc::ncclUniqueId>::uninit();
            // SAFETY: valid out-pointer; the library is present (checked above).
            let r = unsafe { (lib.get_unique_id)(id.as_mut_ptr()) };
            if r != nc::ncclResult_t::ncclSuccess {
                return Err(nccl_error("GetUniqueId", r));
            }
            // SAFETY: initialized by ncclGetUniqueId on success.
            let id = unsafe { id.assume_init() };
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            meeting.client.set(ID_KEY, &bytes)?;
            id
        } else {
            let bytes = meeting.client.get(ID_KEY, meeting.left())?;
            if bytes.len() != 128 {
                return Err(TrainError::Distributed(
                    "rendezvous: malformed NCCL unique id".into(),
                ));
            }
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, s) in internal.iter_mut().zip(&bytes) {
                *d = *s as std::ffi::c_char;
            }
            nc::ncclUniqueId { internal }
        };
        let (rank, world, ordinal) = (env.rank, env.world_size, ordinal as i32);
        // ncclCommInitRank blocks until every rank joins and has no timeout of its own: run
        // it on a thread and give up at the rendezvous deadline (the process then exits).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: driver and NCCL calls with valid pointers; the primary context of
            // `ordinal` is made current on this thread first, as NCCL expects.
            let result = unsafe {
                let mut dev = 0;
                let mut ctx = std::ptr::null_mut();
                if cu::cuDeviceGet(&mut dev, ordinal) != cu::CUresult::CUDA_SUCCESS
                    || cu::cuDevicePrimaryCtxRetain(&mut ctx, dev) != cu::CUresult::CUDA_SUCCESS
                    || cu::cuCtxSetCurrent(ctx) != cu::CUresult::CUDA_SUCCESS
                {
                    Err(TrainError::Distributed(format!(
                        "cannot make GPU {ordinal} current"
                    )))
                } else {
                    let mut comm = std::ptr::null_mut();
                    let r = (lib.comm_init_rank)(&mut comm, world as i32, id, rank as i32);
                    if r == nc::ncclResult_t::ncclSuccess {
                        Ok(comm as usize)
                    } else {
                        Err(nccl_error("CommInitRank", r))
                    }
                }
            };
            let _ = tx.send(result);
        });
        let comm = match rx.recv_timeout(meeting.left().max(Duration::from_secs(1))) {
            Ok(r) => r? as nc::ncclComm_t,
            Err(_) => {
                return Err(TrainError::Distributed(format!(
                    "NCCL: not all {world} ranks joined the communicator before the rendezvous \
                     timeout"
                )));
            }
        };
        Ok(Nccl {
            lib,
            comm,
            rank,
            world,
            device,
            bf16: config.bf16_gradients,
            timeout: Duration::from_secs(config.collective_timeout_seconds),
            broken: None,
        })
    }

    /// Waits until the stream's work is done, an NCCL error shows, or the timeout passes.
    fn wait(&mut self, what: &str) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: queries on the legacy default stream and our live communicator.
            let (stream, async_error) = unsafe {
                let s = cu::cuStreamQuery(std::ptr::null_mut());
                let mut e = nc::ncclResult_t::ncclSuccess;
                (self.lib.comm_get_async_error)(self.comm, &mut e);
                (s, e)
            };
            if async_error != nc::ncclResult_t::ncclSuccess
                && async_error != nc::ncclResult_t::ncclInProgress
            {
                return self.abort(nccl_error(what, async_error).to_string());
            }
            match stream {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return self.abort(format!("CUDA error during {what}: {other:?}")),
            }
            if start.elapsed() >= self.timeout {
                return self.abort(format!(
                    "NCCL {what} did not complete within {} s: a peer rank died or hangs",
                    self.timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    fn abort<T>(&mut self, message: String) -> Result<T> {
        // SAFETY: aborting our own communicator; it is not used afterwards.
        unsafe {
            (self.lib.comm_abort)(self.comm);
        }
        self.comm = std::ptr::null_mut();
        self.broken = Some(message.clone());
        Err(TrainError::Distributed(message))
    }

    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(b) => Err(TrainError::Distributed(format!(
                "the NCCL communicator was aborted by an earlier failure: {b}"
            ))),
            None => Ok(()),
        }
    }

    fn check_tensor(tensor: &Tensor) -> Result<()> {
        if !tensor.device().is_cuda() || !tensor.is_contiguous() {
            return Err(TrainError::Distributed(
                "NCCL collectives need contiguous CUDA tensors".into(),
            ));
        }
        Ok(())
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn device(&self) -> Device {
        self.device
    }

    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
        self.check()?;
        Self::check_tensor(tensor)?;
        let exchange_bf16 = self.bf16 && tensor.kind() == Kind::Float;
        let wire = if exchange_bf16 {
            tensor.f_to_kind(Kind::BFloat16)?
        } else {
            tensor.shallow_clone()
        };
        let ptr = wire.data_ptr();
        // SAFETY: `wire` is a contiguous CUDA tensor of numel elements, alive until `wait`
        // has seen the stream finish.
        let r = unsafe {
            (self.lib.all_reduce)(
                ptr as *const c_void,
                ptr,
                wire.numel(),
                data_type(wire.kind())?,
                nc::ncclRedOp_t::ncclSum,
                self.comm,
                std::ptr::null_mut(),
            )
        };
        if r != nc::ncclResult_t::ncclSuccess {
            return self.abort(nccl_error("AllReduce", r).to_string());
        }
        self.wait("all-reduce")?;
        if exchange_bf16 {
            tch::no_grad(|| tensor.f_copy_(&wire))?;
        }
        Ok(())
    }

    fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()> {
        self.check()?;
        Self::check_tensor(tensor)?;
        let ptr = tensor.data_ptr();
        // SAFETY: as in all_reduce_sum.
        let r = unsafe {
            (self.lib.broadcast)(
                ptr as *const c_void,
                ptr,
                tensor.numel(),
                data_type(tensor.kind())?,
                root as i32,
                self.comm,
                std::ptr::null_mut(),
            )
        };
        if r != nc::ncclResult_t::ncclSuccess {
            return self.abort(nccl_error("Broadcast", r).to_string());
        }
        self.wait("broadcast")
    }

    fn barrier(&mut self) -> Result<()> {
        let mut one = Tensor::f_ones([1], (Kind::Float, self.device))?;
        self.all_reduce_sum(&mut one)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: our communicator, not used afterwards.
            unsafe {
                (self.lib.comm_destroy)(self.comm);
            }
        }
    }
}
