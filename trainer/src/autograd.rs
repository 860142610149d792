//! The two autograd calls tch does not expose (csrc/autograd.cpp): pointing a parameter's
//! gradient at a tensor of our choosing, and a hook run once a parameter's gradient of the
//! running backward is complete.
//!
//! With every gradient a view of a flat buffer, AccumulateGrad adds each backward's
//! gradient into that buffer in place (libtorch does `grad += new_grad` when the gradient
//! exists and no double backward is asked for), so the optimizer, the gradient norm and the
//! gradient exchange work on a few flat tensors, with no copies. The hook tells the
//! gradient exchange which buckets are complete while backward is still running.

use std::ffi::{CStr, c_char, c_void};

use tch::Tensor;

use crate::error::{Result, TrainError};

/// Called with the hook's context and index once the parameter's gradient is complete.
pub type ReadyFn = extern "C" fn(context: *mut c_void, index: usize);

unsafe extern "C" {
    fn ft_set_grad(param: *mut c_void, grad: *const c_void) -> *mut c_char;
    fn ft_set_grad_ready_hook(
        param: *mut c_void,
        f: ReadyFn,
        context: *mut c_void,
        index: usize,
    ) -> *mut c_char;
    fn ft_clear_grad_ready_hook(param: *mut c_void) -> *mut c_char;
    fn ft_free_error(error: *mut c_char);
}

pub(crate) fn check(error: *mut c_char, what: &str) -> Result<()> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a NUL-terminated string from the shim's malloc, freed right after.
    let message = unsafe {
        let m = CStr::from_ptr(error).to_string_lossy().into_owned();
        ft_free_error(error);
        m
    };
    Err(TrainError::Other(
        format!("libtorch {what}: {message}").into(),
    ))
}

/// Makes `grad` the gradient of `param` (same shape, kind and device): later backward
/// passes accumulate into `grad`'s memory.
pub fn set_grad(param: &Tensor, grad: &Tensor) -> Result<()> {
    if param.size() != grad.size() || param.kind() != grad.kind() {
        return Err(TrainError::Other(
            format!(
                "set_grad: a {:?} {:?} gradient for a {:?} {:?} parameter",
                grad.kind(),
                grad.size(),
                param.kind(),
                param.size()
            )
            .into(),
        ));
    }
    // SAFETY: both pointers are live torch::Tensor objects owned by the Rust tensors.
    check(
        unsafe {
            ft_set_grad(
                param.as_ptr() as *mut c_void,
                grad.as_ptr() as *const c_void,
            )
        },
        "set_grad",
    )
}

/// Runs `f(context, index)` each time a backward pass completes `param`'s gradient, until
/// `clear_ready_hook`. A parameter has at most one such hook.
///
/// # Safety
/// `context` must stay valid, and `f` must be safe to call with it from whatever thread runs
/// the backward pass, until the hook is cleared.
pub unsafe fn set_ready_hook(
    param: &Tensor,
    f: ReadyFn,
    context: *mut c_void,
    index: usize,
) -> Result<()> {
    // SAFETY: `param` is a live torch::Tensor; the caller vouches for context.
    check(
        unsafe { ft_set_grad_ready_hook(param.as_ptr() as *mut c_void, f, context, index) },
        "gradient hook",
    )
}

/// Removes `param`'s hook (none is fine).
pub fn clear_ready_hook(param: &Tensor) -> Result<()> {
    // SAFETY: `param` is a live torch::Tensor.
    check(
        unsafe { ft_clear_grad_ready_hook(param.as_ptr() as *mut c_void) },
        "gradient hook",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tch::{Device, Kind};

    #[test]
    fn backward_accumulates_into_the_given_gradient_buffer() {
        let flat = Tensor::zeros([5], (Kind::Float, Device::Cpu));
        let a = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        set_grad(&a, &flat.narrow(0, 0, 2)).unwrap();
        set_grad(&b, &flat.narrow(0, 2, 3)).unwrap();
        ((&a * 2.0).sum(Kind::Float) + (&b * 3.0).sum(Kind::Float)).backward();
        ((&a * 2.0).sum(Kind::Float) + (&b * 3.0).sum(Kind::Float)).backward();
        assert_eq!(
            Vec::<f32>::try_from(&flat).unwrap(),
            [4.0, 4.0, 6.0, 6.0, 6.0]
        );
        let _ = flat.shallow_clone().zero_();
        assert_eq!(Vec::<f32>::try_from(&a.grad()).unwrap(), [0.0, 0.0]);
        assert!(set_grad(&a, &flat.narrow(0, 0, 3)).is_err());
    }

    static ORDER: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    extern "C" fn record(_: *mut c_void, index: usize) {
        ORDER.lock().unwrap().push(index);
    }

    #[test]
    fn the_hook_runs_once_per_backward_in_production_order_until_cleared() {
        let first = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let second = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        for (i, p) in [&first, &second].into_iter().enumerate() {
            // SAFETY: `record` ignores the context.
            unsafe { set_ready_hook(p, record, std::ptr::null_mut(), i).unwrap() };
        }
        // `first` feeds `second`'s input twice: its gradient completes last, once.
        let h = (&first * 2.0).exp();
        let y = ((&h * &second).sum(Kind::Float) + h.sum(Kind::Float)).sum(Kind::Float);
        y.backward();
        assert_eq!(*ORDER.lock().unwrap(), [1, 0]);
        clear_ready_hook(&first).unwrap();
        clear_ready_hook(&second).unwrap();
        ((&first * &second).sum(Kind::Float)).backward();
        assert_eq!(*ORDER.lock().unwrap(), [1, 0]);
        assert!(
            unsafe { set_ready_hook(&first.detach(), record, std::ptr::null_mut(), 9,) }.is_err()
        );
    }
}
