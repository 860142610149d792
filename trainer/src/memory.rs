//! The libtorch memory call tch exposes only in a deprecated form (csrc/memory.cpp): pinning
//! a host tensor without naming a device. tch's `pin_memory(device)` makes PyTorch 2.11 warn
//! on every call (twice per micro-batch on a GPU).

use std::ffi::{CStr, c_char, c_void};

use tch::Tensor;

use crate::error::{Result, TrainError};

unsafe extern "C" {
    fn ft_pin_memory(tensor: *const c_void, out: *mut *mut c_void) -> *mut c_char;
    fn ft_free_error(error: *mut c_char);
}

/// `host` copied into page-locked memory, for an asynchronous copy to the GPU. Fails (with
/// libtorch's message) where no accelerator is available, as on a CPU-only build.
pub fn pin_memory(host: &Tensor) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `host` is a live tensor; on success the shim stores a new at::Tensor* that
    // the returned Tensor owns; on failure it returns a malloc'ed message freed here.
    let error = unsafe { ft_pin_memory(host.as_ptr() as *const c_void, &mut out) };
    if !error.is_null() {
        // SAFETY: a NUL-terminated string from the shim, freed right after.
        let message = unsafe {
            let m = CStr::from_ptr(error).to_string_lossy().into_owned();
            ft_free_error(error);
            m
        };
        return Err(TrainError::Other(
            format!("libtorch pin_memory: {message}").into(),
        ));
    }
    // SAFETY: `out` is a new at::Tensor* (tch's C_tensor) that nothing else owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_accelerator_pinning_is_an_error_not_a_crash() {
        let host = Tensor::from_slice(&[1.0f32, 2.0]);
        if tch::Cuda::is_available() {
            let pinned = pin_memory(&host).unwrap();
            assert!(pinned.is_pinned(tch::Device::Cuda(0)));
            assert_eq!(Vec::<f32>::try_from(&pinned).unwrap(), [1.0, 2.0]);
        } else {
            let e = pin_memory(&host).unwrap_err().to_string();
            assert!(e.starts_with("libtorch pin_memory: "), "{e}");
        }
    }
}
