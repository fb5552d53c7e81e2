//! Pinned host allocation rules (contract §5.6).
//!
//! The host pool is page-aligned, device-visible host memory that the GPU reads directly. Before
//! anything is reserved, a pool is checked against every limit of the host that could refuse it
//! later — or, worse, accept it and then starve the machine:
//!
//! * the RAM available (`MemAvailable` on Linux): at most [`MAX_PINNED_PERCENT`]% of it;
//! * the locked-memory limit (`RLIMIT_MEMLOCK`, `ulimit -l`), where the pinning counts against it
//!   (`mlock`, RDMA registration; not the CUDA or ROCm drivers' own pinning, and never for a
//!   process with `CAP_IPC_LOCK` such as root);
//! * the free space of the shared-memory file system (`/dev/shm`), for a pool the ranks of a node
//!   share.
//!
//! Backends measure the limits (I/O the core does not do) and call [`check_host_pool`] (or
//! [`check_pinned_budget`] where only the available RAM applies). Each refusal names the limit and
//! what to change: the host budget (`--host-mem` of the `hisparse` command, `host_mem=` of the
//! Python module, [`crate::config::HiSparseConfig::host_budget_bytes`]) or the limit itself.

use core::fmt;

/// Alignment of every pinned host allocation, in bytes (the common page size).
pub const PINNED_ALIGNMENT: usize = 4096;

/// Share of available RAM, in percent, that may be pinned.
pub const MAX_PINNED_PERCENT: u64 = 95;

/// Where the host budget is set, as a refusal tells the user.
const LOWER_THE_BUDGET: &str = "lower the host budget (`--host-mem`, `host_mem=`, \
                                 `HiSparseConfig::host_budget_bytes`)";

/// The locked-memory limit a pool's pinning counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockedMemory {
    /// `RLIMIT_MEMLOCK`'s soft limit, in bytes.
    pub limit: u64,
    /// Bytes the process has locked already (`VmLck`).
    pub locked: u64,
}

/// The limits of this host that a host pool must fit, as a backend measured them. A limit that
/// does not apply, or that could not be measured, is `None` and checks nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostLimits {
    /// Bytes of RAM available for new allocations (`MemAvailable`).
    pub available: Option<u64>,
    /// The locked-memory limit, when the pool's pinning counts against it.
    pub locked: Option<LockedMemory>,
    /// Free bytes of the shared-memory file system, for a pool backed by a shared segment.
    pub shared_free: Option<u64>,
}

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
    /// Pinning the request would pass the locked-memory limit (`RLIMIT_MEMLOCK`).
    ExceedsLockedLimit {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the process has locked already.
        locked: u64,
        /// The limit.
        limit: u64,
    },
    /// A shared pool larger than the free space of the shared-memory file system.
    ExceedsSharedSpace {
        /// Bytes asked for.
        requested: u64,
        /// Free bytes of `/dev/shm`.
        free: u64,
    },
}

/// `bytes` with its size in GiB, for messages.
struct Size(u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes ({:.2} GiB)",
            self.0,
            self.0 as f64 / (1u64 << 30) as f64
        )
    }
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
                "a pinned host pool of {} exceeds {MAX_PINNED_PERCENT}% of the {} of RAM \
                 available (MemAvailable; at most {} may be pinned): {LOWER_THE_BUDGET}, or \
                 free memory",
                Size(requested),
                Size(available),
                Size(limit)
            ),
            PinnedBudgetError::ExceedsLockedLimit {
                requested,
                locked,
                limit,
            } => write!(
                f,
                "pinning a host pool of {} would pass the locked-memory limit (RLIMIT_MEMLOCK, \
                 `ulimit -l`) of {}, {} of it locked already: raise the limit (`ulimit -l \
                 unlimited`, `LimitMEMLOCK=infinity` for a systemd service, `memlock` in \
                 /etc/security/limits.conf, `--ulimit memlock=-1` for a container), or \
                 {LOWER_THE_BUDGET}",
                Size(requested),
                Size(limit),
                Size(locked)
            ),
            PinnedBudgetError::ExceedsSharedSpace { requested, free } => write!(
                f,
                "a shared host pool of {} does not fit the {} free in the shared-memory file \
                 system (/dev/shm): enlarge it (`mount -o remount,size=<size> /dev/shm`, \
                 `--shm-size` for a container), or {LOWER_THE_BUDGET}",
                Size(requested),
                Size(free)
            ),
        }
    }
}

impl core::error::Error for PinnedBudgetError {}

impl crate::error::Error for PinnedBudgetError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            PinnedBudgetError::Empty => crate::error::ErrorKind::InvalidArgument,
            PinnedBudgetError::ExceedsAvailable { .. }
            | PinnedBudgetError::ExceedsLockedLimit { .. }
            | PinnedBudgetError::ExceedsSharedSpace { .. } => {
                crate::error::ErrorKind::OutOfPinnedMemory
            }
        }
    }
}

/// Accepts `requested` bytes of pinned memory only if it is positive and at most
/// [`MAX_PINNED_PERCENT`]% of `available`.
pub fn check_pinned_budget(requested: u64, available: u64) -> Result<(), PinnedBudgetError> {
    check_host_pool(
        requested,
        &HostLimits {
            available: Some(available),
            ..HostLimits::default()
        },
    )
}

/// Accepts a host pool of `requested` bytes only if it is positive and fits every limit in
/// `limits`: at most [`MAX_PINNED_PERCENT`]% of the available RAM, within the locked-memory limit
/// (counting what is locked already) and within the shared-memory file system's free space.
/// Limits are checked in that order; the first one passed is the error.
pub fn check_host_pool(requested: u64, limits: &HostLimits) -> Result<(), PinnedBudgetError> {
    if requested == 0 {
        return Err(PinnedBudgetError::Empty);
    }
    if let Some(available) = limits.available {
        let limit = (available as u128 * MAX_PINNED_PERCENT as u128 / 100) as u64;
        if requested > limit {
            return Err(PinnedBudgetError::ExceedsAvailable {
                requested,
                available,
                limit,
            });
        }
    }
    if let Some(LockedMemory { limit, locked }) = limits.locked
        && requested > limit.saturating_sub(locked)
    {
        return Err(PinnedBudgetError::ExceedsLockedLimit {
            requested,
            locked,
            limit,
        });
    }
    if let Some(free) = limits.shared_free
        && requested > free
    {
        return Err(PinnedBudgetError::ExceedsSharedSpace { requested, free });
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

    #[test]
    fn locked_limit_counts_what_is_locked_already() {
        let limits = HostLimits {
            available: Some(1 << 40),
            locked: Some(LockedMemory {
                limit: 1000,
                locked: 200,
            }),
            shared_free: None,
        };
        assert_eq!(check_host_pool(800, &limits), Ok(()));
        let e = check_host_pool(801, &limits).unwrap_err();
        assert_eq!(
            e,
            PinnedBudgetError::ExceedsLockedLimit {
                requested: 801,
                locked: 200,
                limit: 1000
            }
        );
        let over = HostLimits {
            locked: Some(LockedMemory {
                limit: 100,
                locked: 300,
            }),
            ..limits
        };
        assert!(
            check_host_pool(1, &over).is_err(),
            "locked beyond the limit"
        );
    }

    #[test]
    fn shared_space_and_order_of_the_checks() {
        let limits = HostLimits {
            available: Some(100),
            locked: Some(LockedMemory {
                limit: 90,
                locked: 0,
            }),
            shared_free: Some(80),
        };
        assert_eq!(check_host_pool(80, &limits), Ok(()));
        assert!(matches!(
            check_host_pool(85, &limits),
            Err(PinnedBudgetError::ExceedsSharedSpace { free: 80, .. })
        ));
        assert!(matches!(
            check_host_pool(91, &limits),
            Err(PinnedBudgetError::ExceedsLockedLimit { .. })
        ));
        assert!(matches!(
            check_host_pool(96, &limits),
            Err(PinnedBudgetError::ExceedsAvailable { .. })
        ));
        assert_eq!(
            check_host_pool(u64::MAX, &HostLimits::default()),
            Ok(()),
            "no limit measured, nothing refused"
        );
    }

    #[test]
    fn every_refusal_names_its_limit_and_what_to_change() {
        use std::string::ToString;
        let cases = [
            (
                PinnedBudgetError::ExceedsAvailable {
                    requested: 3 << 30,
                    available: 2 << 30,
                    limit: 1 << 30,
                },
                "MemAvailable",
            ),
            (
                PinnedBudgetError::ExceedsLockedLimit {
                    requested: 3 << 30,
                    locked: 0,
                    limit: 64 << 10,
                },
                "ulimit -l",
            ),
            (
                PinnedBudgetError::ExceedsSharedSpace {
                    requested: 3 << 30,
                    free: 1 << 30,
                },
                "/dev/shm",
            ),
        ];
        for (e, limit) in cases {
            let msg = e.to_string();
            assert!(msg.contains(limit), "{msg}");
            assert!(msg.contains("3.00 GiB"), "{msg}");
            for flag in ["--host-mem", "host_mem=", "host_budget_bytes"] {
                assert!(msg.contains(flag), "{msg}");
            }
            assert_eq!(
                crate::error::Error::kind(&e),
                crate::error::ErrorKind::OutOfPinnedMemory
            );
        }
    }
}
