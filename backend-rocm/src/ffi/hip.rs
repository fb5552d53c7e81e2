//! The loaded HIP runtime: the driver, its devices and their properties.

use std::ffi::{CStr, c_int};

use libloading::Library;

use super::{DeviceProp, HIP_SUCCESS, HipFns, HipStatus, PROP_BYTES, load_library};

/// The loaded HIP runtime.
pub struct Hip {
    pub(super) fns: HipFns,
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
}
