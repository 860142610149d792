//! fp32 linear layers on a CPU through oneDNN (libtorch's `mkldnn_linear`) instead of the
//! `addmm` that `nn::Linear` calls, which runs MKL's sgemm. On CPUs where MKL takes its
//! generic path (AMD: `mkl_blas_def_sgemm_kernel_0_zen`, 256-bit) oneDNN's JIT kernels use
//! the whole AVX-512 width: at the Multi30k recipe's shapes (1,800 rows, 256 -> 768) 480
//! against 209 GFLOP/s forward and 382 against 215 forward and backward, on the 2-core AMD
//! EPYC this project is developed on (docs/performance.md). Results are fp32 (no reduced
//! precision: 6e-7 relative to an fp64 product, MKL's 4e-7).
//!
//! The input goes to oneDNN's layout and the output back (`to_mkldnn`, `to_dense`), all
//! differentiable, so autograd computes the gradients with oneDNN's backward kernels too.
//! libtorch's C API has `to_mkldnn` but tch does not wrap it: [`to_mkldnn`] calls it.

use std::sync::LazyLock;

use tch::{Device, Kind, Tensor, nn};

/// Whether this libtorch was built with oneDNN (every x86-64 and aarch64 release is).
static HAS_ONEDNN: LazyLock<bool> = LazyLock::new(tch::utils::has_mkldnn);

/// Below this many rows MKL's call costs less than oneDNN's layout round trip: 8 rows (a
/// decoding step) 26 against 92 µs; 64 rows 163 against 130 µs (torch 2.11, 2 threads).
const MIN_ROWS: i64 = 64;

/// Whether an fp32 product with `x`'s rows goes through oneDNN: on a CPU, with at least
/// [`MIN_ROWS`] rows.
pub(super) fn applies(x: &Tensor) -> bool {
    let rows = match x.size().last() {
        Some(&last) if last > 0 => x.numel() as i64 / last,
        _ => 0,
    };
    x.device() == Device::Cpu && x.kind() == Kind::Float && rows >= MIN_ROWS && *HAS_ONEDNN
}

/// `x W^T + b` for fp32 `x` [..., in] on a CPU, through oneDNN: [..., out].
pub(super) fn linear(x: &Tensor, layer: &nn::Linear) -> Tensor {
    let mut size = x.size();
    let input = *size
        .last()
        .expect("a linear layer's input has a feature dimension");
    let rows = to_mkldnn(&x.reshape([-1, input]).contiguous());
    let y = rows
        .mkldnn_linear(&layer.ws, layer.bs.as_ref())
        .to_dense(None::<Kind>, false);
    *size.last_mut().expect("checked above") = layer.ws.size()[0];
    y.view(size.as_slice())
}

/// `a b^T (+ bias)` for fp32 CPU matrices `a` [m, k] and `b` [n, k] through oneDNN, without
/// autograd's bookkeeping of a layer (the fused loss's products): [m, n]. Transposed views
/// are copied to be contiguous first.
pub(super) fn product_t(a: &Tensor, b: &Tensor, bias: Option<&Tensor>) -> Tensor {
    to_mkldnn(&a.contiguous())
        .mkldnn_linear(&b.contiguous(), bias)
        .to_dense(None::<Kind>, false)
}

/// `x` (a contiguous dense CPU tensor) in oneDNN's layout; autograd carries gradients back.
fn to_mkldnn(x: &Tensor) -> Tensor {
    let mut out = [std::ptr::null_mut(); 1];
    // SAFETY: `x` is a live tensor; on success libtorch stores a new tensor in `out[0]`, which
    // the returned Tensor owns; -1 is "no dtype" (keep x's).
    let error = unsafe {
        torch_sys::c_generated::atg_to_mkldnn(out.as_mut_ptr(), x.as_ptr() as *mut _, -1);
        torch_sys::get_and_reset_last_err()
    };
    if !error.is_null() {
        // SAFETY: a NUL-terminated string libtorch's C API malloc'ed for the caller to free.
        let message = unsafe {
            let m = std::ffi::CStr::from_ptr(error)
                .to_string_lossy()
                .into_owned();
            libc::free(error as *mut libc::c_void);
            m
        };
        panic!("libtorch to_mkldnn: {message}");
    }
    // SAFETY: `out[0]` is a new at::Tensor* (tch's C_tensor) that nothing else owns.
    unsafe { Tensor::from_ptr(out[0]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same layer through libtorch's `linear` (MKL) and through oneDNN: outputs and every
    /// gradient agree to fp32 rounding, for a 3-D input as the model passes.
    #[test]
    fn onednn_linear_matches_libtorchs_forward_and_backward() {
        tch::manual_seed(7);
        let vs = nn::VarStore::new(Device::Cpu);
        let layer = nn::linear(vs.root() / "l", 48, 80, Default::default());
        let x = Tensor::randn([3, 25, 48], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let g = Tensor::randn([3, 25, 80], (Kind::Float, Device::Cpu));
        assert!(applies(&x), "this libtorch has oneDNN");

        let inputs = [&x, &layer.ws, layer.bs.as_ref().unwrap()];
        let grads = |y: Tensor| {
            assert_eq!(y.size(), [3, 25, 80]);
            let got = Tensor::run_backward(&[(&y * &g).sum(Kind::Float)], &inputs, false, false);
            (y.detach(), got)
        };
        let (want_y, want) = grads(x.apply(&layer));
        let (got_y, got) = grads(linear(&x, &layer));
        let close = |a: &Tensor, b: &Tensor| {
            let scale = a.abs().max().double_value(&[]).max(1.0);
            (a - b).abs().max().double_value(&[]) / scale
        };
        assert!(close(&want_y, &got_y) < 1e-5, "{}", close(&want_y, &got_y));
        for (w, g) in want.iter().zip(&got) {
            assert!(close(w, g) < 1e-5, "{}", close(w, g));
        }
    }

    #[test]
    fn only_fp32_cpu_tensors_of_enough_rows_go_through_onednn() {
        let float = (Kind::Float, Device::Cpu);
        assert!(!applies(&Tensor::zeros([0, 4], float)));
        assert!(!applies(&Tensor::zeros([4, 0], float)));
        assert!(!applies(&Tensor::zeros([2, 31, 4], float)), "62 rows");
        assert!(applies(&Tensor::zeros([2, 32, 4], float)), "64 rows");
        assert!(!applies(&Tensor::zeros(
            [64, 4],
            (Kind::BFloat16, Device::Cpu)
        )));
    }
}
