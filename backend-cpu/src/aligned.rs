//! Zeroed, page-aligned heap allocations, and cache prefetch hints over them: the only `unsafe`
//! code of this crate.
//!
//! [`AlignedBytes`] owns `len` zeroed bytes at an address aligned to
//! [`hisparse_core::ops::PINNED_ALIGNMENT`]. It behaves like a `Box<[u8]>` with a stronger
//! alignment: unique ownership, freed on drop, safe slice views. Buffers of 2 MiB and more are
//! 2 MiB aligned and advised to use transparent huge pages on Linux (`madvise`).

use core::ptr::NonNull;
use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};

use hisparse_core::ops::PINNED_ALIGNMENT;

/// Size of a transparent huge page (x86-64 and most aarch64 Linux kernels).
const HUGE_PAGE: usize = 2 << 20;

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// `madvise(2)` from the C library the standard library already links.
    fn madvise(
        addr: *mut core::ffi::c_void,
        len: usize,
        advice: core::ffi::c_int,
    ) -> core::ffi::c_int;
}

/// Asks the kernel to back `[ptr, ptr + len)` with transparent huge pages. Purely advisory: a
/// refusal (THP disabled, another kernel) changes nothing but speed, so the result is ignored.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: NonNull<u8>, len: usize) {
    const MADV_HUGEPAGE: core::ffi::c_int = 14;
    // SAFETY: `[ptr, ptr + len)` lies inside one live allocation of ours whose start is 2 MiB
    // aligned (a multiple of the page size, as `madvise` requires). MADV_HUGEPAGE only changes
    // how the kernel backs the range, never its contents or validity.
    let _ = unsafe { madvise(ptr.as_ptr().cast(), len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: NonNull<u8>, _len: usize) {}

/// `len` zeroed bytes aligned to [`PINNED_ALIGNMENT`] (to 2 MiB from 2 MiB on).
pub(crate) struct AlignedBytes {
    /// Start of the allocation (never dangling: at least one byte is always allocated).
    ptr: NonNull<u8>,
    /// Bytes visible through the slice views.
    len: usize,
    /// The layout the memory was allocated with (size `max(len, 1)`).
    layout: Layout,
}

// SAFETY: `AlignedBytes` uniquely owns its allocation (like `Box<[u8]>`); no other handle to the
// memory exists, so moving it to another thread is sound.
unsafe impl Send for AlignedBytes {}
// SAFETY: shared access only yields `&[u8]` (immutable views); mutation needs `&mut self`.
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    /// Allocates `len` zeroed bytes, or `None` when the size cannot be laid out (above
    /// `isize::MAX`) or the allocator refuses.
    pub(crate) fn zeroed(len: usize) -> Option<Self> {
        if len < HUGE_PAGE {
            // Allocate at least one byte so the pointer is always a real, aligned allocation.
            let layout = Layout::from_size_align(len.max(1), PINNED_ALIGNMENT).ok()?;
            // SAFETY: `layout` has a non-zero size (at least 1) and a valid power-of-two
            // alignment, which is all `alloc_zeroed` requires. A null result is handled below.
            let raw = unsafe { alloc_zeroed(layout) };
            let ptr = NonNull::new(raw)?;
            return Some(AlignedBytes { ptr, len, layout });
        }
        // Large buffers (host pools) are aligned to a huge page, advised to use huge pages
        // *before* their first touch, then zeroed: random row gathers over a large pool are
        // otherwise dominated by TLB misses.
        let layout = Layout::from_size_align(len, HUGE_PAGE).ok()?;
        // SAFETY: `layout` has a non-zero size (`len >= HUGE_PAGE`) and a valid power-of-two
        // alignment, which is all `alloc` requires. A null result is handled below.
        let raw = unsafe { alloc(layout) };
        let ptr = NonNull::new(raw)?;
        advise_huge_pages(ptr, len);
        // SAFETY: `ptr` is valid for writes of `len` bytes (just allocated with a layout of that
        // size, exclusively ours); writing zeros initialises every byte the slice views expose.
        unsafe { core::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Some(AlignedBytes { ptr, len, layout })
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to an allocation of `layout.size() >= len` bytes that this value
        // owns; all of it was zero-initialised by `alloc_zeroed`, so `len` bytes are initialised.
        // The returned borrow is tied to `&self`, so the memory outlives it and no `&mut` view
        // can coexist with it.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees this is the only view of the memory
        // for the lifetime of the returned borrow.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Address of the first byte.
    pub(crate) fn address(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed(self.layout)` and is freed exactly once,
        // here, with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Hints the CPU to bring every cache line of `bytes` into the cache for reading. A hint only:
/// no effect on memory contents, never a fault; a no-op off x86-64.
#[inline(always)]
pub(crate) fn prefetch_read(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..bytes.len()).step_by(64) {
        // SAFETY: `at < bytes.len()`, so the pointer stays inside `bytes`. `_mm_prefetch` needs
        // SSE, which every x86-64 CPU has; a prefetch never faults and never changes memory.
        unsafe {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(at).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Hints the CPU to bring every cache line of `bytes` into the cache for writing
/// (`prefetchw`; CPUs without it treat it as a no-op). A hint only, as [`prefetch_read`].
#[inline(always)]
pub(crate) fn prefetch_write(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..bytes.len()).step_by(64) {
        // SAFETY: as in `prefetch_read`: in bounds, baseline SSE, a hint that never faults.
        unsafe {
            use core::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_ET0>(bytes.as_ptr().add(at).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_writable() {
        for len in [0, 1, 7, 4096, 4097, 1 << 20, 2 << 20, (5 << 20) + 3] {
            let mut b = AlignedBytes::zeroed(len).unwrap();
            assert_eq!(b.address() % PINNED_ALIGNMENT, 0, "len {len}");
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(0xA5);
            assert!(b.as_slice().iter().all(|&x| x == 0xA5));
        }
    }

    #[test]
    fn prefetch_hints_change_nothing() {
        let mut b = AlignedBytes::zeroed(1000).unwrap();
        b.as_mut_slice()[999] = 7;
        prefetch_read(b.as_slice());
        prefetch_write(&b.as_slice()[1..]);
        prefetch_read(&[]);
        assert_eq!(b.as_slice()[999], 7);
        assert!(b.as_slice()[..999].iter().all(|&x| x == 0));
    }

    #[test]
    fn impossible_size_is_refused() {
        assert!(AlignedBytes::zeroed(usize::MAX).is_none());
        assert!(AlignedBytes::zeroed(isize::MAX as usize).is_none());
    }
}
