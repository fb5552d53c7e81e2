//! One host pool for every tensor-parallel rank of a node: a backend that can use a
//! shared-memory segment ([`SharedSegment`]) as its pinned host pool.
//!
//! Every rank of a node holds the same MLA KV, so one host copy serves them all. One process
//! creates the segment ([`SharedSegment::create`]); each rank opens it by name and turns it into
//! its backend's host buffer ([`SharedHostPool::host_pool_from_shared`]); its runtime is built
//! with [`crate::Runtime::with_pools`]. Who writes what is decided once, in
//! [`crate::RuntimeConfig::writes_host`]: exactly one rank writes row mirrors, spills and host
//! copy-on-write; every rank reads (swap-in gathers, restores) onto its own GPU. Each rank
//! reports its own transfer batches as a worker of the coordinator, so a page is durable when
//! every rank has reported it — the writer's report being the one that carries the copy.

use hisparse_core::Device;
pub use hisparse_host_memory::{SharedSegment, ShmError};

/// A backend whose pinned host buffer can be a shared-memory segment.
pub trait SharedHostPool: Device {
    /// `segment` as this device's host buffer (registered with the driver where the device
    /// reads host memory directly). The buffer keeps the mapping alive.
    fn host_pool_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<Self::HostBuffer, Self::Error>;
}

#[cfg(feature = "cpu")]
impl SharedHostPool for hisparse_backend_cpu::CpuDevice {
    fn host_pool_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<hisparse_backend_cpu::CpuBuffer, hisparse_backend_cpu::CpuError> {
        hisparse_backend_cpu::CpuBuffer::from_shared(segment)
    }
}

#[cfg(feature = "cuda")]
impl SharedHostPool for hisparse_backend_cuda::CudaDevice {
    fn host_pool_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<hisparse_backend_cuda::CudaHostBuffer, hisparse_backend_cuda::CudaError> {
        self.host_buffer_from_shared(segment)
    }
}

#[cfg(feature = "rocm")]
impl SharedHostPool for hisparse_backend_rocm::RocmDevice {
    fn host_pool_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<hisparse_backend_rocm::RocmHostBuffer, hisparse_backend_rocm::RocmError> {
        self.host_buffer_from_shared(segment)
    }
}

#[cfg(any(
    feature = "cpu",
    feature = "cuda",
    feature = "vulkan",
    feature = "rocm"
))]
impl SharedHostPool for crate::AnyDevice {
    fn host_pool_from_shared(
        &self,
        segment: SharedSegment,
    ) -> Result<crate::AnyHostBuffer, crate::AnyError> {
        match self {
            #[cfg(feature = "cpu")]
            crate::AnyDevice::Cpu(d) => Ok(d.host_pool_from_shared(segment)?.into()),
            #[cfg(feature = "cuda")]
            crate::AnyDevice::Cuda(d) => Ok(d.host_pool_from_shared(segment)?.into()),
            #[cfg(feature = "rocm")]
            crate::AnyDevice::Rocm(d) => Ok(d.host_pool_from_shared(segment)?.into()),
            #[allow(unreachable_patterns)]
            other => Err(crate::AnyError::Unsupported(format!(
                "the {} backend cannot use a shared-memory host pool yet; run the ranks with one host pool each",
                other.kind()
            ))),
        }
    }
}
