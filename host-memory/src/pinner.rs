//! [`Pinner`]: how a host region's ranges are pinned — by a GPU driver (the backends' own), not
//! at all ([`NoPin`]) or by `mlock` ([`Mlock`]).

use std::convert::Infallible;
use std::io;

use crate::ffi;

/// A driver's (or the kernel's) pinning of host memory, applied to the ranges of a
/// [`crate::HostRegion`]: the CUDA and ROCm backends register memory with their driver; [`NoPin`]
/// leaves it pageable; [`Mlock`] locks it with `mlock`.
pub trait Pinner: Send + Sync + 'static {
    /// What a refused pinning reports.
    type Error: Send;

    /// Whether the pinning counts against the locked-memory limit (`RLIMIT_MEMLOCK`), so that a
    /// pool larger than the limit must be refused before it is reserved.
    fn counts_against_memlock(&self) -> bool;

    /// Whether adjacent ranges pinned separately form one range for the device (it reaches
    /// registered memory at its host address), so a pool may be pinned in chunks, in parallel.
    /// When `false` the whole pool is pinned with one call, after it was touched in parallel.
    fn pins_in_chunks(&self) -> bool;

    /// Pins `[addr, addr + len)`, memory that is mapped and touched. Called from the set-up's
    /// worker threads, concurrently for disjoint ranges.
    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), Self::Error>;

    /// Unpins a range [`Pinner::pin`] pinned (the same address and length), once, after
    /// [`Pinner::quiesce`]. Called from release threads, concurrently for disjoint ranges.
    fn unpin(&self, addr: *mut u8, len: usize);

    /// Waits until no device work reads or writes the pool any more. Called once, before the
    /// first [`Pinner::unpin`], on the thread that releases the pool.
    fn quiesce(&self) {}
}

/// No pinning: the pool is ordinary pageable memory (the CPU backend's host pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPin;

impl Pinner for NoPin {
    type Error = Infallible;
    fn counts_against_memlock(&self) -> bool {
        false
    }
    fn pins_in_chunks(&self) -> bool {
        true
    }
    fn pin(&self, _addr: *mut u8, _len: usize) -> Result<(), Infallible> {
        Ok(())
    }
    fn unpin(&self, _addr: *mut u8, _len: usize) {}
}

/// Pinning by `mlock`: the pool's pages stay in RAM. Counts against `RLIMIT_MEMLOCK` (unless
/// the process has `CAP_IPC_LOCK`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Mlock;

impl Pinner for Mlock {
    type Error = io::Error;
    fn counts_against_memlock(&self) -> bool {
        true
    }
    fn pins_in_chunks(&self) -> bool {
        true
    }
    fn pin(&self, addr: *mut u8, len: usize) -> Result<(), io::Error> {
        ffi::lock(addr, len).map_err(|(_, e)| e)
    }
    fn unpin(&self, addr: *mut u8, len: usize) {
        ffi::unlock(addr, len);
    }
}
