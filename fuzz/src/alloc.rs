//! An allocator that remembers the largest single allocation: a test binary of a parser
//! installs it (`#[global_allocator]`) to check that no input makes the parser reserve more
//! than its declared limit (a length field of 2^32 must be refused, not allocated).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
pub struct CountingAlloc;

// SAFETY: every call is forwarded to `System` unchanged; only a counter is updated.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Starts a measurement (process-wide: measure in a test that runs alone in its process, as
/// under nextest).
pub fn reset_largest_allocation() {
    LARGEST.store(0, Ordering::Relaxed);
}

/// The largest single allocation since [`reset_largest_allocation`]; 0 when the binary does
/// not use [`CountingAlloc`].
pub fn largest_allocation_since() -> usize {
    LARGEST.load(Ordering::Relaxed)
}
