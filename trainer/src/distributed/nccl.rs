//! NCCL between GPUs, through cudarc (libcuda and libnccl are loaded at run time).
//!
//! Rank 0 creates the NCCL unique id and publishes it in the rendezvous store; every rank
//! joins the communicator on the GPU libtorch picked for it (`local_rank % visible GPUs`).
//!
//! Collectives run on a side stream of their own, ordered against libtorch's stream (the
//! legacy default stream, where the model's kernels run) by events: a collective waits for
//! the work queued before it, and `finish_started` makes libtorch's later work wait for the
//! collectives, all on the GPU. libtorch's current stream is that default stream because
//! ferrotrain never sets another (no stream guards, no CUDA graphs); code that does must hand
//! its stream here instead of the null one. The communicator is non-blocking (NCCL 2.14+):
//! joining it and queueing a collective return at once and are polled (`watchdog.rs`), so no
//! NCCL call blocks the host. `download` (and so `download_parts`) and `barrier` poll events
//! and NCCL's asynchronous error, collective by collective in the order they were queued:
//! the compute before each (its `ready` mark), then the collective itself under the
//! collective timeout (its `done` mark); a hang or an error aborts the communicator
//! (ncclCommAbort, never a destroy that would wait), so a dead or hung peer never hangs the
//! gang. The trainer's step reads the host once, at its end, so a step has one such wait;
//! gradient buckets started during backward run on the side stream while backward's kernels
//! run on libtorch's, and the part of the exchange backward did not hide is timed on the GPU
//! (`device_exchange_seconds`, the step's `commFraction`). Every CUDA call first makes the
//! communicator's context current on the calling thread (the backward hooks run on
//! libtorch's device thread).

use std::ffi::{CStr, c_void};
use std::time::Duration;

use cudarc::driver::sys as cu;
use cudarc::nccl::sys as nc;
use ferrotrain_api::config::DistributedConfig;
use tch::{Device, Kind, Tensor};

use super::collective::Collective;
use super::nccl_lib::{
    Code, IN_PROGRESS, NcclLib, NonBlockingConfig, SUCCESS, code_hint, code_name, nccl,
};
use super::rank::RankEnv;
use super::rendezvous::Rendezvous;
use super::watchdog::{ABORT_LIMIT, Abortable, Mark, Poll, bounded_abort};
use crate::error::{Result, TrainError};
use ferrotrain_launch::keys;

/// Fails with a clear message unless libcuda, GPU `ordinal` and libnccl are present; returns
/// the loaded NCCL.
pub fn check_available(ordinal: usize) -> Result<&'static NcclLib> {
    // SAFETY: only probes whether the shared libraries can be loaded.
    if !unsafe { cu::is_culib_present() } {
        return Err(TrainError::Config(
            "distributed.backend nccl: the CUDA driver library (libcuda.so.1) cannot be loaded: \
             no GPU driver on this node (use backend `ring` on CPU nodes)"
                .into(),
        ));
    }
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        let r = cu::cuInit(0);
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(TrainError::Config(
                format!(
                    "distributed.backend nccl: the CUDA driver failed to initialize ({r:?}): no \
                 usable GPU"
                )
                .into(),
            ));
        }
        let mut count = 0;
        let r = cu::cuDeviceGetCount(&mut count);
        if r != cu::CUresult::CUDA_SUCCESS || (count as usize) <= ordinal {
            return Err(TrainError::Config(
                format!(
                    "distributed.backend nccl: this rank's device is GPU {ordinal} but {count} \
                 GPU(s) are visible"
                )
                .into(),
            ));
        }
    }
    nccl()
}

fn nccl_error(what: &str, r: Code) -> TrainError {
    TrainError::Distributed(format!("NCCL {what} failed: {}", code_text(r)).into())
}

/// An `ncclResult_t`'s name and NCCL's own words for it.
fn code_text(r: Code) -> String {
    // SAFETY: ncclGetErrorString returns a static C string for any code.
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
    match code_hint(r) {
        "" => format!("{} {text}", code_name(r)),
        hint => format!("{} {text} ({hint})", code_name(r)),
    }
}

/// Aborts a communicator (ncclCommAbort: also ends the collectives in flight), waiting at
/// most `ABORT_LIMIT` for it (`watchdog::bounded_abort`); false when it gave up.
fn abort_comm(comm: nc::ncclComm_t) -> bool {
    let Ok(lib) = nccl() else { return true };
    let handle = comm as usize;
    // SAFETY: a communicator made by ncclCommInitRank*, not used afterwards; NCCL allows
    // its abort from any thread.
    let abort = move || unsafe {
        (lib.comm_abort)(handle as nc::ncclComm_t);
    };
    let finished = bounded_abort(ABORT_LIMIT, abort);
    if !finished {
        tracing::error!(
            "ncclCommAbort did not return within {} s: the GPU's queue is stuck (NCCL's \
             abort waits for the work queued before its collectives); the rank fails \
             without it, and its process ends once the queue moves or the driver resets it",
            ABORT_LIMIT.as_secs()
        );
    }
    finished
}

/// NCCL's asynchronous state of `comm` as a poll: ready, in progress, or an error.
fn async_state(lib: &NcclLib, comm: nc::ncclComm_t, what: &str) -> Poll {
    let mut state = SUCCESS;
    // SAFETY: a live communicator and a valid out-pointer.
    let r = unsafe { (lib.comm_get_async_error)(comm, &mut state) };
    match (r, state) {
        (SUCCESS, SUCCESS) => Poll::Ready,
        (SUCCESS, IN_PROGRESS) => Poll::Pending,
        (SUCCESS, e) | (e, _) => Poll::Failed(format!("NCCL {what}: {}", code_text(e))),
    }
}

/// A CUDA event recorded earlier, as a poll.
fn event_state(event: cu::CUevent, what: &str) -> Poll {
    // SAFETY: a live event of ours.
    match unsafe { cu::cuEventQuery(event) } {
        cu::CUresult::CUDA_SUCCESS => Poll::Ready,
        cu::CUresult::CUDA_ERROR_NOT_READY => Poll::Pending,
        other => Poll::Failed(format!("CUDA error during {what}: {other:?}")),
    }
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
            return Err(TrainError::Distributed(
                format!("NCCL cannot exchange {other:?} tensors").into(),
            ));
        }
    })
}

/// An NCCL communicator over all ranks.
pub struct Nccl {
    lib: &'static NcclLib,
    /// Non-blocking where NCCL has ncclCommInitRankConfig (2.14+): no NCCL call blocks the
    /// host; every wait is bounded and a hang aborts it.
    comm: Abortable<nc::ncclComm_t>,
    rank: usize,
    world: usize,
    device: Device,
    bf16: bool,
    timeout: Duration,
    streams: Streams,
    /// Started all-reduces not finished yet: (the caller's tensor, what went over the wire
    /// when that is a bf16 copy), kept alive until libtorch's stream waits for them.
    started: Vec<(Tensor, Option<Tensor>)>,
    /// The last host wait's exchange that backward did not hide, timed on the GPU.
    exchange_seconds: Option<f64>,
    /// Collectives queued by this communicator.
    queued_total: u64,
    /// The test hook's collective to hold the side stream before, and for how long
    /// (`HANG_ENV`).
    hang_at: Option<(u64, Duration)>,
}

/// Test hook: `FERROTRAIN_INJECT_HANG=N[:SECONDS]` holds the side stream before this
/// process's Nth collective (counting from 1) for SECONDS (default twice the collective
/// timeout), as a hung peer would hold it, in the first attempt and round only (attempt 0,
/// round 0: the restart runs clean). A hold longer than the timeout plus `ABORT_LIMIT`
/// keeps NCCL's abort from returning (the stuck-GPU case).
/// bench/gpu-validate.sh uses it to check, on a GPU, that a hung collective fails at the
/// collective timeout and the rank restarts from its checkpoint.
const HANG_ENV: &str = "FERROTRAIN_INJECT_HANG";

/// The hook's collective and hold, if it is set for this rank's attempt and round.
fn hang_at(env: &RankEnv, timeout: Duration) -> Option<(u64, Duration)> {
    let spec = std::env::var(HANG_ENV).ok()?;
    let (n, seconds) = spec.trim().split_once(':').unwrap_or((spec.trim(), ""));
    let hold = match seconds {
        "" => 2 * timeout,
        s => Duration::from_secs(s.parse().ok()?),
    };
    (env.attempt == 0 && env.round == 0).then_some((n.parse().ok()?, hold))
}

/// The host function of the hold: sleeps `data` milliseconds on CUDA's callback thread,
/// so the stream it was queued on waits that long.
extern "C" fn hold_stream(data: *mut c_void) {
    std::thread::sleep(Duration::from_millis(data as u64));
}

/// Collectives between two host waits whose marks are kept (a step has one per gradient
/// bucket, plus its scalars): past that the oldest are reused, which loses nothing, since
/// the side stream runs its collectives in order (a later one done means the earlier ones
/// are).
const MARKS: usize = 64;

/// The CUDA objects of a communicator: the GPU's primary context, the side stream its
/// collectives run on and the events that order that stream against libtorch's.
struct Streams {
    context: cu::CUcontext,
    side: cu::CUstream,
    /// Per collective, a ring of MARKS: (recorded on libtorch's stream before it: its input
    /// is ready; recorded on the side stream after it: it is done). The host's wait times
    /// each collective from its own `ready` (watchdog::wait_collectives).
    marks: Vec<(cu::CUevent, cu::CUevent)>,
    /// Collectives queued since the last host wait.
    queued: usize,
    /// Recorded (timed) on libtorch's stream where it first waits for the side stream after
    /// a host wait: the step's compute (backward) ends there, and what follows until `host`
    /// is the exchange backward did not hide.
    compute_end: cu::CUevent,
    compute_end_recorded: bool,
    /// Recorded on the side stream after the started collectives.
    done: cu::CUevent,
    /// Recorded (timed) on libtorch's stream for the host to wait on.
    host: cu::CUevent,
}

fn cuda(what: &str, r: cu::CUresult) -> Result<()> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(TrainError::Distributed(
            format!("CUDA {what} failed: {other:?}").into(),
        )),
    }
}

impl Streams {
    /// The side stream and events on GPU `ordinal`'s primary context.
    fn new(ordinal: i32) -> Result<Self> {
        // SAFETY: driver calls with valid out-pointers; the context is retained for the
        // process's life (libtorch uses the same primary context).
        unsafe {
            let mut dev = 0;
            let mut context = std::ptr::null_mut();
            cuda("cuDeviceGet", cu::cuDeviceGet(&mut dev, ordinal))?;
            cuda(
                "cuDevicePrimaryCtxRetain",
                cu::cuDevicePrimaryCtxRetain(&mut context, dev),
            )?;
            cuda("cuCtxSetCurrent", cu::cuCtxSetCurrent(context))?;
            // The side stream at the highest priority: a bucket's all-reduce is scheduled
            // ahead of backward's kernels queued after it (as PyTorch's NCCL streams are).
            let (mut least, mut greatest) = (0, 0);
            cuda(
                "cuCtxGetStreamPriorityRange",
                cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
            )?;
            let mut side = std::ptr::null_mut();
            let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
            cuda(
                "cuStreamCreateWithPriority",
                cu::cuStreamCreateWithPriority(&mut side, flags, greatest),
            )?;
            let make = |flags: cu::CUevent_flags| -> Result<cu::CUevent> {
                let mut e = std::ptr::null_mut();
                cuda("cuEventCreate", cu::cuEventCreate(&mut e, flags as u32))?;
                Ok(e)
            };
            let event = || make(cu::CUevent_flags::CU_EVENT_DISABLE_TIMING);
            let timed = || make(cu::CUevent_flags::CU_EVENT_DEFAULT);
            let marks = (0..MARKS)
                .map(|_| Ok((event()?, event()?)))
                .collect::<Result<Vec<_>>>()?;
            Ok(Streams {
                context,
                side,
                marks,
                queued: 0,
                compute_end: timed()?,
                compute_end_recorded: false,
                done: event()?,
                host: timed()?,
            })
        }
    }

    /// Makes the communicator's context current on this thread.
    fn current(&self) -> Result<()> {
        // SAFETY: a context retained in `new`.
        cuda("cuCtxSetCurrent", unsafe {
            cu::cuCtxSetCurrent(self.context)
        })
    }

    /// The marks of the next collective.
    fn next_marks(&self) -> (cu::CUevent, cu::CUevent) {
        self.marks[self.queued % MARKS]
    }

    /// The side stream waits for the work queued so far on libtorch's stream (the next
    /// collective's `ready` mark).
    fn side_waits_for_libtorch(&self) -> Result<()> {
        let (ready, _) = self.next_marks();
        // SAFETY: our events and stream; the null stream is the context's legacy stream.
        unsafe {
            cuda(
                "cuEventRecord",
                cu::cuEventRecord(ready, std::ptr::null_mut()),
            )?;
            cuda(
                "cuStreamWaitEvent",
                cu::cuStreamWaitEvent(self.side, ready, 0),
            )
        }
    }

    /// The collective just queued on the side stream gets its `done` mark.
    fn collective_queued(&mut self) -> Result<()> {
        let (_, done) = self.next_marks();
        // SAFETY: our event and stream.
        cuda("cuEventRecord", unsafe {
            cu::cuEventRecord(done, self.side)
        })?;
        self.queued += 1;
        Ok(())
    }

    /// The marks of the collectives queued since the last host wait (at most MARKS, the
    /// newest), oldest first, and whether `compute_end` was recorded; both start again.
    fn take_marks(&mut self) -> (Vec<(cu::CUevent, cu::CUevent)>, bool) {
        let kept = self.queued.min(MARKS);
        let marks = (self.queued - kept..self.queued)
            .map(|k| self.marks[k % MARKS])
            .collect();
        self.queued = 0;
        (marks, std::mem::take(&mut self.compute_end_recorded))
    }

    /// Records `compute_end` on libtorch's stream, the first time since the host's wait.
    fn mark_compute_end(&mut self) -> Result<()> {
        if !self.compute_end_recorded {
            // SAFETY: our event; the null stream is the context's legacy stream.
            let r = unsafe { cu::cuEventRecord(self.compute_end, std::ptr::null_mut()) };
            cuda("cuEventRecord", r)?;
            self.compute_end_recorded = true;
        }
        Ok(())
    }

    /// Seconds from `compute_end` to `host`, both complete.
    fn exchange_seconds(&self) -> Result<f64> {
        let mut ms = 0f32;
        // SAFETY: two timed events of ours, recorded and complete (the host waited).
        let r = unsafe { cu::cuEventElapsedTime(&mut ms, self.compute_end, self.host) };
        cuda("cuEventElapsedTime", r)?;
        Ok(f64::from(ms.max(0.0)) / 1000.0)
    }

    /// libtorch's stream waits for the work queued so far on the side stream.
    fn libtorch_waits_for_side(&self) -> Result<()> {
        // SAFETY: as above.
        unsafe {
            cuda("cuEventRecord", cu::cuEventRecord(self.done, self.side))?;
            cuda(
                "cuStreamWaitEvent",
                cu::cuStreamWaitEvent(std::ptr::null_mut(), self.done, 0),
            )
        }
    }
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
            if r != SUCCESS {
                return Err(nccl_error("GetUniqueId", r));
            }
            // SAFETY: initialized by ncclGetUniqueId on success.
            let id = unsafe { id.assume_init() };
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            meeting.client.set(keys::NCCL_ID, &bytes)?;
            id
        } else {
            let bytes = meeting.client.get(keys::NCCL_ID, meeting.left())?;
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
        let streams = Streams::new(ordinal)?;
        let comm = match lib.comm_init_rank_config {
            Some(init) => join_non_blocking(lib, init, world, id, rank, meeting.left())?,
            None => {
                tracing::warn!(
                    "NCCL before 2.14 has no non-blocking communicator: a hang while \
                     connecting cannot be aborted, only ended with the process"
                );
                join_blocking(lib, world, id, rank, ordinal, meeting.left())?
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
            streams,
            started: Vec::new(),
            exchange_seconds: None,
            queued_total: 0,
            hang_at: hang_at(env, Duration::from_secs(config.collective_timeout_seconds)),
        })
    }

    /// Waits until the work queued so far on libtorch's stream (which includes every
    /// finished collective) is done, an NCCL error shows, or the time runs out: each
    /// collective queued since the last wait in two phases, the compute before it (its
    /// `ready` mark; a slow step is not a hang) and then the collective itself under the
    /// collective timeout (its `done` mark); then the rest. Polls events: a hung peer never
    /// blocks this thread in a synchronising call, and a hang aborts the communicator.
    fn host_wait(&mut self, what: &str) -> Result<()> {
        let comm = self.comm.live()?;
        self.exchange_seconds = None;
        let (marks, timed) = self.streams.take_marks();
        self.streams.current()?;
        // SAFETY: our event; the null stream is the context's legacy stream.
        let r = unsafe { cu::cuEventRecord(self.streams.host, std::ptr::null_mut()) };
        if let Err(e) = cuda("cuEventRecord", r) {
            return self.comm.fail(e.to_string());
        }
        let (lib, host) = (self.lib, self.streams.host);
        let what = format!("NCCL {what}");
        let checked = |mark| {
            let event = match mark {
                Mark::Ready(i) => marks[i].0,
                Mark::Done(i) => marks[i].1,
                Mark::Rest => host,
            };
            match async_state(lib, comm, &what) {
                Poll::Failed(e) => Poll::Failed(e),
                _ => event_state(event, &what),
            }
        };
        self.comm
            .wait_step(&what, self.timeout, marks.len(), checked)?;
        if timed {
            // A measure, not a result: a failure to read it leaves the host's clock in use.
            self.exchange_seconds = self.streams.exchange_seconds().ok();
        }
        Ok(())
    }

    /// Queues `op` (an NCCL call on the given stream) on the side stream after the work
    /// queued so far on libtorch's stream. A non-blocking communicator may answer
    /// ncclInProgress (connecting to its peers on its first collective): then this waits,
    /// bounded by the collective timeout, until NCCL has queued it.
    fn enqueue(
        &mut self,
        what: &str,
        op: impl FnOnce(nc::ncclComm_t, cu::CUstream) -> Code,
    ) -> Result<()> {
        let comm = self.comm.live()?;
        if let Err(e) = self
            .streams
            .current()
            .and_then(|_| self.streams.side_waits_for_libtorch())
        {
            return self.comm.fail(e.to_string());
        }
        let what = format!("NCCL {what}");
        self.queued_total += 1;
        if let Some((_, hold)) = self.hang_at.filter(|&(n, _)| n == self.queued_total) {
            let millis = hold.as_millis() as u64;
            tracing::warn!(
                "{HANG_ENV}: holding the side stream for {millis} ms before collective {}",
                self.queued_total
            );
            // SAFETY: our stream; `hold_stream` only sleeps, its data is the count itself.
            let r =
                unsafe { cu::cuLaunchHostFunc(self.streams.side, Some(hold_stream), millis as _) };
            if let Err(e) = cuda("cuLaunchHostFunc", r) {
                return self.comm.fail(e.to_string());
            }
        }
        match op(comm, self.streams.side) {
            SUCCESS => {}
            IN_PROGRESS => {
                let lib = self.lib;
                self.comm.wait(&what, "queueing", self.timeout, || {
                    async_state(lib, comm, &what)
                })?;
            }
            r => return self.comm.fail(format!("{what} failed: {}", code_text(r))),
        }
        if let Err(e) = self.streams.collective_queued() {
            return self.comm.fail(e.to_string());
        }
        Ok(())
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

    fn device_exchange_seconds(&self) -> Option<f64> {
        self.exchange_seconds
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn exchanges(&self) -> bool {
        true
    }

    fn device(&self) -> Device {
        self.device
    }

    fn all_reduce_sum(&mut self, tensor: &mut Tensor) -> Result<()> {
        self.start_all_reduce_sum(tensor)?;
        self.finish_started()
    }

    fn start_all_reduce_sum(&mut self, tensor: &Tensor) -> Result<()> {
        self.comm.live()?;
        Self::check_tensor(tensor)?;
        let exchange_bf16 = self.bf16 && tensor.kind() == Kind::Float;
        // The bf16 copy is made on libtorch's stream, before the side stream's wait.
        let wire = if exchange_bf16 {
            Some(tensor.f_to_kind(Kind::BFloat16)?)
        } else {
            None
        };
        let on_wire = wire.as_ref().unwrap_or(tensor);
        let (ptr, numel, kind) = (
            on_wire.data_ptr(),
            on_wire.numel(),
            data_type(on_wire.kind())?,
        );
        let lib = self.lib;
        // SAFETY: `on_wire` is a contiguous CUDA tensor of `numel` elements, kept alive in
        // `started` until libtorch's stream waits for the side stream (`finish_started`).
        self.enqueue("AllReduce", |comm, stream| unsafe {
            (lib.all_reduce)(
                ptr as *const c_void,
                ptr,
                numel,
                kind,
                nc::ncclRedOp_t::ncclSum,
                comm,
                stream as _,
            )
        })?;
        self.started.push((tensor.shallow_clone(), wire));
        Ok(())
    }

    fn finish_started(&mut self) -> Result<()> {
        if self.started.is_empty() {
            return self.comm.live().map(|_| ());
        }
        if let Err(e) = self.streams.current().and_then(|_| {
            self.streams.mark_compute_end()?;
            self.streams.libtorch_waits_for_side()
        }) {
            return self.comm.fail(e.to_string());
        }
        // Queued on libtorch's stream after its wait: the bf16 sums back into the tensors.
        for (tensor, wire) in std::mem::take(&mut self.started) {
            if let Some(wire) = wire {
                tch::no_grad(|| tensor.shallow_clone().f_copy_(&wire))?;
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, tensor: &mut Tensor, root: usize) -> Result<()> {
        self.finish_started()?;
        Self::check_tensor(tensor)?;
        let (ptr, numel, kind) = (tensor.data_ptr(), tensor.numel(), data_type(tensor.kind())?);
        let lib = self.lib;
        // SAFETY: as in start_all_reduce_sum; `tensor` is the caller's, alive past the
        // wait below.
        self.enqueue("Broadcast", |comm, stream| unsafe {
            (lib.broadcast)(
                ptr as *const c_void,
                ptr,
                numel,
                kind,
                root as i32,
                comm,
                stream as _,
            )
        })?;
        self.started.push((tensor.shallow_clone(), None));
        self.finish_started()
    }

    fn barrier(&mut self) -> Result<()> {
        let mut one = Tensor::f_ones([1], (Kind::Float, self.device))?;
        self.all_reduce_sum(&mut one)?;
        self.host_wait("barrier")
    }

    /// The step's one host wait: everything queued so far, collectives included, under the
    /// collective timeout; then the copy (which no longer waits). `download_parts` comes
    /// here too (the trait's default), so the step's read is bounded and abortable.
    fn download(&mut self, tensor: Tensor) -> Result<Vec<f64>> {
        self.finish_started()?;
        self.host_wait("the step's collectives")?;
        let host = tensor.f_to_device(Device::Cpu)?.f_to_kind(Kind::Double)?;
        Ok(Vec::try_from(&host)?)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // First the communicator: aborted, never destroyed (a destroy waits for anything
        // still queued), before the stream its kernels ran on goes.
        self.comm.close();
        // SAFETY: our stream and events, not used afterwards.
        unsafe {
            let _ = self.streams.current();
            let marks = self.streams.marks.iter().flat_map(|&(r, d)| [r, d]);
            let others = [
                self.streams.compute_end,
                self.streams.done,
                self.streams.host,
            ];
            for e in marks.chain(others) {
                cu::cuEventDestroy_v2(e);
            }
            cu::cuStreamDestroy_v2(self.streams.side);
        }
    }
}

/// Joins the communicator without blocking (ncclCommInitRankConfig, blocking = 0): NCCL
/// connects in the background while this polls its state until every rank joined, an error
/// shows, or `left` (the rendezvous deadline) passes, when the half-made communicator is
/// aborted. The GPU's context must be current on this thread (`Streams::new`).
fn join_non_blocking(
    lib: &'static NcclLib,
    init: unsafe extern "C" fn(
        *mut nc::ncclComm_t,
        std::ffi::c_int,
        nc::ncclUniqueId,
        std::ffi::c_int,
        *mut NonBlockingConfig,
    ) -> Code,
    world: usize,
    id: nc::ncclUniqueId,
    rank: usize,
    left: Duration,
) -> Result<Abortable<nc::ncclComm_t>> {
    let mut comm = std::ptr::null_mut();
    let mut config = NonBlockingConfig::default();
    // SAFETY: valid out-pointer and config; NCCL copies the config.
    let r = unsafe { init(&mut comm, world as i32, id, rank as i32, &mut config) };
    if comm.is_null() || !(r == SUCCESS || r == IN_PROGRESS) {
        if !comm.is_null() {
            abort_comm(comm);
        }
        return Err(nccl_error("CommInitRankConfig", r));
    }
    let mut comm = Abortable::new(comm, abort_comm);
    let handle = comm.live()?;
    comm.wait(
        &format!("NCCL: joining the communicator of {world} ranks"),
        "every rank joining, within the rendezvous timeout",
        left.max(Duration::from_secs(1)),
        || async_state(lib, handle, "CommInitRankConfig"),
    )?;
    Ok(comm)
}

/// NCCL before 2.14: ncclCommInitRank blocks until every rank joins and has no timeout of
/// its own, so it runs on a thread and this gives up at the rendezvous deadline (the
/// process then exits, leaving the thread).
fn join_blocking(
    lib: &'static NcclLib,
    world: usize,
    id: nc::ncclUniqueId,
    rank: usize,
    ordinal: i32,
    left: Duration,
) -> Result<Abortable<nc::ncclComm_t>> {
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
                Err(TrainError::Distributed(
                    format!("cannot make GPU {ordinal} current").into(),
                ))
            } else {
                let mut comm = std::ptr::null_mut();
                match (lib.comm_init_rank)(&mut comm, world as i32, id, rank as i32) {
                    SUCCESS => Ok(comm as usize),
                    r => Err(nccl_error("CommInitRank", r)),
                }
            }
        };
        let _ = tx.send(result);
    });
    match rx.recv_timeout(left.max(Duration::from_secs(1))) {
        Ok(r) => Ok(Abortable::new(r? as nc::ncclComm_t, abort_comm)),
        Err(_) => Err(TrainError::Distributed(
            format!(
                "NCCL: not all {world} ranks joined the communicator before the rendezvous \
                 timeout"
            )
            .into(),
        )),
    }
}
