//! This rank's replica of the model: its variables, the optimizer whose flat buffers hold
//! every parameter, gradient and moment, and the gradient exchange that keeps the replicas
//! of all ranks equal.
//!
//! The optimizer's flat buffers hold every parameter, gradient and moment (`optim`), in the
//! order backward completes the gradients, which a tiny forward and backward measures at
//! start (`completion_order`, rank 0's order for every rank). With more than one rank the
//! gradient exchange (`distributed::GradSync`) all-reduces slices of those buffers in that order,
//! the first ones while backward is still computing the rest. On a GPU the buffers come
//! from the collective (`Collective::zeros`), so NCCL is handed them directly.

use std::ffi::c_void;
use std::sync::Mutex;

use ferrotrain_api::TrainerConfig;
use ferrotrain_api::config::Precision;
use tch::{Device, Kind, Tensor, nn};

use crate::autograd;
use crate::data::{BOS, EOS, TensorBatch, UNK};
use crate::distributed::{Collective, GradSync, broadcast_u64s};
use crate::error::{Result, TrainError};
use crate::model::{self, Transformer};
use crate::optim::AdamW;

/// This rank's replica of the model, its parameters and what updates them.
pub struct ModelReplica {
    // Dropped in this order (the reverse of making them).
    pub grad_sync: Option<GradSync>,
    pub optimizer: AdamW,
    pub params: Vec<(String, Tensor)>,
    pub model: Transformer,
    pub vs: nn::VarStore,
}

impl ModelReplica {
    /// Seeds libtorch with the run's seed first: the initial weights follow from it.
    pub fn new(
        config: &TrainerConfig,
        device: Device,
        precision: Precision,
        vocab: i64,
        comm: &mut dyn Collective,
        bucket_bytes: usize,
    ) -> Result<ModelReplica> {
        tch::manual_seed(config.seed as i64);
        let vs = nn::VarStore::new(device);
        let model = Transformer::new(&vs.root(), &config.model, vocab, precision);
        let params = model::named_parameters(&vs);
        let order = completion_order(&model, &params, device)?;
        let order = agree_on_order(comm, order, params.len())?;
        let on_comm = comm.device() == device;
        let mut alloc = |n: i64, kind: Kind, device: Device| match on_comm {
            true => comm.zeros(n, kind),
            false => Ok(Tensor::f_zeros([n], (kind, device))?),
        };
        let optimizer = AdamW::with_layout(&params, &order, &config.optimizer, &mut alloc)?;
        let grad_sync = if comm.exchanges() {
            let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
            let mut completion = vec![0; params.len()];
            for (position, &i) in order.iter().enumerate() {
                completion[i] = position;
            }
            let sync = GradSync::new(
                &tensors,
                &optimizer.grad_layout(),
                bucket_bytes,
                &completion,
            )?;
            tracing::debug!(buckets = ?sync.bucket_sizes(), "gradient buckets");
            Some(sync)
        } else {
            None
        };
        Ok(ModelReplica {
            grad_sync,
            optimizer,
            params,
            model,
            vs,
        })
    }
}

/// The order (indices into `params`) in which backward completes the parameters'
/// gradients, from one forward and backward of a one-token batch; parameters it does not
/// reach come last, in index order. The probe's gradients are zeroed.
pub fn completion_order(
    model: &Transformer,
    params: &[(String, Tensor)],
    device: Device,
) -> Result<Vec<usize>> {
    extern "C" fn record(context: *mut c_void, index: usize) {
        // SAFETY: the context is `seen` below, alive until the hooks are cleared.
        let seen = unsafe { &*(context as *const Mutex<Vec<usize>>) };
        seen.lock().unwrap_or_else(|e| e.into_inner()).push(index);
    }
    let seen: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let context = &seen as *const Mutex<Vec<usize>> as *mut c_void;
    let trained = || {
        params
            .iter()
            .enumerate()
            .filter(|(_, (_, p))| p.requires_grad())
    };
    for (i, (_, p)) in trained() {
        // SAFETY: `seen` outlives the hooks (cleared below, before it goes out of scope).
        unsafe { autograd::set_ready_hook(p, record, context, i)? };
    }
    let ids = |v: &[i64]| Tensor::from_slice(v).reshape([1, -1]).to_device(device);
    let batch = TensorBatch::from_tensors(ids(&[UNK, EOS]), ids(&[BOS, UNK]), ids(&[UNK, EOS]));
    // The hooks point at `seen` on this stack frame: they must be cleared even if libtorch
    // panics, or a later backward would call them with a dangling context.
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        model.train_loss_backward(&batch, 0.0, 1.0)
    }));
    for (_, (_, p)) in trained() {
        autograd::clear_ready_hook(p)?;
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    if probe.is_err() {
        return Err(TrainError::Other(
            "the model's probe forward and backward failed".into(),
        ));
    }
    let mut order = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut reached = vec![false; params.len()];
    order.retain(|&i| !std::mem::replace(&mut reached[i], true));
    order.extend((0..params.len()).filter(|&i| !reached[i]));
    Ok(order)
}

/// Rank 0's order for every rank: the buffers, and so the buckets, must match exactly.
fn agree_on_order(comm: &mut dyn Collective, order: Vec<usize>, n: usize) -> Result<Vec<usize>> {
    if comm.world_size() == 1 {
        return Ok(order);
    }
    let values: Vec<u64> = order.iter().map(|&i| i as u64).collect();
    let agreed: Vec<usize> = broadcast_u64s(comm, &values)?
        .into_iter()
        .map(|i| i as usize)
        .collect();
    let mut seen = vec![false; n];
    let valid = agreed.len() == n
        && agreed
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true));
    if !valid {
        return Err(TrainError::Distributed(
            "rank 0's parameter order does not fit this rank's model".into(),
        ));
    }
    Ok(agreed)
}
