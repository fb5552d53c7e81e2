//! Device buffers, pinned host buffers, streams and events: owned HIP objects freed on drop.

use std::ffi::c_void;
use std::sync::Arc;

use hisparse_core::ops::BufferLen;

use crate::capture::Scratch;
use crate::context::Context;
use crate::error::RocmError;
use crate::ffi::Handle;

/// Device memory from `hipMalloc` (zeroed on allocation), or an engine's device memory lent
/// through [`crate::RocmDevice::wrap_device_memory`].
///
/// Dropping memory this backend allocated calls `hipFree`, which synchronises the device first,
/// so work still using the buffer completes before the memory is released; lent memory is left
/// to its owner.
#[derive(Debug)]
pub struct RocmBuffer {
    pub(crate) ptr: *mut c_void,
    pub(crate) len: usize,
    pub(crate) ctx: Arc<Context>,
    /// Whether drop frees the memory (allocated here) or leaves it alone (lent).
    pub(crate) owned: bool,
}

// SAFETY: the buffer owns a device allocation; the HIP API may free it and use it from any thread.
unsafe impl Send for RocmBuffer {}
// SAFETY: shared references only read the address and length.
unsafe impl Sync for RocmBuffer {}

impl RocmBuffer {
    /// Device address of byte `offset` (the caller has bounds-checked `offset`).
    pub(crate) fn at(&self, offset: usize) -> *mut c_void {
        self.ptr.wrapping_byte_add(offset)
    }

    /// Device address as the `u64` a kernel parameter holds.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Device address of byte 0 (for an engine's own copies into the buffer, and diagnostics).
    pub fn device_address(&self) -> u64 {
        self.ptr as u64
    }
}

impl BufferLen for RocmBuffer {
    fn byte_len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for RocmBuffer {
    fn drop(&mut self) {
        if self.ptr.is_null() || !self.owned {
            return;
        }
        self.ctx.bind_quietly();
        // SAFETY: `ptr` came from `hipMalloc` in `RocmDevice::alloc` and is freed exactly once,
        // here; `hipFree` waits for outstanding work on the device first.
        let _ = unsafe { self.ctx.hip.free(self.ptr) };
    }
}

/// Who releases a [`RocmHostBuffer`]'s pinning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pinning {
    /// `hipHostMalloc` here; `hipHostFree` on drop.
    Allocated,
    /// An engine's memory registered here with `hipHostRegister`; `hipHostUnregister` on drop.
    Registered,
    /// An engine's memory it had pinned itself; left alone on drop.
    Borrowed,
}

/// Pinned, mapped host memory: from `hipHostMalloc(hipHostMallocMapped |
/// hipHostMallocPortable)`, page-aligned and zeroed on allocation, or an engine's host memory lent
/// through [`crate::RocmDevice::wrap_host_memory`]. Kernels read it through its device address.
#[derive(Debug)]
pub struct RocmHostBuffer {
    pub(crate) host: *mut u8,
    pub(crate) device: *mut c_void,
    pub(crate) len: usize,
    pub(crate) ctx: Arc<Context>,
    pub(crate) pinning: Pinning,
    /// The shared-memory segment the buffer registers, if any
    /// ([`crate::RocmDevice::host_buffer_from_shared`]). Fields drop after [`Drop::drop`], so the
    /// segment is unmapped only after the drop unregistered it.
    pub(crate) shared: Option<hisparse_shm::SharedSegment>,
}

// SAFETY: the buffer owns a pinned allocation usable from any thread; host-side access goes
// through `&`/`&mut` methods of the device after synchronisation.
unsafe impl Send for RocmHostBuffer {}
// SAFETY: shared references only read addresses and the length.
unsafe impl Sync for RocmHostBuffer {}

impl RocmHostBuffer {
    /// Host address of byte `offset` (bounds-checked by the caller).
    pub(crate) fn host_at(&self, offset: usize) -> *mut c_void {
        self.host.wrapping_add(offset).cast()
    }

    /// Whether the memory is a shared-memory segment
    /// ([`crate::RocmDevice::host_buffer_from_shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Device address of the mapping as a kernel parameter.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device as u64
    }
}

impl BufferLen for RocmHostBuffer {
    fn byte_len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for RocmHostBuffer {
    fn drop(&mut self) {
        if self.host.is_null() {
            return;
        }
        self.ctx.bind_quietly();
        match self.pinning {
            Pinning::Allocated => {
                // SAFETY: `host` came from `hipHostMalloc` in `RocmDevice::alloc_pinned` and is
                // freed exactly once, here; `hipHostFree` waits for outstanding work first.
                let _ = unsafe { self.ctx.hip.host_free(self.host.cast()) };
            }
            Pinning::Registered => {
                // Work still reading or writing the memory finishes before it is unpinned.
                let _ = self.ctx.hip.device_synchronize();
                // SAFETY: `host` was registered in `RocmDevice::wrap_host_memory` and is
                // unregistered exactly once, here, after the device went idle.
                let _ = unsafe { self.ctx.hip.host_unregister(self.host.cast()) };
            }
            Pinning::Borrowed => {}
        }
    }
}

/// A HIP stream: a non-blocking one of this backend (it does not synchronise with the null
/// stream), or an engine's lent through [`crate::RocmDevice::wrap_stream`].
///
/// It owns the resolver's device scratch (the counters and the wanted-row workspace for requests
/// whose table does not fit shared memory), so concurrent streams never share it; the
/// device keeps it too once a launch captured into a graph used it. The workspace grows on the
/// first resolve of a larger shape, without synchronising.
#[derive(Debug)]
pub struct RocmStream {
    pub(crate) raw: Handle,
    pub(crate) ctx: Arc<Context>,
    pub(crate) scratch: Arc<Scratch>,
    /// Whether drop destroys the stream (created here) or leaves it alone (lent by an engine).
    pub(crate) owned: bool,
}

impl RocmStream {
    /// A stream of this backend over `raw` with no workspace yet and its resolver counters
    /// allocated and cleared ([`Scratch::new`]: on the stream, or on `side` while `raw` is being
    /// captured). `owned`: drop destroys `raw`. On failure an owned `raw` is destroyed.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        raw: Handle,
        owned: bool,
        side: Handle,
    ) -> Result<RocmStream, RocmError> {
        let scratch = match Scratch::new(ctx, raw, side) {
            Ok(s) => s,
            Err(e) => {
                if owned {
                    // SAFETY: `raw` was created by the caller for this stream and is not used
                    // after this.
                    let _ = unsafe { ctx.hip.stream_destroy(raw) };
                }
                return Err(e);
            }
        };
        Ok(RocmStream {
            raw,
            ctx: ctx.clone(),
            scratch,
            owned,
        })
    }

    /// The runtime's handle (`hipStream_t`), e.g. to order an engine's own work after this
    /// backend's. It stays owned by this value (or by the engine that lent it).
    pub fn raw_handle(&self) -> *mut c_void {
        self.raw
    }
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for RocmStream {}
// SAFETY: enqueueing from several threads is allowed by HIP; order between threads is the
// caller's business.
unsafe impl Sync for RocmStream {}

impl Drop for RocmStream {
    fn drop(&mut self) {
        self.ctx.bind_quietly();
        if self.owned {
            // SAFETY: `raw` came from `hipStreamCreateWithFlags` and is destroyed exactly once;
            // HIP lets pending work finish before releasing the stream. The scratch goes with its
            // last holder (this stream, or the device after a capture used it).
            let _ = unsafe { self.ctx.hip.stream_destroy(self.raw) };
        }
    }
}

/// A HIP event without timing, recorded on a stream.
#[derive(Debug)]
pub struct RocmEvent {
    pub(crate) raw: Handle,
    pub(crate) ctx: Arc<Context>,
}

// SAFETY: HIP events may be used from any thread.
unsafe impl Send for RocmEvent {}
// SAFETY: as above.
unsafe impl Sync for RocmEvent {}

impl Drop for RocmEvent {
    fn drop(&mut self) {
        self.ctx.bind_quietly();
        // SAFETY: `raw` came from `hipEventCreateWithFlags` and is destroyed exactly once; waits
        // already enqueued on it stay valid (HIP defers the release).
        let _ = unsafe { self.ctx.hip.event_destroy(self.raw) };
    }
}

/// Bytes of RAM the operating system reports as available (`MemAvailable`, else `MemFree`, from
/// `/proc/meminfo`), or `None` where it cannot be read.
pub(crate) fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    ["MemAvailable:", "MemFree:"].iter().find_map(|key| {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let mut words = line[key.len()..].split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}
