//! Which precision the matrix multiplies run in: `precision: auto` decided from the hardware
//! at start-up (bf16 where the silicon has bf16 units, fp16 with loss scaling on GPUs of
//! compute capability 7.x, fp32 otherwise), the same on every rank of a gang.

use ferrotrain_api::config::Precision;
use ferrotrain_api::progress::PrecisionChoice;
use tch::Device;

use crate::distributed::Collective;
use crate::error::{Result, TrainError};

/// What decides `auto`: the device a rank trains on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hardware {
    /// A CPU, with the bf16 matrix unit its /proc/cpuinfo flags name (`amx_bf16`,
    /// `avx512_bf16`), if any.
    Cpu { bf16_unit: Option<&'static str> },
    /// A CUDA GPU with its compute capability (major, minor), when it could be read.
    Cuda { capability: Option<(u32, u32)> },
}

impl Hardware {
    /// The hardware of `device` on this machine.
    pub fn of(device: Device) -> Hardware {
        match device {
            Device::Cuda(ordinal) => Hardware::Cuda {
                capability: gpu_capability(ordinal),
            },
            _ => Hardware::Cpu {
                bf16_unit: cpu_bf16_unit(
                    &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
                ),
            },
        }
    }
}

/// The bf16 matrix unit /proc/cpuinfo's `flags` name (AMX-BF16 first), if any.
pub fn cpu_bf16_unit(cpuinfo: &str) -> Option<&'static str> {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .collect();
    [("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")]
        .into_iter()
        .find(|(flag, _)| flags.contains(flag))
        .map(|(_, name)| name)
}

/// The precision a rank on `hardware` uses for `requested`, and why.
pub fn decide(requested: Precision, hardware: &Hardware) -> PrecisionChoice {
    let (used, reason) = match requested {
        Precision::Auto => auto(hardware),
        asked => (asked, format!("the config asks for {asked}")),
    };
    PrecisionChoice {
        requested,
        used,
        reason,
    }
}

fn auto(hardware: &Hardware) -> (Precision, String) {
    match *hardware {
        Hardware::Cpu {
            bf16_unit: Some(unit),
        } => (Precision::Bf16, format!("auto: this CPU has {unit}")),
        Hardware::Cpu { bf16_unit: None } => (
            Precision::Fp32,
            "auto: this CPU has no bf16 units (AMX-BF16 or AVX512-BF16), bf16 would be emulated"
                .into(),
        ),
        Hardware::Cuda {
            capability: Some((major, minor)),
        } => match major {
            8.. => (
                Precision::Bf16,
                format!("auto: GPU compute capability {major}.{minor} has bf16 tensor cores"),
            ),
            7 => (
                Precision::Fp16,
                format!(
                    "auto: GPU compute capability {major}.{minor} has fp16 tensor cores but no bf16"
                ),
            ),
            _ => (
                Precision::Fp32,
                format!("auto: GPU compute capability {major}.{minor} has no tensor cores"),
            ),
        },
        Hardware::Cuda { capability: None } => (
            Precision::Fp32,
            "auto: the GPU's compute capability could not be read (a build without the cuda \
             feature)"
                .into(),
        ),
    }
}

/// A warning for a precision the hardware can only emulate (asked for explicitly).
pub fn emulation_warning(choice: &PrecisionChoice, hardware: &Hardware) -> Option<String> {
    match (choice.used, hardware) {
        (Precision::Bf16, Hardware::Cpu { bf16_unit: None }) => Some(
            "precision: bf16 on a CPU without AMX or AVX512-BF16: bf16 is emulated and \
             probably slower than fp32 here (precision: auto picks fp32)"
                .into(),
        ),
        (Precision::Fp16, Hardware::Cpu { .. }) => Some(
            "precision: fp16 on a CPU: fp16 matrix multiplies are emulated and slow (use it \
             to test, not to train)"
                .into(),
        ),
        (
            Precision::Bf16,
            Hardware::Cuda {
                capability: Some((major @ ..8, minor)),
            },
        ) => Some(format!(
            "precision: bf16 on a GPU of compute capability {major}.{minor}: no bf16 tensor \
             cores, probably slower than fp16 (precision: auto picks fp16 or fp32)"
        )),
        _ => None,
    }
}

/// The start-up line: `precision: bf16 (auto: this CPU has AVX512-BF16)`.
pub fn startup_line(choice: &PrecisionChoice) -> String {
    format!("precision: {} ({})", choice.used, choice.reason)
}

/// Every rank must train in the same precision: one all-reduce of each rank's choice; a gang
/// whose ranks chose differently (mixed hardware under `auto`) fails on every rank with the
/// same configuration error.
pub fn agree(comm: &mut dyn Collective, choice: &PrecisionChoice) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    const KINDS: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Fp16];
    let mine: Vec<f32> = KINDS
        .iter()
        .map(|&k| f32::from(u8::from(k == choice.used)))
        .collect();
    let mut counts = comm.upload(&mine)?;
    comm.all_reduce_sum(&mut counts)?;
    let counts = comm.download(counts)?;
    let chosen: Vec<String> = KINDS
        .iter()
        .zip(&counts)
        .filter(|(_, n)| **n > 0.5)
        .map(|(k, n)| format!("{} rank(s) {k}", n.round()))
        .collect();
    if chosen.len() <= 1 {
        return Ok(());
    }
    Err(TrainError::Config(
        format!(
            "precision: the gang's ranks would train in different precisions ({}; this rank: \
             {}): its pods run on different hardware. Set precision to fp32, bf16 or fp16, or \
             place the job on one kind of node",
            chosen.join(", "),
            startup_line(choice)
        )
        .into(),
    ))
}

/// The compute capability of GPU `ordinal`, read from the CUDA driver.
#[cfg(feature = "cuda")]
fn gpu_capability(ordinal: usize) -> Option<(u32, u32)> {
    use cudarc::driver::sys as cu;
    use cudarc::driver::sys::CUdevice_attribute as attr;
    // SAFETY: plain driver calls with valid out-pointers, after checking libcuda loads.
    unsafe {
        if !cu::is_culib_present() || cu::cuInit(0) != cu::CUresult::CUDA_SUCCESS {
            return None;
        }
        let mut dev = 0;
        if cu::cuDeviceGet(&mut dev, i32::try_from(ordinal).ok()?) != cu::CUresult::CUDA_SUCCESS {
            return None;
        }
        let read = |a| {
            let mut v = 0;
            (cu::cuDeviceGetAttribute(&mut v, a, dev) == cu::CUresult::CUDA_SUCCESS)
                .then(|| u32::try_from(v).ok())
                .flatten()
        };
        Some((
            read(attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            read(attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_capability(_ordinal: usize) -> Option<(u32, u32)> {
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::distributed::RingCollective;
    use crate::distributed::ring::local_rings;
    use ferrotrain_launch::auth::Auth;

    const AVX2_ONLY: &str = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\n\
                             flags\t\t: fpu sse2 avx avx2 fma\n";
    const ZEN4: &str = "flags\t\t: fpu avx2 avx512f avx512_bf16\n";
    const SAPPHIRE: &str = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n";

    fn cpu(cpuinfo: &str) -> Hardware {
        Hardware::Cpu {
            bf16_unit: cpu_bf16_unit(cpuinfo),
        }
    }

    #[test]
    fn bf16_units_are_read_from_cpuinfo_flags() {
        assert_eq!(cpu_bf16_unit(SAPPHIRE), Some("AMX-BF16"));
        assert_eq!(cpu_bf16_unit(ZEN4), Some("AVX512-BF16"));
        assert_eq!(cpu_bf16_unit(AVX2_ONLY), None);
        let skylake = "model name\t: Xeon avx512_bf16\nflags\t\t: fpu avx2 avx512f\n";
        assert_eq!(cpu_bf16_unit(skylake), None, "only the flags line counts");
        assert_eq!(cpu_bf16_unit(""), None, "unknown: no bf16 units");
    }

    #[test]
    fn auto_on_cpus_picks_bf16_only_where_it_has_units() {
        let line = |cpuinfo| startup_line(&decide(Precision::Auto, &cpu(cpuinfo)));
        assert_eq!(
            line(ZEN4),
            "precision: bf16 (auto: this CPU has AVX512-BF16)"
        );
        assert_eq!(
            line(SAPPHIRE),
            "precision: bf16 (auto: this CPU has AMX-BF16)"
        );
        assert_eq!(
            line(AVX2_ONLY),
            "precision: fp32 (auto: this CPU has no bf16 units (AMX-BF16 or AVX512-BF16), \
             bf16 would be emulated)"
        );
        // This machine, whatever it is: the line names what it found.
        let here = decide(Precision::Auto, &Hardware::of(Device::Cpu));
        assert_ne!(here.used, Precision::Auto);
        println!("{}", startup_line(&here));
    }

    #[test]
    fn auto_on_gpus_follows_the_compute_capability() {
        let table = [
            ((6, 0), Precision::Fp32),
            ((7, 0), Precision::Fp16),
            ((7, 5), Precision::Fp16),
            ((8, 0), Precision::Bf16),
            ((8, 9), Precision::Bf16),
            ((9, 0), Precision::Bf16),
        ];
        for (capability, expected) in table {
            let hw = Hardware::Cuda {
                capability: Some(capability),
            };
            let choice = decide(Precision::Auto, &hw);
            assert_eq!(choice.used, expected, "{capability:?}");
            let (major, minor) = capability;
            assert!(choice.reason.contains(&format!("{major}.{minor}")));
        }
        let unknown = decide(Precision::Auto, &Hardware::Cuda { capability: None });
        assert_eq!(unknown.used, Precision::Fp32);
    }

    #[test]
    fn an_explicit_precision_is_kept_with_a_warning_where_it_is_emulated() {
        let v100 = Hardware::Cuda {
            capability: Some((7, 0)),
        };
        for p in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
            for hw in [cpu(AVX2_ONLY), cpu(ZEN4), v100.clone()] {
                let choice = decide(p, &hw);
                assert_eq!((choice.requested, choice.used), (p, p));
                assert_eq!(choice.reason, format!("the config asks for {p}"));
            }
        }
        let warn = |p, hw: &Hardware| emulation_warning(&decide(p, hw), hw);
        assert!(warn(Precision::Bf16, &cpu(AVX2_ONLY)).is_some());
        assert!(warn(Precision::Bf16, &cpu(ZEN4)).is_none());
        assert!(warn(Precision::Fp16, &cpu(ZEN4)).is_some());
        assert!(warn(Precision::Bf16, &v100).unwrap().contains("7.0"));
        assert!(warn(Precision::Fp16, &v100).is_none());
        assert!(warn(Precision::Auto, &cpu(AVX2_ONLY)).is_none());
    }

    #[test]
    fn a_gang_of_mixed_hardware_refuses_to_start_on_every_rank() {
        let auth = Auth::new("t", 0);
        let run = |choices: [Precision; 2]| {
            let rings = local_rings(2, &auth, Duration::from_secs(10)).unwrap();
            let handles: Vec<_> = rings
                .into_iter()
                .zip(choices)
                .map(|(ring, used)| {
                    std::thread::spawn(move || {
                        let mut ring = RingCollective::new(ring);
                        let choice = PrecisionChoice {
                            requested: Precision::Auto,
                            used,
                            reason: "test".into(),
                        };
                        agree(&mut ring, &choice).map_err(|e| e.to_string())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        };
        assert!(
            run([Precision::Bf16, Precision::Bf16])
                .iter()
                .all(Result::is_ok)
        );
        for outcome in run([Precision::Bf16, Precision::Fp16]) {
            let err = outcome.unwrap_err();
            assert!(err.contains("1 rank(s) bf16, 1 rank(s) fp16"), "{err}");
            assert!(err.contains("Set precision to"), "{err}");
        }
    }
}
