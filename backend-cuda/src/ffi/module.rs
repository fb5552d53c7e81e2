//! Loaded modules, their functions and kernel launches.

use std::ffi::{CStr, CString, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};

use super::{Context, Result, Stream, check};
use crate::error::CudaError;

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
