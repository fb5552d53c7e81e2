//! The CPU backend's error type.

use core::fmt;

use hisparse_core::ops::PinnedBudgetError;
use hisparse_core::{Error, ErrorKind, OpError};
use hisparse_host_memory::HostMemoryError;

/// Why a CPU backend call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuError {
    /// A malformed descriptor or argument, found before any memory was touched.
    Op(OpError),
    /// A pinned allocation the host cannot safely satisfy (zero bytes, or above 95% of the
    /// available RAM).
    PinnedBudget(PinnedBudgetError),
    /// A device buffer larger than the RAM the operating system reports available (device memory
    /// is host RAM on this backend).
    RamExhausted {
        /// Bytes asked for.
        bytes: usize,
        /// Bytes of RAM available.
        available: u64,
    },
    /// The allocator refused a buffer (or its size cannot be laid out in the address space).
    Alloc {
        /// Bytes asked for.
        bytes: usize,
        /// Whether it was a pinned (host pool) allocation.
        pinned: bool,
    },
    /// The host pool could not be set up (the operating system refused a mapping, or explicit
    /// huge pages were asked for and too few are free); nothing stayed reserved.
    HostPool {
        /// Bytes asked for.
        bytes: usize,
        /// What was refused, and what to change.
        problem: String,
    },
    /// Memory lent by the engine ([`crate::CpuBuffer::from_raw_parts`]) cannot be used.
    Lent {
        /// What was lent ("host memory").
        what: &'static str,
        /// The problem and what to pass instead.
        problem: String,
    },
}

impl fmt::Display for CpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuError::Op(e) => write!(f, "cpu: {e}"),
            CpuError::PinnedBudget(e) => write!(f, "cpu: {e}"),
            CpuError::RamExhausted { bytes, available } => write!(
                f,
                "cpu: a device buffer of {bytes} bytes does not fit the {available} bytes of RAM \
                 available (the CPU backend's device memory is host RAM); plan a smaller GPU pool"
            ),
            CpuError::Alloc { bytes, pinned } => write!(
                f,
                "cpu: could not allocate {bytes} bytes of {} memory; free buffers or plan a \
                 smaller pool",
                if *pinned { "pinned host" } else { "device" }
            ),
            CpuError::HostPool { bytes, problem } => {
                write!(f, "cpu: a host pool of {bytes} bytes: {problem}")
            }
            CpuError::Lent { what, problem } => write!(f, "cpu: lent {what}: {problem}"),
        }
    }
}

impl std::error::Error for CpuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CpuError::Op(e) => Some(e),
            CpuError::PinnedBudget(e) => Some(e),
            CpuError::Alloc { .. }
            | CpuError::RamExhausted { .. }
            | CpuError::HostPool { .. }
            | CpuError::Lent { .. } => None,
        }
    }
}

impl Error for CpuError {
    fn kind(&self) -> ErrorKind {
        match self {
            CpuError::Op(e) => e.kind(),
            CpuError::PinnedBudget(e) => e.kind(),
            CpuError::Alloc { pinned: true, .. } | CpuError::HostPool { .. } => {
                ErrorKind::OutOfPinnedMemory
            }
            CpuError::Alloc { pinned: false, .. } | CpuError::RamExhausted { .. } => {
                ErrorKind::OutOfDeviceMemory
            }
            CpuError::Lent { .. } => ErrorKind::InvalidArgument,
        }
    }
}

impl From<OpError> for CpuError {
    fn from(e: OpError) -> Self {
        CpuError::Op(e)
    }
}

impl From<PinnedBudgetError> for CpuError {
    fn from(e: PinnedBudgetError) -> Self {
        CpuError::PinnedBudget(e)
    }
}

impl CpuError {
    /// A failed host-pool set-up of `bytes`: a budget refusal stays one.
    pub(crate) fn host_pool(bytes: usize, e: HostMemoryError) -> Self {
        match e {
            HostMemoryError::Budget(b) => CpuError::PinnedBudget(b),
            other => CpuError::HostPool {
                bytes,
                problem: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::OpName;

    #[test]
    fn kinds_are_portable() {
        let op = CpuError::from(OpError::Zero {
            op: OpName::Remap,
            field: "top_k",
        });
        assert_eq!(op.kind(), ErrorKind::InvalidArgument);
        assert!(op.to_string().contains("top_k"));
        let pinned = CpuError::from(PinnedBudgetError::ExceedsAvailable {
            requested: 10,
            available: 10,
            limit: 9,
        });
        assert_eq!(pinned.kind(), ErrorKind::OutOfPinnedMemory);
        let alloc = CpuError::Alloc {
            bytes: 1,
            pinned: false,
        };
        assert_eq!(alloc.kind(), ErrorKind::OutOfDeviceMemory);
    }
}
