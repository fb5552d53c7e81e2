//! Pointer and stream queries: checking memory and streams an engine lends.

use cudarc::driver::sys::{self, CUresult};

use super::{Result, check};
use crate::error::CudaError;

/// What the driver knows about an address (`cuPointerGetAttribute`), for memory an engine lends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PointerInfo {
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` as its raw value (`CU_MEMORYTYPE_*`), or `None` when the
    /// driver does not know the address (pageable host memory, or no memory at all).
    pub memory_type: Option<u32>,
    /// The context the memory was allocated in (null for allocations not tied to one, such as
    /// virtual-memory-management mappings).
    pub context: sys::CUcontext,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, when the driver answers it.
    pub device_ordinal: Option<i32>,
    /// `(start, size)` of the allocation holding the address, when the driver answers it.
    pub range: Option<(u64, u64)>,
}

/// `CU_MEMORYTYPE_HOST` as the raw value [`PointerInfo::memory_type`] holds.
pub(crate) const MEMORY_TYPE_HOST: u32 = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
/// `CU_MEMORYTYPE_DEVICE` as the raw value [`PointerInfo::memory_type`] holds.
pub(crate) const MEMORY_TYPE_DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;

/// One pointer attribute into `T` (a plain integer or handle the attribute's docs name), or the
/// driver's result code.
fn pointer_attribute<T: Copy>(
    attr: sys::CUpointer_attribute,
    ptr: u64,
    init: T,
) -> std::result::Result<T, CUresult> {
    let mut v = init;
    // SAFETY: `v` is a live, writable `T`, the type the driver writes for `attr` (each call site
    // pairs the attribute with its documented type); the driver only looks `ptr` up.
    let code = unsafe { sys::cuPointerGetAttribute((&raw mut v).cast(), attr, ptr) };
    if code == CUresult::CUDA_SUCCESS {
        Ok(v)
    } else {
        Err(code)
    }
}

/// What the driver knows about `ptr`. Needs a current context.
pub(crate) fn pointer_info(ptr: u64) -> Result<PointerInfo> {
    use sys::CUpointer_attribute as A;
    let memory_type = match pointer_attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr, 0u32) {
        Ok(t) => Some(t),
        // The documented answer for an address the driver has not seen.
        Err(CUresult::CUDA_ERROR_INVALID_VALUE) => None,
        Err(code) => return Err(CudaError::driver("cuPointerGetAttribute", code)),
    };
    if memory_type.is_none() {
        return Ok(PointerInfo {
            memory_type,
            context: std::ptr::null_mut(),
            device_ordinal: None,
            range: None,
        });
    }
    let context = pointer_attribute(A::CU_POINTER_ATTRIBUTE_CONTEXT, ptr, std::ptr::null_mut())
        .unwrap_or(std::ptr::null_mut());
    let device_ordinal = pointer_attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr, 0i32).ok();
    let start = pointer_attribute(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr, 0u64).ok();
    let size = pointer_attribute(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr, 0usize).ok();
    Ok(PointerInfo {
        memory_type,
        context,
        device_ordinal,
        range: start.zip(size).map(|(s, n)| (s, n as u64)),
    })
}

/// `(start, size)` of the device allocation holding `ptr` (`cuMemGetAddressRange`).
pub(crate) fn address_range(ptr: u64) -> Result<(u64, u64)> {
    let (mut start, mut size) = (0u64, 0usize);
    // SAFETY: both are out-pointers; the driver only looks `ptr` up.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut start, &mut size, ptr)
    })?;
    Ok((start, size as u64))
}

/// The context a stream belongs to (`cuStreamGetCtx`).
///
/// # Safety
///
/// `raw` is a live stream handle, the null (default) stream, `CU_STREAM_LEGACY` or
/// `CU_STREAM_PER_THREAD`: the driver dereferences other handles.
pub(crate) unsafe fn stream_context(raw: sys::CUstream) -> Result<sys::CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `ctx` is an out-pointer and `raw` a stream handle the driver accepts (the caller's
    // contract); a destroyed context is reported as a result code.
    check("cuStreamGetCtx", unsafe {
        sys::cuStreamGetCtx(raw, &mut ctx)
    })?;
    Ok(ctx)
}
