//! The driver, its devices and contexts.

use std::ffi::CStr;
use std::sync::Arc;

use cudarc::driver::sys;

use super::{Result, check};

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
