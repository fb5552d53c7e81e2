//! The only module that calls into the CUDA driver and NVRTC (through cudarc's `sys` bindings,
//! loaded at run time). Every `unsafe` block of the crate's FFI lives here and says why it is
//! sound. Above the raw calls sit small RAII handle types ([`Context`], [`DevMem`], [`Stream`],
//! [`Event`], [`Module`], [`Graph`]) and `Result`-returning wrappers; the rest of the crate uses
//! only those (the host pool's pinned memory, `crate::pinned`, registers through
//! [`host_register`] and [`host_unregister`]).
//!
//! Library loading: cudarc's `is_culib_present` probes without panicking, and no driver or NVRTC
//! function is ever called before its probe succeeded (cudarc panics on a missing library).

use std::ffi::{CStr, CString, c_void};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUresult};
use cudarc::nvrtc::sys as nvrtc;

use crate::error::CudaError;
use crate::pinned::PinnedMem;

/// Result of this crate.
pub(crate) type Result<T> = std::result::Result<T, CudaError>;

fn check(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::driver(call, code))
    }
}

// ------------------------------------------------------------------------------------------------
// Libraries
// ------------------------------------------------------------------------------------------------

// ------------------------------------------------------------------------------------------------
// Stream capture
// ------------------------------------------------------------------------------------------------

/// Runs `f` with the calling thread in relaxed stream-capture mode, then restores the thread's
/// mode. While another thread's stream (or this thread's) is being captured in global mode,
/// "potentially unsafe" calls — `cuMemAlloc`, a synchronisation of an unrelated stream — are
/// refused (and may invalidate the capture) unless the calling thread is relaxed: the PyTorch
/// allocator allocates the same way. `f` must not touch a stream being captured.
pub(crate) fn relaxed_capture<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a valid in/out pointer to a mode value; the call only swaps the
    // calling thread's mode.
    check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    })?;
    let result = f();
    // `mode` now holds the thread's previous mode: put it back.
    // SAFETY: as above.
    let restored = check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut mode)
    });
    let value = result?;
    restored.map(|()| value)
}

/// Whether a stream is being captured into a graph (`cuStreamIsCapturing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CaptureStatus {
    /// Not capturing: work runs when enqueued.
    None,
    /// Capturing: work becomes nodes of the graph.
    Active,
    /// A capture whose sequence was invalidated (an operation it cannot record ran); ending it
    /// fails.
    Invalidated,
}

/// How a capture treats potentially unsafe calls of other threads (`CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe calls anywhere in the process are refused while the capture runs (what
    /// `torch.cuda.graph` uses).
    Global,
    /// Unsafe calls are refused on the capturing thread only.
    ThreadLocal,
    /// Nothing is refused.
    Relaxed,
}

/// Whether the CUDA driver library can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names; calls nothing in it.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC can be loaded by cudarc (by name, through the dynamic loader).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc by its usual names; calls nothing in it.
    unsafe { nvrtc::is_culib_present() }
}

/// Libraries loaded by full path, kept loaded for the life of the process so that later loads by
/// name (cudarc's) resolve to them through their SONAME.
static PRELOADED: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

/// Loads the shared library at `path` and keeps it loaded. Returns whether it loaded.
pub(crate) fn preload(path: &Path) -> bool {
    // SAFETY: loading NVIDIA's NVRTC libraries runs only their (side-effect-free) initialisers;
    // the handle is kept in a process-wide list and never unloaded, so no symbol outlives it.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            PRELOADED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lib);
            true
        }
        Err(_) => false,
    }
}

// ------------------------------------------------------------------------------------------------
// Driver, devices, contexts
// ------------------------------------------------------------------------------------------------

/// `cuInit(0)`. Call only after [`driver_present`].
pub(crate) fn init() -> Result<()> {
    // SAFETY: cuInit takes a flags word (must be 0) and has no pointer arguments.
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// Number of CUDA devices.
pub(crate) fn device_count() -> Result<usize> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer for the duration of the call.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n.max(0) as usize)
}

/// Device handle of `ordinal`.
pub(crate) fn device_get(ordinal: usize) -> Result<sys::CUdevice> {
    let mut d = 0;
    // SAFETY: `d` is a valid out-pointer; the ordinal is range-checked by the driver.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut d, ordinal as i32)
    })?;
    Ok(d)
}

/// The device's name.
pub(crate) fn device_name(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds 256 chars and its length is passed; the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev)
    })?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf` (and buf's last byte is 0 at
    // worst because the length passed excludes nothing: the driver truncates with a NUL).
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// The device's PCI address (`domain:bus:device.function`), to find its NUMA node.
pub(crate) fn device_pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: the buffer holds 64 chars and its length is passed; the driver NUL-terminates.
    check("cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev)
    })?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf`.
    let id = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}

/// A device attribute.
pub(crate) fn device_attr(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; `attr` is an enum value of the bindings.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// `(free, total)` device memory of the current context.
pub(crate) fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// A retained primary context of one device. Released on drop.
#[derive(Debug)]
pub(crate) struct Context {
    raw: sys::CUcontext,
    dev: sys::CUdevice,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API is thread-safe);
// every use first makes it current on the calling thread with `bind`.
unsafe impl Send for Context {}
// SAFETY: as above; the handle itself is never mutated after creation.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of `dev`.
    pub(crate) fn retain(dev: sys::CUdevice) -> Result<Arc<Context>> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `dev` a handle returned by cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, dev)
        })?;
        let ctx = Arc::new(Context { raw, dev });
        ctx.bind()?;
        Ok(ctx)
    }

    /// The driver's handle (to compare with the context a lent pointer or stream reports).
    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained, live context (released only in Drop).
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.raw) })
    }

    /// Waits for all work of the context.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: releases the retain taken in `retain`; every object created in the context
        // holds an Arc to it, so none is alive any more.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------------

/// Device memory. Memory this crate allocated is freed on drop, after all work of the context
/// completed (so no enqueued kernel can still use it); lent memory ([`DevMem::lent`]) is
/// left to its owner.
#[derive(Debug)]
pub(crate) struct DevMem {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<Context>,
    /// Whether drop frees the memory (allocated here) or leaves it alone (lent).
    owned: bool,
}

impl DevMem {
    /// Allocates `len` bytes without initialising them and without waiting for the device
    /// (scratch that kernels overwrite before reading; `len == 0` allocates nothing).
    pub(crate) fn alloc_uninit(ctx: &Arc<Context>, len: usize) -> Result<DevMem> {
        ctx.bind()?;
        let mut ptr = 0;
        if len > 0 {
            // SAFETY: `ptr` is a valid out-pointer; the context is current.
            let code = unsafe { sys::cuMemAlloc_v2(&mut ptr, len) };
            if code != CUresult::CUDA_SUCCESS {
                return Err(if code == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    CudaError::OutOfDeviceMemory { bytes: len, code }
                } else {
                    CudaError::driver("cuMemAlloc", code)
                });
            }
        }
        Ok(DevMem {
            ptr,
            len,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// Device memory someone else allocated, which drop leaves alone.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` is device memory of `ctx`'s device that stays allocated, and is used by
    /// nobody else while work of this crate may touch it, for as long as the value lives and until
    /// every operation enqueued on it has completed.
    pub(crate) unsafe fn lent(ctx: &Arc<Context>, ptr: sys::CUdeviceptr, len: usize) -> DevMem {
        DevMem {
            ptr,
            len,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// Allocates `len` zeroed bytes (`len == 0` allocates nothing and has a null address).
    pub(crate) fn alloc_zeroed(ctx: &Arc<Context>, len: usize) -> Result<DevMem> {
        ctx.bind()?;
        let mut ptr = 0;
        if len > 0 {
            // SAFETY: `ptr` is a valid out-pointer; the context is current.
            let code = unsafe { sys::cuMemAlloc_v2(&mut ptr, len) };
            if code != CUresult::CUDA_SUCCESS {
                return Err(if code == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    CudaError::OutOfDeviceMemory { bytes: len, code }
                } else {
                    CudaError::driver("cuMemAlloc", code)
                });
            }
        }
        let mem = DevMem {
            ptr,
            len,
            ctx: ctx.clone(),
            owned: true,
        };
        if len > 0 {
            // SAFETY: `ptr` points to `len` bytes just allocated in this context.
            check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(ptr, 0, len) })?;
            ctx.synchronize()?;
        }
        Ok(mem)
    }

    /// Device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` to byte `offset`, after all work of the context. Synchronous: the bytes are
    /// in device memory when it returns.
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        assert!(offset.checked_add(src.len()).is_some_and(|e| e <= self.len));
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.synchronize()?;
        // SAFETY: the destination range lies inside this allocation (asserted above) and `src`
        // is a live slice of `src.len()` bytes, which the driver has read when the call returns.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, src.as_ptr().cast(), src.len())
        })?;
        // From pageable memory the call returns once `src` sits in the driver's staging buffer;
        // the DMA into device memory may still be running on the legacy stream, which this
        // backend's non-blocking streams do not wait for. Without this a kernel enqueued next
        // could read the old bytes, or a later stream copy into the range be overwritten by
        // the late DMA (the likely cause of an intermittent H200 conformance failure: a case's
        // resolve found -1 entries as if its top-k were partly the sentinel fill uploaded just
        // before the top-k's stream copy).
        self.ctx.synchronize()
    }

    /// Copies `dst.len()` bytes from byte `offset` into `dst`, after all work. Synchronous.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        assert!(offset.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.synchronize()?;
        // SAFETY: the source range lies inside this allocation and `dst` is a live, exclusively
        // borrowed slice of `dst.len()` bytes; the call returns after the copy.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len())
        })
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.len == 0 || !self.owned {
            return;
        }
        let _ = self.ctx.synchronize();
        // SAFETY: `ptr` was allocated by cuMemAlloc in this context and is freed once; all work
        // that could use it has completed (synchronize above).
        unsafe {
            sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Page-locks `[host, host + len)` and maps it into the current context's device address space
/// (`cuMemHostRegister`, DEVICEMAP | PORTABLE: every context may use it).
///
/// # Safety
///
/// The range is live host memory that stays mapped until [`host_unregister`]; `ctx` is current.
pub(crate) unsafe fn host_register(host: *mut u8, len: usize) -> Result<()> {
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
    // SAFETY: the caller guarantees `[host, host + len)` is live host memory; the driver
    // page-locks it and maps it into the current context's address space.
    check("cuMemHostRegister", unsafe {
        sys::cuMemHostRegister_v2(host.cast(), len, flags)
    })
}

/// Unregisters memory [`host_register`] registered at `host` (the same start address).
///
/// # Safety
///
/// No device work that reads or writes the range is enqueued or running (synchronise first): the
/// device loses access to it.
pub(crate) unsafe fn host_unregister(host: *mut u8) -> Result<()> {
    // SAFETY: the caller guarantees the device no longer uses the range; the driver only drops
    // its registration (the memory itself stays mapped).
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(host.cast())
    })
}

/// Device address of page-locked, mapped host memory at `host`.
pub(crate) fn host_device_pointer(host: *mut c_void) -> Result<sys::CUdeviceptr> {
    let mut dev = 0;
    // SAFETY: `dev` is an out-pointer; the driver only looks `host` up in its tables.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0)
    })?;
    Ok(dev)
}

// ------------------------------------------------------------------------------------------------
// Pointer and stream queries (checking memory and streams an engine lends)
// ------------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------------
// Streams, events, graphs
// ------------------------------------------------------------------------------------------------

/// A stream: created here (non-blocking, destroyed on drop; pending work still completes), or
/// lent by an engine ([`Stream::lent`], never destroyed here).
#[derive(Debug)]
pub(crate) struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Context>,
    /// Whether drop destroys the stream.
    owned: bool,
}

// SAFETY: stream handles may be used from any thread of the process (driver API is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw,
            ctx: ctx.clone(),
            owned: true,
        })
    }

    /// A stream someone else created, which drop leaves alone.
    ///
    /// # Safety
    ///
    /// `raw` is a stream of `ctx` (checked by the caller with [`stream_context`]) that stays
    /// valid for as long as the value lives.
    pub(crate) unsafe fn lent(ctx: &Arc<Context>, raw: sys::CUstream) -> Stream {
        Stream {
            raw,
            ctx: ctx.clone(),
            owned: false,
        }
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Blocks until the stream's work completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    /// Makes later work wait for `event`.
    pub(crate) fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Enqueues a copy of `n` bytes from pinned `src[src_off..]` to device `dst[dst_off..]`.
    pub(crate) fn copy_htod(
        &self,
        src: &PinnedMem,
        src_off: usize,
        dst: &DevMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len() && dst_off + n <= dst.len);
        if n == 0 {
            return Ok(());
        }
        // One driver copy per separately registered chunk the range crosses (the driver refuses
        // a pinned range spanning two registrations).
        for piece in src.copy_pieces(src_off, n) {
            let at = piece.start - src_off;
            // SAFETY: both ranges lie inside live allocations (asserted; the piece lies inside
            // the source range); the source is pinned, and both allocations are freed (unpinned)
            // only after the context synchronised.
            check("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.ptr + (dst_off + at) as u64,
                    src.host_ptr().add(piece.start).cast(),
                    piece.len(),
                    self.raw,
                )
            })?;
        }
        Ok(())
    }

    /// Enqueues a copy of `n` bytes from device `src[src_off..]` to pinned `dst[dst_off..]`.
    pub(crate) fn copy_dtoh(
        &self,
        src: &DevMem,
        src_off: usize,
        dst: &PinnedMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len && dst_off + n <= dst.len());
        if n == 0 {
            return Ok(());
        }
        // As in `copy_htod`: one driver copy per registered chunk of the destination range.
        for piece in dst.copy_pieces(dst_off, n) {
            let at = piece.start - dst_off;
            // SAFETY: as in `copy_htod`; the destination is pinned memory owned by `dst`.
            check("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    dst.host_ptr().add(piece.start).cast(),
                    src.ptr + (src_off + at) as u64,
                    piece.len(),
                    self.raw,
                )
            })?;
        }
        Ok(())
    }

    /// Enqueues a copy of `n` bytes between device allocations, or within one (`src` and `dst`
    /// the same allocation) between ranges that do not overlap (the caller checks that, as the
    /// core's `check_copy_within` does).
    pub(crate) fn copy_dtod(
        &self,
        src: &DevMem,
        src_off: usize,
        dst: &DevMem,
        dst_off: usize,
        n: usize,
    ) -> Result<()> {
        assert!(src_off + n <= src.len && dst_off + n <= dst.len);
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie inside live device allocations (asserted) and, within one
        // allocation, do not overlap (the caller's check).
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.ptr + dst_off as u64,
                src.ptr + src_off as u64,
                n,
                self.raw,
            )
        })
    }

    /// Enqueues filling `words` u32 words at `mem[offset..]` with `value`.
    pub(crate) fn fill_u32(
        &self,
        mem: &DevMem,
        offset: usize,
        value: u32,
        words: usize,
    ) -> Result<()> {
        assert!(offset.is_multiple_of(4) && offset + 4 * words <= mem.len);
        if words == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside a live device allocation (asserted) and is 4-aligned.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(mem.ptr + offset as u64, value, words, self.raw)
        })
    }

    /// Starts capturing the stream's work into a graph in `mode`.
    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.ctx.bind()?;
        let mode = match mode {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: `raw` is a live stream; the mode is a valid enum value.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(self.raw, mode)
        })
    }

    /// Whether the stream is being captured (`cuStreamIsCapturing`).
    pub(crate) fn capture_status(&self) -> Result<CaptureStatus> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `raw` is a live stream; `status` is a valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(self.raw, &mut status)
        })?;
        Ok(match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
                CaptureStatus::Invalidated
            }
        })
    }

    /// Copies `src` into `dst[offset..]` on this stream and waits for the copy: complete in
    /// device memory when it returns. For the device's own side stream (never captured), under
    /// [`relaxed_capture`] when another stream may be capturing.
    pub(crate) fn upload_now(&self, dst: &DevMem, offset: usize, src: &[u8]) -> Result<()> {
        assert!(offset.checked_add(src.len()).is_some_and(|e| e <= dst.len));
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: the destination range lies inside a live allocation (asserted) and `src` is a
        // live slice that stays borrowed until the synchronisation below returns.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr + offset as u64,
                src.as_ptr().cast(),
                src.len(),
                self.raw,
            )
        })?;
        self.synchronize()
    }

    /// Ends a capture and instantiates the graph.
    pub(crate) fn end_capture(&self) -> Result<Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; the stream is capturing.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.raw, &mut graph)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just produced by the capture; `exec` is an out-pointer.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if code != CUresult::CUDA_SUCCESS {
            // SAFETY: the graph is ours and not used after this.
            unsafe {
                sys::cuGraphDestroy(graph);
            }
            return Err(CudaError::driver("cuGraphInstantiate", code));
        }
        Ok(Graph {
            graph,
            exec,
            ctx: self.ctx.clone(),
        })
    }

    /// Enqueues one replay of `graph`.
    pub(crate) fn launch_graph(&self, graph: &Graph) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.exec, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = self.ctx.bind();
        // SAFETY: destroys the stream created in `new` once; pending work still completes.
        unsafe {
            sys::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// An event.
#[derive(Debug)]
pub(crate) struct Event {
    raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: event handles may be used from any thread (driver API is thread-safe).
unsafe impl Send for Event {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event; `timing` enables elapsed-time queries.
    pub(crate) fn new(ctx: &Arc<Context>, timing: bool) -> Result<Event> {
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags as u32)
        })?;
        Ok(Event {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live objects of this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw)
        })
    }

    /// Whether the work before the event completed.
    pub(crate) fn is_complete(&self) -> Result<bool> {
        // SAFETY: `raw` is a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(CudaError::driver("cuEventQuery", code)),
        }
    }

    /// Milliseconds between `start` and `self` (waits for `self`).
    pub(crate) fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })?;
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both events are live timing events.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: destroys the event created in `new` once.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}

/// An instantiated CUDA graph.
#[derive(Debug)]
pub(crate) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<Context>,
}

// SAFETY: graph handles may be used from any thread (driver API is thread-safe).
unsafe impl Send for Graph {}
// SAFETY: as above; the handles are never mutated.
unsafe impl Sync for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.ctx.synchronize();
        // SAFETY: both were created in `Stream::end_capture` and are destroyed once, after
        // every replay completed.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Modules and launches
// ------------------------------------------------------------------------------------------------

/// A loaded module.
#[derive(Debug)]
pub(crate) struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Context>,
}

// SAFETY: module and function handles may be used from any thread (driver API is thread-safe).
unsafe impl Send for Module {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Module {}

/// A kernel of a [`Module`] (valid while the module lives; the device keeps both together).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Function(sys::CUfunction);

// SAFETY: see Module.
unsafe impl Send for Function {}
// SAFETY: see Module.
unsafe impl Sync for Function {}

impl Module {
    /// Loads a PTX image (NUL-terminated) into the context; the driver JIT-compiles it.
    pub(crate) fn load_ptx(ctx: &Arc<Context>, ptx: &CStr) -> Result<Module> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `ptx` is a NUL-terminated PTX text that outlives the call; `raw` an out-pointer.
        let code = unsafe { sys::cuModuleLoadData(&mut raw, ptx.as_ptr().cast()) };
        if code != CUresult::CUDA_SUCCESS {
            return Err(CudaError::Compile {
                log: format!("the driver refused the PTX (cuModuleLoadData: {code:?})"),
            });
        }
        Ok(Module {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Looks up a kernel by symbol.
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name).map_err(|_| CudaError::Compile {
            log: format!("bad symbol {name}"),
        })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: `cname` is NUL-terminated and outlives the call; `f` is an out-pointer.
        let code = unsafe { sys::cuModuleGetFunction(&mut f, self.raw, cname.as_ptr()) };
        if code != CUresult::CUDA_SUCCESS {
            return Err(CudaError::Compile {
                log: format!("kernel {name} missing from the module ({code:?})"),
            });
        }
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.synchronize();
        // SAFETY: unloads the module loaded in `load_ptx` once, after all its launches completed.
        unsafe {
            sys::cuModuleUnload(self.raw);
        }
    }
}

impl Function {
    /// Allows up to `bytes` of dynamic shared memory per block.
    pub(crate) fn set_max_dynamic_shared(&self, bytes: u32) -> Result<()> {
        // SAFETY: `self.0` is a live kernel handle; the attribute is a valid enum value.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(
                self.0,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })
    }

    /// An attribute of the compiled kernel (registers, local memory, ...).
    pub(crate) fn attribute(&self, a: sys::CUfunction_attribute) -> Result<i32> {
        let mut v = 0i32;
        // SAFETY: `self.0` is a live kernel handle; `v` is an out-pointer.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut v, a, self.0)
        })?;
        Ok(v)
    }

    /// Blocks of `block` threads (and `dynamic_shared` bytes) one multiprocessor holds at once.
    pub(crate) fn max_active_blocks(&self, block: u32, dynamic_shared: usize) -> Result<i32> {
        let mut v = 0i32;
        // SAFETY: `self.0` is a live kernel handle; `v` is an out-pointer.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut v,
                self.0,
                block as i32,
                dynamic_shared,
            )
        })?;
        Ok(v)
    }
}

/// Launch geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub shared: u32,
}

/// Enqueues `f` on `stream` with the parameter pointers `params`; with `programmatic`, with
/// programmatic stream serialisation (the kernel may start before the previous kernel of the
/// stream has finished).
///
/// # Safety
///
/// `params` holds one pointer per parameter of `f`, in order, each to a live value of the
/// parameter's type; every device pointer among those values addresses device-accessible memory
/// that holds every byte the kernel touches for these arguments and stays alive until the launch
/// completes. With `programmatic`, `f` executes `griddepcontrol.wait` before any global memory
/// access.
pub(crate) unsafe fn launch(
    f: Function,
    l: LaunchShape,
    stream: &Stream,
    params: &mut [*mut c_void],
    programmatic: bool,
) -> Result<()> {
    if !programmatic {
        // SAFETY: the caller guarantees `params` matches the kernel; the driver copies the
        // values before returning.
        return check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f.0,
                l.grid.0,
                l.grid.1,
                l.grid.2,
                l.block,
                1,
                1,
                l.shared,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
    }
    // SAFETY: CUlaunchAttribute is plain data (an id, padding and a union of integers and
    // plain structs), for which all-zero bytes are a valid value.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: l.grid.0,
        gridDimY: l.grid.1,
        gridDimZ: l.grid.2,
        blockDimX: l.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: l.shared,
        hStream: stream.raw,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as above; `config` and the attribute it points at live for the call.
    check("cuLaunchKernelEx", unsafe {
        sys::cuLaunchKernelEx(&config, f.0, params.as_mut_ptr(), std::ptr::null_mut())
    })
}

// ------------------------------------------------------------------------------------------------
// NVRTC
// ------------------------------------------------------------------------------------------------

fn nvrtc_check(call: &str, code: nvrtc::nvrtcResult) -> std::result::Result<(), String> {
    if code == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {code:?}"))
    }
}

/// NVRTC's version `(major, minor)`. Call only after NVRTC was found.
pub(crate) fn nvrtc_version() -> std::result::Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out-pointers.
    nvrtc_check("nvrtcVersion", unsafe {
        nvrtc::nvrtcVersion(&mut major, &mut minor)
    })?;
    Ok((major, minor))
}

/// Compiles `source` with `options`; returns the PTX (NUL-terminated) or the log.
/// Call only after NVRTC was found.
pub(crate) fn nvrtc_compile(
    source: &str,
    name: &str,
    options: &[&str],
) -> std::result::Result<CString, String> {
    let src = CString::new(source).map_err(|_| "source contains NUL".to_owned())?;
    let cname = CString::new(name).map_err(|_| "name contains NUL".to_owned())?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(*o).map_err(|_| "option contains NUL".to_owned()))
        .collect::<std::result::Result<_, _>>()?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = std::ptr::null_mut();
    // SAFETY: `src` and `cname` are NUL-terminated and outlive the call; no headers are passed.
    nvrtc_check("nvrtcCreateProgram", unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    // SAFETY: `prog` is a live program; `opt_ptrs` holds `opts.len()` NUL-terminated strings.
    let compiled =
        unsafe { nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let mut log_len = 0usize;
    // SAFETY: `prog` is live; `log_len` is an out-pointer.
    let _ = unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut log_len) };
    let mut log = vec![0u8; log_len.max(1)];
    // SAFETY: `log` holds `log_len` bytes, what NVRTC said the log needs.
    let _ = unsafe { nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()) };
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .trim()
        .to_owned();
    let result = if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Err(format!("nvrtcCompileProgram: {compiled:?}\n{log}"))
    } else {
        let mut n = 0usize;
        // SAFETY: `prog` compiled; `n` is an out-pointer.
        let sized = nvrtc_check("nvrtcGetPTXSize", unsafe {
            nvrtc::nvrtcGetPTXSize(prog, &mut n)
        });
        sized.and_then(|()| {
            let mut ptx = vec![0u8; n.max(1)];
            // SAFETY: `ptx` holds `n` bytes, the size NVRTC reported (NUL included).
            nvrtc_check("nvrtcGetPTX", unsafe {
                nvrtc::nvrtcGetPTX(prog, ptx.as_mut_ptr().cast())
            })?;
            let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
            ptx.truncate(end);
            CString::new(ptx).map_err(|_| "PTX contains NUL".to_owned())
        })
    };
    // SAFETY: destroys the program created above once.
    let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    result
}
