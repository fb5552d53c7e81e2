//! The lab's measurement probes on CUDA (`kernels/probes.cu`): an empty kernel (the floor of a
//! launch) and a clock probe (sustained work that brings the clocks up, and the SM clock it ran
//! at). They are not HiSparse kernels, so no published crate carries them: the lab compiles them
//! with NVRTC itself and launches them on a backend stream through its raw handle, in the device's
//! primary context (the one the backend retains), so they order with the backend's work and are
//! captured into its graphs like it.

use std::ffi::c_void;

use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaStream};

use crate::module::{LabError, LabFunction, LabModule};

/// The probes' source.
pub const SOURCE: &str = include_str!("../kernels/probes.cu");
/// Symbol of the empty kernel.
pub const EMPTY: &str = "lab_empty";
/// Symbol of the clock probe.
pub const CLOCK_PROBE: &str = "lab_clock_probe";

/// Why a probe could not be compiled, loaded or launched.
pub type ProbeError = LabError;

/// Compiles [`SOURCE`] for the virtual architecture `arch` (e.g. `compute_90`) and returns the
/// PTX. Needs NVRTC (found as the backend finds it), not a GPU.
pub fn compile(arch: &str) -> Result<String, ProbeError> {
    crate::module::compile(SOURCE, "probes.cu", arch)
}

/// The probes loaded into the primary context of one device.
pub struct Probes {
    module: LabModule,
    multiprocessors: u32,
    empty: LabFunction,
    clock: LabFunction,
}

impl Probes {
    /// Compiles and loads the probes for `dev`, CUDA device `ordinal` (the one it was opened on).
    /// The module stays loaded for the life of the process (the primary context outlives it).
    pub fn load(dev: &CudaDevice, ordinal: usize) -> Result<Probes, ProbeError> {
        let (major, minor) = dev.compute_capability();
        let ptx = compile(&format!("compute_{major}{minor}"))?;
        let module = LabModule::load(dev, ordinal, &ptx)?;
        Ok(Probes {
            multiprocessors: dev.multiprocessor_count(),
            empty: module.function(EMPTY)?,
            clock: module.function(CLOCK_PROBE)?,
            module,
        })
    }

    fn launch(
        &self,
        f: LabFunction,
        grid: u32,
        block: u32,
        stream: &CudaStream,
        params: &mut [*mut c_void],
    ) -> Result<(), ProbeError> {
        // SAFETY: `f` is a live function of the probes' module; `params` holds one pointer per
        // parameter of `f` (the callers pass exactly its parameter list), each alive for the
        // call, and the buffers they address outlive the launch (the callers' contracts).
        unsafe { self.module.launch(f, grid, block, 0, stream, params) }
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
            return Err(LabError(
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
