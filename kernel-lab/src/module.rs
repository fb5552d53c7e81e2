//! The lab's own CUDA modules: a source compiled with NVRTC and loaded into the primary context of
//! a backend's device (the one the backend retains), so the lab's kernels order with the
//! backend's work on its streams and are captured into its graphs like it. Nothing here is a
//! HiSparse production kernel: those are the backends'.

use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};
use hisparse_backend_cuda::{CudaDevice, CudaStream};

/// Why a lab kernel could not be compiled, loaded or launched.
#[derive(Debug)]
pub struct LabError(pub String);

impl std::fmt::Display for LabError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel lab: {}", self.0)
    }
}

impl std::error::Error for LabError {}

/// A driver failure of `what`, as a [`LabError`].
pub(crate) fn driver(what: &str) -> impl Fn(sys::CUresult) -> LabError + '_ {
    move |e| LabError(format!("{what}: {e:?}"))
}

/// Compiles `source` (named `name` in diagnostics) for the virtual architecture `arch` (e.g.
/// `compute_90`) with the backend's NVRTC options, and returns the PTX. Needs NVRTC, not a GPU.
pub fn compile(source: &str, name: &str, arch: &str) -> Result<String, LabError> {
    hisparse_backend_cuda::nvrtc::ensure().map_err(|e| LabError(e.to_string()))?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: hisparse_backend_cuda::nvrtc::options(arch),
        name: Some(name.into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| LabError(format!("{name} for {arch}: {e:?}")))
}

/// A kernel of a [`LabModule`] (only [`LabModule::function`] makes one, so it is always live: the
/// module is never unloaded).
#[derive(Clone, Copy, Debug)]
pub struct LabFunction(sys::CUfunction);

/// A PTX module loaded into the primary context of one device, for the life of the process (the
/// primary context outlives it).
pub struct LabModule {
    ctx: sys::CUcontext,
    module: sys::CUmodule,
}

impl LabModule {
    /// Loads `ptx` into the primary context of CUDA device `ordinal` (the one `dev` was opened
    /// on).
    pub fn load(_dev: &CudaDevice, ordinal: usize, ptx: &str) -> Result<LabModule, LabError> {
        let ptx = CString::new(ptx).map_err(|_| LabError("PTX contains NUL".into()))?;
        let ordinal = i32::try_from(ordinal).map_err(|_| LabError("ordinal".into()))?;
        let cu_dev = result::device::get(ordinal).map_err(|e| driver("cuDeviceGet")(e.0))?;
        // SAFETY: `cu_dev` comes from `cuDeviceGet`; the reference taken on the primary context
        // is never released, so the context stays alive while the process uses the module.
        let ctx = unsafe { result::primary_ctx::retain(cu_dev) }
            .map_err(|e| driver("cuDevicePrimaryCtxRetain")(e.0))?;
        // SAFETY: `ctx` is the live primary context retained above.
        unsafe { result::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent")(e.0))?;
        // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }
            .map_err(|e| driver("cuModuleLoadData")(e.0))?;
        Ok(LabModule { ctx, module })
    }

    /// The kernel `name` of the module.
    pub fn function(&self, name: &str) -> Result<LabFunction, LabError> {
        let cname = CString::new(name).map_err(|_| LabError("symbol".into()))?;
        // SAFETY: `self.module` was loaded by `load` and is never unloaded.
        unsafe { result::module::get_function(self.module, cname) }
            .map(LabFunction)
            .map_err(|e| driver("cuModuleGetFunction")(e.0))
    }

    /// Enqueues kernel `f` of this module on `stream`.
    ///
    /// # Safety
    /// `params` holds one pointer per parameter of `f`, each to a value of exactly the
    /// parameter's type and alive for the call; every device address among them stays valid
    /// until the launch completed on `stream`.
    pub unsafe fn launch(
        &self,
        f: LabFunction,
        grid: u32,
        block: u32,
        shared: u32,
        stream: &CudaStream,
        params: &mut [*mut c_void],
    ) -> Result<(), LabError> {
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.launch_2d(f, (grid, 1), block, shared, stream, params) }
    }

    /// Enqueues kernel `f` of this module on `stream` over a grid of `(x, y)` blocks.
    ///
    /// # Safety
    /// As [`LabModule::launch`].
    pub unsafe fn launch_2d(
        &self,
        f: LabFunction,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        stream: &CudaStream,
        params: &mut [*mut c_void],
    ) -> Result<(), LabError> {
        // SAFETY: `self.ctx` is the device's primary context, retained for the process.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| driver("cuCtxSetCurrent")(e.0))?;
        // SAFETY: the caller's contract; the stream belongs to the same context and outlives
        // the launch.
        unsafe {
            result::launch_kernel(
                f.0,
                (grid.0, grid.1, 1),
                (block, 1, 1),
                shared,
                stream.raw_handle(),
                params,
            )
        }
        .map_err(|e| driver("cuLaunchKernel")(e.0))
    }
}
