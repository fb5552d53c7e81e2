//! The HIP and hiprtc entry points this backend calls, loaded at run time.
//!
//! Every raw call of the crate lives here. Each wrapper returns the raw status (`hipError_t` or
//! `hiprtcResult`); [`crate::error`] turns statuses into typed errors.
//!
//! Why not `cubecl-hip-sys`'s functions: its generated wrappers panic when a library or symbol is
//! missing, and it loads both libraries eagerly. This table loads `libamdhip64` alone, resolves
//! every symbol up front (a missing one is a typed `NotFound` error, never a panic), and loads
//! `libhiprtc` only when no embedded code object fits the device. The crate's types
//! (`hipDeviceProp_tR0600`) are still used for the one struct whose layout matters.
//!
//! Search order for both libraries: `$ROCM_PATH/lib`, `$ROCM_PATH`, `$HIP_PATH/lib`, `$HIP_PATH`,
//! `/opt/rocm/lib`, then the dynamic loader's default path (`LD_LIBRARY_PATH`, ldconfig), each
//! trying the unversioned name, then `.so.7`, then `.so.6`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

use libloading::Library;

/// `hipError_t`.
pub type HipStatus = c_uint;
/// `hiprtcResult`.
pub type RtcStatus = c_uint;
/// An opaque HIP handle (`hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`,
/// `hiprtcProgram`).
pub type Handle = *mut c_void;

/// `hipSuccess`.
pub const HIP_SUCCESS: HipStatus = 0;
/// `HIPRTC_SUCCESS`.
pub const RTC_SUCCESS: RtcStatus = 0;
/// `hipErrorNotReady`: the queried work has not completed yet.
pub const HIP_ERROR_NOT_READY: HipStatus = 600;
/// `hipStreamNonBlocking`: the stream does not synchronise with the null stream.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipHostMallocMapped`: pinned memory mapped into the device address space.
pub const HOST_MALLOC_MAPPED: c_uint = 2;
/// `hipHostMallocPortable`: usable from every device.
pub const HOST_MALLOC_PORTABLE: c_uint = 1;
/// `hipHostRegisterPortable`: the registration is visible to every device.
pub const HOST_REGISTER_PORTABLE: c_uint = 1;
/// `hipHostRegisterMapped`: map the registered memory into the device address space.
pub const HOST_REGISTER_MAPPED: c_uint = 2;
/// `hipMemoryTypeUnregistered` (HIP 6): memory the runtime does not know.
pub const MEMORY_TYPE_UNREGISTERED: c_uint = 0;
/// `hipMemoryTypeHost` (HIP 6): pinned host memory.
pub const MEMORY_TYPE_HOST: c_uint = 1;
/// `hipMemoryTypeDevice` (HIP 6): device memory.
pub const MEMORY_TYPE_DEVICE: c_uint = 2;
/// `hipErrorInvalidValue`.
pub const HIP_ERROR_INVALID_VALUE: HipStatus = 1;
/// `hipErrorHostMemoryAlreadyRegistered`.
pub const HIP_ERROR_HOST_MEMORY_ALREADY_REGISTERED: HipStatus = 712;
/// `hipStreamCaptureStatusNone`: the stream is not being captured.
pub const CAPTURE_STATUS_NONE: c_int = 0;
/// `hipStreamCaptureModeRelaxed`: no call is refused because of a capture.
pub const CAPTURE_MODE_RELAXED: c_int = 2;

/// `hipMemcpyKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MemcpyKind {
    /// `hipMemcpyHostToDevice`.
    HostToDevice = 1,
    /// `hipMemcpyDeviceToHost`.
    DeviceToHost = 2,
    /// `hipMemcpyDeviceToDevice`.
    DeviceToDevice = 3,
}

/// `hipDeviceProp_tR0600`, the layout filled by `hipGetDevicePropertiesR0600` (HIP 6.0 and later;
/// identical in every binding set of `cubecl-hip-sys` 7.14).
pub type DeviceProp = cubecl_hip_sys::hipDeviceProp_tR0600;

/// `hipPointerAttribute_t`, the layout filled by `hipPointerGetAttributes` (identical in every
/// binding set of `cubecl-hip-sys` 7.14).
pub type PointerAttribute = cubecl_hip_sys::hipPointerAttribute_t;

/// What the runtime knows about an address (`hipPointerGetAttributes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    /// `hipMemoryType` (HIP 6 values, [`MEMORY_TYPE_HOST`], [`MEMORY_TYPE_DEVICE`], ...);
    /// [`MEMORY_TYPE_UNREGISTERED`] also when the runtime refuses the query for an unknown
    /// address (HIP 5 did).
    pub memory_type: c_uint,
    /// The device the memory belongs to.
    pub device: c_int,
}

/// Bytes reserved for the device-property struct: its size plus slack, so a runtime whose struct
/// grew at the end cannot write past our buffer.
const PROP_BYTES: usize = std::mem::size_of::<DeviceProp>() + 4096;

/// Names of the loaded library files, for reports.
fn library_names(stem: &str) -> [String; 3] {
    [
        format!("lib{stem}.so"),
        format!("lib{stem}.so.7"),
        format!("lib{stem}.so.6"),
    ]
}

fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib"));
            dirs.push(root);
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs
}

/// Loads `lib<stem>.so` from the search path. Returns the library and the path it came from, or
/// a message listing every attempt.
fn load_library(stem: &str) -> Result<(Library, String), String> {
    let names = library_names(stem);
    let mut tried = Vec::new();
    for dir in search_dirs() {
        for name in &names {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            // SAFETY: loading a shared library runs its initialisers. We only load the HIP
            // runtime (or a library that stands in for it) from the documented search path; this
            // is the unavoidable contract of run-time loading.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Ok((lib, path.display().to_string())),
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
    }
    for name in &names {
        // SAFETY: as above; the dynamic loader resolves the bare name on its default path.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "could not load lib{stem}.so (install ROCm, or set ROCM_PATH to its root): {}",
        tried.join("; ")
    ))
}

/// Declares a table of function pointers resolved from one library.
macro_rules! fn_table {
    ($(#[$meta:meta])* $table:ident { $($name:ident: fn($($arg:ty),*) -> $ret:ty;)* }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        struct $table {
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $table {
            /// Resolves every symbol of the table, naming the first one missing.
            fn resolve(lib: &Library) -> Result<Self, String> {
                Ok(Self {
                    $($name: {
                        let symbol = concat!(stringify!($name), "\0").as_bytes();
                        // SAFETY: the symbol is declared by the HIP headers with exactly the
                        // signature of this field (see the table below); the pointer is copied
                        // out and used only while `lib` stays loaded (it is stored beside it).
                        let f = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(symbol) };
                        *f.map_err(|e| format!("symbol `{}` is missing: {e}", stringify!($name)))?
                    },)*
                })
            }
        }
    };
}

fn_table! {
    /// The HIP runtime entry points the backend calls (C signatures from `hip_runtime_api.h`).
    HipFns {
        hipInit: fn(c_uint) -> HipStatus;
        hipGetDeviceCount: fn(*mut c_int) -> HipStatus;
        hipSetDevice: fn(c_int) -> HipStatus;
        hipGetDevicePropertiesR0600: fn(*mut c_void, c_int) -> HipStatus;
        hipRuntimeGetVersion: fn(*mut c_int) -> HipStatus;
        hipGetErrorName: fn(HipStatus) -> *const c_char;
        hipDeviceSynchronize: fn() -> HipStatus;
        hipMalloc: fn(*mut *mut c_void, usize) -> HipStatus;
        hipFree: fn(*mut c_void) -> HipStatus;
        hipHostMalloc: fn(*mut *mut c_void, usize, c_uint) -> HipStatus;
        hipHostFree: fn(*mut c_void) -> HipStatus;
        hipHostGetDevicePointer: fn(*mut *mut c_void, *mut c_void, c_uint) -> HipStatus;
        hipHostRegister: fn(*mut c_void, usize, c_uint) -> HipStatus;
        hipHostUnregister: fn(*mut c_void) -> HipStatus;
        hipMemGetInfo: fn(*mut usize, *mut usize) -> HipStatus;
        hipMemGetAddressRange: fn(*mut *mut c_void, *mut usize, *mut c_void) -> HipStatus;
        hipPointerGetAttributes: fn(*mut c_void, *const c_void) -> HipStatus;
        hipStreamGetDevice: fn(Handle, *mut c_int) -> HipStatus;
        hipStreamIsCapturing: fn(Handle, *mut c_int) -> HipStatus;
        hipThreadExchangeStreamCaptureMode: fn(*mut c_int) -> HipStatus;
        hipMemset: fn(*mut c_void, c_int, usize) -> HipStatus;
        hipMemsetAsync: fn(*mut c_void, c_int, usize, Handle) -> HipStatus;
        hipMemcpy: fn(*mut c_void, *const c_void, usize, c_uint) -> HipStatus;
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_uint, Handle) -> HipStatus;
        hipStreamCreateWithFlags: fn(*mut Handle, c_uint) -> HipStatus;
        hipStreamDestroy: fn(Handle) -> HipStatus;
        hipStreamSynchronize: fn(Handle) -> HipStatus;
        hipStreamWaitEvent: fn(Handle, Handle, c_uint) -> HipStatus;
        hipEventCreateWithFlags: fn(*mut Handle, c_uint) -> HipStatus;
        hipEventRecord: fn(Handle, Handle) -> HipStatus;
        hipEventQuery: fn(Handle) -> HipStatus;
        hipEventDestroy: fn(Handle) -> HipStatus;
        hipModuleLoadData: fn(*mut Handle, *const c_void) -> HipStatus;
        hipModuleUnload: fn(Handle) -> HipStatus;
        hipModuleGetFunction: fn(*mut Handle, Handle, *const c_char) -> HipStatus;
        hipModuleLaunchKernel: fn(
            Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle,
            *mut *mut c_void, *mut *mut c_void
        ) -> HipStatus;
    }
}

fn_table! {
    /// The hiprtc entry points the backend calls (C signatures from `hiprtc.h`).
    RtcFns {
        hiprtcCreateProgram: fn(
            *mut Handle, *const c_char, *const c_char, c_int, *const *const c_char,
            *const *const c_char
        ) -> RtcStatus;
        hiprtcCompileProgram: fn(Handle, c_int, *const *const c_char) -> RtcStatus;
        hiprtcGetProgramLogSize: fn(Handle, *mut usize) -> RtcStatus;
        hiprtcGetProgramLog: fn(Handle, *mut c_char) -> RtcStatus;
        hiprtcGetCodeSize: fn(Handle, *mut usize) -> RtcStatus;
        hiprtcGetCode: fn(Handle, *mut c_char) -> RtcStatus;
        hiprtcDestroyProgram: fn(*mut Handle) -> RtcStatus;
        hiprtcGetErrorString: fn(RtcStatus) -> *const c_char;
    }
}

/// The loaded HIP runtime.
pub struct Hip {
    fns: HipFns,
    /// Where the runtime was loaded from.
    pub path: String,
    // Declared last: dropped after the function pointers that point into it.
    _lib: Library,
}

// SAFETY: the table holds plain function pointers into a library that stays loaded for the life of
// the value; the HIP runtime API is thread-safe (every entry point may be called from any thread).
unsafe impl Send for Hip {}
// SAFETY: as above; `&Hip` only exposes calls into the thread-safe HIP API.
unsafe impl Sync for Hip {}

/// Device properties the backend uses.
#[derive(Clone, Debug)]
pub struct Props {
    /// Marketing name.
    pub name: String,
    /// Full architecture name, e.g. `gfx942:sramecc+:xnack-`.
    pub gcn_arch_name: String,
    /// Device memory in bytes.
    pub total_global_mem: usize,
    /// Shared memory (LDS) one block may use, in bytes.
    pub shared_mem_per_block: usize,
    /// Shared memory (LDS) of one compute unit, in bytes (0 when the runtime does not say).
    pub shared_mem_per_multiprocessor: usize,
    /// Compute units.
    pub multiprocessors: u32,
    /// PCI address, `domain:bus:device.0` (to find the NUMA node).
    pub pci_bus_id: String,
    /// Whether the device reaches registered host memory at its host address
    /// (`canUseHostPointerForRegisteredMem`).
    pub host_pointer_registration: bool,
}

fn c_string_at(bytes: &[u8], offset: usize, max: usize) -> String {
    let field = &bytes[offset..offset + max];
    let end = field.iter().position(|&b| b == 0).unwrap_or(max);
    String::from_utf8_lossy(&field[..end]).into_owned()
}

impl Hip {
    /// Loads `libamdhip64` and resolves every entry point.
    pub fn load() -> Result<Hip, String> {
        let (lib, path) = load_library("amdhip64")?;
        let fns = HipFns::resolve(&lib).map_err(|e| format!("{path}: {e}"))?;
        Ok(Hip {
            fns,
            path,
            _lib: lib,
        })
    }

    /// `hipGetErrorName`, or the number when the runtime has no name for it.
    pub fn error_name(&self, status: HipStatus) -> String {
        // SAFETY: `hipGetErrorName` accepts any value and returns a pointer to a static string
        // (or null).
        let p = unsafe { (self.fns.hipGetErrorName)(status) };
        if p.is_null() {
            return format!("hipError {status}");
        }
        // SAFETY: non-null pointers from `hipGetErrorName` are NUL-terminated static strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `hipInit(0)`.
    pub fn init(&self) -> HipStatus {
        // SAFETY: no pointers; callable at any time.
        unsafe { (self.fns.hipInit)(0) }
    }

    /// `hipGetDeviceCount`.
    pub fn device_count(&self) -> Result<c_int, HipStatus> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable `int`.
        let s = unsafe { (self.fns.hipGetDeviceCount)(&mut n) };
        if s == HIP_SUCCESS { Ok(n) } else { Err(s) }
    }

    /// `hipSetDevice` (per calling thread).
    pub fn set_device(&self, ordinal: c_int) -> HipStatus {
        // SAFETY: no pointers; an invalid ordinal is reported as a status.
        unsafe { (self.fns.hipSetDevice)(ordinal) }
    }

    /// `hipRuntimeGetVersion`.
    pub fn runtime_version(&self) -> Result<c_int, HipStatus> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid, writable `int`.
        let s = unsafe { (self.fns.hipRuntimeGetVersion)(&mut v) };
        if s == HIP_SUCCESS { Ok(v) } else { Err(s) }
    }

    /// `hipGetDevicePropertiesR0600`, reduced to the fields the backend uses.
    pub fn properties(&self, ordinal: c_int) -> Result<Props, HipStatus> {
        // u64 storage: 8-byte alignment, as the struct requires.
        let mut storage = vec![0u64; PROP_BYTES.div_ceil(8)];
        // SAFETY: `storage` is zeroed, 8-byte aligned and larger than `hipDeviceProp_tR0600`
        // (plus 4 KiB of slack); the runtime writes at most the struct.
        let s =
            unsafe { (self.fns.hipGetDevicePropertiesR0600)(storage.as_mut_ptr().cast(), ordinal) };
        if s != HIP_SUCCESS {
            return Err(s);
        }
        let bytes: Vec<u8> = storage.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let usize_at = |at: usize| {
            let mut v = [0u8; std::mem::size_of::<usize>()];
            let n = v.len();
            v.copy_from_slice(&bytes[at..at + n]);
            usize::from_ne_bytes(v)
        };
        let int_at = |at: usize| {
            let mut v = [0u8; 4];
            v.copy_from_slice(&bytes[at..at + 4]);
            i32::from_ne_bytes(v)
        };
        Ok(Props {
            name: c_string_at(&bytes, std::mem::offset_of!(DeviceProp, name), 256),
            gcn_arch_name: c_string_at(&bytes, std::mem::offset_of!(DeviceProp, gcnArchName), 256),
            total_global_mem: usize_at(std::mem::offset_of!(DeviceProp, totalGlobalMem)),
            shared_mem_per_block: usize_at(std::mem::offset_of!(DeviceProp, sharedMemPerBlock)),
            shared_mem_per_multiprocessor: usize_at(std::mem::offset_of!(
                DeviceProp,
                maxSharedMemoryPerMultiProcessor
            )),
            multiprocessors: int_at(std::mem::offset_of!(DeviceProp, multiProcessorCount)).max(1)
                as u32,
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}.0",
                int_at(std::mem::offset_of!(DeviceProp, pciDomainID)),
                int_at(std::mem::offset_of!(DeviceProp, pciBusID)),
                int_at(std::mem::offset_of!(DeviceProp, pciDeviceID))
            ),
            host_pointer_registration: int_at(std::mem::offset_of!(
                DeviceProp,
                canUseHostPointerForRegisteredMem
            )) != 0,
        })
    }

    /// `hipDeviceSynchronize`.
    pub fn device_synchronize(&self) -> HipStatus {
        // SAFETY: no pointers.
        unsafe { (self.fns.hipDeviceSynchronize)() }
    }

    /// `hipMalloc`: returns the device address.
    pub fn malloc(&self, bytes: usize) -> Result<*mut c_void, HipStatus> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let s = unsafe { (self.fns.hipMalloc)(&mut p, bytes) };
        if s == HIP_SUCCESS { Ok(p) } else { Err(s) }
    }

    /// `hipFree` (synchronises the device first, per the HIP documentation).
    ///
    /// # Safety
    /// `ptr` was returned by [`Hip::malloc`] and is not used afterwards.
    pub unsafe fn free(&self, ptr: *mut c_void) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipFree)(ptr) }
    }

    /// `hipHostMalloc` with `flags`.
    pub fn host_malloc(&self, bytes: usize, flags: c_uint) -> Result<*mut c_void, HipStatus> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        let s = unsafe { (self.fns.hipHostMalloc)(&mut p, bytes, flags) };
        if s == HIP_SUCCESS { Ok(p) } else { Err(s) }
    }

    /// `hipHostFree` (synchronises the device first).
    ///
    /// # Safety
    /// `ptr` was returned by [`Hip::host_malloc`] and is not used afterwards.
    pub unsafe fn host_free(&self, ptr: *mut c_void) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipHostFree)(ptr) }
    }

    /// `hipHostGetDevicePointer`: the device address of mapped pinned memory.
    pub fn host_device_pointer(&self, host: *mut c_void) -> Result<*mut c_void, HipStatus> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; `host` is only looked up, not dereferenced.
        let s = unsafe { (self.fns.hipHostGetDevicePointer)(&mut p, host, 0) };
        if s == HIP_SUCCESS { Ok(p) } else { Err(s) }
    }

    /// `hipHostRegister(host, bytes, flags)`: page-locks memory someone else allocated.
    ///
    /// # Safety
    /// `[host, host + bytes)` is live host memory that stays allocated until
    /// [`Hip::host_unregister`].
    pub unsafe fn host_register(
        &self,
        host: *mut c_void,
        bytes: usize,
        flags: c_uint,
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipHostRegister)(host, bytes, flags) }
    }

    /// `hipHostUnregister`.
    ///
    /// # Safety
    /// `host` was registered with [`Hip::host_register`] and no work uses it any more.
    pub unsafe fn host_unregister(&self, host: *mut c_void) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipHostUnregister)(host) }
    }

    /// `hipMemGetInfo`: `(free, total)` bytes of the current device.
    pub fn mem_info(&self) -> Result<(usize, usize), HipStatus> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers.
        let s = unsafe { (self.fns.hipMemGetInfo)(&mut free, &mut total) };
        if s == HIP_SUCCESS {
            Ok((free, total))
        } else {
            Err(s)
        }
    }

    /// `hipMemGetAddressRange`: `(base, size)` of the device allocation holding `ptr`.
    pub fn address_range(&self, ptr: *mut c_void) -> Result<(usize, usize), HipStatus> {
        let (mut base, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: both are valid out-pointers; the runtime only looks `ptr` up.
        let s = unsafe { (self.fns.hipMemGetAddressRange)(&mut base, &mut size, ptr) };
        if s == HIP_SUCCESS {
            Ok((base as usize, size))
        } else {
            Err(s)
        }
    }

    /// `hipPointerGetAttributes`, reduced to the memory type and device. An address the runtime
    /// does not know is [`MEMORY_TYPE_UNREGISTERED`] (HIP 6 answers so; HIP 5 refused with
    /// `hipErrorInvalidValue`, mapped to the same).
    pub fn pointer_info(&self, ptr: *const c_void) -> Result<PointerInfo, HipStatus> {
        let mut storage = vec![0u64; std::mem::size_of::<PointerAttribute>().div_ceil(8) + 8];
        // SAFETY: `storage` is zeroed, 8-byte aligned and larger than `hipPointerAttribute_t`;
        // the runtime writes at most the struct and only looks `ptr` up.
        let s = unsafe { (self.fns.hipPointerGetAttributes)(storage.as_mut_ptr().cast(), ptr) };
        if s == HIP_ERROR_INVALID_VALUE {
            return Ok(PointerInfo {
                memory_type: MEMORY_TYPE_UNREGISTERED,
                device: -1,
            });
        }
        if s != HIP_SUCCESS {
            return Err(s);
        }
        let bytes: Vec<u8> = storage.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        Ok(PointerInfo {
            memory_type: u32_at(std::mem::offset_of!(PointerAttribute, type_)),
            device: u32_at(std::mem::offset_of!(PointerAttribute, device)) as c_int,
        })
    }

    /// `hipStreamGetDevice`: the device a stream belongs to.
    ///
    /// # Safety
    /// `stream` is a live stream handle or the null stream (the runtime dereferences it).
    pub unsafe fn stream_device(&self, stream: Handle) -> Result<c_int, HipStatus> {
        let mut d: c_int = -1;
        // SAFETY: `d` is a valid out-pointer; `stream` per the caller's contract.
        let s = unsafe { (self.fns.hipStreamGetDevice)(stream, &mut d) };
        if s == HIP_SUCCESS { Ok(d) } else { Err(s) }
    }

    /// `hipStreamIsCapturing`: the stream's capture status (`hipStreamCaptureStatus`;
    /// [`CAPTURE_STATUS_NONE`] when it is not being captured).
    pub fn stream_capture_status(&self, stream: Handle) -> Result<c_int, HipStatus> {
        let mut status: c_int = CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a valid out-pointer; the runtime reports an invalid stream as a
        // status.
        let s = unsafe { (self.fns.hipStreamIsCapturing)(stream, &mut status) };
        if s == HIP_SUCCESS { Ok(status) } else { Err(s) }
    }

    /// `hipThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to `*mode`
    /// and leaves its previous mode there.
    pub fn exchange_capture_mode(&self, mode: &mut c_int) -> HipStatus {
        // SAFETY: `mode` is a valid in/out pointer to a mode value.
        unsafe { (self.fns.hipThreadExchangeStreamCaptureMode)(mode) }
    }

    /// `hipMemset` (null stream).
    ///
    /// # Safety
    /// `[dst, dst + bytes)` lies in one device allocation.
    pub unsafe fn memset(&self, dst: *mut c_void, value: u8, bytes: usize) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipMemset)(dst, c_int::from(value), bytes) }
    }

    /// `hipMemsetAsync` on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + bytes)` lies in one device allocation that outlives the work on `stream`.
    pub unsafe fn memset_async(
        &self,
        dst: *mut c_void,
        value: u8,
        bytes: usize,
        stream: Handle,
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipMemsetAsync)(dst, c_int::from(value), bytes, stream) }
    }

    /// `hipMemcpy` (synchronous with respect to the host).
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` in the direction `kind` names.
    pub unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipMemcpy)(dst, src, bytes, kind as c_uint) }
    }

    /// `hipMemcpyAsync` on `stream`.
    ///
    /// # Safety
    /// Both ranges are device or pinned memory valid for `bytes`, and stay valid until the copy
    /// completes on `stream`.
    pub unsafe fn memcpy_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
        stream: Handle,
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipMemcpyAsync)(dst, src, bytes, kind as c_uint, stream) }
    }

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
    pub fn stream_create(&self) -> Result<Handle, HipStatus> {
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        let s = unsafe { (self.fns.hipStreamCreateWithFlags)(&mut h, STREAM_NON_BLOCKING) };
        if s == HIP_SUCCESS { Ok(h) } else { Err(s) }
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `stream` came from [`Hip::stream_create`] and is not used afterwards.
    pub unsafe fn stream_destroy(&self, stream: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipStreamDestroy)(stream) }
    }

    /// `hipStreamSynchronize`.
    pub fn stream_synchronize(&self, stream: Handle) -> HipStatus {
        // SAFETY: the handle is owned by a live `RocmStream`; an invalid one is reported as a
        // status by the runtime.
        unsafe { (self.fns.hipStreamSynchronize)(stream) }
    }

    /// `hipStreamWaitEvent(stream, event, 0)`.
    pub fn stream_wait_event(&self, stream: Handle, event: Handle) -> HipStatus {
        // SAFETY: both handles are owned by live backend objects.
        unsafe { (self.fns.hipStreamWaitEvent)(stream, event, 0) }
    }

    /// `hipEventCreateWithFlags(hipEventDisableTiming)`.
    pub fn event_create(&self) -> Result<Handle, HipStatus> {
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer.
        let s = unsafe { (self.fns.hipEventCreateWithFlags)(&mut h, EVENT_DISABLE_TIMING) };
        if s == HIP_SUCCESS { Ok(h) } else { Err(s) }
    }

    /// `hipEventRecord`.
    pub fn event_record(&self, event: Handle, stream: Handle) -> HipStatus {
        // SAFETY: both handles are owned by live backend objects.
        unsafe { (self.fns.hipEventRecord)(event, stream) }
    }

    /// `hipEventQuery`: `hipSuccess` once the recorded work completed, `hipErrorNotReady` before.
    pub fn event_query(&self, event: Handle) -> HipStatus {
        // SAFETY: the handle is owned by a live backend object.
        unsafe { (self.fns.hipEventQuery)(event) }
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `event` came from [`Hip::event_create`] and is not used afterwards.
    pub unsafe fn event_destroy(&self, event: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipEventDestroy)(event) }
    }

    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `image` points at a complete code object (or hiprtc output) that stays valid for the call.
    pub unsafe fn module_load_data(&self, image: *const c_void) -> Result<Handle, HipStatus> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `m` is a valid out-pointer; `image` per the caller's contract.
        let s = unsafe { (self.fns.hipModuleLoadData)(&mut m, image) };
        if s == HIP_SUCCESS { Ok(m) } else { Err(s) }
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `module` came from [`Hip::module_load_data`]; none of its functions is used afterwards.
    pub unsafe fn module_unload(&self, module: Handle) -> HipStatus {
        // SAFETY: forwarded from the caller's contract.
        unsafe { (self.fns.hipModuleUnload)(module) }
    }

    /// `hipModuleGetFunction`.
    pub fn module_get_function(&self, module: Handle, name: &CStr) -> Result<Handle, HipStatus> {
        let mut f = std::ptr::null_mut();
        // SAFETY: `f` is a valid out-pointer, `module` is a live module handle, and `name` is
        // NUL-terminated.
        let s = unsafe { (self.fns.hipModuleGetFunction)(&mut f, module, name.as_ptr()) };
        if s == HIP_SUCCESS { Ok(f) } else { Err(s) }
    }

    /// `hipModuleLaunchKernel` with a 1-D grid and block.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each pointing at a value of exactly the
    /// parameter's type; every device pointer among them stays valid until the launch completes
    /// on `stream`.
    pub unsafe fn launch(
        &self,
        function: Handle,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared_bytes: c_uint,
        stream: Handle,
        params: &mut [*mut c_void],
    ) -> HipStatus {
        // SAFETY: forwarded from the caller's contract; `extra` is null as HIP allows.
        unsafe {
            (self.fns.hipModuleLaunchKernel)(
                function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }
}

/// The loaded hiprtc library.
pub struct Rtc {
    fns: RtcFns,
    _lib: Library,
}

// SAFETY: plain function pointers into a library kept loaded by the value; hiprtc programs are
// only used by the thread that created them.
unsafe impl Send for Rtc {}
// SAFETY: as above.
unsafe impl Sync for Rtc {}

/// A compile failure: the hiprtc status, its name, and the compiler log.
#[derive(Debug)]
pub struct RtcFailure {
    /// Which hiprtc call failed.
    pub call: &'static str,
    /// Status name.
    pub status: String,
    /// Compiler log (may be empty).
    pub log: String,
}

impl Rtc {
    /// Loads `libhiprtc` and resolves every entry point.
    pub fn load() -> Result<Rtc, String> {
        let (lib, path) = load_library("hiprtc")?;
        let fns = RtcFns::resolve(&lib).map_err(|e| format!("{path}: {e}"))?;
        Ok(Rtc { fns, _lib: lib })
    }

    fn status_name(&self, s: RtcStatus) -> String {
        // SAFETY: accepts any value; returns a static string or null.
        let p = unsafe { (self.fns.hiprtcGetErrorString)(s) };
        if p.is_null() {
            return format!("hiprtcResult {s}");
        }
        // SAFETY: non-null results are NUL-terminated static strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Compiles `source` with `options`, returning the code object.
    pub fn compile(
        &self,
        source: &CStr,
        name: &CStr,
        options: &[&CStr],
    ) -> Result<Vec<u8>, RtcFailure> {
        let fail = |call, s, log| RtcFailure {
            call,
            status: self.status_name(s),
            log,
        };
        let mut prog: Handle = std::ptr::null_mut();
        // SAFETY: `prog` is a valid out-pointer; `source` and `name` are NUL-terminated; no
        // headers are passed (count 0, null arrays).
        let s = unsafe {
            (self.fns.hiprtcCreateProgram)(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if s != RTC_SUCCESS {
            return Err(fail("hiprtcCreateProgram", s, String::new()));
        }
        let result = self.compile_program(prog, options);
        // SAFETY: `prog` was created above and is not used after this call.
        unsafe { (self.fns.hiprtcDestroyProgram)(&mut prog) };
        result
    }

    fn compile_program(&self, prog: Handle, options: &[&CStr]) -> Result<Vec<u8>, RtcFailure> {
        let opts: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is a live program; `opts` holds `opts.len()` NUL-terminated strings that
        // outlive the call.
        let s =
            unsafe { (self.fns.hiprtcCompileProgram)(prog, opts.len() as c_int, opts.as_ptr()) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcCompileProgram",
                status: self.status_name(s),
                log: self.log(prog),
            });
        }
        let mut size = 0usize;
        // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
        let s = unsafe { (self.fns.hiprtcGetCodeSize)(prog, &mut size) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcGetCodeSize",
                status: self.status_name(s),
                log: String::new(),
            });
        }
        let mut code = vec![0u8; size];
        // SAFETY: `code` holds exactly the `size` bytes hiprtc reported.
        let s = unsafe { (self.fns.hiprtcGetCode)(prog, code.as_mut_ptr().cast()) };
        if s != RTC_SUCCESS {
            return Err(RtcFailure {
                call: "hiprtcGetCode",
                status: self.status_name(s),
                log: String::new(),
            });
        }
        Ok(code)
    }

    fn log(&self, prog: Handle) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is live; `size` is a valid out-pointer.
        if unsafe { (self.fns.hiprtcGetProgramLogSize)(prog, &mut size) } != RTC_SUCCESS {
            return String::new();
        }
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: `log` holds at least the `size` bytes hiprtc reported.
        if unsafe { (self.fns.hiprtcGetProgramLog)(prog, log.as_mut_ptr().cast()) } != RTC_SUCCESS {
            return String::new();
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).into_owned()
    }
}
