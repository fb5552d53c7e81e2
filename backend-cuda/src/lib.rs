//! HiSparse CUDA backend: every data-plane operation of [`hisparse_core::Device`] as CUDA
//! kernels, through the CUDA driver API (cudarc, loaded at run time) and NVRTC.
//!
//! * [`CudaDevice::open`] loads the driver, retains the device's primary context and finds NVRTC
//!   (also outside the library path: see [`nvrtc`]). A missing driver, device or NVRTC is an
//!   error of kind `NotFound`; nothing panics.
//! * The host pool ([`CudaHostBuffer`]) is reserved with `mmap` on the NUMA node of the GPU's PCI
//!   root, zeroed and registered (`cuMemHostRegister`, DEVICEMAP | PORTABLE) in parallel chunks
//!   by one thread per CPU of that node, and released (unregistered and unmapped) on a thread of
//!   its own when dropped ([`CudaDevice::with_host_pool_config`], `hisparse-host-memory`). It is
//!   cacheable (not write-combined) and mapped into the device's address space: the swap-in
//!   gather kernel reads host rows directly with 16-byte loads, many in flight.
//! * Kernels come from the shared source in `hisparse-gpu-kernels`, compiled with NVRTC for the
//!   device's architecture on first use and cached per process; building this crate needs no
//!   CUDA toolkit.
//! * The decode-path operations (remap, resolve, gather, invalidate, compressed slot mapping)
//!   only enqueue kernels (the resolver's counters are cleared once, when a stream is made): no host
//!   synchronisation, so they can be captured in a CUDA graph ([`CudaDevice::capture`],
//!   [`CudaDevice::capture_in`] in global mode as `torch.cuda.graph` does, or the engine's own
//!   capture of a stream lent with [`CudaDevice::lend_stream`]; [`hisparse_core::Device::is_capturing`]
//!   tells). Page and row copies stage their per-call lists through pinned memory and an
//!   asynchronous copy, one launch for all layers and pairs; their layer tables, and every list of
//!   work being captured, live in a device-lifetime list arena instead (`capture` module).
//! * What to launch comes from the shared planners of `hisparse_gpu_kernels::plan` (grids,
//!   blocks, shared memory, staged lists, workspace, the splitting of conflicting copies); this
//!   crate stages, places and enqueues. [`CudaDevice::set_programmatic_launch`] launches the
//!   remap, resolve and gather kernels with programmatic dependent launch (sm_90+, off by
//!   default);
//!   [`CudaDevice::kernel_report`] says what the driver made of the kernels (registers, spills,
//!   blocks per multiprocessor).
//! * [`CudaOptions`], given at [`CudaDevice::open_with`], configures a device; its one value forces
//!   the resolver's global-state mode, which the conformance suite checks
//!   (`tests/conformance_resolve_global.rs`). Nothing is read from the environment.
//! * Buffers free their memory after the context has finished all enqueued work, so dropping a
//!   buffer that a kernel still uses is safe (it waits). Do not drop buffers while capturing.
//! * Engine-owned memory and streams: [`CudaDevice::lend_device_memory`],
//!   [`CudaDevice::lend_host_memory`] and [`CudaDevice::lend_stream`] use an engine's device
//!   allocation, host memory (registered as pinned when it is not yet) and stream (PyTorch's
//!   current stream) as this backend's, checked with the driver and never freed or destroyed
//!   here.
//! * Table maintenance ([`Device::write_table`], [`Device::reset_hot_state`]) stages its list in
//!   pinned memory and runs one kernel; [`Device::copy_within_device`] is one device-to-device
//!   copy; none of them synchronises with the host.
//!
//! [`Device::write_table`]: hisparse_core::Device::write_table
//! [`Device::reset_hot_state`]: hisparse_core::Device::reset_hot_state
//! [`Device::copy_within_device`]: hisparse_core::Device::copy_within_device
//!
//! Checks without a GPU (what CI runs):
//!
//! ```text
//! pip install nvidia-cuda-nvrtc==13.0.88
//! export CUDA_PATH="$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
//! HISPARSE_REQUIRE_NVRTC=1 cargo test -p hisparse-backend-cuda   # NVRTC compiles every kernel;
//!                                                                # conformance reports skipped
//! HISPARSE_REQUIRE_CXX=1 cargo test -p hisparse-gpu-kernels      # kernels run on the CPU
//! ```
//!
//! On a GPU machine: `HISPARSE_REQUIRE_DEVICE=1` makes the conformance target fail instead of
//! skipping when no device opens; the unpublished `hisparse-kernel-lab` crate's `cuda_bench`
//! measures every kernel beside its ceiling.
//!
//! What this crate deliberately does not do: manage several devices at once, or use the CUDA
//! runtime API.
//!
//! All FFI sits in one private module; every `unsafe` block carries a `// SAFETY:` comment.

#![deny(missing_docs)]

mod capture;
mod device;
mod error;
mod ffi;
mod handles;
mod launch;
mod lent;
pub mod nvrtc;
mod pinned;
mod staging;

pub use cudarc::driver::sys::{CUdeviceptr, CUstream};
pub use device::{
    CaptureMode, CudaBuffer, CudaDevice, CudaEvent, CudaGraph, CudaHostBuffer, CudaOptions,
    CudaStream, GATHER_WALK_ENV, KernelReport,
};
pub use error::CudaError;
/// How the swap-in gather walks a miss plan ([`CudaOptions::gather_walk`]).
pub use hisparse_gpu_kernels::plan::GatherWalk;
