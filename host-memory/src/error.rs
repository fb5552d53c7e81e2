//! Why a host pool could not be set up.

use core::fmt;
use std::convert::Infallible;
use std::io;

use hisparse_core::ops::PinnedBudgetError;

/// Why a host pool could not be set up (the pinning's own refusals are
/// [`SetupError::Pin`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum HostMemoryError {
    /// Refused before anything was reserved: zero bytes, or a limit of the host (available
    /// RAM, the locked-memory limit, `/dev/shm` space).
    Budget(PinnedBudgetError),
    /// Explicit huge pages were asked for ([`crate::HugePages::Explicit`]) and too few are free.
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
