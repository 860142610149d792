//! AdamW whose state is ours (so it is checkpointed), gradient clipping, and the learning
//! rate schedules.
//!
//! The update is PyTorch's `torch.optim.AdamW` (decoupled weight decay, bias-corrected
//! moments); a test compares one trajectory with numbers PyTorch printed.

use ferrotrain_api::config::{OptimizerConfig, ScheduleConfig, ScheduleHorizon, ScheduleKind};
use tch::{Kind, Tensor};

use crate::error::{Result, TrainError};

/// One parameter and its moment estimates: views of its group's buffers.
struct Slot {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// Parameters that share a kind, a device and weight decay, laid end to end: the
/// parameters (the model's own tensors, re-pointed with `set_data`), their gradients
/// (each parameter's `.grad` is a view, see `autograd::set_grad`) and their moments are
/// views of one buffer each, so an update, the gradient norm, zeroing and the gradient
/// exchange are a handful of kernels per group, not several per parameter (a transformer
/// has ~200).
struct Group {
    decay: bool,
    /// Indices into `AdamW::slots`, in buffer order.
    members: Vec<usize>,
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
}

/// A group's gradient buffer and where each parameter's gradient sits in it, for the
/// gradient exchange (`distributed::GradSync`).
pub struct GradLayout {
    /// The flat gradient buffer.
    pub flat: Tensor,
    /// (parameter index in the order given to `AdamW::new`, offset, elements), in buffer
    /// order.
    pub members: Vec<(usize, i64, i64)>,
}

/// AdamW over a fixed, named list of parameters.
pub struct AdamW {
    /// In the order the parameters were given (the checkpoint's and the broadcast's order).
    slots: Vec<Slot>,
    groups: Vec<Group>,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    /// The clipping factor `clip_to` decided, applied by the next `step` (1 = none).
    grad_scale: f64,
    /// Updates applied so far (PyTorch's `state["step"]`).
    pub steps: u64,
    /// Whether `step` uses libtorch's fused kernel (until it fails once).
    fused: bool,
}

unsafe extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn ft_fused_adamw(
        param: *mut std::ffi::c_void,
        grad: *const std::ffi::c_void,
        exp_avg: *mut std::ffi::c_void,
        exp_avg_sq: *mut std::ffi::c_void,
        step: f64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut std::ffi::c_char;
}

/// One AdamW update of group `g` by libtorch's `_fused_adamw_` (csrc/optim.cpp).
fn fused_adamw(
    g: &Group,
    step: u64,
    lr: f64,
    beta1: f64,
    beta2: f64,
    weight_decay: f64,
    eps: f64,
) -> Result<()> {
    // SAFETY: the four pointers are live tensors of this group, used only for the call; the
    // shim catches every C++ exception.
    let error = unsafe {
        ft_fused_adamw(
            g.param.as_ptr() as *mut _,
            g.grad.as_ptr() as *const _,
            g.exp_avg.as_ptr() as *mut _,
            g.exp_avg_sq.as_ptr() as *mut _,
            step as f64,
            lr,
            beta1,
            beta2,
            weight_decay,
            eps,
        )
    };
    crate::autograd::check(error, "fused AdamW")
}

/// Biases and layer norms are not decayed (the usual transformer recipe).
fn decays(name: &str) -> bool {
    !(name.ends_with(".bias") || name.contains("norm"))
}

/// The parameters taken in `order`, split by (decay, kind, device); each group's members
/// keep that order.
fn group_members(
    params: &[(String, Tensor)],
    order: &[usize],
) -> Vec<((bool, Kind, tch::Device), Vec<usize>)> {
    let mut groups: Vec<((bool, Kind, tch::Device), Vec<usize>)> = Vec::new();
    for &i in order {
        let (name, p) = &params[i];
        let key = (decays(name), p.kind(), p.device());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups
}

impl AdamW {
    /// `params` in the order every rank agrees on (sorted by name), laid out in that order.
    pub fn new(params: &[(String, Tensor)], c: &OptimizerConfig) -> Self {
        let order: Vec<usize> = (0..params.len()).collect();
        let mut alloc =
            |n: i64, kind: Kind, device: tch::Device| Ok(Tensor::f_zeros([n], (kind, device))?);
        Self::with_layout(params, &order, c, &mut alloc).expect("zeros on the parameters' device")
    }

    /// Like `new`, with the buffers laid out in `order` (a permutation of the parameter
    /// indices; the trainer passes the order backward completes the gradients in, so the
    /// gradient exchange can start on the first buffers while backward runs). Each
    /// parameter's data and any gradient it has move into its group's buffers (values
    /// unchanged): the model keeps training the same tensors, which now share storage with
    /// the optimizer's flat views. `alloc(elements, kind, device)` gives each buffer, zeroed.
    pub fn with_layout(
        params: &[(String, Tensor)],
        order: &[usize],
        c: &OptimizerConfig,
        alloc: &mut dyn FnMut(i64, Kind, tch::Device) -> Result<Tensor>,
    ) -> Result<Self> {
        assert_eq!(
            order.len(),
            params.len(),
            "the layout orders every parameter"
        );
        let mut slots: Vec<Option<Slot>> = (0..params.len()).map(|_| None).collect();
        let mut groups = Vec::new();
        for ((decay, kind, device), members) in group_members(params, order) {
            let total: i64 = members.iter().map(|&i| params[i].1.numel() as i64).sum();
            let flat = alloc(total, kind, device)?;
            let (grad, exp_avg, exp_avg_sq) = (
                alloc(total, kind, device)?,
                alloc(total, kind, device)?,
                alloc(total, kind, device)?,
            );
            let mut offset = 0;
            for &i in &members {
                let (name, p) = &params[i];
                let (n, shape) = (p.numel() as i64, p.size());
                let view = |t: &Tensor| t.narrow(0, offset, n).view(shape.as_slice());
                let mut data = view(&flat);
                let mut grad_view = view(&grad);
                tch::no_grad(|| {
                    data.copy_(p);
                    let old = p.grad();
                    if old.defined() {
                        grad_view.copy_(&old);
                    }
                });
                p.shallow_clone().set_data(&data);
                crate::autograd::set_grad(p, &grad_view)?;
                slots[i] = Some(Slot {
                    name: name.clone(),
                    param: p.shallow_clone(),
                    exp_avg: view(&exp_avg),
                    exp_avg_sq: view(&exp_avg_sq),
                });
                offset += n;
            }
            groups.push(Group {
                decay,
                members,
                param: flat,
                grad,
                exp_avg,
                exp_avg_sq,
            });
        }
        Ok(AdamW {
            slots: slots
                .into_iter()
                .map(|s| s.expect("every parameter grouped"))
                .collect(),
            groups,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
            grad_scale: 1.0,
            steps: 0,
            fused: true,
        })
    }

    /// Each group's gradient buffer and its members' places in it.
    pub fn grad_layout(&self) -> Vec<GradLayout> {
        self.groups
            .iter()
            .map(|g| {
                let mut offset = 0;
                let members = g
                    .members
                    .iter()
                    .map(|&i| {
                        let n = self.slots[i].param.numel() as i64;
                        offset += n;
                        (i, offset - n, n)
                    })
                    .collect();
                GradLayout {
                    flat: g.grad.shallow_clone(),
                    members,
                }
            })
            .collect()
    }

    /// The flat buffers a new rank must take from rank 0: every group's parameters and
    /// moments.
    pub fn state_buffers(&self) -> Vec<Tensor> {
        self.groups
            .iter()
            .flat_map(|g| [&g.param, &g.exp_avg, &g.exp_avg_sq])
            .map(Tensor::shallow_clone)
            .collect()
    }

    /// One update at learning rate `lr` from the gradient buffers (a parameter no backward
    /// reached has a zero gradient, like PyTorch's `zero_grad(set_to_none=False)`), scaled
    /// by what `clip_to` decided. PyTorch's AdamW, element by element, on each group's
    /// buffers: libtorch's fused kernel (`_fused_adamw_`, one pass over the buffers), or the
    /// same arithmetic op by op where the fused kernel fails (logged once).
    pub fn step(&mut self, lr: f64) {
        self.steps += 1;
        let scale = std::mem::replace(&mut self.grad_scale, 1.0);
        tch::no_grad(|| {
            for g in &self.groups {
                if scale != 1.0 {
                    let _ = g.grad.shallow_clone().g_mul_scalar_(scale);
                }
                let decay = if g.decay { self.weight_decay } else { 0.0 };
                if self.fused {
                    if let Err(e) =
                        fused_adamw(g, self.steps, lr, self.beta1, self.beta2, decay, self.eps)
                    {
                        tracing::warn!("AdamW: the fused kernel failed ({e}); updating op by op");
                        self.fused = false;
                        self.step_by_ops(g, lr, decay);
                    }
                } else {
                    self.step_by_ops(g, lr, decay);
                }
            }
        });
    }

    /// `step`'s arithmetic for group `g`, one op at a time (PyTorch's unfused AdamW).
    fn step_by_ops(&self, g: &Group, lr: f64, decay: f64) {
        let t = self.steps as i32;
        let bias1 = 1.0 - self.beta1.powi(t);
        let bias2_sqrt = (1.0 - self.beta2.powi(t)).sqrt();
        let step_size = lr / bias1;
        let (grad, mut param, mut exp_avg, mut exp_avg_sq) = (
            g.grad.shallow_clone(),
            g.param.shallow_clone(),
            g.exp_avg.shallow_clone(),
            g.exp_avg_sq.shallow_clone(),
        );
        if decay != 0.0 {
            let _ = param.g_mul_scalar_(1.0 - lr * decay);
        }
        let _ = exp_avg.lerp_(&grad, 1.0 - self.beta1);
        let _ = exp_avg_sq.g_mul_scalar_(self.beta2);
        let _ = exp_avg_sq.addcmul_(&(&grad * (1.0 - self.beta2)), &grad);
        let denom = (exp_avg_sq.sqrt() / bias2_sqrt) + self.eps;
        let _ = param.addcdiv_(&(&exp_avg * -step_size), &denom);
    }

    /// Sets every gradient to zero: one kernel per group buffer, no re-allocation.
    pub fn zero_grad(&mut self) {
        self.grad_scale = 1.0;
        for g in &self.groups {
            let _ = g.grad.shallow_clone().zero_();
        }
    }

    /// Scales gradients so their global L2 norm is at most `max_norm`; returns the norm
    /// before clipping. `max_norm` 0 only measures.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let total = self.grad_norm().map_or(0.0, |t| t.double_value(&[]));
        self.clip_to(total, max_norm);
        total
    }

    /// The global L2 norm of the gradients as a 0-dim f64 tensor on their device (None
    /// without parameters); the trainer reads it with the step's other scalars in one go.
    /// One norm per group buffer.
    pub fn grad_norm(&self) -> Option<Tensor> {
        let norms: Vec<Tensor> = self
            .groups
            .iter()
            .map(|g| g.grad.norm().to_kind(Kind::Double))
            .collect();
        (!norms.is_empty()).then(|| Tensor::stack(&norms, 0).norm())
    }

    /// Clips the gradients to `max_norm` when their norm `total` is above it: the next
    /// `step` scales each group's gradient buffer in place, once.
    pub fn clip_to(&mut self, total: f64, max_norm: f64) {
        self.grad_scale = if max_norm > 0.0 && total > max_norm {
            max_norm / (total + 1e-6)
        } else {
            1.0
        };
    }

    /// Divides the gradients by the fp16 loss scale in the next `step` (after `clip_to`,
    /// which was given the unscaled norm), in the same one multiply.
    pub fn unscale(&mut self, loss_scale: f64) {
        self.grad_scale /= loss_scale;
    }

    /// The state as named tensors (`<param>.exp_avg`, `<param>.exp_avg_sq`, and `step`).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.slots.len() + 1);
        for s in &self.slots {
            out.push((format!("{}.exp_avg", s.name), s.exp_avg.shallow_clone()));
            out.push((
                format!("{}.exp_avg_sq", s.name),
                s.exp_avg_sq.shallow_clone(),
            ));
        }
        out.push(("step".to_string(), Tensor::from_slice(&[self.steps as i64])));
        out
    }

    /// Restores a state saved by `state`; every tensor must be present with the right shape.
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let find = |name: &str| -> Result<&Tensor> {
            state
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| {
                    TrainError::IncompatibleCheckpoint(
                        format!("optimizer state has no tensor {name}").into(),
                    )
                })
        };
        for s in &mut self.slots {
            for (suffix, dst) in [
                ("exp_avg", &mut s.exp_avg),
                ("exp_avg_sq", &mut s.exp_avg_sq),
            ] {
                let name = format!("{}.{suffix}", s.name);
                let src = find(&name)?;
                if src.size() != dst.size() {
                    return Err(TrainError::IncompatibleCheckpoint(
                        format!(
                            "optimizer tensor {name} has shape {:?}, the model needs {:?}",
                            src.size(),
                            dst.size()
                        )
                        .into(),
                    ));
                }
                tch::no_grad(|| dst.copy_(src));
            }
        }
        self.steps = find("step")?.int64_value(&[0]) as u64;
        Ok(())
    }
}

/// Learning rate at optimizer step `step` (1-based: the first update uses step 1).
/// `time_used` is the fraction of `maxSeconds` spent so far; only `horizon: time` reads it.
///
/// With `horizon: steps` the decay starts after warmup and ends at `max_steps`. With
/// `horizon: time` it runs over the whole budget and multiplies the warmup ramp:
/// `peak * min(1, step / warmup) * decay(time_used)`, so the two never jump.
pub fn learning_rate(
    peak: f64,
    s: &ScheduleConfig,
    max_steps: u64,
    step: u64,
    time_used: f64,
) -> f64 {
    let step = step.max(1) as f64;
    let warmup = s.warmup_steps as f64;
    let floor = s.min_lr_ratio * peak;
    // Decay from peak to floor as `progress` goes from 0 to 1.
    let decay = |progress: f64| {
        let p = progress.clamp(0.0, 1.0);
        match s.kind {
            ScheduleKind::Cosine => {
                floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
            }
            _ => floor + (peak - floor) * (1.0 - p),
        }
    };
    let decays = matches!(s.kind, ScheduleKind::Cosine | ScheduleKind::Linear);
    if decays && s.horizon == ScheduleHorizon::Time {
        let ramp = if warmup > 0.0 {
            (step / warmup).min(1.0)
        } else {
            1.0
        };
        return ramp * decay(time_used);
    }
    if step <= warmup {
        return peak * step / warmup;
    }
    match s.kind {
        ScheduleKind::Constant => peak,
        ScheduleKind::InverseSqrt => peak * (warmup.max(1.0) / step).sqrt(),
        ScheduleKind::Cosine | ScheduleKind::Linear => {
            let span = (max_steps as f64 - warmup).max(1.0);
            decay((step - warmup) / span)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(kind: ScheduleKind, warmup: u64, min: f64) -> ScheduleConfig {
        ScheduleConfig {
            kind,
            warmup_steps: warmup,
            min_lr_ratio: min,
            horizon: ScheduleHorizon::Steps,
        }
    }

    #[test]
    fn schedules_follow_their_formulas() {
        let inv = schedule(ScheduleKind::InverseSqrt, 300, 0.0);
        let cases = [
            (1, 2e-3 / 300.0),
            (150, 1e-3),
            (300, 2e-3),
            (1200, 1e-3),
            (4800, 5e-4),
        ];
        for (step, want) in cases {
            let got = learning_rate(2e-3, &inv, 10_000, step, 0.0);
            assert!(
                (got - want).abs() < 1e-12,
                "inverseSqrt step {step}: {got} != {want}"
            );
        }
        let cos = schedule(ScheduleKind::Cosine, 100, 0.1);
        let cases = [(50, 0.5), (100, 1.0), (550, 0.55), (1000, 0.1), (5000, 0.1)];
        for (step, want) in cases {
            let got = learning_rate(1.0, &cos, 1000, step, 0.0);
            assert!(
                (got - want).abs() < 1e-12,
                "cosine step {step}: {got} != {want}"
            );
        }
        let constant = schedule(ScheduleKind::Constant, 0, 0.0);
        assert_eq!(learning_rate(0.5, &constant, 10, 1, 0.0), 0.5);
        assert_eq!(learning_rate(0.5, &constant, 10, 1_000_000, 0.0), 0.5);
        let no_warmup = schedule(ScheduleKind::InverseSqrt, 0, 0.0);
        assert_eq!(learning_rate(0.5, &no_warmup, 10, 1, 0.0), 0.5);
        assert_eq!(learning_rate(0.5, &no_warmup, 10, 4, 0.0), 0.25);
        // Linear over steps: warmup 100, then 1.0 -> 0.2 between steps 100 and 1100.
        let linear = schedule(ScheduleKind::Linear, 100, 0.2);
        let cases = [(50, 0.5), (100, 1.0), (600, 0.6), (1100, 0.2), (5000, 0.2)];
        for (step, want) in cases {
            let got = learning_rate(1.0, &linear, 1100, step, 0.99);
            assert!(
                (got - want).abs() < 1e-12,
                "linear step {step}: {got} != {want}"
            );
        }
    }

    #[test]
    fn time_horizon_decays_with_the_budget_not_the_step() {
        let mut linear = schedule(ScheduleKind::Linear, 100, 0.0);
        linear.horizon = ScheduleHorizon::Time;
        // (step, fraction of maxSeconds used, lr); maxSteps (1000) plays no part.
        let cases = [
            (50, 0.01, 0.5 * 0.99),
            (100, 0.05, 0.95),
            (5000, 0.5, 0.5),
            (900, 0.75, 0.25),
            (20_000, 1.0, 0.0),
            (20_001, 1.3, 0.0),
        ];
        for (step, used, want) in cases {
            let got = learning_rate(1.0, &linear, 1000, step, used);
            assert!(
                (got - want).abs() < 1e-12,
                "linear/time step {step} used {used}: {got} != {want}"
            );
        }
        let mut cos = schedule(ScheduleKind::Cosine, 0, 0.1);
        cos.horizon = ScheduleHorizon::Time;
        assert!((learning_rate(1.0, &cos, 10, 7, 0.5) - 0.55).abs() < 1e-12);
    }

    /// Three AdamW steps on fixed gradients, against torch.optim.AdamW 2.11.0 (CPU, float64):
    /// produced by scripts/reference/adamw_reference.py, whose output is pasted below.
    #[test]
    fn adamw_matches_pytorch() {
        let config = OptimizerConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
            weight_decay: 0.01,
            clip_norm: 0.0,
        };
        let w = Tensor::from_slice(&[0.5f64, -1.0, 2.0]).set_requires_grad(true);
        let b = Tensor::from_slice(&[0.25f64]).set_requires_grad(true);
        let params = vec![
            ("layer.weight".to_string(), w.shallow_clone()),
            ("layer.bias".to_string(), b.shallow_clone()),
        ];
        let mut opt = AdamW::new(&params, &config);
        let grads_w = [[0.1f64, -0.2, 0.3], [0.05, 0.1, -0.4], [-0.3, 0.2, 0.1]];
        let grads_b = [0.5f64, -0.25, 0.125];
        for (i, lr) in [0.1, 0.05, 0.02].into_iter().enumerate() {
            opt.zero_grad();
            // d/dw of sum(w * g) is g: sets the gradients to the fixed values exactly.
            let gw = Tensor::from_slice(&grads_w[i]);
            let gb = Tensor::from_slice(&[grads_b[i]]);
            ((&w * &gw).sum(Kind::Double) + (&b * &gb).sum(Kind::Double)).backward();
            opt.step(lr);
        }
        let got_w: Vec<f64> = Vec::try_from(&w.detach()).unwrap();
        let got_b: Vec<f64> = Vec::try_from(&b.detach()).unwrap();
        let want_w = REFERENCE_W;
        let want_b = REFERENCE_B;
        for (g, e) in got_w
            .iter()
            .zip(want_w.iter())
            .chain(got_b.iter().zip(want_b.iter()))
        {
            assert!(
                (g - e).abs() < 1e-12,
                "got {got_w:?} {got_b:?}, PyTorch {want_w:?} {want_b:?}"
            );
        }
        assert_eq!(opt.steps, 3);
        assert!(opt.fused, "libtorch's fused kernel made the updates");
    }

    #[test]
    fn the_fused_update_is_the_op_by_op_one_in_fp32() {
        let config = OptimizerConfig {
            lr: 0.003,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
            weight_decay: 0.2,
            clip_norm: 0.0,
        };
        tch::manual_seed(5);
        let start = Tensor::randn([1000], (Kind::Float, tch::Device::Cpu));
        let run = |fused: bool| {
            let w = start.copy().set_requires_grad(true);
            let b = start.narrow(0, 0, 10).copy().set_requires_grad(true);
            let params = vec![
                ("w.weight".to_string(), w.shallow_clone()),
                ("w.bias".to_string(), b.shallow_clone()),
            ];
            let mut opt = AdamW::new(&params, &config);
            opt.fused = fused;
            for step in 0..5 {
                opt.zero_grad();
                ((&w * &w).sum(Kind::Float) * (step as f64 + 1.0) + (&b * 3.0).sum(Kind::Float))
                    .backward();
                opt.clip_to(10.0, 1.0);
                opt.step(0.003);
            }
            assert_eq!(opt.fused, fused);
            Tensor::cat(&[w.detach(), b.detach()], 0)
        };
        let diff = (run(true) - run(false)).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "{diff}");
    }

    // Printed by `python scripts/reference/adamw_reference.py` with torch 2.11.0+cu130 on CPU.
    const REFERENCE_W: [f64; 3] = [0.35937872955887085, -0.890471888323569, 1.9067597148719575];
    const REFERENCE_B: [f64; 1] = [0.12978892340184256];

    /// AdamW without weight decay, clipping to norm 1.
    fn clipping_config() -> OptimizerConfig {
        OptimizerConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
            weight_decay: 0.0,
            clip_norm: 1.0,
        }
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_state_round_trips() {
        let config = clipping_config();
        let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        (&w * &w).sum(Kind::Float).backward(); // grad = 2w = (6, 8), norm 10
        let params = vec![("w".to_string(), w.shallow_clone())];
        let mut opt = AdamW::new(&params, &config);
        let norm = opt.clip_grad_norm(1.0);
        assert!((norm - 10.0).abs() < 1e-5);
        opt.step(0.1);
        let state = opt.state();
        // The first moment is (1 - beta1) times the gradient the step used: the clipped one.
        let first_moment = state[0].1.norm().double_value(&[]);
        assert!((first_moment - 0.1).abs() < 1e-5, "{first_moment}");
        let w2 = Tensor::from_slice(&[0.0f32, 0.0]).set_requires_grad(true);
        let mut other = AdamW::new(&[("w".to_string(), w2)], &config);
        other.load_state(&state).unwrap();
        assert_eq!(other.steps, 1);
        for ((n1, t1), (n2, t2)) in state.iter().zip(other.state().iter()) {
            assert_eq!(n1, n2);
            assert!(t1.equal(t2), "{n1}");
        }
        let wrong = vec![(
            "w".to_string(),
            Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)),
        )];
        let mut mismatched = AdamW::new(&wrong, &config);
        assert!(matches!(
            mismatched.load_state(&state),
            Err(TrainError::IncompatibleCheckpoint(_))
        ));
    }

    #[test]
    fn fp16_gradients_are_unscaled_and_clipped_by_their_true_norm() {
        let config = OptimizerConfig {
            clip_norm: 5.0,
            ..clipping_config()
        };
        let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        // The loss scaled by 1024: grad = 1024 * (6, 8), true norm 10.
        ((&w * &w).sum(Kind::Float) * 1024.0).backward();
        let mut opt = AdamW::new(&[("w".to_string(), w.shallow_clone())], &config);
        let scaled = opt.grad_norm().unwrap().double_value(&[]);
        opt.clip_to(scaled / 1024.0, config.clip_norm);
        opt.unscale(1024.0);
        opt.step(0.1);
        // The step used (6, 8) clipped to norm 5: the first moment is 0.1 of that.
        let first_moment = opt.state()[0].1.norm().double_value(&[]);
        assert!((first_moment - 0.5).abs() < 1e-5, "{first_moment}");
    }
}
