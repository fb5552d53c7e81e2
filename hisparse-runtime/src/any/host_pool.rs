//! How host pools are set up, through [`AnyDevice`]: the backends' host-pool configuration and
//! the report of how a pool was set up.

use hisparse_host_memory::{HostPoolConfig, Setup};

use super::*;

impl AnyDevice {
    /// The same device, setting up host pools ([`Device::alloc_pinned`], lent host memory, shared
    /// segments) as `cfg` says: the CPU, CUDA and ROCm backends' `with_host_pool_config`. The
    /// Vulkan backend allocates its host pool through Vulkan and is returned unchanged.
    pub fn with_host_pool_config(self, cfg: HostPoolConfig) -> Self {
        let _ = &cfg;
        match self {
            #[cfg(feature = "cpu")]
            AnyDevice::Cpu(d) => AnyDevice::Cpu(d.with_host_pool_config(cfg)),
            #[cfg(feature = "cuda")]
            AnyDevice::Cuda(d) => AnyDevice::Cuda(d.with_host_pool_config(cfg)),
            #[cfg(feature = "rocm")]
            AnyDevice::Rocm(d) => AnyDevice::Rocm(d.with_host_pool_config(cfg)),
            #[cfg(feature = "vulkan")]
            AnyDevice::Vulkan(d) => AnyDevice::Vulkan(d),
        }
    }
}

impl AnyHostBuffer {
    /// How the pool was set up (threads, NUMA node, pages, registrations), where the backend
    /// built it on `hisparse-host-memory`; `None` for memory lent already pinned, a CPU
    /// buffer over lent memory, or a Vulkan host buffer.
    pub fn setup(&self) -> Option<&Setup> {
        match self {
            #[cfg(feature = "cpu")]
            AnyHostBuffer::Cpu(b) => b.setup(),
            #[cfg(feature = "cuda")]
            AnyHostBuffer::Cuda(b) => b.setup(),
            #[cfg(feature = "rocm")]
            AnyHostBuffer::Rocm(b) => b.setup(),
            #[cfg(feature = "vulkan")]
            AnyHostBuffer::Vulkan(_) => None,
        }
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use hisparse_host_memory::HugePages;

    #[test]
    fn the_configuration_reaches_the_backend_and_the_setup_comes_back() {
        let cfg = HostPoolConfig {
            huge_pages: HugePages::Off,
            threads: Some(2),
            ..HostPoolConfig::default()
        };
        let dev = AnyDevice::open(BackendKind::Cpu, "")
            .unwrap()
            .with_host_pool_config(cfg);
        let pool = dev.alloc_pinned(3 << 20).unwrap();
        let setup = pool
            .setup()
            .expect("the CPU backend's pool is a host region");
        assert_eq!(setup.pages, hisparse_host_memory::Pages::Base);
        use crate::SharedHostPool;
        let name = crate::SharedSegment::unique_name("hisparse-runtime-test");
        let segment = crate::SharedSegment::create(&name, 1 << 16).unwrap();
        let shared = dev.host_pool_from_shared(segment).unwrap();
        assert!(
            shared.setup().is_none(),
            "the CPU backend maps a segment as it is"
        );
    }
}
