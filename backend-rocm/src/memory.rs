//! Device buffers, pinned host buffers, streams and events: owned HIP objects freed on drop.

use std::ffi::c_void;
use std::sync::Arc;

use hisparse_core::ops::BufferLen;
use hisparse_host_memory::HostRegion;

use crate::capture::Scratch;
use crate::context::Context;
use crate::error::RocmError;
use crate::ffi::Handle;

/// Device memory from `hipMalloc` (zeroed on allocation), or an engine's device memory lent
/// through [`crate::RocmDevice::lend_device_memory`].
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
#[derive(Debug)]
pub(crate) enum Pinning {
    /// Registered here, chunk by chunk or whole: a pool reserved here, an engine's lent memory
    /// or a shared segment. The region unregisters (and unmaps what it mapped) when dropped,
    /// after the device went idle (on a release thread for large pools).
    Registered(Box<HostRegion<crate::pinned::HipPin>>),
    /// An engine's memory it had pinned itself; left alone on drop.
    Lent,
}

/// Pinned, mapped host memory: a host pool reserved, zeroed and registered here
/// ([`hisparse_core::Device::alloc_pinned`]; see `crate::pinned`), or an engine's host memory
/// lent through [`crate::RocmDevice::lend_host_memory`], or a shared segment
/// ([`crate::RocmDevice::host_buffer_from_shared`]). Kernels read it through its device address.
#[derive(Debug)]
pub struct RocmHostBuffer {
    pub(crate) host: *mut u8,
    pub(crate) device: *mut c_void,
    pub(crate) len: usize,
    pub(crate) pinning: Pinning,
}

// SAFETY: the buffer owns a pinned allocation usable from any thread; host-side access goes
// through `&`/`&mut` methods of the device after synchronisation.
unsafe impl Send for RocmHostBuffer {}
// SAFETY: shared references only read addresses and the length.
unsafe impl Sync for RocmHostBuffer {}

impl RocmHostBuffer {
    /// The region this backend registered, if it did (not memory its owner pinned).
    fn region(&self) -> Option<&HostRegion<crate::pinned::HipPin>> {
        match &self.pinning {
            Pinning::Registered(r) => Some(r),
            Pinning::Lent => None,
        }
    }

    /// `[off, off + n)` in the pieces a driver copy must be issued as
    /// (hisparse_host_memory::copy_pieces: cut at the chunks registered separately).
    pub(crate) fn copy_pieces(
        &self,
        off: usize,
        n: usize,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        hisparse_host_memory::copy_pieces(self.region(), off..off + n)
    }

    /// Host address of byte `offset` (bounds-checked by the caller).
    pub(crate) fn host_at(&self, offset: usize) -> *mut c_void {
        self.host.wrapping_add(offset).cast()
    }

    /// Whether the memory is a shared-memory segment
    /// ([`crate::RocmDevice::host_buffer_from_shared`]).
    pub fn is_shared(&self) -> bool {
        self.region().is_some_and(|r| r.segment().is_some())
    }

    /// How the memory was set up (threads, NUMA node, pages, registrations), when this backend
    /// registered it; `None` for memory that was pinned already.
    pub fn setup(&self) -> Option<&hisparse_host_memory::Setup> {
        self.region().map(HostRegion::setup)
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

/// A HIP stream: a non-blocking one of this backend (it does not synchronise with the null
/// stream), or an engine's lent through [`crate::RocmDevice::lend_stream`].
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
