//! Device and host memory: allocation, registration, queries, fills and copies.

use std::ffi::{c_int, c_uint, c_void};

use super::{
    HIP_ERROR_INVALID_VALUE, HIP_SUCCESS, Handle, Hip, HipStatus, MEMORY_TYPE_UNREGISTERED,
    MemcpyKind, PointerAttribute, PointerInfo,
};

impl Hip {
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
}
