//! Pinned host allocation rules (SPEC §5.6).
//!
//! The host pool is page-aligned, device-visible host memory that the GPU reads directly. Pinning
//! too much RAM starves the operating system, so a budget above 95% of the available memory is
//! refused with a clear error before anything is pinned. Backends measure "available" (an I/O
//! the core does not do) and call [`check_pinned_budget`].

use core::fmt;

/// Alignment of every pinned host allocation, in bytes (the common page size).
pub const PINNED_ALIGNMENT: usize = 4096;

/// Share of available RAM, in percent, that may be pinned.
pub const MAX_PINNED_PERCENT: u64 = 95;

/// A pinned-memory request the host cannot safely satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PinnedBudgetError {
    /// Zero bytes were asked for.
    Empty,
    /// More than [`MAX_PINNED_PERCENT`] of available RAM was asked for.
    ExceedsAvailable {
        /// Bytes asked for.
        requested: u64,
        /// Bytes of RAM available.
        available: u64,
        /// The most that may be pinned.
        limit: u64,
    },
}

impl fmt::Display for PinnedBudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PinnedBudgetError::Empty => {
                f.write_str("pinned allocation of 0 bytes; ask for at least one byte")
            }
            PinnedBudgetError::ExceedsAvailable {
                requested,
                available,
                limit,
            } => write!(
                f,
                "pinned allocation of {requested} bytes exceeds {MAX_PINNED_PERCENT}% of the \
                 {available} bytes of available RAM (limit {limit}); lower the host budget"
            ),
        }
    }
}

impl core::error::Error for PinnedBudgetError {}

impl crate::error::Error for PinnedBudgetError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            PinnedBudgetError::Empty => crate::error::ErrorKind::InvalidArgument,
            PinnedBudgetError::ExceedsAvailable { .. } => {
                crate::error::ErrorKind::OutOfPinnedMemory
            }
        }
    }
}

/// Accepts `requested` bytes of pinned memory only if it is positive and at most
/// [`MAX_PINNED_PERCENT`]% of `available`.
pub fn check_pinned_budget(requested: u64, available: u64) -> Result<(), PinnedBudgetError> {
    if requested == 0 {
        return Err(PinnedBudgetError::Empty);
    }
    let limit = (available as u128 * MAX_PINNED_PERCENT as u128 / 100) as u64;
    if requested > limit {
        return Err(PinnedBudgetError::ExceedsAvailable {
            requested,
            available,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_boundary_is_95_percent() {
        assert_eq!(check_pinned_budget(95, 100), Ok(()));
        assert!(matches!(
            check_pinned_budget(96, 100),
            Err(PinnedBudgetError::ExceedsAvailable { limit: 95, .. })
        ));
        assert_eq!(check_pinned_budget(0, 100), Err(PinnedBudgetError::Empty));
    }
}
