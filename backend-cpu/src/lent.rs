//! Memory a [`crate::CpuBuffer`] views without allocating it — an engine's (a numpy array's data,
//! a tensor's storage), a shared-memory segment, or the host pool's region — the second and last
//! module of this crate with `unsafe` code.
//!
//! [`LentBytes`] is a pointer and a length the caller vouches for (see
//! [`crate::CpuBuffer::from_raw_parts`]). It never frees the memory. Its views follow the same
//! borrowing rules as [`crate::CpuBuffer`]'s own memory: shared views through `&self`, one
//! mutable view through `&mut self`.

use core::ptr::NonNull;

/// Alignment every lent range must have: the backend views buffers as `i32` and `u16` tables,
/// and the GPU backends ask the same of device memory.
pub(crate) const LENT_ALIGNMENT: usize = 16;

/// Why a lent range is refused.
pub(crate) fn check_lent(ptr: *mut u8, len: usize) -> Result<NonNull<u8>, String> {
    let Some(start) = NonNull::new(ptr) else {
        return Err("the pointer is null: pass the address of live memory".into());
    };
    if len == 0 {
        return Err("the length is 0: lend at least one byte".into());
    }
    let addr = ptr as usize;
    if !addr.is_multiple_of(LENT_ALIGNMENT) {
        return Err(format!(
            "{addr:#x} is not a multiple of {LENT_ALIGNMENT} bytes: lend {LENT_ALIGNMENT}-byte aligned memory"
        ));
    }
    if addr.checked_add(len).is_none() || len > isize::MAX as usize {
        return Err(format!(
            "{len} bytes at {addr:#x} run past the end of the address space"
        ));
    }
    Ok(start)
}

/// The mapping of a shared-memory segment as a lent range. The caller stores `segment` beside
/// the result, so the mapping outlives every view of it.
pub(crate) fn of_segment(
    segment: &hisparse_host_memory::SharedSegment,
) -> Result<LentBytes, String> {
    let start = check_lent(segment.addr().as_ptr(), segment.len())?;
    // SAFETY: the range passed `check_lent` and is the segment's live, zero-initialised,
    // read-write mapping, kept alive by the buffer that stores the segment beside these bytes.
    // Other processes write it too; the host pool's protocol (one writer per page, readers only
    // after the writer's completion reached them through a synchronisation point) keeps every
    // view this crate hands out, which lasts one call, free of concurrent writes to its bytes.
    Ok(unsafe { LentBytes::new(start, segment.len()) })
}

/// The memory of a host pool region as a range. The caller stores `region` beside the result, so
/// the mapping outlives every view of it.
pub(crate) fn of_region(region: &hisparse_host_memory::HostRegion) -> LentBytes {
    // SAFETY: the region's memory is a private mapping of `len` bytes it reserved and zeroed
    // (page-aligned, so 16-byte aligned; `len <= isize::MAX` as a mapping), that nothing else
    // maps or references, and that lives until the region is dropped — after the buffer that
    // stores it beside these bytes is done with them.
    unsafe { LentBytes::new(region.addr(), region.len()) }
}

/// `len` bytes at `ptr` that someone else allocated and will free.
pub(crate) struct LentBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the lender guarantees (`CpuBuffer::from_raw_parts`) that nothing else reads or writes
// the range while the buffer may be used, so it behaves like uniquely owned memory: moving it to
// another thread is sound.
unsafe impl Send for LentBytes {}
// SAFETY: shared access only yields `&[u8]`; mutation needs `&mut self`, as for `AlignedBytes`.
unsafe impl Sync for LentBytes {}

impl LentBytes {
    /// # Safety
    ///
    /// The contract of [`crate::CpuBuffer::from_raw_parts`]; `ptr` passed [`check_lent`].
    pub(crate) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        LentBytes { ptr, len }
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: the lender guarantees `[ptr, ptr + len)` is initialised, readable memory that
        // outlives this value and that nothing writes while the view lives; `len <= isize::MAX`
        // and the pointer is non-null and aligned (checked by `check_lent`).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the memory is writable; `&mut self` makes this the only
        // view made through this value, and the lender guarantees no other view exists.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Address of the first byte.
    pub(crate) fn address(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ranges_are_refused() {
        let mut v = vec![0u128; 4];
        let p = v.as_mut_ptr().cast::<u8>();
        assert!(check_lent(p, 64).is_ok());
        assert!(
            check_lent(core::ptr::null_mut(), 64)
                .unwrap_err()
                .contains("null")
        );
        assert!(check_lent(p, 0).unwrap_err().contains("length is 0"));
        assert!(
            check_lent(p.wrapping_add(4), 16)
                .unwrap_err()
                .contains("multiple of 16")
        );
        let top = (usize::MAX & !15) as *mut u8;
        assert!(
            check_lent(top, 32)
                .unwrap_err()
                .contains("end of the address space")
        );
    }
}
