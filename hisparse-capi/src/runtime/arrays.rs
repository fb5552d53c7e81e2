//! The runtime's device arrays an engine's own kernels read: the step's slot mapping, the
//! per-request block table of every GPU group (and the host table), the batch table. Each is
//! int32 `[rows][cols]`, row-major and contiguous, at an address fixed for the runtime's life (a
//! graph may capture kernels that read it), rewritten in stream order by the calls that own it.

use hisparse_core::Device;
use hisparse_core::layout::GroupKind;
use hisparse_runtime::AnyBuffer;

use super::{HsRuntime, RuntimeState};
use crate::error::{Failure, HsStatus, guard, invalid, output, output_opt, slice_mut};
use crate::exclusive::{answer_entered_array, enter};

/// One of the runtime's device arrays: int32 `[rows][cols]`, row-major and contiguous.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HsDeviceArray {
    /// The address of element `[0][0]`: a device pointer (`CUdeviceptr`, HIP device pointer),
    /// or host memory on the CPU backend. Fixed for the runtime's life.
    pub address: u64,
    /// Rows.
    pub rows: u32,
    /// Elements per row.
    pub cols: u32,
}

/// Which array a call names.
#[derive(Clone, Copy)]
enum Array {
    SlotMapping,
    BlockTable(usize),
    Batch,
}

/// The address of `buf`'s memory, for the backends whose buffers have one an engine's kernels
/// can read.
fn address(buf: &AnyBuffer) -> Result<u64, Failure> {
    match buf {
        #[cfg(feature = "cpu")]
        AnyBuffer::Cpu(b) => Ok(b.address() as u64),
        #[cfg(feature = "cuda")]
        AnyBuffer::Cuda(b) => Ok(b.device_address()),
        #[cfg(feature = "rocm")]
        AnyBuffer::Rocm(b) => Ok(b.device_address()),
        #[allow(unreachable_patterns)]
        _ => Err(crate::error::unsupported(
            "this backend's device buffers have no address an engine's kernels can read; use the cpu, cuda or rocm backend",
        )),
    }
}

impl RuntimeState {
    /// The buffer of `array` and its shape.
    fn array(&self, array: Array) -> Result<(&AnyBuffer, u32, u32), Failure> {
        let rt = &self.rt;
        let kv = rt.layout();
        let state_rows = rt.config().state_rows;
        match array {
            Array::SlotMapping => Ok((
                rt.slot_mapping(),
                rt.slot_mapping_groups().len() as u32,
                rt.config().max_batched_tokens,
            )),
            Array::Batch => Ok((rt.batch_buffer(), 1, rt.config().max_step_tokens)),
            Array::BlockTable(group) => {
                let kind = kv.groups.get(group).map(|g| g.kind);
                let bucket = kv.groups.get(group).and_then(|g| g.bucket);
                let table = match (kind, bucket) {
                    (Some(GroupKind::Source), _) => Some(rt.host_table()),
                    (Some(GroupKind::Indexer), _) => Some(rt.indexer_table()),
                    (Some(GroupKind::Resident), Some(b)) => rt.resident_table(b),
                    (Some(GroupKind::Hot), Some(b)) => rt.hot_table(b),
                    (Some(GroupKind::Regular), _) => rt.regular_table(group),
                    _ => None,
                };
                let table = table.ok_or_else(|| {
                    invalid(format!(
                        "layout group {group} has no per-request table ({} groups; see hs_layout_group)",
                        kv.groups.len()
                    ))
                })?;
                let cols = match kind {
                    Some(GroupKind::Hot) => kv.hot_blocks_per_request,
                    _ => kv.table_width(group),
                };
                Ok((table, state_rows, cols))
            }
        }
    }

    /// `array` as an `HsDeviceArray`.
    fn describe(&self, array: Array) -> Result<HsDeviceArray, Failure> {
        let (buf, rows, cols) = self.array(array)?;
        Ok(HsDeviceArray {
            address: address(buf)?,
            rows,
            cols,
        })
    }

    /// Copies the first `out.len()` elements of `array` to `out`, after the runtime's compute
    /// stream finished what it enqueued.
    fn read(&self, array: Array, out: &mut [i32]) -> Result<(), Failure> {
        let (buf, rows, cols) = self.array(array)?;
        let len = rows as usize * cols as usize;
        if out.len() > len {
            return Err(invalid(format!(
                "`len` = {} but the array holds {len} elements ({rows} × {cols}); read at most that many",
                out.len()
            )));
        }
        let dev = self.rt.device();
        dev.synchronize(self.rt.compute_stream())?;
        Ok(dev.download_i32(buf, 0, out)?)
    }
}

/// The step's slot mapping on the device: int32 `[write groups][max_batched_tokens]`; for each
/// write group (`hs_runtime_slot_mapping_groups`, in layout order: the indexer group, every
/// resident bucket, every regular group) and each token the step computes — the command's
/// scheduled requests in order, each request's tokens in order — the row the token writes in the
/// group's view (`hs_layout_layer_view`), -1 for a token that writes no row of the group (a
/// compressed group between its rows) and beyond the step's tokens (`*step_tokens`, if not
/// NULL). Rewritten by every `hs_runtime_begin_step`, on its stream.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for an `HsDeviceArray`;
/// `step_tokens` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_slot_mapping(
    runtime: *const HsRuntime,
    out: *mut HsDeviceArray,
    step_tokens: *mut u32,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out, step_tokens) = unsafe {
            (
                enter(runtime, "runtime")?,
                output(out, "out")?,
                output_opt(step_tokens),
            )
        };
        out.set(r.describe(Array::SlotMapping)?);
        if let Some(t) = step_tokens {
            t.set(r.rt.step_tokens());
        }
        Ok(())
    })
}

/// The layout group of each row of the slot mapping, into `out` (`capacity` elements; `*count`
/// receives how many rows there are). NULL `out` with `capacity` 0 asks only for the count; a
/// smaller array gets `HS_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
///
/// `runtime` is a live handle; `out` is NULL or points to `capacity` writable values; `count`
/// points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_slot_mapping_groups(
    runtime: *const HsRuntime,
    out: *mut usize,
    capacity: usize,
    count: *mut usize,
) -> HsStatus {
    // SAFETY: forwarded contract.
    unsafe {
        answer_entered_array(runtime, "runtime", out, capacity, count, |r| {
            r.rt.slot_mapping_groups()
        })
    }
}

/// The per-request table of layout group `group` on the device: int32
/// `[state_rows][cols]`, state row → its blocks. For the source group, the host table (page →
/// host block, -1 for none); for the indexer, resident and regular groups, their block tables
/// (column → GPU block, 0 for none: for a resident group, "read from host"); for a hot group,
/// the `hot_blocks_per_request` GPU blocks of each request's hot region (-1 for none). Updated
/// by every `hs_runtime_begin_step`, on its stream.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for an `HsDeviceArray`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_block_table(
    runtime: *const HsRuntime,
    group: usize,
    out: *mut HsDeviceArray,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        out.set(r.describe(Array::BlockTable(group))?);
        Ok(())
    })
}

/// The batch table `hs_runtime_set_batch` writes: int32 `[1][max_step_tokens]`, token row →
/// state row, -1 for padding; what per-layer calls without their own state rows (and the graphs
/// that captured them) read.
///
/// # Safety
///
/// `runtime` is a live handle; `out` points to writable memory for an `HsDeviceArray`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_batch_table(
    runtime: *const HsRuntime,
    out: *mut HsDeviceArray,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, output(out, "out")?) };
        out.set(r.describe(Array::Batch)?);
        Ok(())
    })
}

/// Copies the first `len` elements of the slot mapping (row-major) to `out`, once the runtime's
/// compute stream finished what it enqueued: a host copy for debugging and for backends whose
/// device memory the caller cannot read.
///
/// # Safety
///
/// `runtime` is a live handle used by no other thread meanwhile; `out` points to `len`
/// writable `int32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_slot_mapping(
    runtime: *const HsRuntime,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        r.read(Array::SlotMapping, out)
    })
}

/// Copies the first `len` elements of layout group `group`'s table (row-major) to `out`, as
/// `hs_runtime_read_slot_mapping`.
///
/// # Safety
///
/// As `hs_runtime_read_slot_mapping`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_runtime_read_block_table(
    runtime: *const HsRuntime,
    group: usize,
    out: *mut i32,
    len: usize,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (r, out) = unsafe { (enter(runtime, "runtime")?, slice_mut(out, len, "out")?) };
        r.read(Array::BlockTable(group), out)
    })
}
