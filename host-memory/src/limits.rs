//! The host's limits a pool must fit, measured (the rule that judges them is
//! [`hisparse_core::ops::check_host_pool`]).

use std::time::Duration;

use hisparse_core::ops::{HostLimits, LockedMemory, PinnedBudgetError, check_host_pool};

use crate::{ffi, meminfo, release};

/// How long a refused pool waits for this process's releases still running before the refusal
/// stands: a pool dropped a moment ago is still being unmapped on its release thread, and its
/// memory comes back when that finishes (seconds for hundreds of GiB).
const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Runs `check`; when it refuses while pools this process dropped are still being released,
/// waits for those releases (at most a minute) and runs it again — so that an engine that drops
/// a pool and allocates the next one at once is not refused for memory on its way back. Every
/// budget check of a host pool goes through it (this crate's, and the runtime's before it
/// allocates).
pub fn check_after_releases<T, E>(check: impl Fn() -> Result<T, E>) -> Result<T, E> {
    match check() {
        Err(_) if release::releases_in_flight() > 0 => {
            release::wait_for_releases(RELEASE_WAIT);
            check()
        }
        checked => checked,
    }
}

/// [`check_after_releases`] of `bytes` against the limits `measure` reads (the one rule,
/// [`check_host_pool`]).
pub(crate) fn check_pool_after_releases(
    bytes: u64,
    measure: impl Fn() -> HostLimits,
) -> Result<(), PinnedBudgetError> {
    check_after_releases(|| check_host_pool(bytes, &measure()))
}

/// The locked-memory limit (`RLIMIT_MEMLOCK`) and what this process has locked already, when a
/// pinning that counts against it would be bounded by it: `None` when the limit is unlimited or
/// the process may lock without limit (`CAP_IPC_LOCK`, as root).
///
/// What counts against it: `mlock` and RDMA memory registration (`ibv_reg_mr`, as NIXL's UCX
/// backend uses). What does not: the CUDA and ROCm drivers' own pinning (`cuMemHostRegister`,
/// `cuMemHostAlloc`, `hipHostRegister`), which the kernel drivers do without charging the limit.
pub fn locked_memory_limit() -> Option<LockedMemory> {
    if meminfo::may_lock_without_limit() {
        return None;
    }
    let limit = ffi::memlock_limit()?;
    Some(LockedMemory {
        limit,
        locked: meminfo::locked_bytes(),
    })
}

/// Free bytes of the shared-memory file system POSIX shared memory lives in (`/dev/shm`).
pub fn shared_memory_free() -> Option<u64> {
    ffi::free_space(crate::shm_pages::SHM_DIR)
}

/// The limits a private pool must fit: the available RAM (unless `huge_tlb`: explicit huge pages
/// are not part of it, and are checked against the free huge pages instead), and the
/// locked-memory limit when its pinning counts against it.
pub(crate) fn private_pool(counts_against_memlock: bool, huge_tlb: bool) -> HostLimits {
    HostLimits {
        available: if huge_tlb {
            None
        } else {
            meminfo::available_ram()
        },
        locked: counts_against_memlock.then(locked_memory_limit).flatten(),
        shared_free: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_refusal_waits_for_releases_in_flight_and_measures_again() {
        let available = Arc::new(AtomicU64::new(10));
        let measure = {
            let available = available.clone();
            move || HostLimits {
                available: Some(available.load(Ordering::SeqCst)),
                ..HostLimits::default()
            }
        };
        // A pool being released: its memory comes back when the release finishes.
        let freed = available.clone();
        let release = release::in_background(move || {
            std::thread::sleep(Duration::from_millis(50));
            freed.store(1 << 40, Ordering::SeqCst);
        });
        check_pool_after_releases(1 << 30, &measure).expect("fits once the release finished");
        assert!(release.is_finished());
        // Nothing in flight: the refusal stands at once, naming what is available.
        available.store(10, Ordering::SeqCst);
        release::wait_for_releases(RELEASE_WAIT);
        let e = check_pool_after_releases(1 << 30, &measure).unwrap_err();
        assert!(
            matches!(e, PinnedBudgetError::ExceedsAvailable { .. }),
            "{e:?}"
        );
    }
}
