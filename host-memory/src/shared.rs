//! [`SharedSegment`]: a named POSIX shared-memory segment, the host pool every tensor-parallel
//! rank of a node maps.

use core::fmt;
use std::ptr::NonNull;

use hisparse_core::ops::{HostLimits, PINNED_ALIGNMENT, PinnedBudgetError, check_host_pool};

use crate::config::{HUGE_PAGE, HostPoolConfig, HugePages, PARALLEL_FROM};
use crate::ffi::{self, Opened};
use crate::mapping::unmap_in_chunks;
use crate::numa::Workers;
use crate::parallel::for_each_chunk;
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
/// Dropping it removes the name (when this process created it) at once, and unmaps the mapping
/// — on a thread of its own for segments of 64 MiB and more ([`crate::release`]).
#[derive(Debug)]
pub struct SharedSegment {
    addr: NonNull<u8>,
    len: usize,
    name: String,
    creator: bool,
    /// Whether the mapping is still to be unmapped (false once released).
    mapped: bool,
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
        check_name(name)?;
        let limits = HostLimits {
            available: meminfo::available_ram(),
            locked: None,
            shared_free: limits::shared_memory_free(),
        };
        check_host_pool(len as u64, &limits).map_err(ShmError::Budget)?;
        let os = |(call, source)| ShmError::Os {
            call,
            name: name.to_string(),
            source,
        };
        let addr = ffi::shm_create_and_map(name, len).map_err(os)?;
        let segment = SharedSegment {
            addr,
            len,
            name: name.to_string(),
            creator: true,
            mapped: true,
        };
        if len >= HUGE_PAGE && cfg.huge_pages != HugePages::Off {
            // Advice only: honoured where `shmem_enabled` allows huge pages, same contents.
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
        match ffi::shm_open_and_map(name, len).map_err(os)? {
            Opened::Mapped(addr) => Ok(SharedSegment {
                addr,
                len,
                name: name.to_string(),
                creator: false,
                mapped: true,
            }),
            Opened::TooSmall(actual) => Err(ShmError::TooSmall {
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

    /// Whether this process created the segment (and removes its name on drop).
    pub fn is_creator(&self) -> bool {
        self.creator
    }

    /// Removes the name (creator) and unmaps the mapping on this thread, in chunks of `chunk`
    /// bytes on `workers`.
    pub(crate) fn release_here(mut self, workers: &Workers, chunk: usize) {
        self.unlink_and_unmap(workers, chunk);
    }

    fn unlink_and_unmap(&mut self, workers: &Workers, chunk: usize) {
        if !self.mapped {
            return;
        }
        self.mapped = false;
        if self.creator {
            ffi::shm_unlink(&self.name);
        }
        // SAFETY: the mapping is this value's and, as it is being released, used by nothing
        // in this process any more (buffers built on it hold the segment and drop it last).
        unsafe { unmap_in_chunks(self.addr, self.len, chunk, workers) };
    }
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        if !self.mapped {
            return;
        }
        if self.len < PARALLEL_FROM {
            self.unlink_and_unmap(&Workers::one(), self.len.max(1));
            return;
        }
        if self.creator {
            // The name goes now: a new segment of the same name may be created at once.
            ffi::shm_unlink(&self.name);
            self.creator = false;
        }
        let moved = SharedSegment {
            addr: self.addr,
            len: self.len,
            name: std::mem::take(&mut self.name),
            creator: false,
            mapped: true,
        };
        self.mapped = false;
        let _ = release::spawn(move || {
            let workers = Workers::plan(None, None);
            let chunk = config::chunk_bytes(moved.len, workers.threads, None);
            moved.release_here(&workers, chunk);
        });
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
        assert!(matches!(
            SharedSegment::open(&name, 8193),
            Err(ShmError::TooSmall { actual: 8192, .. })
        ));
        drop(a);
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
}
