//! Where a process computes: the device a rank picks (a GPU when it has one, the CPU only
//! when the pod was given none) and the line that says so at start-up.

use ferrotrain_api::config::DeviceKind;
use tch::Device;

use crate::error::{Result, TrainError};

/// What this process can see of CUDA (`Cuda::device_count`, 0 without a CUDA libtorch or GPU).
pub fn visible_gpus() -> usize {
    if tch::Cuda::is_available() {
        tch::Cuda::device_count().max(0) as usize
    } else {
        0
    }
}

/// GPUs the pod was given (FERROTRAIN_EXPECT_GPUS, set by the operator from gpusPerReplica).
pub fn expected_gpus() -> Result<u32> {
    let name = ferrotrain_api::env::FERROTRAIN_EXPECT_GPUS;
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            TrainError::Config(format!("{name}={v:?} is not a number of GPUs").into())
        }),
        _ => Ok(0),
    }
}

/// The CUDA device (of the `visible` ones) that local rank `local_rank` computes on: ranks
/// share GPUs round-robin when there are fewer GPUs than ranks.
pub fn cuda_ordinal(local_rank: usize, visible: usize) -> usize {
    local_rank % visible.max(1)
}

/// Picks the device for this rank: GPU `local_rank % visible` (one visible GPU per process
/// works), the CPU when there is none, unless the pod was given GPUs (`expect_gpus`): then a
/// missing CUDA is a configuration error, not a silent CPU run.
pub fn select_device(
    kind: DeviceKind,
    local_rank: usize,
    expect_gpus: u32,
    visible: usize,
) -> Result<Device> {
    let why = || {
        if tch::utils::has_cuda() {
            "no CUDA device is visible"
        } else {
            "this libtorch has no CUDA (a CPU build, or libtorch_cuda was not linked)"
        }
    };
    match kind {
        DeviceKind::Cpu => {
            if expect_gpus > 0 {
                tracing::warn!(
                    "device: cpu while the pod was given {expect_gpus} GPU(s): they stay idle"
                );
            }
            Ok(Device::Cpu)
        }
        _ if visible > 0 => Ok(Device::Cuda(cuda_ordinal(local_rank, visible))),
        DeviceKind::Auto if expect_gpus == 0 => Ok(Device::Cpu),
        DeviceKind::Auto => Err(TrainError::Config(
            format!(
                "device: auto on a pod given {expect_gpus} GPU(s) ({}), but {}: refusing to \
             train on the CPU (set device: cpu to do so on purpose)",
                ferrotrain_api::env::FERROTRAIN_EXPECT_GPUS,
                why()
            )
            .into(),
        )),
        DeviceKind::Cuda => Err(TrainError::Config(
            format!("device: cuda requested but {}", why()).into(),
        )),
    }
}

/// One line on what this process computes with: the device, the libtorch build, CUDA.
pub fn startup_line(device: Device) -> String {
    // Linked against libtorch_cuda (build.rs); libtorch itself says CUDA only with a GPU.
    let build = match (env!("FERROTRAIN_LIBTORCH_BUILD"), tch::utils::has_cuda()) {
        ("CUDA", _) | (_, true) => "CUDA",
        _ => "CPU",
    };
    let mut line = format!(
        "device {device:?}; libtorch {} ({build} build, tch {}); {} CUDA device(s) visible",
        env!("FERROTRAIN_LIBTORCH_VERSION"),
        TCH_VERSION,
        visible_gpus()
    );
    if tch::Cuda::is_available() {
        line += &format!("; cuDNN {}", tch::Cuda::cudnn_is_available());
    }
    line
}

/// The tch crate this binary was built with (it pins the libtorch version).
const TCH_VERSION: &str = "0.24.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_given_gpus_never_trains_on_the_cpu_by_accident() {
        use DeviceKind::{Auto, Cpu, Cuda};
        // (kind, local rank, GPUs the pod was given, GPUs visible) -> device or exit 2
        let table = [
            (Auto, 0, 0, 0, Some(Device::Cpu)),
            (Auto, 0, 4, 0, None),
            (Cuda, 0, 0, 0, None),
            (Cuda, 1, 4, 0, None),
            (Cpu, 0, 4, 0, Some(Device::Cpu)),
            (Cpu, 1, 0, 2, Some(Device::Cpu)),
            (Auto, 3, 4, 4, Some(Device::Cuda(3))),
            // One visible GPU per process (the device plugin's way): every rank uses GPU 0.
            (Auto, 3, 1, 1, Some(Device::Cuda(0))),
            (Cuda, 5, 0, 2, Some(Device::Cuda(1))),
        ];
        for (kind, local, expect, visible, want) in table {
            let got = select_device(kind, local, expect, visible);
            match want {
                Some(d) => assert_eq!(got.unwrap(), d, "{kind:?} {local} {expect} {visible}"),
                None => {
                    let err = got.unwrap_err();
                    assert_eq!(err.exit_code(), 2, "{err}");
                    if kind == Auto {
                        assert!(
                            err.to_string().contains("refusing to train on the CPU"),
                            "{err}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_startup_line_names_the_device_and_the_libtorch_build() {
        let line = startup_line(Device::Cpu);
        assert!(line.contains("device Cpu"), "{line}");
        assert!(line.contains("libtorch 2."), "{line}");
        assert!(
            line.contains("CPU build") || line.contains("CUDA build"),
            "{line}"
        );
        if !cfg!(feature = "cuda") {
            assert!(line.contains("CPU build"), "{line}");
        }
    }
}
