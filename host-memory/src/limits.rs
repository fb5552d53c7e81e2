//! The host's limits a pool must fit, measured (the rule that judges them is
//! [`hisparse_core::ops::check_host_pool`]).

use hisparse_core::ops::{HostLimits, LockedMemory};

use crate::{ffi, meminfo};

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
    ffi::free_space("/dev/shm")
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
