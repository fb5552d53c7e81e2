//! The only module that calls into the CUDA driver and NVRTC (through cudarc's `sys` bindings,
//! loaded at run time). Every `unsafe` block of the crate's FFI lives here and says why it is
//! sound. Above the raw calls sit small RAII handle types ([`Context`], [`DevMem`], [`Stream`],
//! [`Event`], [`Module`], [`Graph`]) and `Result`-returning wrappers; the rest of the crate uses
//! only those (the host pool's pinned memory, `crate::pinned`, registers through
//! [`host_register`] and [`host_unregister`]).
//!
//! One file per handle or group of driver calls: `library` (probing and loading the libraries),
//! `device` (the driver, devices, contexts), `memory`, `pointer` (queries on lent memory and
//! streams), `stream`, `event`, `graph`, `capture` (capture modes), `module` (modules and
//! launches), `nvrtc`.
//!
//! Library loading: cudarc's `is_culib_present` probes without panicking, and no driver or NVRTC
//! function is ever called before its probe succeeded (cudarc panics on a missing library).

use cudarc::driver::sys::CUresult;

use crate::error::CudaError;

/// Result of this crate.
pub(crate) type Result<T> = std::result::Result<T, CudaError>;

fn check(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::driver(call, code))
    }
}

mod capture;
mod device;
mod event;
mod graph;
mod library;
mod memory;
mod module;
mod nvrtc;
mod pointer;
mod stream;

pub use capture::CaptureMode;
pub(crate) use capture::{CaptureStatus, relaxed_capture};
pub(crate) use device::{
    Context, device_attr, device_count, device_get, device_name, device_pci_bus_id, init, mem_info,
};
pub(crate) use event::Event;
pub(crate) use graph::Graph;
pub(crate) use library::{driver_present, nvrtc_present, preload};
pub(crate) use memory::{DevMem, host_device_pointer, host_register, host_unregister};
pub(crate) use module::{Function, LaunchShape, Module, launch};
pub(crate) use nvrtc::{nvrtc_compile, nvrtc_version};
pub(crate) use pointer::{
    MEMORY_TYPE_DEVICE, MEMORY_TYPE_HOST, PointerInfo, address_range, pointer_info, stream_context,
};
pub(crate) use stream::Stream;
