#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod ffi;

use core::fmt;
use core::ptr::NonNull;

use hisparse_core::ops::{PINNED_ALIGNMENT, PinnedBudgetError, check_pinned_budget};

/// Why a segment could not be created or opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShmError {
    /// The name is not a valid segment name.
    BadName(String),
    /// The size is zero or above the safe share of RAM.
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
            _ => None,
        }
    }
}

impl hisparse_core::Error for ShmError {
    fn kind(&self) -> hisparse_core::ErrorKind {
        use hisparse_core::ErrorKind as K;
        match self {
            ShmError::BadName(_) | ShmError::TooSmall { .. } => K::InvalidArgument,
            ShmError::Budget(_) => K::OutOfPinnedMemory,
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
#[derive(Debug)]
pub struct SharedSegment {
    addr: NonNull<u8>,
    len: usize,
    name: String,
    creator: bool,
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
    /// Creates segment `name` of `len` zeroed bytes (it must not exist yet) and maps it. `len`
    /// is checked against the RAM available first.
    pub fn create(name: &str, len: usize) -> Result<Self, ShmError> {
        check_name(name)?;
        let available = available_ram().unwrap_or(u64::MAX);
        check_pinned_budget(len as u64, available).map_err(ShmError::Budget)?;
        let addr = ffi::create_and_map(name, len)?;
        Ok(SharedSegment {
            addr,
            len,
            name: name.to_string(),
            creator: true,
        })
    }

    /// Opens existing segment `name` and maps its first `len` bytes.
    pub fn open(name: &str, len: usize) -> Result<Self, ShmError> {
        check_name(name)?;
        if len == 0 {
            return Err(ShmError::Budget(PinnedBudgetError::Empty));
        }
        let addr = ffi::open_and_map(name, len)?;
        Ok(SharedSegment {
            addr,
            len,
            name: name.to_string(),
            creator: false,
        })
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
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        ffi::unmap(self.addr, self.len);
        if self.creator {
            ffi::unlink(&self.name);
        }
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

const _: () = assert!(PINNED_ALIGNMENT <= 4096, "mmap gives page alignment");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_created_here_is_seen_through_a_second_mapping() {
        let name = SharedSegment::unique_name("hisparse-shm-test");
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
        let name = SharedSegment::unique_name("hisparse-shm-test");
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
}
