//! A test double of the HIP runtime and hiprtc: exactly the entry points the HiSparse ROCm backend
//! calls, on host memory, with every kernel run by the core's reference implementation.
//!
//! Build it (`cargo build -p hisparse-hip-double`), expose the library under the names the backend
//! loads (`backend-rocm/scripts/hip-double-root.sh DIR` makes `DIR/lib/libamdhip64.so` and
//! `DIR/lib/libhiprtc.so`), and point `ROCM_PATH` at `DIR`. The real backend code then runs:
//! library loading, device selection by `gcnArchName`, code-object choice or hiprtc fallback,
//! argument packing, pitches, offsets, stream order, events, error mapping.
//!
//! What the double models:
//! * "device" memory is host memory, filled with `0xCD` on allocation; pinned memory is mapped at
//!   the same address; every copy and every kernel pointer must lie inside one live allocation;
//! * streams queue work and run it only when something waits (see [`state`]); asynchronous copies
//!   must use registered memory (stricter than HIP, which also accepts pageable memory);
//! * `hipModuleLoadData` accepts an AMDGPU ELF code object whose architecture matches the device
//!   (else `hipErrorNoBinaryForGpu`) or the double's hiprtc output for that architecture;
//!   `hipModuleGetFunction` finds a kernel only if the image defines it (`name` and `name.kd`);
//! * stream capture and graphs (`hipStreamBeginCapture` .. `hipGraphLaunch`, module [`graph`]):
//!   captured work is recorded and replayed; in global mode the unsafe calls of threads not in
//!   relaxed mode are refused and invalidate the capture, as HIP does;
//! * `hipModuleLaunchKernel` decodes the parameters with the kernel ABI table of
//!   `hisparse-gpu-kernels`, and at execution runs the reference op for that kernel, except the
//!   copy kernels, which are emulated access by access with the kernel source's chunking and
//!   alignment (`copy`); a failure is a sticky `hipErrorIllegalAddress`, as a fault on a GPU
//!   would be.
//!
//! Environment: `HISPARSE_HIP_DOUBLE_DEVICES` (default 1; 0 makes `hipGetDeviceCount` report
//! `hipErrorNoDevice`), `HISPARSE_HIP_DOUBLE_ARCH` (default `gfx942:sramecc+:xnack-`),
//! `HISPARSE_HIP_DOUBLE_MEMORY` (device bytes, default 16 GiB; `hipMalloc` beyond it is
//! `hipErrorOutOfMemory`), `HISPARSE_HIP_DOUBLE_RTC_FAIL=1` (hiprtc reports a compile error).

#![allow(clippy::missing_safety_doc)] // C entry points: the contract is HIP's own documentation.

mod copy;
#[path = "../../src/elf.rs"]
#[allow(dead_code)]
mod elf;
pub mod exec;
pub mod graph;
pub mod mem;
mod rtc;
pub mod state;
pub mod status;

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use state::{Kind, Module, Op, State};
use status::*;

/// The LDS a block may use on CDNA and RDNA (64 KiB): reported as `sharedMemPerBlock`; a launch
/// asking for more dynamic shared memory fails.
pub(crate) const SHARED_MEM_PER_BLOCK: usize = 64 * 1024;

pub use rtc::{
    hiprtcCompileProgram, hiprtcCreateProgram, hiprtcDestroyProgram, hiprtcGetCode,
    hiprtcGetCodeSize, hiprtcGetErrorString, hiprtcGetProgramLog, hiprtcGetProgramLogSize,
};

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

thread_local! {
    static CURRENT: Cell<c_int> = const { Cell::new(0) };
}

/// Locks the double's state (recovering from a poisoned lock: the state stays consistent because
/// every mutation completes before any code that can panic).
fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls that block the host or allocate (synchronisations, synchronous copies, allocations,
/// frees, module loads, stream and event creation) made so far.
static BLOCKING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn blocking() {
    BLOCKING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Not HIP: how many blocking or allocating calls (see `BLOCKING`) the process made so far, so a
/// test can prove the decode-path operations make none.
#[unsafe(no_mangle)]
pub extern "C" fn hisparse_hip_double_blocking_calls() -> u64 {
    BLOCKING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Devices the double reports.
fn device_count() -> c_int {
    std::env::var("HISPARSE_HIP_DOUBLE_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The architecture the double reports, e.g. `gfx942:sramecc+:xnack-`.
pub fn arch() -> String {
    std::env::var("HISPARSE_HIP_DOUBLE_ARCH").unwrap_or_else(|_| "gfx942:sramecc+:xnack-".into())
}

/// The processor part of [`arch`], e.g. `gfx942`.
pub fn arch_base() -> String {
    arch().split(':').next().unwrap_or_default().to_owned()
}

fn memory_limit() -> usize {
    std::env::var("HISPARSE_HIP_DOUBLE_MEMORY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 30)
}

/// Writes `value` through an out-pointer, or reports `hipErrorInvalidValue` for null.
///
/// # Safety
/// `out` is null or valid for writing a `T`.
unsafe fn put<T>(out: *mut T, value: T) -> u32 {
    if out.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null and, per the caller's contract, valid for writes.
    unsafe { out.write(value) };
    HIP_SUCCESS
}

/// `hipInit`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipInit(flags: c_uint) -> u32 {
    if flags != 0 {
        HIP_ERROR_INVALID_VALUE
    } else {
        HIP_SUCCESS
    }
}

/// `hipGetDeviceCount`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetDeviceCount(count: *mut c_int) -> u32 {
    let n = device_count();
    // SAFETY: HIP contract: `count` is a valid out-pointer.
    let s = unsafe { put(count, n.max(0)) };
    if s != HIP_SUCCESS {
        s
    } else if n <= 0 {
        HIP_ERROR_NO_DEVICE
    } else {
        HIP_SUCCESS
    }
}

/// `hipSetDevice`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipSetDevice(ordinal: c_int) -> u32 {
    if ordinal < 0 || ordinal >= device_count() {
        return HIP_ERROR_INVALID_DEVICE;
    }
    CURRENT.with(|c| c.set(ordinal));
    HIP_SUCCESS
}

/// `hipRuntimeGetVersion`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> u32 {
    // SAFETY: HIP contract: valid out-pointer. 6.2.41134 in HIP_VERSION encoding.
    unsafe { put(version, 60_241_134) }
}

/// Copies a string into a fixed C char array field, NUL-terminated.
fn fill(field: &mut [c_char], text: &str) {
    field.fill(0);
    let room = field.len() - 1;
    for (d, s) in field.iter_mut().zip(text.bytes().take(room)) {
        *d = s as c_char;
    }
}

/// `hipGetDevicePropertiesR0600`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetDevicePropertiesR0600(
    prop: *mut cubecl_hip_sys::hipDeviceProp_tR0600,
    ordinal: c_int,
) -> u32 {
    if ordinal < 0 || ordinal >= device_count() {
        return HIP_ERROR_INVALID_DEVICE;
    }
    if prop.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: HIP contract: `prop` points at a writable `hipDeviceProp_tR0600`. Every field is
    // an integer or an array of integers, so all-zero bytes are a valid value.
    let p = unsafe {
        std::ptr::write_bytes(prop, 0, 1);
        &mut *prop
    };
    fill(&mut p.name, "HiSparse HIP test double");
    fill(&mut p.gcnArchName, &arch());
    p.totalGlobalMem = memory_limit();
    p.warpSize = if arch_base().starts_with("gfx11") {
        32
    } else {
        64
    };
    p.maxThreadsPerBlock = 1024;
    p.multiProcessorCount = 8;
    p.sharedMemPerBlock = SHARED_MEM_PER_BLOCK;
    p.canMapHostMemory = 1;
    p.major = 9;
    p.minor = 4;
    HIP_SUCCESS
}

/// `hipGetErrorName`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipGetErrorName(status: u32) -> *const c_char {
    hip_name(status).as_ptr().cast()
}

/// `hipDeviceSynchronize`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipDeviceSynchronize() -> u32 {
    blocking();
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain_all();
    st.sticky_status()
}

/// `hipMalloc`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMalloc(ptr: *mut *mut c_void, bytes: usize) -> u32 {
    blocking();
    if ptr.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    if bytes == 0 {
        // SAFETY: non-null out-pointer per the HIP contract.
        return unsafe { put(ptr, std::ptr::null_mut()) };
    }
    if st.device_bytes.saturating_add(bytes) > memory_limit() {
        return HIP_ERROR_OUT_OF_MEMORY;
    }
    let Some(addr) = mem::alloc(&mut st, bytes, Kind::Device) else {
        return HIP_ERROR_OUT_OF_MEMORY;
    };
    st.device_bytes += bytes;
    // SAFETY: as above.
    unsafe { put(ptr, addr as *mut c_void) }
}

/// Frees a device or pinned allocation after draining every stream (HIP's frees synchronise).
fn free_kind(addr: usize, want: Kind) -> u32 {
    if addr == 0 {
        return HIP_SUCCESS;
    }
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain_all();
    match st.allocs.get(&addr).map(|a| (a.kind, a.len)) {
        Some((kind, len)) if kind == want => {
            mem::free(&mut st, addr);
            if kind == Kind::Device {
                st.device_bytes -= len;
            }
            HIP_SUCCESS
        }
        _ => HIP_ERROR_INVALID_VALUE,
    }
}

/// `hipFree`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipFree(ptr: *mut c_void) -> u32 {
    blocking();
    free_kind(ptr as usize, Kind::Device)
}

/// `hipHostMalloc`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipHostMalloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint) -> u32 {
    blocking();
    // hipHostMallocPortable | hipHostMallocMapped | hipHostMallocCoherent | NonCoherent are known.
    if ptr.is_null() || bytes == 0 || flags & !(1 | 2 | 0x4000_0000 | 0x8000_0000) != 0 {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    let Some(addr) = mem::alloc(&mut st, bytes, Kind::Pinned) else {
        return HIP_ERROR_OUT_OF_MEMORY;
    };
    // SAFETY: non-null out-pointer per the HIP contract.
    unsafe { put(ptr, addr as *mut c_void) }
}

/// `hipHostFree`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipHostFree(ptr: *mut c_void) -> u32 {
    blocking();
    free_kind(ptr as usize, Kind::Pinned)
}

/// `hipHostGetDevicePointer`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipHostGetDevicePointer(
    dev: *mut *mut c_void,
    host: *mut c_void,
    flags: c_uint,
) -> u32 {
    if flags != 0 {
        return HIP_ERROR_INVALID_VALUE;
    }
    let st = state();
    // Any address inside pinned or registered memory maps to itself (the double's device sees
    // host memory at the same address).
    match st.find(host as usize, 0) {
        // SAFETY: HIP contract: `dev` is a valid out-pointer.
        Some((_, a)) if Kind::HOST.contains(&a.kind) => unsafe { put(dev, host) },
        _ => HIP_ERROR_INVALID_VALUE,
    }
}

/// `hipHostRegister`, as HIP documents it, on the double's host-memory device (crate docs): the
/// caller's host memory becomes pinned and mapped at the same address.
#[unsafe(no_mangle)]
pub extern "C" fn hipHostRegister(host: *mut c_void, bytes: usize, flags: c_uint) -> u32 {
    blocking();
    // hipHostRegisterDefault | Portable | Mapped | IoMemory | ReadOnly.
    if host.is_null() || bytes == 0 || flags & !(1 | 2 | 4 | 8) != 0 {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    match mem::register(&mut st, host as usize, bytes) {
        Ok(()) => HIP_SUCCESS,
        Err(Kind::Device) => HIP_ERROR_INVALID_VALUE,
        Err(_) => HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    }
}

/// `hipHostUnregister`, as HIP documents it, on the double's host-memory device (crate docs).
/// Waits for all queued work first, so nothing reads the memory after it is unpinned.
#[unsafe(no_mangle)]
pub extern "C" fn hipHostUnregister(host: *mut c_void) -> u32 {
    blocking();
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain_all();
    match st.allocs.get(&(host as usize)).map(|a| a.kind) {
        Some(Kind::Registered) => {
            mem::free(&mut st, host as usize);
            HIP_SUCCESS
        }
        _ => HIP_ERROR_HOST_MEMORY_NOT_REGISTERED,
    }
}

/// `hipMemGetInfo`, as HIP documents it, on the double's host-memory device (crate docs): the
/// device memory limit and what `hipMalloc` has not taken of it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> u32 {
    let limit = memory_limit();
    let used = state().device_bytes;
    // SAFETY: HIP contract: both are valid out-pointers (null is refused by `put`).
    let s = unsafe { put(free, limit.saturating_sub(used)) };
    if s != HIP_SUCCESS {
        return s;
    }
    // SAFETY: as above.
    unsafe { put(total, limit) }
}

/// `hipMemGetAddressRange`, as HIP documents it, on the double's host-memory device (crate
/// docs): base and size of the device allocation holding `ptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemGetAddressRange(
    base: *mut *mut c_void,
    size: *mut usize,
    ptr: *mut c_void,
) -> u32 {
    let st = state();
    let Some((start, a)) = st.find(ptr as usize, 0) else {
        return HIP_ERROR_NOT_FOUND;
    };
    if a.kind != Kind::Device {
        return HIP_ERROR_NOT_FOUND;
    }
    // SAFETY: HIP contract: valid out-pointers (null is refused by `put`).
    let s = unsafe { put(base, start as *mut c_void) };
    if s != HIP_SUCCESS {
        return s;
    }
    // SAFETY: as above.
    unsafe { put(size, a.len) }
}

/// `hipPointerGetAttributes`, as HIP 6 documents it, on the double's host-memory device (crate
/// docs): device memory is `hipMemoryTypeDevice`, pinned and registered host memory
/// `hipMemoryTypeHost` (mapped at the same address), anything else `hipMemoryTypeUnregistered`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipPointerGetAttributes(
    attributes: *mut cubecl_hip_sys::hipPointerAttribute_t,
    ptr: *const c_void,
) -> u32 {
    if attributes.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    let st = state();
    let addr = ptr as usize;
    let (memory_type, device, host) = match st.find(addr, 0).map(|(_, a)| a.kind) {
        Some(Kind::Device) => (2, 0, std::ptr::null_mut()),
        Some(Kind::Pinned | Kind::Registered) => (1, 0, ptr.cast_mut()),
        None => (0, -1, std::ptr::null_mut()),
    };
    let value = cubecl_hip_sys::hipPointerAttribute_t {
        type_: memory_type,
        device,
        devicePointer: if memory_type == 0 {
            std::ptr::null_mut()
        } else {
            ptr.cast_mut()
        },
        hostPointer: host,
        isManaged: 0,
        allocationFlags: 0,
    };
    // SAFETY: HIP contract: `attributes` points at a writable hipPointerAttribute_t (non-null,
    // checked).
    unsafe { put(attributes, value) }
}

/// `hipStreamGetDevice`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipStreamGetDevice(stream: *mut c_void, device: *mut c_int) -> u32 {
    let mut st = state();
    if let Err(s) = st.stream(stream as usize) {
        return s;
    }
    let current = CURRENT.with(Cell::get);
    // SAFETY: HIP contract: valid out-pointer (null is refused by `put`).
    unsafe { put(device, current) }
}

/// `hipMemset`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipMemset(dst: *mut c_void, value: c_int, bytes: usize) -> u32 {
    blocking();
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain_all();
    if let Err(s) = st.check_range(dst as usize, bytes, &[Kind::Device]) {
        return s;
    }
    mem::write(&st, dst as usize, &vec![value as u8; bytes]);
    st.sticky_status()
}

/// `hipMemsetAsync`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipMemsetAsync(
    dst: *mut c_void,
    value: c_int,
    bytes: usize,
    stream: *mut c_void,
) -> u32 {
    let mut st = state();
    if let Err(s) = st.check_range(dst as usize, bytes, &[Kind::Device]) {
        return s;
    }
    let op = Op::Fill {
        dst: dst as usize,
        value: value as u8,
        len: bytes,
    };
    enqueue_bytes(&mut st, stream, bytes, op)
}

/// Enqueues an asynchronous memset or copy of `bytes` bytes on `stream`, its ranges checked; an
/// empty one enqueues nothing and only checks the stream.
fn enqueue_bytes(st: &mut State, stream: *mut c_void, bytes: usize, op: Op) -> u32 {
    if bytes == 0 {
        return st
            .stream(stream as usize)
            .map_or_else(|e| e, |_| HIP_SUCCESS);
    }
    match st.enqueue(stream as usize, op) {
        Ok(()) => HIP_SUCCESS,
        Err(e) => e,
    }
}

/// Which allocation kinds each side of a copy may use: `(dst, src)`; `None` = unregistered host
/// memory is allowed (synchronous copies only).
fn sides(kind: c_uint) -> Option<(&'static [Kind], &'static [Kind])> {
    const HOST: &[Kind] = Kind::HOST;
    const ANY: &[Kind] = &[Kind::Device, Kind::Pinned, Kind::Registered];
    Some(match kind {
        0 => (HOST, HOST),
        1 => (ANY, HOST),
        2 => (HOST, ANY),
        3 => (ANY, ANY),
        4 => (ANY, ANY),
        _ => return None,
    })
}

/// `hipMemcpy`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_uint,
) -> u32 {
    blocking();
    let Some((dk, sk)) = sides(kind) else {
        return HIP_ERROR_INVALID_VALUE;
    };
    let mut st = state();
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain_all();
    if bytes == 0 {
        return st.sticky_status();
    }
    let (d, s) = (dst as usize, src as usize);
    // A side declared "host" may be pageable memory for a synchronous copy.
    let src_registered = st.check_range(s, bytes, sk).is_ok();
    let dst_registered = st.check_range(d, bytes, dk).is_ok();
    if (!src_registered && sk != Kind::HOST) || (!dst_registered && dk != Kind::HOST) {
        return HIP_ERROR_INVALID_VALUE;
    }
    let data = if src_registered {
        mem::read(&st, s, bytes)
    } else {
        // SAFETY: HIP contract of hipMemcpy: `src` is readable for `bytes`.
        unsafe { mem::read_host(src.cast(), bytes) }
    };
    if dst_registered {
        mem::write(&st, d, &data);
    } else {
        // SAFETY: HIP contract of hipMemcpy: `dst` is writable for `bytes`.
        unsafe { mem::write_host(dst.cast(), &data) };
    }
    st.sticky_status()
}

/// `hipMemcpyAsync`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_uint,
    stream: *mut c_void,
) -> u32 {
    let Some((dk, sk)) = sides(kind) else {
        return HIP_ERROR_INVALID_VALUE;
    };
    let mut st = state();
    if let Err(s) = st
        .check_range(dst as usize, bytes, dk)
        .and_then(|_| st.check_range(src as usize, bytes, sk))
    {
        return s;
    }
    let op = Op::Copy {
        dst: dst as usize,
        src: src as usize,
        len: bytes,
    };
    enqueue_bytes(&mut st, stream, bytes, op)
}

/// `hipStreamCreateWithFlags`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipStreamCreateWithFlags(stream: *mut *mut c_void, flags: c_uint) -> u32 {
    blocking();
    if flags > 1 {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    let h = st.handle();
    st.streams.insert(h, Default::default());
    // SAFETY: HIP contract: valid out-pointer.
    unsafe { put(stream, h as *mut c_void) }
}

/// `hipStreamDestroy`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipStreamDestroy(stream: *mut c_void) -> u32 {
    let mut st = state();
    let h = stream as usize;
    if h == 0 || !st.streams.contains_key(&h) {
        return HIP_ERROR_INVALID_HANDLE;
    }
    // Pending work completes before the stream goes away.
    st.drain(h);
    st.streams.remove(&h);
    HIP_SUCCESS
}

/// `hipStreamSynchronize`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipStreamSynchronize(stream: *mut c_void) -> u32 {
    blocking();
    let mut st = state();
    let h = stream as usize;
    match st.stream(h) {
        Err(s) => return s,
        Ok(s) => {
            // A stream being captured cannot be waited for: its work runs only at replay.
            if let Some(c) = s.capture.as_mut() {
                c.invalidated = true;
                return HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            }
        }
    }
    if let Err(s) = graph::unsafe_call(&mut st) {
        return s;
    }
    st.drain(h);
    st.sticky_status()
}

/// `hipEventCreateWithFlags`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipEventCreateWithFlags(event: *mut *mut c_void, flags: c_uint) -> u32 {
    blocking();
    // hipEventDefault | hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess.
    if flags & !0x7 != 0 || event.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    let h = st.handle();
    st.events.insert(h, None);
    // SAFETY: HIP contract: valid (non-null, checked) out-pointer.
    unsafe { put(event, h as *mut c_void) }
}

/// `hipEventRecord`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipEventRecord(event: *mut c_void, stream: *mut c_void) -> u32 {
    let mut st = state();
    let (seq, captured) = match st.stream(stream as usize) {
        Ok(s) => (s.enqueued, s.capture.is_some()),
        Err(e) => return e,
    };
    if !st.events.contains_key(&(event as usize)) {
        return HIP_ERROR_INVALID_HANDLE;
    }
    if captured {
        // The event becomes part of the graph.
        st.captured_events.insert(event as usize);
        return HIP_SUCCESS;
    }
    st.captured_events.remove(&(event as usize));
    match st.events.get_mut(&(event as usize)) {
        Some(slot) => {
            *slot = Some((stream as usize, seq));
            HIP_SUCCESS
        }
        None => HIP_ERROR_INVALID_HANDLE,
    }
}

/// `hipStreamWaitEvent`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    flags: c_uint,
) -> u32 {
    if flags != 0 {
        return HIP_ERROR_INVALID_VALUE;
    }
    let mut st = state();
    let Some(&recorded) = st.events.get(&(event as usize)) else {
        return HIP_ERROR_INVALID_HANDLE;
    };
    if st.captured_events.contains(&(event as usize)) {
        return HIP_ERROR_CAPTURED_EVENT;
    }
    // An event never recorded is complete: nothing to wait for.
    let Some((other, seq)) = recorded else {
        return st
            .stream(stream as usize)
            .map_or_else(|e| e, |_| HIP_SUCCESS);
    };
    match st.enqueue(stream as usize, Op::Wait { stream: other, seq }) {
        Ok(()) => HIP_SUCCESS,
        Err(e) => e,
    }
}

/// `hipEventQuery`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipEventQuery(event: *mut c_void) -> u32 {
    let mut st = state();
    let Some(&recorded) = st.events.get(&(event as usize)) else {
        return HIP_ERROR_INVALID_HANDLE;
    };
    if st.captured_events.contains(&(event as usize)) {
        return HIP_ERROR_CAPTURED_EVENT;
    }
    let Some((stream, seq)) = recorded else {
        return HIP_SUCCESS;
    };
    // Queued work runs only when something waits for it. A query of work still queued answers
    // "not ready" and lets the device make progress: the work up to the event runs now, so a
    // later query answers success (a GPU also finishes on its own; a poller must never spin
    // forever, nor see success before the work ran).
    let pending = st
        .stream(stream)
        .map(|s| s.queue.front().is_some_and(|&(next, _)| next <= seq))
        .unwrap_or(false);
    if pending {
        st.run_until(stream, seq);
        HIP_ERROR_NOT_READY
    } else {
        st.sticky_status()
    }
}

/// `hipEventDestroy`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipEventDestroy(event: *mut c_void) -> u32 {
    match state().events.remove(&(event as usize)) {
        Some(_) => HIP_SUCCESS,
        None => HIP_ERROR_INVALID_HANDLE,
    }
}

/// Reads a module image: an AMDGPU ELF code object for `device_arch` (a processor name such as
/// `gfx942`), or the double's hiprtc output for it. Returns the kernels it defines.
///
/// # Safety
/// `image` points at a complete image (HIP's contract of `hipModuleLoadData`).
unsafe fn read_image(image: *const u8, device_arch: &str) -> Result<Vec<String>, u32> {
    // SAFETY: every image format starts with at least 64 bytes (ELF header, or the 16-byte
    // marker plus its length word and payload); the caller passes a complete image.
    let head = unsafe { std::slice::from_raw_parts(image, 64) };
    if let Some(len) = rtc::marker_len(head) {
        // SAFETY: the marker records the full length of the blob hiprtc returned.
        let blob = unsafe { std::slice::from_raw_parts(image, len) };
        let (arch, kernels) = rtc::parse_marker(blob).ok_or(HIP_ERROR_INVALID_IMAGE)?;
        return if arch == device_arch {
            Ok(kernels)
        } else {
            Err(HIP_ERROR_NO_BINARY_FOR_GPU)
        };
    }
    let table_end = elf::header_extent(head).map_err(|_| HIP_ERROR_INVALID_IMAGE)?;
    // SAFETY: a complete ELF image holds its section header table.
    let with_table = unsafe { std::slice::from_raw_parts(image, table_end) };
    let len = elf::extent(with_table).map_err(|_| HIP_ERROR_INVALID_IMAGE)?;
    // SAFETY: a complete ELF image holds every section it declares.
    let whole = unsafe { std::slice::from_raw_parts(image, len) };
    let info = elf::parse(whole).map_err(|_| HIP_ERROR_INVALID_IMAGE)?;
    if info.machine != elf::EM_AMDGPU {
        return Err(HIP_ERROR_INVALID_IMAGE);
    }
    if Some(info.flags & elf::EF_AMDGPU_MACH) != elf::mach_of(device_arch) {
        return Err(HIP_ERROR_NO_BINARY_FOR_GPU);
    }
    Ok(hisparse_gpu_kernels_names()
        .filter(|k| info.has_kernel(k))
        .map(str::to_owned)
        .collect())
}

/// Every kernel name of the ABI table.
fn hisparse_gpu_kernels_names() -> impl Iterator<Item = &'static str> {
    exec::kernel_names()
}

/// `hipModuleLoadData`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> u32 {
    blocking();
    if module.is_null() || image.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: HIP contract: `image` is a complete image.
    let kernels = match unsafe { read_image(image.cast(), &arch_base()) } {
        Ok(k) => k,
        Err(s) => return s,
    };
    let mut st = state();
    let h = st.handle();
    st.modules.insert(h, Module { kernels });
    // SAFETY: non-null out-pointer (checked).
    unsafe { put(module, h as *mut c_void) }
}

/// `hipModuleUnload`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub extern "C" fn hipModuleUnload(module: *mut c_void) -> u32 {
    let mut st = state();
    st.drain_all();
    match st.modules.remove(&(module as usize)) {
        Some(_) => HIP_SUCCESS,
        None => HIP_ERROR_INVALID_HANDLE,
    }
}

/// `hipModuleGetFunction`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleGetFunction(
    function: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> u32 {
    if function.is_null() || name.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: HIP contract: `name` is NUL-terminated.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let mut st = state();
    let Some(m) = st.modules.get(&(module as usize)) else {
        return HIP_ERROR_INVALID_HANDLE;
    };
    if !m.kernels.iter().any(|k| *k == name) {
        return HIP_ERROR_NOT_FOUND;
    }
    let Some(index) = exec::kernel_index(&name) else {
        return HIP_ERROR_NOT_FOUND;
    };
    let h = st.handle();
    st.functions.insert(h, index);
    // SAFETY: non-null out-pointer (checked).
    unsafe { put(function, h as *mut c_void) }
}

/// Threads one compute unit of the double runs at once (CDNA: 2,048 work items a CU).
const MAX_THREADS_PER_MULTIPROCESSOR: usize = 2048;

/// `hipModuleOccupancyMaxActiveBlocksPerMultiprocessor`, as HIP documents it, on the double's
/// host-memory device (crate docs). The double has no registers to count: blocks are limited by
/// the compute unit's threads and, with `dynamic_shared` bytes, its LDS.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    function: *mut c_void,
    block_size: c_int,
    dynamic_shared: usize,
) -> u32 {
    if blocks.is_null() || block_size <= 0 || block_size > 1024 {
        return HIP_ERROR_INVALID_VALUE;
    }
    if !state().functions.contains_key(&(function as usize)) {
        return HIP_ERROR_INVALID_HANDLE;
    }
    let by_threads = MAX_THREADS_PER_MULTIPROCESSOR / block_size as usize;
    let by_shared = SHARED_MEM_PER_BLOCK
        .checked_div(dynamic_shared)
        .unwrap_or(usize::MAX);
    let n = by_threads.min(by_shared);
    // SAFETY: non-null out-pointer (checked).
    unsafe { put(blocks, n as c_int) }
}

/// `hipModuleLaunchKernel`, as HIP documents it, on the double's host-memory device (crate docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    function: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> u32 {
    let mut st = state();
    let Some(&index) = st.functions.get(&(function as usize)) else {
        return HIP_ERROR_INVALID_HANDLE;
    };
    let grid = [grid_x, grid_y, grid_z];
    let block = [block_x, block_y, block_z];
    let threads = u64::from(block_x) * u64::from(block_y) * u64::from(block_z);
    if grid.contains(&0)
        || threads == 0
        || threads > 1024
        || shared_bytes as usize > SHARED_MEM_PER_BLOCK
    {
        return HIP_ERROR_INVALID_CONFIGURATION;
    }
    if !extra.is_null() || params.is_null() {
        return HIP_ERROR_INVALID_VALUE;
    }
    // SAFETY: HIP contract: `params` holds one pointer per kernel parameter, each to a value of
    // the parameter's type, as declared by the ABI table the decoder follows.
    let launch = match unsafe { exec::decode(&st, index, grid, block, shared_bytes, params) } {
        Ok(l) => l,
        Err(s) => return s,
    };
    match st.enqueue(stream as usize, Op::Launch(launch)) {
        Ok(()) => HIP_SUCCESS,
        Err(e) => e,
    }
}

/// Kernel launches executed so far, by kernel name (for tests of the double loaded in-process).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hisparse_hip_double_launches(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: callers pass a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    state().launches.get(name.as_ref()).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(16))]
    struct Aligned<T: ?Sized>(T);
    static GFX90A: &Aligned<[u8]> = &Aligned(*include_bytes!("../../kernels/hisparse-gfx90a.co"));

    #[test]
    fn code_objects_load_only_on_their_processor() {
        let image = GFX90A.0.as_ptr();
        // SAFETY: a complete, 16-byte aligned code object embedded above.
        let kernels = unsafe { read_image(image, "gfx90a") }.unwrap();
        assert_eq!(kernels.len(), exec::kernel_names().count());
        // SAFETY: as above.
        let other = unsafe { read_image(image, "gfx942") };
        assert_eq!(other, Err(HIP_ERROR_NO_BINARY_FOR_GPU));
        let garbage = [0u8; 64];
        // SAFETY: 64 readable bytes, which is all a non-image is read for.
        let not_an_image = unsafe { read_image(garbage.as_ptr(), "gfx90a") };
        assert_eq!(not_an_image, Err(HIP_ERROR_INVALID_IMAGE));
    }
}
