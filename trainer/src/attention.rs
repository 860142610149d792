//! Which fused attention kernels libtorch may use on a GPU (csrc/attention.cpp).
//!
//! PyTorch 2.11 puts cuDNN's attention first on Hopper and later GPUs when cuDNN is newer
//! than 9.15 (the torch wheel brings 9.19). With a padding mask, as every translation batch
//! has, cuDNN builds and compiles an execution graph for each new batch shape ([batch,
//! length] changes from step to step), and batches of variable-length sentences keep
//! producing new shapes. Seen on an H200 (bench/gpu-validate.sh, 2026-11-27): Multi30k at
//! 16k tokens per batch in bf16 took about 240 ms per step over its first 50 steps and 21 ms
//! once the shapes had been seen, while fp32, which cuDNN's kernel does not take, ran at
//! 27 ms per step from the first step. So ferrotrain turns cuDNN attention off and libtorch
//! picks flash or memory-efficient attention, which compile nothing per shape.
//! `FERROTRAIN_CUDNN_ATTENTION=1` leaves it on (fixed-shape workloads may gain from it).

use tch::Device;

unsafe extern "C" {
    fn ft_sdp_use_cudnn(enabled: bool);
    fn ft_sdp_cudnn_enabled() -> bool;
}

/// The environment variable that leaves cuDNN attention on.
pub const CUDNN_ATTENTION_ENV: &str = "FERROTRAIN_CUDNN_ATTENTION";

/// Whether cuDNN attention stays on: `FERROTRAIN_CUDNN_ATTENTION` is 1, true, yes or on.
pub fn cudnn_wanted(value: Option<&str>) -> bool {
    matches!(
        value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
        Some("1" | "true" | "yes" | "on")
    )
}

/// Sets libtorch's attention kernels for `device` (before the first forward pass) and
/// returns the start-up line that says which, or None on the CPU (no fused GPU kernels).
pub fn configure(device: Device) -> Option<String> {
    if !device.is_cuda() {
        return None;
    }
    let keep = cudnn_wanted(std::env::var(CUDNN_ATTENTION_ENV).ok().as_deref());
    set_cudnn(keep);
    Some(if keep {
        format!("attention: cuDNN attention allowed ({CUDNN_ATTENTION_ENV}=1)")
    } else {
        format!(
            "attention: flash or memory-efficient kernels (cuDNN attention off: it compiles \
             a graph per batch shape; {CUDNN_ATTENTION_ENV}=1 allows it)"
        )
    })
}

/// libtorch's switch for cuDNN attention (torch.backends.cuda.enable_cudnn_sdp).
pub fn set_cudnn(enabled: bool) {
    // SAFETY: plain setters of libtorch's global context; no pointers cross.
    unsafe { ft_sdp_use_cudnn(enabled) }
}

/// Whether libtorch may pick cuDNN attention.
pub fn cudnn_enabled() -> bool {
    // SAFETY: a plain getter of libtorch's global context.
    unsafe { ft_sdp_cudnn_enabled() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_reaches_libtorch_and_only_gpus_are_configured() {
        assert!(configure(Device::Cpu).is_none());
        set_cudnn(false);
        assert!(!cudnn_enabled());
        set_cudnn(true);
        assert!(cudnn_enabled());
    }

    #[test]
    fn only_an_explicit_yes_keeps_cudnn_attention() {
        for yes in ["1", "true", "TRUE", " on ", "yes"] {
            assert!(cudnn_wanted(Some(yes)), "{yes}");
        }
        for no in [None, Some(""), Some("0"), Some("false"), Some("no")] {
            assert!(!cudnn_wanted(no), "{no:?}");
        }
    }
}
