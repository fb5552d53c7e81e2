//! [`HostRegion`]: a host pool's memory, touched and pinned in parallel chunks, released in the
//! background.

use core::fmt;
use std::convert::Infallible;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use hisparse_core::ops::{HostLimits, PINNED_ALIGNMENT, PinnedBudgetError, check_host_pool};

use crate::config::{HUGE_PAGE, HostPoolConfig, HugePages, PARALLEL_FROM, Registration};
use crate::error::{HostMemoryError, NotOneDeviceRange, SetupError};
use crate::mapping::{populate, resident_bytes, unmap_in_chunks};
use crate::numa::Workers;
use crate::parallel::{chunks, for_each_chunk};
use crate::pinner::{NoPin, Pinner};
use crate::release::{self, Release};
use crate::shared::SharedSegment;
use crate::shm_pages::ShmPages;
use crate::{config, ffi, limits, meminfo};

/// The pages a pool was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// Base pages.
    Base,
    /// Transparent huge pages (advised; the kernel backs what it can).
    TransparentHuge,
    /// Explicit huge pages (`MAP_HUGETLB`).
    ExplicitHuge,
    /// The lender's pages, as they are.
    AsGiven,
    /// A shared-memory segment's pages (or a lent array's that maps a file of `/dev/shm`), as
    /// the host's shared-memory settings give them.
    Shared(ShmPages),
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
        let pages: std::borrow::Cow<'_, str> = match self.pages {
            Pages::Base => "base pages".into(),
            Pages::TransparentHuge => "transparent huge pages".into(),
            Pages::ExplicitHuge => "explicit huge pages".into(),
            Pages::AsGiven => "the lender's pages".into(),
            Pages::Shared(p) => p.to_string().into(),
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

/// How the touching threads treat the contents.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// Only zeros (fresh memory): the touch is the zeroing.
    Zeroed,
    /// Someone's data: kept as they are.
    Kept,
}

/// A fresh anonymous mapping for a pool, not touched yet.
struct Reserved {
    base: NonNull<u8>,
    map_len: usize,
    /// Byte 0 of the pool inside the mapping (2 MiB aligned from 2 MiB on).
    addr: NonNull<u8>,
    pages: Pages,
}

impl Reserved {
    /// Checks `len` bytes against the host's limits and maps them as `cfg` says: explicit huge
    /// pages (checked against the free ones instead of the available RAM; `ExplicitIfFree` falls
    /// back to transparent huge pages when they are short, or taken meanwhile), or a mapping one
    /// huge page larger than needed so the pool starts on a huge-page boundary, advised
    /// `MADV_HUGEPAGE` unless base pages were asked for.
    fn new(len: usize, cfg: &HostPoolConfig, memlock: bool) -> Result<Reserved, HostMemoryError> {
        let rounded = len.next_multiple_of(HUGE_PAGE);
        let os = |(call, source)| HostMemoryError::Os {
            call,
            bytes: len,
            source,
        };
        let huge_free = meminfo::free_huge_pages()
            .filter(|&(_, size)| size == HUGE_PAGE as u64)
            .map_or(0, |(free, _)| free);
        let enough = huge_free >= rounded as u64;
        if cfg.huge_pages == HugePages::Explicit && !enough {
            return Err(HostMemoryError::HugePagesShort {
                requested: rounded as u64,
                free: huge_free,
            });
        }
        if enough
            && matches!(
                cfg.huge_pages,
                HugePages::Explicit | HugePages::ExplicitIfFree
            )
        {
            limits::check_pool_after_releases(len as u64, || limits::private_pool(memlock, true))?;
            match ffi::map_anonymous(rounded, true) {
                Ok(base) => {
                    return Ok(Reserved {
                        base,
                        map_len: rounded,
                        addr: base,
                        pages: Pages::ExplicitHuge,
                    });
                }
                Err(e) if cfg.huge_pages == HugePages::Explicit => return Err(os(e)),
                Err(_) => {}
            }
        }
        limits::check_pool_after_releases(len as u64, || limits::private_pool(memlock, false))?;
        if len < HUGE_PAGE {
            let map_len = len.next_multiple_of(ffi::page_size());
            let base = ffi::map_anonymous(map_len, false).map_err(os)?;
            return Ok(Reserved {
                base,
                map_len,
                addr: base,
                pages: Pages::Base,
            });
        }
        let map_len = rounded + HUGE_PAGE;
        let base = ffi::map_anonymous(map_len, false).map_err(os)?;
        let pad = (HUGE_PAGE - base.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        // `pad < HUGE_PAGE`, so `[base + pad, base + pad + rounded)` lies inside the mapping.
        let addr = NonNull::new(base.as_ptr().wrapping_add(pad)).expect("inside a mapping");
        let pages = if cfg.huge_pages == HugePages::Off {
            Pages::Base
        } else {
            // Advice only: a kernel without THP backs the range with base pages, same contents.
            let _ = ffi::advise(addr.as_ptr(), rounded, libc::MADV_HUGEPAGE);
            Pages::TransparentHuge
        };
        Ok(Reserved {
            base,
            map_len,
            addr,
            pages,
        })
    }

    /// Bytes of the mapping from the pool's first byte on.
    fn usable(&self) -> usize {
        self.map_len - (self.addr.as_ptr() as usize - self.base.as_ptr() as usize)
    }
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
        let reserved = Reserved::new(len, cfg, pinner.counts_against_memlock())?;
        let node = cfg.node(device_node);
        if let Some(n) = node {
            // Placement is a speed-up: where mbind is refused (a container's seccomp policy,
            // a node that does not exist), the bound threads' first touch still places pages.
            let _ = ffi::prefer_node(reserved.addr.as_ptr(), reserved.usable(), n);
        }
        let Reserved {
            base,
            map_len,
            addr,
            pages,
        } = reserved;
        let held = Held::new(addr, len, Backing::Mapped { base, len: map_len }, pinner);
        Self::set_up(held, cfg, node, pages, Contents::Zeroed)
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
        // The RAM the pool still needs is its pages not in RAM yet; the whole of it is pinned.
        let missing = len as u64 - resident_bytes(a, len);
        if missing > 0 {
            limits::check_pool_after_releases(missing, || HostLimits {
                available: meminfo::available_ram(),
                ..HostLimits::default()
            })
            .map_err(HostMemoryError::Budget)?;
        }
        let locked = HostLimits {
            locked: limits::private_pool(pinner.counts_against_memlock(), false).locked,
            ..HostLimits::default()
        };
        check_host_pool(len as u64, &locked).map_err(HostMemoryError::Budget)?;
        if missing > 0 && cfg.huge_pages != HugePages::Off {
            // The lender's pages not in RAM yet may come as transparent huge pages when the
            // touch below faults them in: the 2 MiB-aligned interior is advised so (advice only:
            // contents unchanged; a mapping that cannot take huge pages keeps base pages, and the
            // lender's mapping keeps the advice after the pool is released).
            let first = a.next_multiple_of(HUGE_PAGE);
            let last = (a + len) / HUGE_PAGE * HUGE_PAGE;
            if last > first {
                let _ = ffi::advise(first as *mut u8, last - first, libc::MADV_HUGEPAGE);
            }
        }
        // An engine's shared-memory array (a node's pool lent by each rank) has the shared-memory
        // file system's pages: the report says which, and the remedy for 4 KiB ones.
        let pages = if crate::shm_pages::maps_shared_memory_file(a) {
            Pages::Shared(ShmPages::of_host())
        } else {
            Pages::AsGiven
        };
        let held = Held::new(addr, len, Backing::Lent, pinner);
        Self::set_up(held, cfg, cfg.node(device_node), pages, Contents::Kept)
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
        let pages = Pages::Shared(segment.pages());
        let held = Held::new(segment.addr(), len, Backing::Shared(segment), pinner);
        Self::set_up(held, cfg, cfg.node(device_node), pages, Contents::Kept)
    }

    /// Touches and pins `held`'s bytes in parallel chunks; on failure releases what was done (on
    /// this thread) and returns the error.
    fn set_up(
        mut held: Held<P>,
        cfg: &HostPoolConfig,
        node: Option<u32>,
        pages: Pages,
        contents: Contents,
    ) -> Result<Self, SetupError<P::Error>> {
        let len = held.len;
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
    /// `len` bytes at `addr` from `backing`, nothing touched or pinned yet.
    fn new(addr: NonNull<u8>, len: usize, backing: Backing, pinner: P) -> Self {
        Held {
            addr,
            len,
            backing,
            pinner,
            pinned: Vec::new(),
            workers: Workers::one(),
            chunk: 0,
        }
    }

    fn release(self) -> Release {
        let background = match &self.backing {
            Backing::Lent => false,
            Backing::Mapped { .. } | Backing::Shared(_) => self.len >= PARALLEL_FROM,
        };
        if background {
            release::in_background(move || self.release_here())
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
            Backing::Shared(segment) => segment.release_here(&workers),
        }
    }
}

/// `range` of a host buffer (offsets from its first byte) in the pieces a driver copy must be
/// issued as: cut where one chunk of a pool pinned here (`region`) ends and the next begins,
/// since a driver's copy (`cuMemcpyHtoDAsync`, `hipMemcpyAsync`) treats host memory as pinned
/// only within one registration and refuses a range spanning two. One piece for a pool pinned
/// whole, or for memory its owner pinned (`None`); none for an empty range. A kernel reading the
/// pool through its device address is not affected.
pub fn copy_pieces<'a, P: Pinner>(
    region: Option<&'a HostRegion<P>>,
    range: Range<usize>,
) -> impl Iterator<Item = Range<usize>> + 'a {
    let (start, end) = (range.start, range.end);
    let ranges = region.map_or(&[][..], HostRegion::pinned_ranges);
    // Chunks are in order and contiguous: skip those that end before the range starts.
    let first = ranges.partition_point(|r| r.end <= start);
    let chunked = if ranges.len() > 1 {
        &ranges[first..]
    } else {
        &[]
    };
    let whole = (ranges.len() <= 1 && start < end).then_some(start..end);
    whole.into_iter().chain(
        chunked
            .iter()
            .take_while(move |r| r.start < end)
            .map(move |r| r.start.max(start)..r.end.min(end))
            .filter(|piece| !piece.is_empty()),
    )
}
