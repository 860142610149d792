//! The process's memory allocator: jemalloc, for Rust and for libtorch alike.
//!
//! libtorch allocates and frees the same activations every training step, and evaluation
//! (beam search, varying shapes) frees thousands of small tensors in between. glibc's
//! allocator, kept from returning memory to the kernel, fragmented its heap over a run: the
//! resident size kept growing (1.3 → 2.4 GB over 400 steps with evaluations) and the steps
//! slowed with it. jemalloc's size classes keep freed blocks reusable. Two runs side by side
//! on one core each, from the same checkpoint over the same batches (so the VM's speed drift
//! hit both): 4.5-11% faster steps, and the resident size flat at 1.6 GB
//! (docs/performance.md, "Allocator").
//!
//! jemalloc is built with unprefixed symbols, so `malloc`, `free` and `posix_memalign`
//! resolve to it for libtorch and every other C library in the process, not only for Rust
//! (ELF symbol interposition: the executable's definitions come first).
//!
//! Freed memory is kept (`dirty_decay_ms:-1`): with jemalloc's default of returning pages
//! after 10 s, every step page-faulted its activations in again (a quarter of the CPU time
//! in the kernel). The resident size is therefore the run's peak, which a pod's memory limit
//! has to allow anyway. `MALLOC_CONF` in the environment overrides this.

#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// What `malloc_conf` holds: a C string pointer jemalloc reads before `main`.
#[cfg(target_os = "linux")]
#[repr(transparent)]
pub struct Conf(*const libc::c_char);

// SAFETY: a pointer to a static, never written, string.
#[cfg(target_os = "linux")]
unsafe impl Sync for Conf {}

/// jemalloc's compiled-in options (it reads this symbol, then `MALLOC_CONF`).
#[cfg(target_os = "linux")]
#[allow(non_upper_case_globals)]
#[unsafe(no_mangle)]
pub static malloc_conf: Conf = Conf(c"dirty_decay_ms:-1,muzzy_decay_ms:-1".as_ptr());

/// The allocator that C code in this process gets from `malloc` (libtorch's tensors):
/// "jemalloc" when the interposition took, else "system" (always so off Linux).
#[cfg(target_os = "linux")]
pub fn c_malloc() -> &'static str {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let jemalloc = tikv_jemalloc_sys::malloc as *const libc::c_void;
    if std::ptr::eq(found.cast_const(), jemalloc) {
        "jemalloc"
    } else {
        "system"
    }
}

/// The allocator that C code in this process gets from `malloc`.
#[cfg(not(target_os = "linux"))]
pub fn c_malloc() -> &'static str {
    "system"
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// jemalloc's value of option `name` (e.g. "opt.dirty_decay_ms"), an `isize` option.
    fn option_isize(name: &std::ffi::CStr) -> Option<isize> {
        let mut value: isize = 0;
        let mut len = std::mem::size_of::<isize>();
        // SAFETY: mallctl reads an option of the size given into `value`.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&raw mut value).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(value)
    }

    #[test]
    fn c_code_and_libtorch_allocate_from_jemalloc() {
        assert_eq!(c_malloc(), "jemalloc");
        // A tensor's storage comes from posix_memalign: it must be jemalloc's to free.
        let t = tch::Tensor::ones([1 << 20], (tch::Kind::Float, tch::Device::Cpu));
        assert_eq!(t.sum(tch::Kind::Float).double_value(&[]), (1 << 20) as f64);
    }

    #[test]
    fn freed_memory_is_kept_unless_the_environment_says_otherwise() {
        if std::env::var_os("MALLOC_CONF").is_some() {
            return;
        }
        assert_eq!(option_isize(c"opt.dirty_decay_ms"), Some(-1));
        assert_eq!(option_isize(c"opt.muzzy_decay_ms"), Some(-1));
    }
}
