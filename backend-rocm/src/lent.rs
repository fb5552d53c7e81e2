//! Engine-owned memory and streams: device allocations, host memory and streams an inference
//! engine already has (a PyTorch tensor's storage, PyTorch's current `hipStream_t`), used as this
//! backend's buffers and streams without taking ownership. The same contract as the CUDA
//! backend's `lend_*` entry points:
//!
//! * the arguments are checked first without a runtime call (`hisparse_gpu_kernels::lending`);
//! * device memory must be known to the runtime as device memory of this device
//!   (`hipPointerGetAttributes`), and `[ptr, ptr + len)` must lie inside one allocation
//!   (`hipMemGetAddressRange`);
//! * host memory is used as it is when it is pinned already (the whole range must be pinned and
//!   mapped linearly), else registered here (`hipHostRegister`, mapped and portable) and
//!   unregistered when the buffer drops;
//! * a stream must belong to this device (`hipStreamGetDevice`); it is never destroyed here.
//!
//! [`RocmDevice::host_buffer_from_shared`] is the safe entry for one kind of host memory: a
//! shared-memory segment (the host pool the ranks of a node share), registered here and kept
//! alive by the buffer.
//!
//! A failed check is a [`RocmError::Lent`] naming the problem. Verified against the HIP test
//! double (`hisparse-hip-double`), not yet on AMD hardware.

use std::ffi::c_void;

use hisparse_gpu_kernels::lending;
use hisparse_host_memory::SharedSegment;

use crate::device::RocmDevice;
use crate::error::RocmError;
use crate::ffi::{
    HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED, MEMORY_TYPE_DEVICE, MEMORY_TYPE_HOST,
    MEMORY_TYPE_UNREGISTERED,
};
use crate::memory::{Pinning, RocmBuffer, RocmHostBuffer, RocmStream};

fn refuse<T>(what: &'static str, problem: String) -> Result<T, RocmError> {
    Err(RocmError::Lent { what, problem })
}

fn check(what: &'static str, checked: Result<(), String>) -> Result<(), RocmError> {
    checked.map_err(|problem| RocmError::Lent { what, problem })
}

impl RocmDevice {
    /// Uses `len` bytes of device memory at `ptr`, allocated by someone else (an engine's
    /// tensor), as a buffer of this device. The buffer never frees the memory.
    ///
    /// Refused with [`RocmError::Lent`] when the pointer is null, the length zero, the pointer
    /// not 16-byte aligned, the runtime does not know it as device memory of this device, or
    /// `[ptr, ptr + len)` does not lie inside one allocation.
    ///
    /// # Safety
    ///
    /// * **Lifetime:** the memory stays allocated for as long as the returned buffer lives *and*
    ///   until every operation enqueued with it has completed.
    /// * **Exclusive use:** while work of this backend may read or write it, nothing else writes
    ///   it (or reads what this backend writes) without ordering through a stream or an event.
    /// * **Size and device:** `[ptr, ptr + len)` is memory the engine may lend, on this device
    ///   (checked as far as the runtime can tell).
    pub unsafe fn lend_device_memory(
        &self,
        ptr: *mut c_void,
        len: usize,
    ) -> Result<RocmBuffer, RocmError> {
        const WHAT: &str = "device memory";
        check(WHAT, lending::check_device_range(ptr as u64, len))?;
        self.ctx.bind()?;
        let info = self
            .ctx
            .hip
            .pointer_info(ptr)
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipPointerGetAttributes", s))?;
        match info.memory_type {
            MEMORY_TYPE_DEVICE => {}
            MEMORY_TYPE_HOST => {
                return refuse(
                    WHAT,
                    format!("{ptr:p} is pinned host memory: use lend_host_memory for it"),
                );
            }
            MEMORY_TYPE_UNREGISTERED => {
                return refuse(
                    WHAT,
                    format!(
                        "the HIP runtime does not know {ptr:p}: pass memory from hipMalloc or an \
                         engine's allocator on this device"
                    ),
                );
            }
            other => {
                return refuse(
                    WHAT,
                    format!("{ptr:p} is memory of type {other}, not device memory"),
                );
            }
        }
        if info.device != self.ctx.ordinal {
            return refuse(
                WHAT,
                format!(
                    "{ptr:p} belongs to device {}, not to device {}: lend memory of this device",
                    info.device, self.ctx.ordinal
                ),
            );
        }
        let (start, size) = self
            .ctx
            .hip
            .address_range(ptr)
            .map_err(|s| RocmError::hip(&self.ctx.hip, "hipMemGetAddressRange", s))?;
        check(
            WHAT,
            lending::check_inside(ptr as u64, len, start as u64, size as u64),
        )?;
        Ok(RocmBuffer {
            ptr,
            len,
            ctx: self.ctx.clone(),
            owned: false,
        })
    }

    /// Uses `len` bytes of host memory at `ptr`, allocated by someone else (a pinned tensor, or
    /// plain memory), as a pinned buffer of this device that kernels read and write directly.
    /// Memory the runtime does not know is registered here (`hipHostRegister`, mapped and
    /// portable) — touched (contents kept) and registered in parallel chunks as the device's
    /// host-pool configuration says ([`RocmDevice::with_host_pool_config`]) — and unregistered,
    /// in parallel chunks, before the buffer's drop returns; memory that is pinned already is used
    /// as it is and left pinned.
    ///
    /// Refused with [`RocmError::Lent`] when the pointer is null, the length zero, the pointer
    /// not page-aligned, the address is device memory, already pinned memory does not cover the
    /// range (or is not mapped linearly), or the runtime refuses to register it.
    ///
    /// # Safety
    ///
    /// * **Lifetime:** `[ptr, ptr + len)` is readable and writable host memory that stays
    ///   allocated for as long as the returned buffer lives *and* until every operation enqueued
    ///   with it has completed.
    /// * **Exclusive use:** while work of this backend may touch it, the host neither writes it
    ///   nor reads what the device writes, except after synchronising.
    /// * **Extent:** when the driver does not report the extent of memory that is pinned already,
    ///   the backend checks that the range's last byte is pinned too and mapped linearly with the
    ///   first; a range that runs on into an adjacent pinned allocation passes that check, so the
    ///   length must be the caller's own allocation's.
    /// * **Alignment and size:** page-aligned (checked); one allocation of the caller's.
    pub unsafe fn lend_host_memory(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RocmHostBuffer, RocmError> {
        const WHAT: &str = "host memory";
        check(WHAT, lending::check_host_range(ptr as usize, len))?;
        self.ctx.bind()?;
        let hip = &self.ctx.hip;
        let info = hip
            .pointer_info(ptr.cast())
            .map_err(|s| RocmError::hip(hip, "hipPointerGetAttributes", s))?;
        match info.memory_type {
            MEMORY_TYPE_UNREGISTERED => {
                // SAFETY: the caller guarantees `[ptr, ptr + len)` is live host memory that
                // outlives the buffer and that nothing else touches meanwhile; the buffer
                // unregisters it before its drop returns.
                unsafe { self.lend_pool(ptr, len) }.map_err(|e| match e {
                    RocmError::Hip { status, name, .. }
                        if status == HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED =>
                    {
                        RocmError::Lent {
                            what: WHAT,
                            problem: format!(
                                "part of the {len} bytes at {ptr:p} is pinned already ({name}): \
                                 pass the whole pinned allocation, or memory not pinned at all"
                            ),
                        }
                    }
                    RocmError::Hip {
                        call, status, name, ..
                    } => RocmError::Lent {
                        what: WHAT,
                        problem: format!(
                            "{call} refused {len} bytes at {ptr:p}: {name} ({status}); pass \
                             ordinary, readable and writable host memory"
                        ),
                    },
                    other => other,
                })
            }
            MEMORY_TYPE_HOST => {
                let last = ptr.wrapping_add(len - 1);
                let tail = hip
                    .pointer_info(last.cast())
                    .map_err(|s| RocmError::hip(hip, "hipPointerGetAttributes", s))?;
                let linear = tail.memory_type == MEMORY_TYPE_HOST
                    && hip
                        .host_device_pointer(ptr.cast())
                        .ok()
                        .zip(hip.host_device_pointer(last.cast()).ok())
                        .is_some_and(|(a, b)| (b as usize).wrapping_sub(a as usize) == len - 1);
                if !linear {
                    return refuse(
                        WHAT,
                        format!(
                            "{len} bytes at {ptr:p} are not one pinned, mapped range: pass the \
                             pinned allocation's own length, or unpinned memory to register"
                        ),
                    );
                }
                let device = hip
                    .host_device_pointer(ptr.cast())
                    .map_err(|s| RocmError::hip(hip, "hipHostGetDevicePointer", s))?;
                Ok(RocmHostBuffer {
                    host: ptr,
                    device,
                    len,
                    pinning: Pinning::Lent,
                })
            }
            _ => refuse(
                WHAT,
                format!("{ptr:p} is device memory: use lend_device_memory for it"),
            ),
        }
    }

    /// Uses a shared-memory segment — the host pool every tensor-parallel rank of a node maps —
    /// as a pinned host buffer of this device: the segment's mapping is registered with the
    /// runtime (`hipHostRegister`, mapped and portable) in parallel chunks, the buffer keeps the
    /// segment alive, and on drop — on a thread of its own for segments of 64 MiB and more — it
    /// unregisters the mapping (after the device went idle) before the segment unmaps it.
    ///
    /// Other processes (the other ranks) map the same memory. What keeps that sound is the host
    /// pool's protocol: one rank writes a page's bytes, and another reads them only after the
    /// writer's completion was reported to it (a synchronisation point between the processes).
    ///
    /// Refused with [`RocmError::Lent`] when the runtime refuses to register the mapping (for
    /// instance because this process registered the same address range already).
    pub fn host_buffer_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<RocmHostBuffer, RocmError> {
        const WHAT: &str = "shared host memory";
        let ptr = segment.addr().as_ptr();
        let len = segment.len();
        check(WHAT, lending::check_host_range(ptr as usize, len))?;
        let name = segment.name().to_string();
        self.share_pool(segment).map_err(|e| match e {
            RocmError::Hip {
                call,
                status,
                name: error,
                ..
            } => RocmError::Lent {
                what: WHAT,
                problem: format!(
                    "{call} refused the {len}-byte segment `{name}` at {ptr:p}: {error} \
                     ({status}); map the segment once per process and hand each mapping to one \
                     buffer"
                ),
            },
            other => other,
        })
    }

    /// Enqueues this backend's work on a stream someone else created (`hipStream_t`, e.g. the
    /// engine's current stream) instead of one of its own. The returned stream never destroys
    /// `raw`; it has its own resolver scratch, like every stream of this backend. `raw` may be
    /// being captured into a graph (`torch.cuda.graph` on ROCm captures in global mode): the
    /// lending then allocates with the thread in relaxed capture mode and clears the resolver
    /// counters on the device's own side stream, waiting for it, so they are zero for eager use
    /// and for every replay alike (the `capture` module). Keep the lent stream while the stream
    /// is in use rather than lending it per call.
    ///
    /// Refused with [`RocmError::Lent`] when the stream belongs to another device.
    ///
    /// # Safety
    ///
    /// * `raw` is a live stream handle or the null stream (the runtime dereferences it).
    /// * It stays valid for as long as the returned stream lives and until the work enqueued on
    ///   it has completed; the engine may keep enqueuing its own work on it.
    pub unsafe fn lend_stream(&self, raw: *mut c_void) -> Result<RocmStream, RocmError> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees `raw` is a handle the runtime accepts.
        let device = unsafe { self.ctx.hip.stream_device(raw) }.map_err(|s| RocmError::Lent {
            what: "stream",
            problem: format!(
                "the HIP runtime does not accept the stream handle {raw:p}: {} ({s})",
                self.ctx.hip.error_name(s)
            ),
        })?;
        if device != self.ctx.ordinal {
            return refuse(
                "stream",
                format!(
                    "stream {raw:p} belongs to device {device}, not to device {}: create it on \
                     this device",
                    self.ctx.ordinal
                ),
            );
        }
        RocmStream::new(&self.ctx, raw, false, self.lasting.side)
    }

    /// Whether `buf` is lent memory this backend registered as pinned itself (and will unregister
    /// when it drops), as opposed to memory it allocated or memory that was pinned already.
    pub fn registered_here(&self, buf: &RocmHostBuffer) -> bool {
        matches!(buf.pinning, Pinning::Registered(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::{Error as _, ErrorKind};

    #[test]
    fn refused_arguments_are_typed_invalid_argument_errors() {
        for (what, r) in [
            ("device memory", lending::check_device_range(0, 16)),
            ("device memory", lending::check_device_range(0x1008, 16)),
            ("host memory", lending::check_host_range(0x1000, 0)),
            ("host memory", lending::check_host_range(0x1010, 64)),
        ] {
            let e = check(what, r).expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("cannot use the {what}: ")),
                "{e}"
            );
        }
    }
}
