//! Device buffers for the per-layer calls (`HsBuffer`: allocated, or the engine's memory
//! lent) and synchronous access to the runtime's pools and tables (a forward pass writing KV
//! rows into pools the runtime owns; debugging).

use std::ffi::c_void;

use hisparse_core::Device;
use hisparse_runtime::AnyBuffer;

use super::HsRuntime;
use crate::error::{
    Failure, HsStatus, deref, deref_mut, free_handle, guard, handle, invalid, output, slice,
    slice_mut,
};
use crate::exclusive::enter;

/// A device buffer of a runtime's device (opaque): top-k inputs, row-index outputs, counts.
/// Free with `hs_buffer_free`.
pub struct HsBuffer {
    pub(crate) buf: AnyBuffer,
}

/// Copies the resident table row of `state_row` in `bucket` (page → GPU block, 0 = read from
/// host) into `out`: the first `min(len, max_pages_per_request)` entries.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable `int32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_resident_row(
    runtime: *const HsRuntime,
    bucket: u32,
    state_row: u32,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        let row = r.rt.resident_row(bucket, state_row).ok_or_else(|| {
            invalid(format!(
                "bucket {bucket} or state row {state_row} is outside the runtime ({} buckets, {} state rows)",
                r.rt.layout().num_buckets,
                r.rt.config().state_rows
            ))
        })?;
        let n = out.len().min(row.len());
        out[..n].copy_from_slice(&row[..n]);
        Ok(())
    })
}

/// Writes `len` bytes into the device pool at byte `offset`, synchronously (an engine's
/// forward pass writing KV rows into a pool the runtime owns).
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `data` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_write_device_pool(
    runtime: *mut HsRuntime,
    offset: usize,
    data: *const u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (mut r, data) = unsafe { (enter(runtime, "runtime")?, slice(data, len, "data")?) };
        let (dev, pools) = r.rt.device_and_pools_mut();
        Ok(dev.upload(&mut pools.device, offset, data)?)
    })
}

/// Reads `len` bytes of the device pool from byte `offset` into `out`, synchronously.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_device_pool(
    runtime: *const HsRuntime,
    offset: usize,
    out: *mut u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        Ok(r.rt.device().download(&r.rt.pools().device, offset, out)?)
    })
}

/// Reads `len` bytes of the host pool from byte `offset` into `out` (call `hs_runtime_drain`
/// first for rows still being copied).
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_host_pool(
    runtime: *const HsRuntime,
    offset: usize,
    out: *mut u8,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        Ok(r.rt.device().read_pinned(&r.rt.pools().host, offset, out)?)
    })
}

/// A zeroed device buffer of `bytes` bytes on the runtime's device; `*out` receives it.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_alloc(
    runtime: *const HsRuntime,
    bytes: usize,
    out: *mut *mut HsBuffer,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        let buf = r.rt.device().alloc(bytes)?;
        out.set(handle(HsBuffer { buf }));
        Ok(())
    })
}

/// The engine's device memory (`bytes` at device pointer `ptr`; host memory on the CPU
/// backend) as a buffer of the runtime's device, without owning it; `*out` receives it.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for a pointer; the memory
/// meets the backend's lending contract: it stays allocated until the buffer is freed and the
/// work enqueued with it completed, and nothing else touches it unordered meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_lend(
    runtime: *const HsRuntime,
    ptr: *mut c_void,
    bytes: usize,
    out: *mut *mut HsBuffer,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        // SAFETY: forwarded contract.
        let buf = unsafe { r.rt.device().lend_device_memory(ptr as usize as u64, bytes) }?;
        out.set(handle(HsBuffer { buf }));
        Ok(())
    })
}

/// Frees a buffer (NULL is ignored); lent memory is left to its owner.
///
/// # Safety
///
/// `buffer` is NULL or a handle from `hs_buffer_alloc` / `hs_buffer_lend` not freed yet, with
/// no work using it still in flight.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_free(buffer: *mut HsBuffer) {
    // SAFETY: forwarded contract.
    unsafe { free_handle(buffer) }
}

/// The byte offset of int32 element `offset`.
fn i32_offset(offset: usize) -> Result<usize, Failure> {
    offset
        .checked_mul(4)
        .ok_or_else(|| invalid("offset overflows"))
}

/// Writes `len` int32 values into `buffer` from element `offset` on, synchronously.
///
/// # Safety
///
/// `runtime` and `buffer` are live handles (the buffer of the runtime's device); `values`
/// holds `len` values.
// Accepted twin of the typed uploads and downloads below (CONTRIBUTING.md, "One rule, one place"): C entry points
// of one signature shape, each body one call into a shared helper.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_upload_i32(
    runtime: *const HsRuntime,
    buffer: *mut HsBuffer,
    offset: usize,
    values: *const i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, b, v) = unsafe {
            (
                enter(runtime, "runtime")?,
                deref_mut(buffer, "buffer")?,
                slice(values, len, "values")?,
            )
        };
        Ok(r.rt
            .device()
            .upload_i32(&mut b.buf, i32_offset(offset)?, v)?)
    })
}

/// Reads `len` int32 values of `buffer` from element `offset` on into `out`, synchronously.
///
/// # Safety
///
/// `runtime` and `buffer` are live handles; `out` points to `len` writable values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_buffer_download_i32(
    runtime: *const HsRuntime,
    buffer: *const HsBuffer,
    offset: usize,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, b, out) = unsafe {
            (
                enter(runtime, "runtime")?,
                deref(buffer, "buffer")?,
                slice_mut(out, len, "out")?,
            )
        };
        Ok(r.rt
            .device()
            .download_i32(&b.buf, i32_offset(offset)?, out)?)
    })
}
