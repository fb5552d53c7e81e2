//! [`SharedSegment`]: a named POSIX shared-memory segment, the host pool every tensor-parallel
//! rank of a node maps.

use core::fmt;
use std::ptr::NonNull;

use hisparse_core::ops::{HostLimits, PINNED_ALIGNMENT, PinnedBudgetError};

use crate::config::{HUGE_PAGE, HostPoolConfig, HugePages, PARALLEL_FROM};
use crate::ffi;
use crate::mapping::unmap_in_chunks;
use crate::numa::Workers;
use crate::parallel::for_each_chunk;
use crate::shm_pages::ShmPages;
use crate::{config, limits, meminfo, release};

/// Why a segment could not be created or opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShmError {
    /// The name is not a valid segment name.
    BadName(String),
    /// Zero bytes, or a limit of the host (available RAM, `/dev/shm` space), refused before
    /// anything was created.
    Budget(PinnedBudgetError),
    /// An existing segment is smaller than the size asked for.
    TooSmall {
        /// The segment's name.
        name: String,
        /// Bytes it has.
        actual: u64,
        /// Bytes asked for.
        needed: u64,
    },
    /// The operating system refused a call.
    Os {
        /// The call (`shm_open`, `ftruncate`, `mmap`, …).
        call: &'static str,
        /// The segment's name.
        name: String,
        /// The error.
        source: std::io::Error,
    },
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::BadName(n) => write!(
                f,
                "`{n}` is not a shared-memory segment name: use up to 200 letters, digits, '-', '_' and '.'"
            ),
            ShmError::Budget(e) => write!(f, "shared host pool: {e}"),
            ShmError::TooSmall {
                name,
                actual,
                needed,
            } => write!(
                f,
                "shared segment `{name}` holds {actual} bytes but {needed} are needed; open it with the creator's size"
            ),
            ShmError::Os { call, name, source } => {
                write!(f, "{call} on shared segment `{name}`: {source}")
            }
        }
    }
}

impl std::error::Error for ShmError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShmError::Os { source, .. } => Some(source),
            ShmError::Budget(e) => Some(e),
            _ => None,
        }
    }
}

impl hisparse_core::Error for ShmError {
    fn kind(&self) -> hisparse_core::ErrorKind {
        use hisparse_core::ErrorKind as K;
        match self {
            ShmError::BadName(_) | ShmError::TooSmall { .. } => K::InvalidArgument,
            ShmError::Budget(e) => e.kind(),
            ShmError::Os { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                K::NotFound
            }
            ShmError::Os { .. } => K::OutOfPinnedMemory,
        }
    }
}

/// A shared-memory segment mapped into this process.
///
/// It hands out its address and length, never a slice: other processes write the same memory,
/// so which bytes may be read when is the host pool's protocol, enforced by whoever builds a
/// buffer on top of it (a backend).
///
/// A segment of more than 1 GiB is made of several files of 1 GiB (`name`, `name.1`,
/// `name.2`, …), mapped side by side into one range: the kernel allocates and frees a file's
/// pages under that file's lock, so the files are populated and freed in parallel where one file
/// would go at one thread's pace. An opener learns the file size from the first file.
///
/// Dropping it removes the names (when this process created it) at once, and unmaps the mapping
/// — on a thread of its own for segments of 64 MiB and more ([`crate::release`]), a file per
/// worker.
#[derive(Debug)]
pub struct SharedSegment {
    addr: NonNull<u8>,
    len: usize,
    name: String,
    /// Bytes of each file the segment is made of (the last may hold fewer).
    part_bytes: usize,
    creator: bool,
    /// Whether the mapping is still to be unmapped (false once released).
    mapped: bool,
    /// The pages the host's shared-memory settings give its files.
    pages: ShmPages,
}

// SAFETY: the segment is plain memory mapped shared and readable/writable from any thread; the
// handle holds no thread-affine state.
unsafe impl Send for SharedSegment {}
// SAFETY: as above; `&SharedSegment` only exposes the address and the length.
unsafe impl Sync for SharedSegment {}

fn check_name(name: &str) -> Result<(), ShmError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ShmError::BadName(name.to_string()))
    }
}

impl SharedSegment {
    /// Creates segment `name` of `len` zeroed bytes (it must not exist yet), maps it and touches
    /// it in parallel, as [`HostPoolConfig::default`] says ([`SharedSegment::create_with`]).
    pub fn create(name: &str, len: usize) -> Result<Self, ShmError> {
        Self::create_with(name, len, &HostPoolConfig::default())
    }

    /// Creates segment `name` of `len` zeroed bytes (it must not exist yet) and maps it; its
    /// pages are allocated (zeroed) by threads in parallel chunks, on transparent huge pages where
    /// the shared-memory file system allows them, on node [`crate::Placement::Node`] when `cfg`
    /// names one.
    ///
    /// `len` is checked against the RAM available and the free space of `/dev/shm` first: a
    /// segment that cannot fit is refused with [`ShmError::Budget`] before it is created.
    pub fn create_with(name: &str, len: usize, cfg: &HostPoolConfig) -> Result<Self, ShmError> {
        Self::create_in_parts(name, len, cfg, PART_BYTES)
    }

    /// [`SharedSegment::create_with`], made of files of `part_bytes` (a multiple of
    /// [`HUGE_PAGE`]).
    fn create_in_parts(
        name: &str,
        len: usize,
        cfg: &HostPoolConfig,
        part_bytes: usize,
    ) -> Result<Self, ShmError> {
        check_name(name)?;
        limits::check_pool_after_releases(len as u64, || HostLimits {
            available: meminfo::available_ram(),
            locked: None,
            shared_free: limits::shared_memory_free(),
        })
        .map_err(ShmError::Budget)?;
        let os = |(call, source)| ShmError::Os {
            call,
            name: name.to_string(),
            source,
        };
        let addr = map_parts(name, len, part_bytes, true).map_err(|e| match e {
            Mapped::Os(e) => os(e),
            Mapped::TooSmall(_) => unreachable!("a created segment has the size asked for"),
        })?;
        let segment = SharedSegment {
            addr,
            len,
            name: name.to_string(),
            part_bytes: part_bytes.min(len),
            creator: true,
            mapped: true,
            pages: ShmPages::of_host(),
        };
        if len >= HUGE_PAGE && cfg.huge_pages != HugePages::Off {
            // Advice only: honoured where `/dev/shm`'s mount allows huge pages (`ShmPages`),
            // same contents.
            let _ = ffi::advise(addr.as_ptr(), len, libc::MADV_HUGEPAGE);
        }
        let node = cfg.node(None);
        if let Some(n) = node {
            // A speed-up only, as for private pools.
            let _ = ffi::prefer_node(addr.as_ptr(), len, n);
        }
        let workers = if len < PARALLEL_FROM {
            Workers::one()
        } else {
            Workers::plan(node, cfg.threads)
        };
        let chunk = config::chunk_bytes(len, workers.threads, cfg.chunk_bytes);
        let base = addr.as_ptr() as usize;
        for_each_chunk(len, chunk, &workers, |_, r| {
            // Allocating every page now, in parallel, spares the ranks the page faults (and
            // would report a full /dev/shm here rather than as a SIGBUS later).
            ffi::advise(
                (base + r.start) as *mut u8,
                r.len(),
                libc::MADV_POPULATE_WRITE,
            )
        })
        .or_else(|(call, e)| {
            if e.raw_os_error() == Some(libc::EINVAL) {
                // A kernel without MADV_POPULATE_WRITE (before 5.14): pages fault in on use.
                Ok(())
            } else {
                Err((call, e))
            }
        })
        .map_err(os)?;
        Ok(segment)
    }

    /// Opens existing segment `name` and maps its first `len` bytes.
    pub fn open(name: &str, len: usize) -> Result<Self, ShmError> {
        check_name(name)?;
        if len == 0 {
            return Err(ShmError::Budget(PinnedBudgetError::Empty));
        }
        let os = |(call, source)| ShmError::Os {
            call,
            name: name.to_string(),
            source,
        };
        // The creator's part size is the size of its first file (all of the segment when it is
        // one file).
        let (fd, first) = ffi::shm_open_sized(name).map_err(os)?;
        ffi::close(fd);
        let part_bytes = usize::try_from(first).unwrap_or(usize::MAX).min(len);
        match map_parts(name, len, part_bytes.max(1), false) {
            Ok(addr) => Ok(SharedSegment {
                addr,
                len,
                name: name.to_string(),
                part_bytes,
                creator: false,
                mapped: true,
                pages: ShmPages::of_host(),
            }),
            Err(Mapped::Os(e)) => Err(os(e)),
            Err(Mapped::TooSmall(actual)) => Err(ShmError::TooSmall {
                name: name.to_string(),
                actual,
                needed: len as u64,
            }),
        }
    }

    /// A name unique to this process and moment, for a segment its ranks share.
    pub fn unique_name(prefix: &str) -> String {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{prefix}-{}-{t:x}", std::process::id())
    }

    /// Address of the first byte (page-aligned, a multiple of [`PINNED_ALIGNMENT`]).
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Mapped bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are mapped (never: a zero size is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pages the host's shared-memory settings give the segment's files (read when it was
    /// created or opened): 4 KiB pages unless the mount holding `/dev/shm` allows huge pages.
    pub fn pages(&self) -> ShmPages {
        self.pages
    }

    /// Whether this process created the segment (and removes its name on drop).
    pub fn is_creator(&self) -> bool {
        self.creator
    }

    /// Removes the names (creator) and unmaps the mapping on this thread, a file at a time on
    /// `workers`: unmapping a file's last mapping frees its pages, under that file's own lock,
    /// so the files are freed in parallel.
    pub(crate) fn release_here(mut self, workers: &Workers) {
        self.unlink_and_unmap(workers);
    }

    fn unlink_and_unmap(&mut self, workers: &Workers) {
        if !self.mapped {
            return;
        }
        self.mapped = false;
        if self.creator {
            unlink_parts(&self.name, self.len, self.part_bytes);
        }
        // SAFETY: the mapping is this value's and, as it is being released, used by nothing
        // in this process any more (buffers built on it hold the segment and drop it last).
        unsafe { unmap_in_chunks(self.addr, self.len, self.part_bytes, workers) };
    }
}

/// Bytes of each file a segment of this process's making is made of (the last may hold fewer).
/// The kernel allocates and frees the pages of one shared-memory file under that file's lock: a
/// segment of one file is populated and freed at one thread's pace whatever the threads, one of
/// many files in parallel.
const PART_BYTES: usize = 1 << 30;

/// The name of file `i` of segment `name`: the name itself, then `name.1`, `name.2`, …
fn part_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_string()
    } else {
        format!("{name}.{i}")
    }
}

/// Why mapping a segment's files failed.
enum Mapped {
    Os((&'static str, std::io::Error)),
    /// The files hold fewer bytes than asked for: how many they hold.
    TooSmall(u64),
}

/// Maps the files of segment `name` (`part_bytes` each) side by side into one reserved range of
/// `len` bytes: created (zeroed) when `create`, else opened. On failure nothing stays mapped,
/// and nothing created stays named.
fn map_parts(
    name: &str,
    len: usize,
    part_bytes: usize,
    create: bool,
) -> Result<NonNull<u8>, Mapped> {
    let base = ffi::reserve(len, HUGE_PAGE).map_err(Mapped::Os)?;
    let mut found = 0u64;
    // Files this call created: the only ones a failure may unname.
    let mut made = 0;
    let mut result = Ok(());
    for (i, at) in (0..len).step_by(part_bytes).enumerate() {
        let part = part_bytes.min(len - at);
        let name_i = part_name(name, i);
        let fd = if create {
            let fd = ffi::shm_create(&name_i, part).map_err(Mapped::Os);
            made += usize::from(fd.is_ok());
            fd
        } else {
            match ffi::shm_open_sized(&name_i) {
                Ok((fd, size)) if size < part as u64 => {
                    ffi::close(fd);
                    Err(Mapped::TooSmall(found + size))
                }
                Ok((fd, _)) => Ok(fd),
                Err((_, e)) if i > 0 && e.kind() == std::io::ErrorKind::NotFound => {
                    Err(Mapped::TooSmall(found))
                }
                Err(e) => Err(Mapped::Os(e)),
            }
        };
        let at_ptr = NonNull::new(base.as_ptr().wrapping_add(at)).expect("inside the reservation");
        // SAFETY: `[at, at + part)` lies inside the reservation made above, used by nothing else.
        result =
            fd.and_then(|fd| unsafe { ffi::map_shared_at(fd, at_ptr, part) }.map_err(Mapped::Os));
        if result.is_err() {
            for j in 0..made {
                ffi::shm_unlink(&part_name(name, j));
            }
            break;
        }
        found += part as u64;
    }
    match result {
        Ok(()) => Ok(base),
        Err(e) => {
            // SAFETY: the reservation (and what was mapped over it) is this function's, unused.
            unsafe { ffi::unmap(base.as_ptr(), len) };
            Err(e)
        }
    }
}

/// Removes the names of the files of a segment of `len` bytes made of `part_bytes` files.
fn unlink_parts(name: &str, len: usize, part_bytes: usize) {
    for i in 0..len.div_ceil(part_bytes.max(1)) {
        ffi::shm_unlink(&part_name(name, i));
    }
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        if !self.mapped {
            return;
        }
        if self.len < PARALLEL_FROM {
            self.unlink_and_unmap(&Workers::one());
            return;
        }
        if self.creator {
            // The names go now: a new segment of the same name may be created at once.
            unlink_parts(&self.name, self.len, self.part_bytes);
            self.creator = false;
        }
        let moved = SharedSegment {
            addr: self.addr,
            len: self.len,
            name: std::mem::take(&mut self.name),
            part_bytes: self.part_bytes,
            creator: false,
            mapped: true,
            pages: self.pages,
        };
        self.mapped = false;
        let _ = release::in_background(move || moved.release_here(&Workers::plan(None, None)));
    }
}

const _: () = assert!(PINNED_ALIGNMENT <= 4096, "mmap gives page alignment");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_created_here_is_seen_through_a_second_mapping() {
        let name = SharedSegment::unique_name("hisparse-host-memory-test");
        let a = SharedSegment::create(&name, 1 << 20).unwrap();
        let b = SharedSegment::open(&name, 1 << 20).unwrap();
        assert_eq!(a.addr().as_ptr() as usize % 4096, 0);
        assert_ne!(a.addr(), b.addr(), "two mappings of one segment");
        ffi::write_byte(a.addr(), 12345, 0x5A);
        assert_eq!(ffi::read_byte(b.addr(), 12345), 0x5A);
        assert_eq!(ffi::read_byte(b.addr(), 0), 0, "created zeroed");
        drop(b);
        drop(a);
        assert!(
            matches!(
                SharedSegment::open(&name, 1 << 20),
                Err(ShmError::Os { .. })
            ),
            "the creator removed the name"
        );
    }

    #[test]
    fn bad_names_sizes_and_duplicates_are_typed_errors() {
        assert!(matches!(
            SharedSegment::create("a/b", 4096),
            Err(ShmError::BadName(_))
        ));
        assert!(matches!(
            SharedSegment::create("", 4096),
            Err(ShmError::BadName(_))
        ));
        let name = SharedSegment::unique_name("hisparse-host-memory-test");
        assert!(matches!(
            SharedSegment::create(&name, 0),
            Err(ShmError::Budget(_))
        ));
        assert!(matches!(
            SharedSegment::create(&name, usize::MAX / 2),
            Err(ShmError::Budget(_))
        ));
        let a = SharedSegment::create(&name, 8192).unwrap();
        assert!(matches!(
            SharedSegment::create(&name, 8192),
            Err(ShmError::Os { .. })
        ));
        let r = SharedSegment::open(&name, 8193);
        assert!(
            matches!(r, Err(ShmError::TooSmall { actual: 8192, .. })),
            "{r:?}"
        );
        drop(a);
    }

    #[test]
    fn a_segment_of_several_files_maps_as_one_range_and_goes_whole() {
        let part = 2 * HUGE_PAGE;
        let len = 2 * part + 12288;
        let name = SharedSegment::unique_name("hisparse-host-memory-test");
        let cfg = HostPoolConfig::default();
        let a = SharedSegment::create_in_parts(&name, len, &cfg, part).unwrap();
        assert_eq!(a.addr().as_ptr() as usize % HUGE_PAGE, 0);
        // The opener learns the part size from the first file.
        let b = SharedSegment::open(&name, len).unwrap();
        for at in [0, part - 1, part, 2 * part, len - 1] {
            ffi::write_byte(a.addr(), at, (at % 251) as u8 + 1);
            assert_eq!(
                ffi::read_byte(b.addr(), at),
                (at % 251) as u8 + 1,
                "byte {at}"
            );
        }
        // Fewer bytes than the files hold map; more are refused with what the files hold.
        drop(SharedSegment::open(&name, part + 1).unwrap());
        assert!(matches!(
            SharedSegment::open(&name, len + 1),
            Err(ShmError::TooSmall { actual, .. }) if actual == len as u64
        ));
        assert!(matches!(
            SharedSegment::open(&name, 3 * part + 1),
            Err(ShmError::TooSmall { actual, .. }) if actual == len as u64
        ));
        drop(a);
        for i in 0..3 {
            assert!(
                ffi::shm_open_sized(&part_name(&name, i)).is_err(),
                "file {i} is unnamed with the creator's drop"
            );
        }
        assert_eq!(
            ffi::read_byte(b.addr(), len - 1),
            ((len - 1) % 251) as u8 + 1
        );
        drop(b);
        // A failed create removes the files it made: the name can be taken again.
        let c = SharedSegment::create_in_parts(&name, len, &cfg, part).unwrap();
        assert!(matches!(
            SharedSegment::create_in_parts(&name, len, &cfg, part),
            Err(ShmError::Os { .. })
        ));
        assert!(
            SharedSegment::open(&name, len).is_ok(),
            "the first creator's files stay"
        );
        drop(c);
    }

    #[test]
    fn a_large_segment_is_touched_in_parallel_and_unmapped_in_the_background() {
        let len = PARALLEL_FROM + (3 << 20);
        let name = SharedSegment::unique_name("hisparse-host-memory-test");
        let cfg = HostPoolConfig {
            threads: Some(3),
            chunk_bytes: Some(4 << 20),
            ..HostPoolConfig::default()
        };
        let a = SharedSegment::create_with(&name, len, &cfg).unwrap();
        let b = SharedSegment::open(&name, len).unwrap();
        let huge_mapped = pmd_mapped_kib(a.addr());
        if a.pages().huge() {
            // Huge pages are allowed, not promised (memory may be too fragmented): report only.
            eprintln!("{}: {huge_mapped:?} KiB mapped by huge pages", a.pages());
        } else if a.pages() != ShmPages::Unknown {
            assert_eq!(huge_mapped, Some(0), "{} yet huge pages mapped", a.pages());
        }
        assert_eq!(ffi::read_byte(b.addr(), len - 1), 0);
        ffi::write_byte(a.addr(), len - 1, 7);
        assert_eq!(ffi::read_byte(b.addr(), len - 1), 7);
        drop(a);
        assert!(
            SharedSegment::open(&name, len).is_err(),
            "the name goes with the creator's drop, before the unmapping finishes"
        );
        assert_eq!(
            ffi::read_byte(b.addr(), 0),
            0,
            "the opener's mapping lives on"
        );
        drop(b);
        assert!(release::wait_for_releases(std::time::Duration::from_secs(
            60
        )));
    }

    /// KiB of the mapping starting at `addr` that huge pages map (`ShmemPmdMapped` in
    /// `/proc/self/smaps`), `None` where that cannot be read.
    fn pmd_mapped_kib(addr: NonNull<u8>) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = format!("{:x}-", addr.as_ptr() as usize);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start)).skip(1);
        let line = lines.find(|l| l.starts_with("ShmemPmdMapped:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }
}
