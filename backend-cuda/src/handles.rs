//! The handles a [`CudaDevice`] hands out: device buffers, host buffers, streams, events and
//! graphs.

use std::sync::Arc;

use hisparse_core::ops::BufferLen;

use crate::capture::Scratch;
use crate::device::{CudaDevice, Result};
use crate::ffi::{self, DevMem, Event, Stream};
use crate::pinned::PinnedMem;

/// Device memory of a [`CudaDevice`] (zeroed at allocation; freed after outstanding work).
#[derive(Debug)]
pub struct CudaBuffer {
    pub(crate) mem: DevMem,
}

impl CudaBuffer {
    /// Device address (for diagnostics).
    pub fn device_address(&self) -> u64 {
        self.mem.ptr()
    }
}

impl BufferLen for CudaBuffer {
    fn byte_len(&self) -> u64 {
        self.mem.len() as u64
    }
}

/// Pinned, page-aligned host memory mapped into the device's address space: kernels read and
/// write it directly over the bus (cacheable, not write-combined). Allocated here
/// ([`Device::alloc_pinned`](hisparse_core::Device::alloc_pinned)), lent by an engine
/// ([`CudaDevice::lend_host_memory`]) or a shared-memory segment every rank of a node maps
/// ([`CudaDevice::host_buffer_from_shared`]).
#[derive(Debug)]
pub struct CudaHostBuffer {
    pub(crate) mem: PinnedMem,
}

impl CudaHostBuffer {
    /// Whether the memory is a shared-memory segment ([`CudaDevice::host_buffer_from_shared`]).
    pub fn is_shared(&self) -> bool {
        self.mem.segment().is_some()
    }

    /// How the memory was set up (threads, NUMA node, pages, registrations), when this backend
    /// registered it; `None` for memory that was pinned already.
    pub fn setup(&self) -> Option<&hisparse_host_memory::Setup> {
        self.mem.setup()
    }
}

impl BufferLen for CudaHostBuffer {
    fn byte_len(&self) -> u64 {
        self.mem.len() as u64
    }
}

/// A CUDA stream (a non-blocking one of this backend, or an engine's lent through
/// [`CudaDevice::lend_stream`]), with the scratch memory its resolver launches use.
#[derive(Debug)]
pub struct CudaStream {
    pub(crate) inner: Stream,
    /// The resolver's counters (`hisparse_gpu_kernels::WORKSPACE_COUNTER_BYTES`: zero before the
    /// first launch, left zero by every launch, so no launch needs a memset first) and workspace;
    /// kept by the device too once a captured launch used them.
    pub(crate) scratch: Arc<Scratch>,
}

impl CudaStream {
    /// `inner` with empty scratch and cleared resolver counters ([`Scratch::new`]: no host
    /// synchronisation unless `inner` is being captured).
    pub(crate) fn from_inner(dev: &CudaDevice, inner: Stream) -> Result<CudaStream> {
        let scratch = Scratch::new(&dev.ctx, &inner, &dev.lasting.side)?;
        Ok(CudaStream { inner, scratch })
    }

    /// The driver's handle of the stream, e.g. to order an engine's own work after this
    /// backend's (`torch.cuda.ExternalStream`). It stays owned by this value.
    pub fn raw_handle(&self) -> cudarc::driver::sys::CUstream {
        self.inner.raw()
    }
}

/// A CUDA event.
#[derive(Debug)]
pub struct CudaEvent {
    pub(crate) inner: Event,
}

/// An instantiated CUDA graph captured with [`CudaDevice::capture`].
#[derive(Debug)]
pub struct CudaGraph {
    pub(crate) inner: ffi::Graph,
}
