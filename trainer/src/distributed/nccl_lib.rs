//! Loads libnccl by the names NCCL is actually shipped under.
//!
//! cudarc 0.19's loader tries libnccl.so, libnccl.so.12/.11/.10/.9/.1 but never
//! `libnccl.so.2`, the only name the nvidia-nccl-cu12/cu13 wheels and Debian's libnccl2
//! install (libnccl.so comes with the -dev package alone), and it has no hook to add one. The
//! trainer uses a handful of NCCL entry points, so it loads them itself: `FERROTRAIN_NCCL_LIBRARY`
//! (a path) when set, else `libnccl.so.2`, else cudarc's names. cudarc still provides the types.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use cudarc::nccl::sys as nc;
use ferrotrain_api::env;

use crate::error::{Result, TrainError};

type Stream = nc::cudaStream_t;

/// An `ncclResult_t` as the C ABI returns it: an int, mapped by value (a code newer than
/// this build knows must not become an invalid Rust enum).
pub type Code = c_int;
pub const SUCCESS: Code = 0;
pub const IN_PROGRESS: Code = 7;

/// What an `ncclResult_t` code usually means in a pod, for the error a rank fails with.
pub fn code_hint(code: Code) -> &'static str {
    match code {
        1 => {
            "a CUDA call inside NCCL failed: the GPU or its driver (nvidia-smi, dmesg on the node)"
        }
        2 => {
            "a system call failed: often /sys/bus/pci hidden from the container (sandboxed \
              runtimes such as gVisor) or /dev/shm too small (spec.podTemplate.shmSize); run \
              `ferrotrain doctor` in the pod"
        }
        3 => "NCCL's internal error: often different NCCL versions on the ranks",
        6 => {
            "a peer rank failed, or the network between the ranks did (NCCL_SOCKET_IFNAME, \
              NCCL_IB_* settings; docs/gpu.md)"
        }
        _ => "",
    }
}

/// The name of an `ncclResult_t` code.
pub fn code_name(code: Code) -> String {
    match code {
        0 => "ncclSuccess".into(),
        1 => "ncclUnhandledCudaError".into(),
        2 => "ncclSystemError".into(),
        3 => "ncclInternalError".into(),
        4 => "ncclInvalidArgument".into(),
        5 => "ncclInvalidUsage".into(),
        6 => "ncclRemoteError".into(),
        7 => "ncclInProgress".into(),
        other => format!("ncclResult {other}"),
    }
}

/// `ncclConfig_t` as NCCL 2.14 defined it (NCCL_CONFIG_INITIALIZER: `size`, `magic`,
/// `version`, then every field undefined): later NCCLs read a config of the size it says it
/// has and keep their defaults for the fields it lacks. Only `blocking` is set, to 0.
#[repr(C)]
pub struct NonBlockingConfig {
    size: usize,
    magic: std::ffi::c_uint,
    version: std::ffi::c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

impl Default for NonBlockingConfig {
    fn default() -> Self {
        const UNDEF_INT: c_int = c_int::MIN;
        NonBlockingConfig {
            size: std::mem::size_of::<NonBlockingConfig>(),
            magic: 0xcafe_beef,
            version: 21400,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
        }
    }
}

/// The NCCL entry points the trainer calls.
pub struct NcclLib {
    /// Which candidate was loaded (for the start-up log).
    pub name: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> Code,
    pub get_unique_id: unsafe extern "C" fn(*mut nc::ncclUniqueId) -> Code,
    pub comm_init_rank:
        unsafe extern "C" fn(*mut nc::ncclComm_t, c_int, nc::ncclUniqueId, c_int) -> Code,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        nc::ncclDataType_t,
        nc::ncclRedOp_t,
        nc::ncclComm_t,
        Stream,
    ) -> Code,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        nc::ncclDataType_t,
        c_int,
        nc::ncclComm_t,
        Stream,
    ) -> Code,
    /// `ncclCommInitRankConfig` (NCCL >= 2.14): a non-blocking communicator.
    pub comm_init_rank_config: Option<
        unsafe extern "C" fn(
            *mut nc::ncclComm_t,
            c_int,
            nc::ncclUniqueId,
            c_int,
            *mut NonBlockingConfig,
        ) -> Code,
    >,
    pub comm_get_async_error: unsafe extern "C" fn(nc::ncclComm_t, *mut Code) -> Code,
    pub comm_abort: unsafe extern "C" fn(nc::ncclComm_t) -> Code,
    pub get_error_string: unsafe extern "C" fn(Code) -> *const c_char,
    /// Keeps the symbols above valid.
    _lib: libloading::Library,
}

/// The names tried, in order: the override, the soname NCCL 2 ships, then cudarc's list.
pub fn candidates(override_path: Option<&str>) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(p) = override_path.map(str::trim).filter(|p| !p.is_empty()) {
        names.push(p.to_string());
    }
    names.push("libnccl.so.2".to_string());
    for n in cudarc::get_lib_name_candidates("nccl") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

impl NcclLib {
    /// Loads the first candidate that opens and has every entry point.
    pub fn load(names: &[String]) -> Result<Self> {
        let mut tried = Vec::new();
        for name in names {
            // SAFETY: loading NCCL runs its initializers, which have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => match Self::from_library(name, lib) {
                    Ok(l) => return Ok(l),
                    Err(e) => tried.push(format!("{name}: {e}")),
                },
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(TrainError::Config(
            format!(
                "distributed.backend nccl: libnccl cannot be loaded (install NCCL 2, add its \
             directory to LD_LIBRARY_PATH, or set {} to its path); tried {}",
                env::FERROTRAIN_NCCL_LIBRARY,
                tried.join("; ")
            )
            .into(),
        ))
    }

    fn from_library(name: &str, lib: libloading::Library) -> std::result::Result<Self, String> {
        /// The symbol, or an error naming it (libloading's says only "dlsym failed").
        unsafe fn sym<T: Copy>(
            lib: &libloading::Library,
            name: &str,
        ) -> std::result::Result<T, String> {
            let c = format!("{name}\0");
            // SAFETY: the caller states the symbol's type.
            unsafe { lib.get::<T>(c.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| format!("no {name} ({e})"))
        }
        // SAFETY: the symbol types are NCCL 2's C signatures (as in cudarc's bindings); the
        // pointers stay valid while `_lib` is alive, which is as long as `self`.
        unsafe {
            Ok(NcclLib {
                name: name.to_string(),
                get_version: sym(&lib, "ncclGetVersion")?,
                get_unique_id: sym(&lib, "ncclGetUniqueId")?,
                comm_init_rank: sym(&lib, "ncclCommInitRank")?,
                all_reduce: sym(&lib, "ncclAllReduce")?,
                broadcast: sym(&lib, "ncclBroadcast")?,
                comm_init_rank_config: sym(&lib, "ncclCommInitRankConfig").ok(),
                comm_get_async_error: sym(&lib, "ncclCommGetAsyncError")?,
                comm_abort: sym(&lib, "ncclCommAbort")?,
                get_error_string: sym(&lib, "ncclGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// NCCL's version as "2.27.3".
    pub fn version(&self) -> Option<String> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { (self.get_version)(&mut v) };
        (r == SUCCESS).then(|| version_string(v))
    }
}

/// NCCL >= 2.9 encodes its version as major*10000 + minor*100 + patch.
pub fn version_string(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100)
}

/// The process's NCCL, loaded once.
pub fn nccl() -> Result<&'static NcclLib> {
    static LIB: OnceLock<std::result::Result<NcclLib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let over = std::env::var(env::FERROTRAIN_NCCL_LIBRARY).ok();
        NcclLib::load(&candidates(over.as_deref())).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| TrainError::Config(e.clone().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nccl2_soname_comes_first_after_the_override() {
        let names = candidates(None);
        assert_eq!(names[0], "libnccl.so.2");
        assert!(names.contains(&"libnccl.so".to_string()));
        assert_eq!(
            names.iter().filter(|n| *n == "libnccl.so.2").count(),
            1,
            "{names:?}"
        );
        let names = candidates(Some("/opt/nccl/lib/libnccl.so.2"));
        assert_eq!(names[0], "/opt/nccl/lib/libnccl.so.2");
        assert_eq!(names[1], "libnccl.so.2");
        assert_eq!(candidates(Some("  ")), candidates(None));
    }

    #[test]
    fn a_missing_library_is_a_config_error_naming_what_was_tried() {
        let err = NcclLib::load(&["/nonexistent/libnccl.so.2".to_string()])
            .err()
            .unwrap();
        assert!(matches!(err, TrainError::Config(_)), "{err}");
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libnccl.so.2"), "{text}");
        assert!(text.contains(env::FERROTRAIN_NCCL_LIBRARY), "{text}");
    }

    #[test]
    fn a_library_without_nccl_symbols_is_skipped() {
        // libc opens but has no ncclGetVersion: the loader must go on, not accept it.
        let err = NcclLib::load(&["libc.so.6".to_string()]).err().unwrap();
        assert!(err.to_string().contains("ncclGetVersion"), "{err}");
    }

    #[test]
    fn result_codes_are_named_by_value_even_unknown_ones() {
        assert_eq!(code_name(SUCCESS), "ncclSuccess");
        assert_eq!(code_name(IN_PROGRESS), "ncclInProgress");
        assert_eq!(code_name(6), "ncclRemoteError");
        assert_eq!(code_name(42), "ncclResult 42");
        assert!(code_hint(2).contains("ferrotrain doctor"));
        assert!(code_hint(6).contains("peer rank"));
        assert_eq!(code_hint(42), "");
    }

    #[test]
    fn the_non_blocking_config_is_nccl_2_14s_initializer() {
        let c = NonBlockingConfig::default();
        // size_t, 2 x unsigned, 4 x int, a pointer: 40 bytes on 64-bit Linux.
        assert_eq!((c.size, c.magic, c.version), (40, 0xcafe_beef, 21400));
        assert_eq!((c.blocking, c.cga_cluster_size), (0, c_int::MIN));
        assert!(c.net_name.is_null());
    }

    #[test]
    fn versions_read_like_nccl_prints_them() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(21903), "2.19.3");
    }
}
