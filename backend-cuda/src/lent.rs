//! Engine-owned memory and streams: device allocations, host memory and streams an inference
//! engine already has (a PyTorch tensor's storage, PyTorch's current stream), used as this
//! backend's buffers and streams without taking ownership.
//!
//! Every entry is `unsafe`: the backend cannot know how long the engine keeps the memory or the
//! stream alive. What it can check, it checks with the driver before anything is kept, and a
//! failed check is a [`CudaError::Lent`] naming the problem:
//!
//! * the argument itself (null, zero length, alignment, address overflow), without a driver call
//!   (`hisparse_gpu_kernels::lending`, shared with the ROCm backend);
//! * device memory: the driver knows the address as device memory of *this* device's context
//!   (`cuPointerGetAttribute`), and `[ptr, ptr + len)` lies inside one allocation;
//! * host memory: pinned already (it must then be mapped into this context, and the whole range
//!   must be pinned) or registered here (`cuMemHostRegister`, DEVICEMAP | PORTABLE), in which case
//!   the buffer unregisters it on drop and only then;
//! * a stream: it belongs to this device's context (`cuStreamGetCtx`); it is never destroyed here.
//!
//! [`CudaDevice::host_buffer_from_shared`] is the safe entry for one kind of host memory: a
//! shared-memory segment (the host pool the ranks of a node share), registered here and kept
//! alive by the buffer.

use cudarc::driver::sys::{self, CUstream};
use hisparse_gpu_kernels::lending;
use hisparse_host_memory::SharedSegment;

use crate::device::{CudaBuffer, CudaDevice, CudaHostBuffer, CudaStream};
use crate::error::CudaError;
use crate::ffi::{self, DevMem, MEMORY_TYPE_DEVICE, MEMORY_TYPE_HOST, PointerInfo};
use crate::pinned::PinnedMem;

type Result<T> = std::result::Result<T, CudaError>;

fn refuse<T>(what: &'static str, problem: String) -> Result<T> {
    Err(CudaError::Lent { what, problem })
}

fn check(what: &'static str, checked: std::result::Result<(), String>) -> Result<()> {
    checked.map_err(|problem| CudaError::Lent { what, problem })
}

impl CudaDevice {
    /// Whether `info` says the memory belongs to this device's context: allocated in it, or not
    /// tied to a context (virtual-memory mappings) but on this device.
    fn same_device(&self, info: &PointerInfo) -> bool {
        if !info.context.is_null() {
            return info.context == self.ctx.raw();
        }
        info.device_ordinal == Some(self.ordinal as i32)
    }

    /// Uses `len` bytes of device memory at `ptr`, allocated by someone else (an engine's tensor),
    /// as a buffer of this device. The buffer never frees the memory.
    ///
    /// Refused with [`CudaError::Lent`] when the pointer is null, the length zero, the pointer
    /// not 16-byte aligned, the driver does not know it as device memory of this device's
    /// context, or `[ptr, ptr + len)` does not lie inside one allocation.
    ///
    /// # Safety
    ///
    /// * **Lifetime:** the memory stays allocated for as long as the returned buffer lives *and*
    ///   until every operation enqueued with it has completed (synchronise, or wait for an event,
    ///   before freeing it).
    /// * **Exclusive use:** while work of this backend may read or write it, nothing else writes
    ///   it (and nothing else reads what this backend writes) without ordering through a stream
    ///   or an event.
    /// * **Size and context:** `[ptr, ptr + len)` is memory the engine may lend; it belongs to
    ///   this device (the backend checks what the driver can tell: the context or device of
    ///   the allocation and its extent).
    pub unsafe fn lend_device_memory(
        &self,
        ptr: sys::CUdeviceptr,
        len: usize,
    ) -> Result<CudaBuffer> {
        const WHAT: &str = "device memory";
        check(WHAT, lending::check_device_range(ptr, len))?;
        self.ctx.bind()?;
        let info = ffi::pointer_info(ptr)?;
        match info.memory_type {
            Some(MEMORY_TYPE_DEVICE) => {}
            Some(MEMORY_TYPE_HOST) => {
                return refuse(
                    WHAT,
                    format!("{ptr:#x} is pinned host memory: use lend_host_memory for it"),
                );
            }
            Some(other) => {
                return refuse(
                    WHAT,
                    format!("{ptr:#x} is memory of type {other}, not device memory"),
                );
            }
            None => {
                return refuse(
                    WHAT,
                    format!(
                        "the CUDA driver does not know {ptr:#x}: pass memory from cuMemAlloc, \
                         cudaMalloc or an engine's allocator on this device"
                    ),
                );
            }
        }
        if !self.same_device(&info) {
            return refuse(
                WHAT,
                format!(
                    "{ptr:#x} belongs to another CUDA context or device (device {:?}), not to \
                     device {}'s primary context: lend memory of this device",
                    info.device_ordinal, self.ordinal
                ),
            );
        }
        let range = match info.range {
            Some(r) => r,
            None => ffi::address_range(ptr)?,
        };
        check(WHAT, lending::check_inside(ptr, len, range.0, range.1))?;
        // SAFETY: the driver confirmed `[ptr, ptr + len)` is device memory of this context inside
        // one allocation; the caller guarantees its lifetime and exclusive use.
        let mem = unsafe { DevMem::lent(&self.ctx, ptr, len) };
        Ok(CudaBuffer { mem })
    }

    /// Uses `len` bytes of host memory at `ptr`, allocated by someone else (a pinned PyTorch
    /// tensor, or plain memory), as a pinned buffer of this device that kernels read and write
    /// directly. Memory the driver does not know yet is registered here (`cuMemHostRegister`,
    /// page-locked and mapped into the device's address space) — touched (contents kept) and
    /// registered in parallel chunks by threads of the GPU's NUMA node, as the device's host-pool
    /// configuration says ([`CudaDevice::with_host_pool_config`]) — and unregistered, in parallel
    /// chunks, before the buffer's drop returns (so the engine may free the memory right after);
    /// memory that is already pinned is used as it is and left pinned.
    ///
    /// Refused with [`CudaError::Lent`] when the pointer is null, the length zero, the pointer
    /// not page-aligned ([`hisparse_core::ops::PINNED_ALIGNMENT`]), the address is device memory, already pinned
    /// memory belongs to another context, is not mapped into the device's address space or does
    /// not cover `[ptr, ptr + len)`, or the driver refuses to register it (for instance because
    /// part of the range is already registered).
    ///
    /// # Safety
    ///
    /// * **Lifetime:** `[ptr, ptr + len)` is readable and writable host memory that stays
    ///   allocated for as long as the returned buffer lives *and* until every operation enqueued
    ///   with it has completed.
    /// * **Exclusive use:** while work of this backend may touch it, the host neither writes it
    ///   nor reads what the device writes, except after synchronising (a stream, an event, or
    ///   the backend's synchronous `read_pinned` / `write_pinned`).
    /// * **Extent:** when the driver does not report the extent of memory that is pinned already,
    ///   the backend checks that the range's last byte is pinned too and mapped linearly with the
    ///   first; a range that runs on into an adjacent pinned allocation passes that check, so the
    ///   length must be the caller's own allocation's.
    /// * **Alignment and size:** the pointer is page-aligned (checked) and the range is one
    ///   allocation of the caller's (checked against the driver's records when already pinned).
    pub unsafe fn lend_host_memory(&self, ptr: *mut u8, len: usize) -> Result<CudaHostBuffer> {
        const WHAT: &str = "host memory";
        check(WHAT, lending::check_host_range(ptr as usize, len))?;
        self.ctx.bind()?;
        let addr = ptr as u64;
        let info = ffi::pointer_info(addr)?;
        let register = match info.memory_type {
            None => {
                // Nothing of the range may be pinned yet: registering a range that overlaps a
                // registered one fails, and the error below says so.
                true
            }
            Some(MEMORY_TYPE_HOST) => {
                if !info.context.is_null() && info.context != self.ctx.raw() {
                    return refuse(
                        WHAT,
                        format!(
                            "{ptr:p} was pinned in another CUDA context: pin it as portable \
                             memory (cuMemHostAlloc PORTABLE), or in device {}'s primary context",
                            self.ordinal
                        ),
                    );
                }
                match info.range {
                    Some((start, size)) => {
                        check(WHAT, lending::check_inside(addr, len, start, size))?
                    }
                    None => {
                        // The driver gives no extent for this pinned memory: the last byte must be
                        // pinned as well, mapped linearly with the first.
                        let last = addr + len as u64 - 1;
                        let tail = ffi::pointer_info(last)?;
                        let linear = tail.memory_type == Some(MEMORY_TYPE_HOST)
                            && ffi::host_device_pointer(ptr.cast())
                                .ok()
                                .zip(
                                    ffi::host_device_pointer(ptr.wrapping_add(len - 1).cast()).ok(),
                                )
                                .is_some_and(|(a, b)| b.wrapping_sub(a) == len as u64 - 1);
                        if !linear {
                            return refuse(
                                WHAT,
                                format!(
                                    "{len} bytes at {ptr:p} are not one pinned, mapped range: \
                                     pass the pinned allocation's own length, or unpinned memory \
                                     to register"
                                ),
                            );
                        }
                    }
                }
                false
            }
            Some(_) => {
                return refuse(
                    WHAT,
                    format!("{ptr:p} is device memory: use lend_device_memory for it"),
                );
            }
        };
        // SAFETY: the arguments were checked above; the caller guarantees the range is live host
        // memory lent exclusively for the buffer's life; when `register` is false the driver
        // reported it page-locked in this context and covering the whole range.
        let mem = unsafe { PinnedMem::lent(&self.ctx, ptr, len, register, &self.host_pool) }
            .map_err(|e| match e {
                CudaError::Driver { call, code } => CudaError::Lent {
                    what: WHAT,
                    problem: format!(
                        "{call} refused {len} bytes at {ptr:p} ({code:?}): pass memory that is \
                         either pinned as a whole already or not pinned at all, and not \
                         memory-mapped device or file memory"
                    ),
                },
                other => other,
            })?;
        Ok(CudaHostBuffer { mem })
    }

    /// Uses a shared-memory segment — the host pool every tensor-parallel rank of a node maps —
    /// as a pinned host buffer of this device: the segment's mapping is registered with the
    /// driver (`cuMemHostRegister`, page-locked, mapped into the device's address space and
    /// portable) in parallel chunks, the buffer keeps the segment alive, and on drop — on a
    /// thread of its own for segments of 64 MiB and more — it unregisters the mapping (after the
    /// context's outstanding work) before the segment unmaps it.
    ///
    /// Other processes (the other ranks) map the same memory. What keeps that sound is the host
    /// pool's protocol, as for any pinned buffer a GPU writes while the host runs: one rank
    /// writes a page's bytes, and another reads them only after the writer's completion was
    /// reported to it (a synchronisation point between the processes).
    ///
    /// Refused with [`CudaError::Lent`] when the driver refuses to register the mapping (for
    /// instance because this process registered the same address range already).
    pub fn host_buffer_from_shared(&self, segment: SharedSegment) -> Result<CudaHostBuffer> {
        const WHAT: &str = "shared host memory";
        let ptr = segment.addr().as_ptr();
        let len = segment.len();
        let name = segment.name().to_string();
        check(WHAT, lending::check_host_range(ptr as usize, len))?;
        // The region keeps the segment and unmaps it only after it unregistered the mapping,
        // once every enqueued operation completed (its pinner's quiesce synchronises the
        // context first). Within this process nothing else can reach the mapping: the segment
        // hands out no slices and is owned by the buffer. Other processes' accesses are ordered
        // by the host pool's protocol (above).
        let mem = PinnedMem::shared(&self.ctx, segment, &self.host_pool).map_err(|e| match e {
            CudaError::Driver { call, code } => CudaError::Lent {
                what: WHAT,
                problem: format!(
                    "{call} refused the {len}-byte segment `{name}` at {ptr:p} ({code:?}): map the \
                     segment once per process and hand each mapping to one buffer"
                ),
            },
            other => other,
        })?;
        Ok(CudaHostBuffer { mem })
    }

    /// Enqueues this backend's work on a stream someone else created (PyTorch's current stream)
    /// instead of one of its own. The returned stream never destroys `raw`; it has its own
    /// scratch memory for the resolver, like every stream of this backend, whose counters it
    /// clears with a first operation on `raw` — or, while `raw` is being captured into a graph
    /// (in any mode, `torch.cuda.graph`'s global mode included), on the device's own side stream,
    /// waiting for it, so the counters are zero for eager use and for every replay alike. Lending
    /// under capture allocates with the thread in relaxed capture mode (the `capture` module).
    /// Lending costs two allocations and a driver call or two: keep the lent stream while the
    /// stream is in use rather than lending it per call.
    ///
    /// Refused with [`CudaError::Lent`] when the stream belongs to another context than this
    /// device's primary context.
    ///
    /// # Safety
    ///
    /// * `raw` is a live stream handle (or the null stream, `CU_STREAM_LEGACY`,
    ///   `CU_STREAM_PER_THREAD`): the driver dereferences other values.
    /// * It stays valid for as long as the returned stream lives and until the work enqueued on
    ///   it has completed; the engine may keep enqueuing its own work on it (that is the point:
    ///   both are ordered by the stream).
    pub unsafe fn lend_stream(&self, raw: CUstream) -> Result<CudaStream> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees `raw` is a handle the driver accepts.
        let ctx = unsafe { ffi::stream_context(raw) }.map_err(|e| CudaError::Lent {
            what: "stream",
            problem: format!("the driver does not accept the stream handle {raw:p}: {e}"),
        })?;
        if ctx != self.ctx.raw() {
            return refuse(
                "stream",
                format!(
                    "stream {raw:p} belongs to another CUDA context, not to device {}'s primary \
                     context (the one the CUDA runtime and PyTorch use): create it on this device",
                    self.ordinal
                ),
            );
        }
        // SAFETY: the driver confirmed the stream belongs to this context; the caller guarantees
        // it outlives the value.
        CudaStream::from_inner(self, unsafe { ffi::Stream::lent(&self.ctx, raw) })
    }

    /// Whether `buf` is lent memory this backend registered as pinned itself (and will
    /// unregister when it drops), as opposed to memory it allocated or memory that was pinned
    /// already.
    pub fn registered_here(&self, buf: &CudaHostBuffer) -> bool {
        buf.mem.registered_here()
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
            (
                "host memory",
                lending::check_inside(0x2000, 4097, 0x2000, 4096),
            ),
        ] {
            let e = check(what, r).expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("cannot use the {what}: ")),
                "{msg}"
            );
        }
        assert!(check("stream", Ok(())).is_ok());
    }
}
