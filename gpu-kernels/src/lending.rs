//! Argument checks for memory an engine lends to a backend (a PyTorch tensor's device storage,
//! its pinned host memory), shared by the CUDA and ROCm backends' `wrap_*` entry points. They
//! need no driver: each says, in a sentence ending with what to pass instead, why a pointer and
//! length cannot be used, before the backend asks its driver what it knows about the address.

use hisparse_core::ops::PINNED_ALIGNMENT;

/// Alignment every lent device range must have: the kernels read 16 bytes at a time from the
/// start of a buffer (`cuMemAlloc` and `hipMalloc` align to 256).
pub const DEVICE_ALIGNMENT: u64 = 16;

/// Checks a lent device range: non-null, non-empty, aligned to [`DEVICE_ALIGNMENT`], and not
/// running past the end of the address space.
pub fn check_device_range(ptr: u64, len: usize) -> Result<(), String> {
    if ptr == 0 {
        return Err("the pointer is null".into());
    }
    if len == 0 {
        return Err(format!(
            "the range at {ptr:#x} is empty: pass the allocation's length in bytes"
        ));
    }
    if !ptr.is_multiple_of(DEVICE_ALIGNMENT) {
        return Err(format!(
            "{ptr:#x} is not aligned to {DEVICE_ALIGNMENT} bytes: pass the start of an \
             allocation, or an offset into it that is a multiple of {DEVICE_ALIGNMENT}"
        ));
    }
    if ptr.checked_add(len as u64).is_none() {
        return Err(format!(
            "{len} bytes at {ptr:#x} run past the end of the address space"
        ));
    }
    Ok(())
}

/// Checks a lent host range: non-null, non-empty, aligned to [`PINNED_ALIGNMENT`] (a page, as
/// every pinned buffer of the backends), and not running past the end of the address space.
pub fn check_host_range(ptr: usize, len: usize) -> Result<(), String> {
    if ptr == 0 {
        return Err("the pointer is null".into());
    }
    if len == 0 {
        return Err(format!(
            "the range at {ptr:#x} is empty: pass the allocation's length in bytes"
        ));
    }
    if !ptr.is_multiple_of(PINNED_ALIGNMENT) {
        return Err(format!(
            "{ptr:#x} is not aligned to {PINNED_ALIGNMENT} bytes (a page): pinned pools must \
             start on a page; allocate the pool page-aligned or lend it from its first page"
        ));
    }
    if ptr.checked_add(len).is_none() {
        return Err(format!(
            "{len} bytes at {ptr:#x} run past the end of the address space"
        ));
    }
    Ok(())
}

/// Checks that `[ptr, ptr + len)` lies inside the allocation `[start, start + size)` the driver
/// reports for `ptr`.
pub fn check_inside(ptr: u64, len: usize, start: u64, size: u64) -> Result<(), String> {
    let end = ptr.checked_add(len as u64);
    let alloc_end = start.saturating_add(size);
    if ptr < start || end.is_none_or(|e| e > alloc_end) {
        return Err(format!(
            "{len} bytes at {ptr:#x} do not lie inside one allocation (the allocation holding \
             {ptr:#x} spans {start:#x}..{alloc_end:#x}, {size} bytes): pass a length that ends \
             inside it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ranges() {
        assert!(check_device_range(0x7f00_0000_0000, 4096).is_ok());
        assert!(check_device_range(0, 16).unwrap_err().contains("null"));
        assert!(check_device_range(0x1000, 0).unwrap_err().contains("empty"));
        assert!(
            check_device_range(0x1004, 16)
                .unwrap_err()
                .contains("aligned to 16")
        );
        assert!(
            check_device_range(u64::MAX - 15, 32)
                .unwrap_err()
                .contains("end of the address")
        );
    }

    #[test]
    fn host_ranges_are_page_aligned_and_non_empty() {
        assert!(check_host_range(0x10_0000, 1).is_ok());
        assert!(check_host_range(0, 4096).unwrap_err().contains("null"));
        assert!(
            check_host_range(0x10_0000, 0)
                .unwrap_err()
                .contains("empty")
        );
        let m = check_host_range(0x10_0010, 4096).unwrap_err();
        assert!(m.contains("not aligned to 4096"), "{m}");
        assert!(
            check_host_range(usize::MAX - 4095, 8192)
                .unwrap_err()
                .contains("end of the address")
        );
    }

    #[test]
    fn a_range_lies_inside_its_allocation() {
        assert!(check_inside(0x1000, 0x1000, 0x1000, 0x1000).is_ok());
        assert!(check_inside(0x1800, 0x800, 0x1000, 0x1000).is_ok());
        let m = check_inside(0x1800, 0x801, 0x1000, 0x1000).unwrap_err();
        assert!(m.contains("do not lie inside one allocation"), "{m}");
        assert!(check_inside(0xff0, 16, 0x1000, 0x1000).is_err());
        assert!(check_inside(u64::MAX - 8, 16, u64::MAX - 8, 8).is_err());
    }
}
