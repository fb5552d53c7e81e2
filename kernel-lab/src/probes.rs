//! The lab's measurement probes on CUDA (`kernels/probes.cu`): an empty kernel (the floor of a
//! launch) and a clock probe (sustained work that brings the clocks up, and the SM clock it ran
//! at). They are not HiSparse kernels, so no published crate carries them: the lab compiles them
//! with NVRTC itself and launches them on a backend stream through its raw handle, in the device's
//! primary context (the one the backend retains), so they order with the backend's work and are
//! captured into its graphs like it.

use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};
use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaStream};

/// The probes' source.
pub const SOURCE: &str = include_str!("../kernels/probes.cu");
/// Symbol of the empty kernel.
pub const EMPTY: &str = "lab_empty";
/// Symbol of the clock probe.
pub const CLOCK_PROBE: &str = "lab_clock_probe";

/// Why a probe could not be compiled, loaded or launched.
#[derive(Debug)]
pub struct ProbeError(String);

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lab probe: {}", self.0)
    }
}

impl std::error::Error for ProbeError {}

fn driver(what: &str) -> impl Fn(sys::CUresult) -> ProbeError + '_ {
    move |e| ProbeError(format!("{what}: {e:?}"))
}

/// Compiles [`SOURCE`] for the virtual architecture `arch` (e.g. `compute_90`) and returns the
/// PTX. Needs NVRTC (found as the backend finds it), not a GPU.
pub fn compile(arch: &str) -> Result<String, ProbeError> {
    hisparse_backend_cuda::nvrtc::ensure().map_err(|e| ProbeError(e.to_string()))?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("probes.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| ProbeError(format!("{arch}: {e:?}")))
}

/// The probes loaded into the primary context of one device.
pub struct Probes {
    ctx: sys::CUcontext,
    multiprocessors: u32,
    empty: sys::CUfunction,
    clock: sys::CUfunction,
}

impl Probes {
    /// Compiles and loads the probes for `dev`, CUDA device `ordinal` (the one it was opened on).
    /// The module stays loaded for the life of the process (the primary context outlives it).
    pub fn load(dev: &CudaDevice, ordinal: usize) -> Result<Probes, ProbeError> {
        let (major, minor) = dev.compute_capability();
        let ptx = CString::new(compile(&format!("compute_{major}{minor}"))?)
            .map_err(|_| ProbeError("PTX contains NUL".into()))?;
        let ordinal = i32::try_from(ordinal).map_err(|_| ProbeError("ordinal".into()))?;
        let cu_dev = result::device::get(ordinal).map_err(|e| driver("cuDeviceGet")(e.0))?;
        // SAFETY: `cu_dev` comes from `cuDeviceGet`; the reference taken on the primary context
        // is never released, so the context stays alive while the process uses the probes.
        let ctx = unsafe { result::primary_ctx::retain(cu_dev) }
            .map_err(|e| driver("cuDevicePrimaryCtxRetain")(e.0))?;
        // SAFETY: `ctx` is the live primary context retained above.
        unsafe { result::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent")(e.0))?;
        // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }
            .map_err(|e| driver("cuModuleLoadData")(e.0))?;
        let function = |name: &str| {
            let cname = CString::new(name).map_err(|_| ProbeError("symbol".into()))?;
            // SAFETY: `module` was loaded above and is never unloaded.
            unsafe { result::module::get_function(module, cname) }
                .map_err(|e| driver("cuModuleGetFunction")(e.0))
        };
        Ok(Probes {
            ctx,
            multiprocessors: dev.multiprocessor_count(),
            empty: function(EMPTY)?,
            clock: function(CLOCK_PROBE)?,
        })
    }

    fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        stream: &CudaStream,
        params: &mut [*mut c_void],
    ) -> Result<(), ProbeError> {
        // SAFETY: `self.ctx` is the device's primary context, retained for the process.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| driver("cuCtxSetCurrent")(e.0))?;
        // SAFETY: `f` is a live function of the probes' module; `params` holds one pointer per
        // parameter of `f` (the callers pass exactly its parameter list), each alive for the
        // call; the stream belongs to the same context and outlives the launch.
        unsafe {
            result::launch_kernel(
                f,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                stream.raw_handle(),
                params,
            )
        }
        .map_err(|e| driver("cuLaunchKernel")(e.0))
    }

    /// Enqueues one launch of the empty kernel (one block of one thread) on `stream`: the floor
    /// of a kernel's cost, inside a graph or not.
    pub fn launch_empty(&self, stream: &CudaStream) -> Result<(), ProbeError> {
        self.launch(self.empty, 1, 1, stream, &mut [])
    }

    /// Enqueues the clock probe on `stream`: one block per multiprocessor spinning for `ns`
    /// nanoseconds of the GPU's timer, block 0 measuring the SM clock over its spin into `out`
    /// (two `u64`: cycles, nanoseconds; see [`clock_mhz`]).
    pub fn launch_clock_probe(
        &self,
        stream: &CudaStream,
        out: &mut CudaBuffer,
        ns: u64,
    ) -> Result<(), ProbeError> {
        use hisparse_core::ops::BufferLen;
        if out.byte_len() < 16 {
            return Err(ProbeError(
                "the clock probe writes 16 bytes: pass a buffer of at least 16".into(),
            ));
        }
        let mut addr = out.device_address();
        let mut spin = ns;
        let mut params = [
            (&raw mut addr).cast::<c_void>(),
            (&raw mut spin).cast::<c_void>(),
        ];
        // `lab_clock_probe(u64* out, u64 ns)`: `addr` is a live device buffer of at least 16
        // bytes (checked), kept alive by the caller until the stream's work completed.
        self.launch(self.clock, self.multiprocessors, 32, stream, &mut params)
    }
}

/// The SM clock in MHz from a probe's output (`[cycles, nanoseconds]`, downloaded after
/// [`Probes::launch_clock_probe`] completed), or `None` when the probe measured nothing.
pub fn clock_mhz(probe: [u64; 2]) -> Option<f64> {
    (probe[1] > 0).then(|| probe[0] as f64 * 1e3 / probe[1] as f64)
}
