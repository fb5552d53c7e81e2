//! HiSparse's kernel lab: the per-backend benchmarks and A/B harnesses that measure the
//! production kernels of the published backends beside the ceilings of the same run, and the
//! measurement probes they need. Unpublished: nothing here runs in production, and kernel
//! experiments (a variant measured against the production kernel) belong here, not in the
//! backends.
//!
//! * `cuda_bench` (binary): the CUDA decode path inside CUDA graphs, every figure beside the bulk
//!   copies, the device copy and the launch floor measured in the same run, and the SM clock each
//!   run ran at ([`probes`]).
//! * `vulkan_bench` (binary): the Vulkan backend's copies, gather, index paths and decode step,
//!   device time from timestamps beside wall time, for every kernel and copy engine the backend
//!   offers as an option.
//! * `resolve_replay` (binary): times Vulkan resolves on states a run dumped
//!   (`VulkanOptions::dump_resolve`).
//!
//! * [`module`]: compiles the lab's own kernels with NVRTC and loads them into a backend's
//!   context.
//!
//! The device-generic benches (`hisparse bench`, the same figures on every backend) live in
//! `benches/`.

pub mod module;
pub mod probes;
pub mod remap_lab;
