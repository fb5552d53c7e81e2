//! [`HostRegion`]: a host pool's memory, touched and pinned in parallel chunks, released in the
//! background.

use core::fmt;
use std::convert::Infallible;
use std::io;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use hisparse_core::ops::{HostLimits, PINNED_ALIGNMENT, PinnedBudgetError, check_host_pool};

use crate::config::{HUGE_PAGE, HostPoolConfig, HugePages, PARALLEL_FROM, Registration};
use crate::numa::Workers;
use crate::parallel::{chunks, for_each_chunk};
use crate::release::{self, Release};
use crate::shared::SharedSegment;
use crate::{config, ffi, limits, meminfo};

/// A driver's (or the kernel's) pinning of host memory, applied to the ranges of a
/// [`HostRegion`]: the CUDA and ROCm backends register memory with their driver; [`NoPin`]
/// leaves it pageable; [`Mlock`] locks it with `mlock`.
pub trait Pinner: Send + Sync + 'static {
    /// What a refused pinning reports.
    type Error: Send;

    /// Whether the pinning counts against the locked-memory limit (`RLIMIT_MEMLOCK`), so that a
    /// pool larger than the limit must be refused before it is reserved.
    fn counts_against_memlock(&self) -> bool;

    /// Whether adjacent ranges pinned separately form one range for the device (it reaches
    /// registered memory at its host address), so a pool may be pinned in chunks, in parallel.
    /// When `false` the whole pool is pinned with one call, after it was touched in parallel.
    fn pins_in_chunks(&self) -> bool;

    /// Pins `[addr, addr + len)`, memory that is mapped and touched. Called from the set-up's
    /// worker threads, concurrently for disjoint ranges.
    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), Self::Error>;

    /// Unpins a range [`Pinner::pin`] pinned (the same address and length), once, after
    /// [`Pinner::quiesce`]. Called from release threads, concurrently for disjoint ranges.
    fn unpin(&self, addr: *mut u8, len: usize);

    /// Waits until no device work reads or writes the pool any more. Called once, before the
    /// first [`Pinner::unpin`], on the thread that releases the pool.
    fn quiesce(&self) {}
}

/// No pinning: the pool is ordinary pageable memory (the CPU backend's host pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPin;

impl Pinner for NoPin {
    type Error = Infallible;
    fn counts_against_memlock(&self) -> bool {
        false
    }
    fn pins_in_chunks(&self) -> bool {
        true
    }
    fn pin(&self, _addr: *mut u8, _len: usize) -> Result<(), Infallible> {
        Ok(())
    }
    fn unpin(&self, _addr: *mut u8, _len: usize) {}
}

/// Pinning by `mlock`: the pool's pages stay in RAM. Counts against `RLIMIT_MEMLOCK` (unless
/// the process has `CAP_IPC_LOCK`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Mlock;

impl Pinner for Mlock {
    type Error = io::Error;
    fn counts_against_memlock(&self) -> bool {
        true
    }
    fn pins_in_chunks(&self) -> bool {
        true
    }
    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), io::Error> {
        ffi::lock(addr, len).map_err(|(_, e)| e)
    }
    fn unpin(&self, addr: *mut u8, len: usize) {
        ffi::unlock(addr, len);
    }
}

/// Why a host pool could not be set up (the pinning's own refusals are
/// [`SetupError::Pin`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum HostMemoryError {
    /// Refused before anything was reserved: zero bytes, or a limit of the host (available
    /// RAM, the locked-memory limit, `/dev/shm` space).
    Budget(PinnedBudgetError),
    /// Explicit huge pages were asked for ([`HugePages::Explicit`]) and too few are free.
    HugePagesShort {
        /// Bytes asked for (rounded up to the huge page size).
        requested: u64,
        /// Bytes of free explicit huge pages.
        free: u64,
    },
    /// Lent memory that cannot be used as a pool.
    Lent(String),
    /// The operating system refused a call (`mmap`, `madvise`, …).
    Os {
        /// The call.
        call: &'static str,
        /// Bytes of the pool.
        bytes: usize,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for HostMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMemoryError::Budget(e) => write!(f, "{e}"),
            HostMemoryError::HugePagesShort { requested, free } => write!(
                f,
                "a host pool of {requested} bytes on explicit huge pages, but only {free} bytes of \
                 them are free: reserve more (`sysctl vm.nr_hugepages=<pages>`) or use transparent \
                 huge pages (HugePages::Transparent)"
            ),
            HostMemoryError::Lent(problem) => write!(f, "lent host memory: {problem}"),
            HostMemoryError::Os {
                call,
                bytes,
                source,
            } => write!(
                f,
                "{call} refused a host pool of {bytes} bytes: {source}; lower the host budget \
                 (`--host-mem`, `host_mem=`, `HiSparseConfig::host_budget_bytes`) or free memory"
            ),
        }
    }
}

impl std::error::Error for HostMemoryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostMemoryError::Budget(e) => Some(e),
            HostMemoryError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl hisparse_core::Error for HostMemoryError {
    fn kind(&self) -> hisparse_core::ErrorKind {
        use hisparse_core::ErrorKind as K;
        match self {
            HostMemoryError::Budget(e) => e.kind(),
            HostMemoryError::Lent(_) => K::InvalidArgument,
            HostMemoryError::HugePagesShort { .. } | HostMemoryError::Os { .. } => {
                K::OutOfPinnedMemory
            }
        }
    }
}

impl From<PinnedBudgetError> for HostMemoryError {
    fn from(e: PinnedBudgetError) -> Self {
        HostMemoryError::Budget(e)
    }
}

/// A failed set-up: the host refused, or the pinning did. Nothing stays reserved or pinned.
#[derive(Debug)]
pub enum SetupError<E> {
    /// The host refused (limits, mapping).
    Host(HostMemoryError),
    /// The pinner refused (the driver's error).
    Pin(E),
}

impl<E> SetupError<E> {
    /// The error as the pinner's own type, which can hold a [`HostMemoryError`].
    pub fn into_error(self) -> E
    where
        E: From<HostMemoryError>,
    {
        match self {
            SetupError::Host(e) => e.into(),
            SetupError::Pin(e) => e,
        }
    }
}

impl<E> From<HostMemoryError> for SetupError<E> {
    fn from(e: HostMemoryError) -> Self {
        SetupError::Host(e)
    }
}

impl From<SetupError<Infallible>> for HostMemoryError {
    fn from(e: SetupError<Infallible>) -> Self {
        match e {
            SetupError::Host(e) => e,
        }
    }
}

/// A pool whose chunks, pinned separately, are not one range in the device's address space (the
/// device does not reach registered memory at its host address after all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotOneDeviceRange {
    /// Bytes of the pool.
    pub bytes: usize,
    /// Offset of the first chunk that breaks the range.
    pub offset: usize,
    /// Its device address.
    pub found: u64,
    /// The device address that would continue the range.
    pub expected: u64,
}

impl fmt::Display for NotOneDeviceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the chunks of a {}-byte host pool registered separately are not one device range \
             (byte {} is at {:#x}, not {:#x}): register it whole (HostPoolConfig::registration = \
             Registration::Whole)",
            self.bytes, self.offset, self.found, self.expected
        )
    }
}

impl std::error::Error for NotOneDeviceRange {}

/// The pages a pool was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// Base pages.
    Base,
    /// Transparent huge pages (advised; the kernel backs what it can).
    TransparentHuge,
    /// Explicit huge pages (`MAP_HUGETLB`).
    ExplicitHuge,
    /// The lender's or the segment's pages, as they are.
    AsGiven,
}

/// How a pool was set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Threads that touched and pinned it.
    pub threads: usize,
    /// The NUMA node its pages were asked onto (`None`: wherever they were touched).
    pub node: Option<u32>,
    /// The pages it was asked for.
    pub pages: Pages,
    /// Separate pinnings (driver registrations) it holds: 0 when not pinned, 1 when pinned as a
    /// whole.
    pub pinnings: usize,
    /// Bytes each thread touched at a time.
    pub chunk_bytes: usize,
}

impl fmt::Display for Setup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pages = match self.pages {
            Pages::Base => "base pages",
            Pages::TransparentHuge => "transparent huge pages",
            Pages::ExplicitHuge => "explicit huge pages",
            Pages::AsGiven => "the lender's pages",
        };
        let node = match self.node {
            Some(n) => format!("NUMA node {n}"),
            None => "no NUMA placement".to_string(),
        };
        write!(
            f,
            "{} thread{}, {node}, {pages}, {} pinning{} ({} MiB chunks)",
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.pinnings,
            if self.pinnings == 1 { "" } else { "s" },
            self.chunk_bytes >> 20
        )
    }
}

/// Where a region's memory comes from, and how it goes.
enum Backing {
    /// An anonymous mapping of `len` bytes at `base`, reserved here and unmapped on release.
    Mapped { base: NonNull<u8>, len: usize },
    /// Memory someone else allocated and frees; only the pinning is released.
    Lent,
    /// A shared-memory segment, unmapped (and unlinked by its creator) on release.
    Shared(SharedSegment),
}

/// What a release needs, moved to the thread that releases.
struct Held<P: Pinner> {
    addr: NonNull<u8>,
    /// Bytes of the pool (the mapping may be larger).
    len: usize,
    backing: Backing,
    pinner: P,
    /// Byte ranges (offsets into the region) pinned separately.
    pinned: Vec<Range<usize>>,
    workers: Workers,
    chunk: usize,
}

// SAFETY: `Held` owns its mapping (or a lent range whose lender vouched for exclusive use, or a
// segment), and nothing else holds its address once it is moved to the releasing thread.
unsafe impl<P: Pinner> Send for Held<P> {}

/// A host pool's memory: reserved (or lent, or a shared segment), touched and pinned in
/// parallel chunks, and released — unpinned and unmapped in parallel chunks — on a thread of its
/// own when dropped (see [`crate::release`]).
///
/// It hands out its address and length, never a slice: a GPU reads and writes it while it
/// lives, so which bytes the host may touch when is the backend's business.
pub struct HostRegion<P: Pinner = NoPin> {
    addr: NonNull<u8>,
    len: usize,
    setup: Setup,
    held: Option<Held<P>>,
}

// SAFETY: the region owns its memory (or an exclusive loan of it) and exposes only its address;
// the pinner is `Send + Sync`.
unsafe impl<P: Pinner> Send for HostRegion<P> {}
// SAFETY: `&HostRegion` only reads the address, the length and the set-up report.
unsafe impl<P: Pinner> Sync for HostRegion<P> {}

impl<P: Pinner> fmt::Debug for HostRegion<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostRegion")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

/// Whether `MADV_POPULATE_WRITE` works here: 0 unknown, 1 yes, 2 no (kernels before 5.14).
static POPULATE: AtomicU8 = AtomicU8::new(0);

/// Faults `[addr, addr + len)` in writable without changing its contents: `MADV_POPULATE_WRITE`
/// (the kernel zeroes fresh pages and keeps present ones), or where the kernel lacks it a write
/// per page (`zeroed`: a zero into memory that holds only zeros; else each byte written back).
///
/// # Safety
///
/// The range is mapped, readable and writable, and nothing else reads or writes it meanwhile;
/// with `zeroed` it holds only zeros.
unsafe fn populate(
    addr: *mut u8,
    len: usize,
    zeroed: bool,
) -> Result<(), (&'static str, io::Error)> {
    if POPULATE.load(Ordering::Relaxed) != 2 {
        match ffi::advise(addr, len, libc::MADV_POPULATE_WRITE) {
            Ok(()) => {
                POPULATE.store(1, Ordering::Relaxed);
                return Ok(());
            }
            Err((_, e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                POPULATE.store(2, Ordering::Relaxed);
            }
            Err((_, e)) => return Err(("madvise(MADV_POPULATE_WRITE)", e)),
        }
    }
    let page = ffi::page_size();
    if zeroed {
        // SAFETY: forwarded contract (exclusive, writable, all zeros).
        unsafe { ffi::touch_zeroed(addr, len, page) };
    } else {
        // SAFETY: forwarded contract (exclusive, readable and writable).
        unsafe { ffi::touch_preserving(addr, len, page) };
    }
    Ok(())
}

/// How the touching threads treat the contents.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// Only zeros (fresh memory): the touch is the zeroing.
    Zeroed,
    /// Someone's data: kept as they are.
    Kept,
}

impl<P: Pinner> HostRegion<P> {
    /// Reserves `len` zeroed bytes, aligned to 2 MiB (4 KiB for pools under 2 MiB), placed and
    /// paged as `cfg` says for a device on NUMA node `device_node`, touched (zeroed by the
    /// kernel) and pinned by `pinner` in parallel chunks.
    ///
    /// The host's limits are checked first (available RAM, or the free explicit huge pages; the
    /// locked-memory limit when `pinner` counts against it): a pool that cannot fit is refused
    /// with [`HostMemoryError::Budget`] before anything is reserved.
    pub fn allocate(
        len: usize,
        cfg: &HostPoolConfig,
        device_node: Option<u32>,
        pinner: P,
    ) -> Result<Self, SetupError<P::Error>> {
        if len == 0 {
            return Err(HostMemoryError::Budget(PinnedBudgetError::Empty).into());
        }
        let rounded = len.next_multiple_of(HUGE_PAGE);
        let huge_free = meminfo::free_huge_pages();
        let huge_tlb = match cfg.huge_pages {
            HugePages::Explicit => {
                let free = huge_free.map_or(0, |(free, _)| free);
                if huge_free.is_none_or(|(_, size)| size != HUGE_PAGE as u64)
                    || free < rounded as u64
                {
                    return Err(HostMemoryError::HugePagesShort {
                        requested: rounded as u64,
                        free,
                    }
                    .into());
                }
                true
            }
            HugePages::ExplicitIfFree => huge_free
                .is_some_and(|(free, size)| size == HUGE_PAGE as u64 && free >= rounded as u64),
            HugePages::Transparent | HugePages::Off => false,
        };
        let limits = limits::private_pool(pinner.counts_against_memlock(), huge_tlb);
        check_host_pool(len as u64, &limits).map_err(HostMemoryError::Budget)?;

        let os = |(call, source)| HostMemoryError::Os {
            call,
            bytes: len,
            source,
        };
        let (base, map_len, addr) = if huge_tlb {
            let base = ffi::map_anonymous(rounded, true).map_err(os)?;
            (base, rounded, base)
        } else if len >= HUGE_PAGE {
            // One huge page more than needed, so the pool can start on a huge-page boundary.
            let map_len = rounded + HUGE_PAGE;
            let base = ffi::map_anonymous(map_len, false).map_err(os)?;
            let pad = (HUGE_PAGE - base.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
            // `pad < HUGE_PAGE`, so `[base + pad, base + pad + rounded)` lies inside the mapping.
            let addr = NonNull::new(base.as_ptr().wrapping_add(pad)).expect("inside a mapping");
            (base, map_len, addr)
        } else {
            let map_len = len.next_multiple_of(ffi::page_size());
            let base = ffi::map_anonymous(map_len, false).map_err(os)?;
            (base, map_len, base)
        };
        let pages = if huge_tlb {
            Pages::ExplicitHuge
        } else if cfg.huge_pages == HugePages::Off || len < HUGE_PAGE {
            Pages::Base
        } else {
            // Advice only: a kernel without THP backs the range with base pages, same contents.
            let _ = ffi::advise(addr.as_ptr(), rounded, libc::MADV_HUGEPAGE);
            Pages::TransparentHuge
        };
        let node = cfg.node(device_node);
        if let Some(n) = node {
            // Placement is a speed-up: where mbind is refused (a container's seccomp policy,
            // a node that does not exist), the bound threads' first touch still places pages.
            let usable = map_len - (addr.as_ptr() as usize - base.as_ptr() as usize);
            let _ = ffi::prefer_node(addr.as_ptr(), usable, n);
        }
        let held = Held {
            addr,
            len,
            backing: Backing::Mapped { base, len: map_len },
            pinner,
            pinned: Vec::new(),
            workers: Workers::one(),
            chunk: 0,
        };
        Self::set_up(held, len, cfg, node, pages, Contents::Zeroed)
    }

    /// Pins `len` bytes of memory someone else allocated (an engine's array), touched (contents
    /// kept) and pinned in parallel chunks as `cfg` says. The memory stays the lender's: a
    /// release unpins it — on the releasing thread, before [`HostRegion::release`] or the drop
    /// returns, so the lender may free or pin it again right after — and never unmaps it.
    ///
    /// Refused with [`HostMemoryError::Lent`] when `addr` is not aligned to
    /// [`PINNED_ALIGNMENT`] or the range runs past the address space; with
    /// [`HostMemoryError::Budget`] when the part of it that is not in RAM yet exceeds the
    /// available RAM, or the pinning counts against a locked-memory limit it exceeds.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` is mapped, readable and writable memory that stays mapped while the
    /// region lives, and that nothing else reads or writes while the region is being set up.
    pub unsafe fn lend(
        addr: NonNull<u8>,
        len: usize,
        cfg: &HostPoolConfig,
        device_node: Option<u32>,
        pinner: P,
    ) -> Result<Self, SetupError<P::Error>> {
        if len == 0 {
            return Err(HostMemoryError::Budget(PinnedBudgetError::Empty).into());
        }
        let a = addr.as_ptr() as usize;
        if !a.is_multiple_of(PINNED_ALIGNMENT) || !a.is_multiple_of(ffi::page_size()) {
            return Err(HostMemoryError::Lent(format!(
                "{a:#x} is not a multiple of {PINNED_ALIGNMENT} bytes: lend page-aligned memory"
            ))
            .into());
        }
        if a.checked_add(len).is_none() || len > isize::MAX as usize {
            return Err(HostMemoryError::Lent(format!(
                "{len} bytes at {a:#x} run past the end of the address space"
            ))
            .into());
        }
        let limits = limits::private_pool(pinner.counts_against_memlock(), false);
        // The RAM the pool still needs is its pages not in RAM yet; the whole of it is pinned.
        let missing = len as u64 - resident_bytes(a, len);
        if missing > 0 {
            let ram = HostLimits {
                available: limits.available,
                ..HostLimits::default()
            };
            check_host_pool(missing, &ram).map_err(HostMemoryError::Budget)?;
        }
        let locked = HostLimits {
            locked: limits.locked,
            ..HostLimits::default()
        };
        check_host_pool(len as u64, &locked).map_err(HostMemoryError::Budget)?;
        let held = Held {
            addr,
            len,
            backing: Backing::Lent,
            pinner,
            pinned: Vec::new(),
            workers: Workers::one(),
            chunk: 0,
        };
        let node = cfg.node(device_node);
        Self::set_up(held, len, cfg, node, Pages::AsGiven, Contents::Kept)
    }

    /// Pins a shared-memory segment's mapping (the host pool every rank of a node maps), touched
    /// (contents kept) and pinned in parallel chunks as `cfg` says. A release unpins it and then
    /// drops the segment, on a thread of its own.
    ///
    /// Refused with [`HostMemoryError::Budget`] when the pinning counts against a locked-memory
    /// limit the segment exceeds.
    pub fn share(
        segment: SharedSegment,
        cfg: &HostPoolConfig,
        device_node: Option<u32>,
        pinner: P,
    ) -> Result<Self, SetupError<P::Error>> {
        let len = segment.len();
        let limits = HostLimits {
            locked: limits::private_pool(pinner.counts_against_memlock(), false).locked,
            ..HostLimits::default()
        };
        check_host_pool(len as u64, &limits).map_err(HostMemoryError::Budget)?;
        let held = Held {
            addr: segment.addr(),
            len,
            backing: Backing::Shared(segment),
            pinner,
            pinned: Vec::new(),
            workers: Workers::one(),
            chunk: 0,
        };
        let node = cfg.node(device_node);
        Self::set_up(held, len, cfg, node, Pages::AsGiven, Contents::Kept)
    }

    /// Touches and pins `held`'s `len` bytes in parallel chunks; on failure releases what was
    /// done (on this thread) and returns the error.
    fn set_up(
        mut held: Held<P>,
        len: usize,
        cfg: &HostPoolConfig,
        node: Option<u32>,
        pages: Pages,
        contents: Contents,
    ) -> Result<Self, SetupError<P::Error>> {
        held.workers = if len < PARALLEL_FROM {
            Workers::one()
        } else {
            Workers::plan(node, cfg.threads)
        };
        held.chunk = config::chunk_bytes(len, held.workers.threads, cfg.chunk_bytes);
        let chunked = held.pinner.pins_in_chunks() && cfg.registration == Registration::Chunks;
        let count = chunks(len, held.chunk).count();
        let pinned: Vec<AtomicBool> = (0..count).map(|_| AtomicBool::new(false)).collect();
        let base = held.addr.as_ptr() as usize;
        let pinner = &held.pinner;
        let result = for_each_chunk(len, held.chunk, &held.workers, |i, r| {
            let at = (base + r.start) as *mut u8;
            // SAFETY: the chunk lies inside the region's memory, which this set-up uses
            // exclusively: a fresh mapping of zeros (`Zeroed`), or lent or shared memory whose
            // owner vouched that nothing else touches it meanwhile (`Kept`, contents kept).
            unsafe { populate(at, r.len(), contents == Contents::Zeroed) }.map_err(
                |(call, e)| {
                    SetupError::Host(HostMemoryError::Os {
                        call,
                        bytes: len,
                        source: e,
                    })
                },
            )?;
            if chunked {
                pinner.pin(at, r.len()).map_err(SetupError::Pin)?;
                pinned[i].store(true, Ordering::Relaxed);
            }
            Ok(())
        });
        held.pinned = chunks(len, held.chunk)
            .zip(&pinned)
            .filter(|(_, p)| p.load(Ordering::Relaxed))
            .map(|(r, _)| r)
            .collect();
        let result = result.and_then(|()| {
            if chunked {
                return Ok(());
            }
            held.pinner
                .pin(held.addr.as_ptr(), len)
                .map_err(SetupError::Pin)?;
            held.pinned = std::iter::once(0..len).collect();
            Ok(())
        });
        let setup = Setup {
            threads: held.workers.threads.min(count.max(1)),
            node,
            pages,
            pinnings: held.pinned.len(),
            chunk_bytes: held.chunk,
        };
        let region = HostRegion {
            addr: held.addr,
            len,
            setup,
            held: Some(held),
        };
        match result {
            Ok(()) => Ok(region),
            Err(e) => {
                let held = region.take();
                if let Some(held) = held {
                    held.release_here();
                }
                Err(e)
            }
        }
    }

    fn take(mut self) -> Option<Held<P>> {
        self.held.take()
    }

    /// Address of the first byte: a multiple of [`PINNED_ALIGNMENT`] (of 2 MiB for a pool of
    /// 2 MiB or more that the region reserved).
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Bytes of the pool.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the pool holds no bytes (never: a zero size is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How it was set up.
    pub fn setup(&self) -> &Setup {
        &self.setup
    }

    /// The byte ranges (offsets from [`HostRegion::addr`]) pinned separately, in order.
    pub fn pinned_ranges(&self) -> &[Range<usize>] {
        self.held.as_ref().map_or(&[], |h| &h.pinned)
    }

    /// The device address of byte 0, `device_address` being the driver's translation of a host
    /// address of the pool (`cuMemHostGetDevicePointer`, `hipHostGetDevicePointer`). Every
    /// chunk pinned separately must continue the range linearly, or the result is a
    /// [`NotOneDeviceRange`] error.
    pub fn device_base<E: From<NotOneDeviceRange>>(
        &self,
        device_address: impl Fn(*mut u8) -> Result<u64, E>,
    ) -> Result<u64, E> {
        let host = self.addr.as_ptr();
        let base = device_address(host)?;
        for r in self.pinned_ranges().iter().skip(1) {
            let found = device_address(host.wrapping_add(r.start))?;
            let expected = base.wrapping_add(r.start as u64);
            if found != expected {
                return Err(NotOneDeviceRange {
                    bytes: self.len,
                    offset: r.start,
                    found,
                    expected,
                }
                .into());
            }
        }
        Ok(base)
    }

    /// The pinner.
    pub fn pinner(&self) -> &P {
        &self
            .held
            .as_ref()
            .expect("a live region holds its pinner")
            .pinner
    }

    /// Whether the memory is lent ([`HostRegion::lend`]).
    pub fn is_lent(&self) -> bool {
        matches!(self.held.as_ref().map(|h| &h.backing), Some(Backing::Lent))
    }

    /// The shared segment, if the memory is one ([`HostRegion::share`]).
    pub fn segment(&self) -> Option<&SharedSegment> {
        match self.held.as_ref().map(|h| &h.backing) {
            Some(Backing::Shared(s)) => Some(s),
            _ => None,
        }
    }

    /// Releases the pool: the pinner quiesces, then every pinned range is unpinned and the
    /// memory unmapped, in parallel chunks. Pools of 64 MiB and more that this region mapped
    /// (or a segment) are released on a thread of their own and this returns at once; lent
    /// memory is unpinned before this returns (its lender may free it right after); small
    /// pools are released here. The returned [`Release`] says when the memory is gone.
    pub fn release(self) -> Release {
        match self.take() {
            Some(held) => held.release(),
            None => Release::finished(),
        }
    }
}

impl<P: Pinner> Drop for HostRegion<P> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            let _ = held.release();
        }
    }
}

impl<P: Pinner> Held<P> {
    fn release(self) -> Release {
        let background = match &self.backing {
            Backing::Lent => false,
            Backing::Mapped { .. } | Backing::Shared(_) => self.len >= PARALLEL_FROM,
        };
        if background {
            release::spawn(move || self.release_here())
        } else {
            self.release_here();
            Release::finished()
        }
    }

    /// Quiesces, unpins and unmaps on this thread, with the set-up's workers.
    fn release_here(self) {
        let Held {
            addr,
            len: _,
            backing,
            pinner,
            pinned,
            workers,
            chunk,
        } = self;
        if !pinned.is_empty() {
            pinner.quiesce();
            let base = addr.as_ptr() as usize;
            let _ = for_each_chunk(pinned.len(), 1, &workers, |i, _| {
                let r = &pinned[i];
                pinner.unpin((base + r.start) as *mut u8, r.len());
                Ok::<(), Infallible>(())
            });
        }
        match backing {
            Backing::Mapped { base, len } => {
                // SAFETY: the mapping was made by `allocate`, is owned by this value and, its
                // pinning released after the pinner quiesced, used by nothing any more.
                unsafe { unmap_in_chunks(base, len, chunk.max(HUGE_PAGE), &workers) }
            }
            Backing::Lent => {}
            Backing::Shared(segment) => segment.release_here(&workers, chunk.max(HUGE_PAGE)),
        }
    }
}

/// Unmaps `[base, base + len)` in chunks of `chunk` bytes on `workers`.
///
/// # Safety
///
/// The mapping is owned by the caller and nothing uses it any more.
pub(crate) unsafe fn unmap_in_chunks(
    base: NonNull<u8>,
    len: usize,
    chunk: usize,
    workers: &Workers,
) {
    let p = base.as_ptr() as usize;
    let _ = for_each_chunk(
        len,
        chunk.next_multiple_of(ffi::page_size()),
        workers,
        |_, r| {
            // SAFETY: a page-aligned part of the caller's mapping, unmapped once.
            unsafe { ffi::unmap((p + r.start) as *mut u8, r.len()) };
            Ok::<(), Infallible>(())
        },
    );
}

/// Bytes of `[addr, addr + len)` resident in RAM, by pages (`mincore`), counted in chunks so the
/// vector stays small; 0 for a range the kernel cannot report.
fn resident_bytes(addr: usize, len: usize) -> u64 {
    let page = ffi::page_size();
    let mut resident = 0u64;
    for r in chunks(len, 1 << 30) {
        resident += ffi::resident_pages(addr + r.start, r.len()).unwrap_or(0) as u64 * page as u64;
    }
    resident.min(len as u64)
}

/// Whether every page of `[addr, addr + len)` is mapped in this process: a way to see that a
/// released pool's memory is gone.
pub fn is_mapped(addr: usize, len: usize) -> bool {
    ffi::is_mapped(addr, len)
}

/// An anonymous private mapping of zeros whose pages are not touched yet — what `calloc` (or
/// `numpy.zeros`) gives for a large array: an engine's ordinary, unpinned memory, for
/// benchmarks and tests that lend such an array to a backend. Unmapped on drop.
#[derive(Debug)]
pub struct AnonymousMapping {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it hands out its address only.
unsafe impl Send for AnonymousMapping {}

impl AnonymousMapping {
    /// Maps `len` bytes (page-aligned, zero, untouched).
    pub fn new(len: usize) -> io::Result<AnonymousMapping> {
        let addr = ffi::map_anonymous(len.max(1), false).map_err(|(_, e)| e)?;
        Ok(AnonymousMapping { addr, len })
    }

    /// Address of the first byte (page-aligned).
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AnonymousMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is this value's; whoever borrowed its address was required to be
        // done with it before the drop (the lending contracts of the backends).
        unsafe { ffi::unmap(self.addr.as_ptr(), self.len.max(1)) };
    }
}
