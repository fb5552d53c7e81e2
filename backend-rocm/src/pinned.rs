//! The host pool's pinned memory, built on [`hisparse_host_memory::HostRegion`] and registered
//! with the HIP runtime (`hipHostRegister`, mapped and portable), as the CUDA backend does it:
//! reserved on the NUMA node of the GPU's PCI root, zeroed (touched) and registered in parallel
//! chunks by threads of that node — in chunks only when the device reaches registered memory at
//! its host address (`canUseHostPointerForRegisteredMem`), whole otherwise — and released
//! (device synchronised, unregistered and unmapped in parallel chunks) on a thread of its own
//! when dropped. This replaces `hipHostMalloc`, which zeroes and pins in one thread.

use std::ffi::c_void;
use std::sync::Arc;

use hisparse_host_memory::{HostPoolConfig, HostRegion, Pinner, SetupError, SharedSegment};

use crate::context::Context;
use crate::device::RocmDevice;
use crate::error::RocmError;
use crate::ffi::{HOST_REGISTER_MAPPED, HOST_REGISTER_PORTABLE};
use crate::memory::{Pinning, RocmHostBuffer};

/// How this device sets up host pools: the configuration, and what the platform says.
#[derive(Clone, Debug)]
pub(crate) struct HostPoolSetup {
    pub(crate) config: HostPoolConfig,
    /// The NUMA node of the GPU's PCI root (`None`: the platform does not say).
    pub(crate) node: Option<u32>,
}

impl HostPoolSetup {
    /// What sysfs says about the device of `ctx`, with the default configuration.
    pub(crate) fn probe(ctx: &Context) -> HostPoolSetup {
        HostPoolSetup {
            config: HostPoolConfig::default(),
            node: hisparse_host_memory::node_of_pci_device(&ctx.pci_bus_id),
        }
    }
}

/// The HIP runtime's pinning of a host region's ranges. Not charged to `RLIMIT_MEMLOCK`: the
/// kernel driver pins pages itself.
#[derive(Debug)]
pub(crate) struct HipPin {
    ctx: Arc<Context>,
}

impl Pinner for HipPin {
    type Error = RocmError;

    fn counts_against_memlock(&self) -> bool {
        false
    }

    fn pins_in_chunks(&self) -> bool {
        self.ctx.host_pointer_registration
    }

    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), RocmError> {
        self.ctx.bind()?;
        // SAFETY: the region hands over a range of its live, touched memory, which stays mapped
        // until the matching `unpin`.
        let s = unsafe {
            self.ctx.hip.host_register(
                addr.cast(),
                len,
                HOST_REGISTER_MAPPED | HOST_REGISTER_PORTABLE,
            )
        };
        self.ctx.check("hipHostRegister", s)
    }

    fn unpin(&self, addr: *mut u8, _len: usize) {
        self.ctx.bind_quietly();
        // SAFETY: `addr` starts a range `pin` registered; the region calls this once, after
        // `quiesce` waited for the device.
        let _ = unsafe { self.ctx.hip.host_unregister(addr.cast()) };
    }

    fn quiesce(&self) {
        self.ctx.bind_quietly();
        // A failure (a lost device, a runtime being torn down at exit) leaves nothing to wait
        // for.
        let _ = self.ctx.hip.device_synchronize();
    }
}

impl RocmDevice {
    /// The same device, setting up host pools ([`hisparse_core::Device::alloc_pinned`], lent
    /// memory, shared segments) as `cfg` says: NUMA placement (by default the node of the GPU's
    /// PCI root), page size, threads, and whether the runtime registers in chunks or whole.
    pub fn with_host_pool_config(mut self, cfg: HostPoolConfig) -> Self {
        self.host_pool.config = cfg;
        self
    }

    /// How host pools are set up.
    pub fn host_pool_config(&self) -> &HostPoolConfig {
        &self.host_pool.config
    }

    /// The NUMA node of the GPU's PCI root, where the platform reports one.
    pub fn numa_node(&self) -> Option<u32> {
        self.host_pool.node
    }

    fn pinner(&self) -> HipPin {
        HipPin {
            ctx: self.ctx.clone(),
        }
    }

    /// A host pool of `len` zeroed bytes (module docs).
    pub(crate) fn alloc_pool(&self, len: usize) -> Result<RocmHostBuffer, RocmError> {
        let s = &self.host_pool;
        let region = HostRegion::allocate(len, &s.config, s.node, self.pinner())
            .map_err(SetupError::into_error)?;
        self.registered(region)
    }

    /// An engine's unpinned memory, touched (contents kept) and registered in parallel chunks;
    /// unregistered, in parallel chunks, before the buffer's drop returns.
    ///
    /// # Safety
    ///
    /// `[host, host + len)` is live, readable and writable host memory that stays allocated
    /// while the buffer lives and until every operation enqueued on it has completed, and that
    /// nothing else touches while it is being registered.
    pub(crate) unsafe fn lend_pool(
        &self,
        host: *mut u8,
        len: usize,
    ) -> Result<RocmHostBuffer, RocmError> {
        let s = &self.host_pool;
        let Some(start) = std::ptr::NonNull::new(host) else {
            return Err(RocmError::Lent {
                what: "host memory",
                problem: "the pointer is null: pass the address of live memory".into(),
            });
        };
        // SAFETY: forwarded contract.
        let region = unsafe { HostRegion::lend(start, len, &s.config, s.node, self.pinner()) }
            .map_err(SetupError::into_error)?;
        self.registered(region)
    }

    /// A shared segment's mapping, registered in parallel chunks.
    pub(crate) fn share_pool(&self, segment: SharedSegment) -> Result<RocmHostBuffer, RocmError> {
        let s = &self.host_pool;
        let region = HostRegion::share(segment, &s.config, s.node, self.pinner())
            .map_err(SetupError::into_error)?;
        self.registered(region)
    }

    /// `region` as a buffer: its device address, one linear range over every chunk registered
    /// separately (checked).
    fn registered(&self, region: HostRegion<HipPin>) -> Result<RocmHostBuffer, RocmError> {
        let hip = &self.ctx.hip;
        let device = region.device_base(|p| {
            hip.host_device_pointer(p.cast())
                .map(|d| d as u64)
                .map_err(|s| RocmError::hip(hip, "hipHostGetDevicePointer", s))
        })?;
        Ok(RocmHostBuffer {
            host: region.addr().as_ptr(),
            device: device as usize as *mut c_void,
            len: region.len(),
            pinning: Pinning::Registered(Box::new(region)),
        })
    }
}

impl From<hisparse_host_memory::NotOneDeviceRange> for RocmError {
    fn from(e: hisparse_host_memory::NotOneDeviceRange) -> Self {
        RocmError::Unsupported(e.to_string())
    }
}

impl From<hisparse_host_memory::HostMemoryError> for RocmError {
    fn from(e: hisparse_host_memory::HostMemoryError) -> Self {
        use hisparse_host_memory::HostMemoryError as H;
        match e {
            H::Budget(b) => RocmError::PinnedBudget(b),
            H::Lent(problem) => RocmError::Lent {
                what: "host memory",
                problem,
            },
            other => RocmError::HostPool(other.to_string()),
        }
    }
}
