//! Pinned host memory: the host pool and the staging rings, built on
//! [`hisparse_host_memory::HostRegion`] and registered with the driver.
//!
//! * **Set-up.** A pool is reserved with `mmap` (2 MiB aligned, transparent huge pages), its pages
//!   asked onto the NUMA node of the GPU's PCI root (`cuDeviceGetPCIBusId` →
//!   `/sys/bus/pci/devices/<id>/numa_node`), touched by one thread per CPU of that node in
//!   parallel chunks (the kernel zeroes each page as the touch faults it in: the pool is zeroed
//!   as the [`hisparse_core::Device`] contract wants) and registered chunk by chunk as soon as
//!   each is touched (`cuMemHostRegister`, DEVICEMAP | PORTABLE), in parallel. Chunks form one
//!   device range only when the device reaches registered memory at its host address
//!   (`CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`); otherwise, or with
//!   [`hisparse_host_memory::Registration::Whole`], the pool is touched in parallel and registered once. This replaces
//!   `cuMemHostAlloc`, which zeroes and pins in one thread at the page-fault rate.
//! * **Release.** Dropping a pool of 64 MiB or more hands the context synchronisation, the
//!   `cuMemHostUnregister` of every chunk and the `munmap` to a thread of its own, in parallel
//!   chunks (see [`hisparse_host_memory::release`]); the engine's thread returns at once. An
//!   engine's lent memory is unregistered before the drop returns (the engine may free it or
//!   register it again right after).
//! * **Exit.** A process may exit while a release runs: the thread is not waited for, the
//!   driver drops the process's registrations and the kernel its memory.

use std::sync::Arc;

use cudarc::driver::sys;
use hisparse_core::ops::PINNED_ALIGNMENT;
use hisparse_host_memory::{HostPoolConfig, HostRegion, Pinner, SetupError, SharedSegment};

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::ffi::{self, Context, Result};

/// How this device sets up host pools: the configuration, and what the platform says.
#[derive(Clone, Debug)]
pub(crate) struct HostPoolSetup {
    pub(crate) config: HostPoolConfig,
    /// The NUMA node of the GPU's PCI root (`None`: the platform does not say).
    pub(crate) node: Option<u32>,
    /// Whether the device reaches registered memory at its host address, so that chunks
    /// registered separately form one device range.
    pub(crate) host_pointer: bool,
}

impl HostPoolSetup {
    /// What the driver and sysfs say about device `dev`, with the default configuration.
    pub(crate) fn probe(dev: sys::CUdevice) -> Result<HostPoolSetup> {
        use sys::CUdevice_attribute as Attr;
        let host_pointer = ffi::device_attr(
            dev,
            Attr::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        )? != 0;
        // No PCI address, or none in sysfs: placement falls back to wherever threads touch.
        let node = ffi::device_pci_bus_id(dev)
            .ok()
            .and_then(|id| hisparse_host_memory::node_of_pci_device(&id));
        Ok(HostPoolSetup {
            config: HostPoolConfig::default(),
            node,
            host_pointer,
        })
    }

    fn pinner(&self, ctx: &Arc<Context>) -> CudaPin {
        CudaPin {
            ctx: ctx.clone(),
            chunks: self.host_pointer,
        }
    }
}

impl CudaDevice {
    /// The same device, setting up host pools ([`hisparse_core::Device::alloc_pinned`], lent
    /// memory, shared segments) as `cfg` says: NUMA placement (by default the node of the GPU's
    /// PCI root), page size, threads, and whether the driver registers in chunks or whole.
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
}

/// The CUDA driver's pinning of a host region's ranges (`cuMemHostRegister`, DEVICEMAP |
/// PORTABLE). Not charged to `RLIMIT_MEMLOCK`: the driver pins pages itself.
#[derive(Debug)]
pub(crate) struct CudaPin {
    ctx: Arc<Context>,
    chunks: bool,
}

impl Pinner for CudaPin {
    type Error = CudaError;

    fn counts_against_memlock(&self) -> bool {
        false
    }

    fn pins_in_chunks(&self) -> bool {
        self.chunks
    }

    fn pin(&self, addr: *mut u8, len: usize) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the region hands over a range of its live, touched memory, which stays mapped
        // until the matching `unpin`; the context is current on this thread.
        unsafe { ffi::host_register(addr, len) }
    }

    fn unpin(&self, addr: *mut u8, _len: usize) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `addr` starts a range `pin` registered; the region calls this once, after
            // `quiesce` waited for every piece of work of the context.
            let _ = unsafe { ffi::host_unregister(addr) };
        }
    }

    fn quiesce(&self) {
        // A failure (a lost device, a driver being torn down at exit) leaves nothing to wait for.
        let _ = self.ctx.synchronize();
    }
}

/// Who releases a [`PinnedMem`]'s pinning.
#[derive(Debug)]
enum Pinning {
    /// Registered here, chunk by chunk or whole: memory reserved here, an engine's lent memory
    /// or a shared segment. The region unregisters (and unmaps what it mapped) when dropped,
    /// after its pinner's quiesce synchronised the context (on a release thread for large
    /// pools).
    Registered(Box<HostRegion<CudaPin>>),
    /// Host memory someone else allocated and pinned; left alone on drop.
    Lent,
}

/// Pinned host memory, mapped into the device's address space (DEVICEMAP | PORTABLE, cacheable,
/// not write-combined, so the host reads it at full speed too). Registered here, it is
/// unregistered (and unmapped, when mapped here) after all work of the context when dropped;
/// lent, it is left to its owner.
#[derive(Debug)]
pub(crate) struct PinnedMem {
    /// Byte 0 of the buffer ([`PINNED_ALIGNMENT`]-aligned).
    host: *mut u8,
    dev: sys::CUdeviceptr,
    len: usize,
    pinning: Pinning,
}

// SAFETY: the memory is plain host memory owned (or, lent, held exclusively) by this value;
// access goes through `&self`/`&mut self`, so Rust's aliasing rules hold across threads.
unsafe impl Send for PinnedMem {}
// SAFETY: shared references only read (`as_slice`).
unsafe impl Sync for PinnedMem {}

/// A driver refusal to pin `bytes` as the out-of-pinned-memory error it is.
fn refused_pin(bytes: usize) -> impl Fn(SetupError<CudaError>) -> CudaError {
    move |e| match e {
        SetupError::Pin(CudaError::Driver { code, .. }) => {
            CudaError::OutOfPinnedMemory { bytes, code }
        }
        other => other.into_error(),
    }
}

impl PinnedMem {
    /// `len` zeroed, pinned bytes for a staging ring: one thread, no placement.
    pub(crate) fn alloc_zeroed(ctx: &Arc<Context>, len: usize) -> Result<PinnedMem> {
        let setup = HostPoolSetup {
            config: HostPoolConfig {
                threads: Some(1),
                ..HostPoolConfig::default()
            },
            node: None,
            host_pointer: false,
        };
        Self::alloc_pool(ctx, len, &setup)
    }

    /// A host pool of `len` zeroed bytes, set up as `setup` says (module docs).
    pub(crate) fn alloc_pool(
        ctx: &Arc<Context>,
        len: usize,
        setup: &HostPoolSetup,
    ) -> Result<PinnedMem> {
        let region = HostRegion::allocate(len, &setup.config, setup.node, setup.pinner(ctx))
            .map_err(refused_pin(len))?;
        Self::registered(region)
    }

    /// Host memory someone else allocated: registered here as pinned and device-mapped when
    /// `register` — touched (contents kept) and registered in parallel chunks as `setup` says,
    /// and unregistered, in parallel chunks, before the drop returns — else already pinned and
    /// mapped by its owner (left alone on drop).
    ///
    /// # Safety
    ///
    /// `[host, host + len)` is host memory, readable and writable, that stays allocated for as
    /// long as the value lives and until every operation enqueued on it has completed, and that
    /// nothing else reads or writes while such work may touch it (nor while it is registered
    /// here). When `register` is false it is page-locked and mapped into `ctx`'s device address
    /// space (`cuMemHostAlloc`, `cuMemHostRegister` with DEVICEMAP, or any pinned memory under
    /// unified addressing).
    pub(crate) unsafe fn lent(
        ctx: &Arc<Context>,
        host: *mut u8,
        len: usize,
        register: bool,
        setup: &HostPoolSetup,
    ) -> Result<PinnedMem> {
        ctx.bind()?;
        let Some(start) = std::ptr::NonNull::new(host) else {
            return Err(CudaError::Lent {
                what: "host memory",
                problem: "the pointer is null: pass the address of live memory".into(),
            });
        };
        if !register {
            return Ok(PinnedMem {
                host,
                dev: ffi::host_device_pointer(host.cast())?,
                len,
                pinning: Pinning::Lent,
            });
        }
        // SAFETY: forwarded contract: live, readable and writable memory that nothing else
        // touches while the region sets it up or holds it.
        let region =
            unsafe { HostRegion::lend(start, len, &setup.config, setup.node, setup.pinner(ctx)) }
                .map_err(SetupError::into_error)?;
        Self::registered(region)
    }

    /// A shared segment's mapping, registered in parallel chunks as `setup` says; the segment
    /// is unmapped only after its registration was dropped.
    pub(crate) fn shared(
        ctx: &Arc<Context>,
        segment: SharedSegment,
        setup: &HostPoolSetup,
    ) -> Result<PinnedMem> {
        ctx.bind()?;
        let region = HostRegion::share(segment, &setup.config, setup.node, setup.pinner(ctx))
            .map_err(SetupError::into_error)?;
        Self::registered(region)
    }

    /// The memory of `region` as the device sees it: its device address, one linear range over
    /// every chunk registered separately (checked).
    fn registered(region: HostRegion<CudaPin>) -> Result<PinnedMem> {
        let dev = region.device_base(|p| ffi::host_device_pointer(p.cast()))?;
        Ok(PinnedMem {
            host: region.addr().as_ptr(),
            dev,
            len: region.len(),
            pinning: Pinning::Registered(Box::new(region)),
        })
    }

    /// The region this crate registered, if it did (not memory its owner pinned).
    fn region(&self) -> Option<&HostRegion<CudaPin>> {
        match &self.pinning {
            Pinning::Registered(r) => Some(r),
            Pinning::Lent => None,
        }
    }

    /// `[off, off + n)` in the pieces a driver copy must be issued as
    /// (hisparse_host_memory::copy_pieces: cut at the chunks registered separately).
    pub(crate) fn copy_pieces(
        &self,
        off: usize,
        n: usize,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        hisparse_host_memory::copy_pieces(self.region(), off..off + n)
    }

    /// Host address.
    pub(crate) fn host_addr(&self) -> usize {
        self.host as usize
    }

    /// Host pointer of byte 0 (for the driver's copies).
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Device address of byte 0 (the GPU reads and writes the host memory through it).
    pub(crate) fn dev_ptr(&self) -> u64 {
        self.dev
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether drop unregisters the pinning (memory registered by this crate).
    pub(crate) fn registered_here(&self) -> bool {
        matches!(self.pinning, Pinning::Registered(_))
    }

    /// The shared segment the memory is, if any.
    pub(crate) fn segment(&self) -> Option<&SharedSegment> {
        self.region().and_then(HostRegion::segment)
    }

    /// How the memory was set up, when it was registered here.
    pub(crate) fn setup(&self) -> Option<&hisparse_host_memory::Setup> {
        self.region().map(HostRegion::setup)
    }

    /// The bytes. Callers synchronise with the device before reading what it wrote.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `host` points to `len` initialised bytes that live until drop: a region
        // mapped (and zeroed) here and owned by `self`, a shared segment it holds, or memory
        // lent under the contract of `lent`.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// The bytes, mutably. Callers synchronise with the device first.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access on the host.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }
}

/// Kept so the page-size assumption of the registration is checked where it is made.
const _: () = assert!(PINNED_ALIGNMENT <= hisparse_host_memory::HUGE_PAGE);

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use hisparse_core::ops::PinnedBudgetError;
    use hisparse_core::{Error as _, ErrorKind};
    use hisparse_host_memory::HostMemoryError;

    #[test]
    fn refusals_keep_their_kind_and_name_what_refused() {
        let oom = refused_pin(64)(SetupError::Pin(CudaError::driver(
            "cuMemHostRegister",
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        )));
        assert!(
            matches!(oom, CudaError::OutOfPinnedMemory { bytes: 64, .. }),
            "{oom}"
        );
        assert_eq!(oom.kind(), ErrorKind::OutOfPinnedMemory);
        let budget = refused_pin(64)(SetupError::Host(HostMemoryError::Budget(
            PinnedBudgetError::ExceedsAvailable {
                requested: 64,
                available: 10,
                limit: 9,
            },
        )));
        assert!(matches!(budget, CudaError::PinnedBudget(_)), "{budget}");
        assert!(budget.to_string().contains("--host-mem"), "{budget}");
        let short = refused_pin(64)(SetupError::Host(HostMemoryError::HugePagesShort {
            requested: 64,
            free: 0,
        }));
        assert_eq!(short.kind(), ErrorKind::OutOfPinnedMemory);
        assert!(short.to_string().contains("vm.nr_hugepages"), "{short}");
    }
}
