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
//!
//! This file holds the types, constants, library loading and the two function tables; the
//! wrappers are grouped by what they touch: `hip` (the runtime, devices, properties), `memory`
//! (allocation, registration, queries, fills and copies), `stream` (streams, capture, events),
//! `module` (code objects and launches) and `rtc` (hiprtc).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

use libloading::Library;

mod hip;
mod memory;
mod module;
mod rtc;
mod stream;

pub use hip::Hip;
pub use rtc::Rtc;

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
        hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: fn(
            *mut c_int, Handle, c_int, usize
        ) -> HipStatus;
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
