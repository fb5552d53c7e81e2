//! Mappings: faulting a range in, unmapping one in parallel chunks, asking what is resident, and
//! [`AnonymousMapping`], an engine's ordinary array.

use std::convert::Infallible;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::ffi;
use crate::numa::Workers;
use crate::parallel::{chunks, for_each_chunk};

/// Whether `MADV_POPULATE_WRITE` works here: 0 unknown, 1 yes, 2 no (kernels before 5.14).
static POPULATE: AtomicU8 = AtomicU8::new(0);

/// Faults `[addr, addr + len)` in writable without changing its contents: `MADV_POPULATE_WRITE`
/// (the kernel zeroes fresh pages and keeps present ones), or where the kernel lacks it a write
/// per page (`zeroed`: a zero into memory that holds only zeros; else each byte written back).
///
/// # Safety
///
/// The range is mapped, readable and writable, and nothing else reads or writes it meanwhile;
/// with `zeroed` it holds only zeros.
pub(crate) unsafe fn populate(
    addr: *mut u8,
    len: usize,
    zeroed: bool,
) -> Result<(), (&'static str, io::Error)> {
    if POPULATE.load(Ordering::Relaxed) != 2 {
        match ffi::advise(addr, len, libc::MADV_POPULATE_WRITE) {
            Ok(()) => {
                POPULATE.store(1, Ordering::Relaxed);
                return Ok(());
            }
            Err((_, e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                // On a fresh anonymous mapping EINVAL means the kernel lacks the advice; on
                // someone else's memory it may only mean this mapping's kind (device or I/O
                // memory), so only the former is remembered.
                if zeroed && POPULATE.load(Ordering::Relaxed) == 0 {
                    POPULATE.store(2, Ordering::Relaxed);
                }
            }
            Err((_, e)) => return Err(("madvise(MADV_POPULATE_WRITE)", e)),
        }
    }
    let page = ffi::page_size();
    if zeroed {
        // SAFETY: forwarded contract (exclusive, writable, all zeros).
        unsafe { ffi::touch_zeroed(addr, len, page) };
    } else {
        // SAFETY: forwarded contract (exclusive, readable and writable).
        unsafe { ffi::touch_preserving(addr, len, page) };
    }
    Ok(())
}

/// Unmaps `[base, base + len)` in chunks of `chunk` bytes on `workers`.
///
/// # Safety
///
/// The mapping is owned by the caller and nothing uses it any more.
pub(crate) unsafe fn unmap_in_chunks(
    base: NonNull<u8>,
    len: usize,
    chunk: usize,
    workers: &Workers,
) {
    let p = base.as_ptr() as usize;
    let _ = for_each_chunk(
        len,
        chunk.next_multiple_of(ffi::page_size()),
        workers,
        |_, r| {
            // SAFETY: a page-aligned part of the caller's mapping, unmapped once.
            unsafe { ffi::unmap((p + r.start) as *mut u8, r.len()) };
            Ok::<(), Infallible>(())
        },
    );
}

/// Bytes of `[addr, addr + len)` resident in RAM, by pages (`mincore`), counted in chunks so the
/// vector stays small; 0 for a range the kernel cannot report.
pub(crate) fn resident_bytes(addr: usize, len: usize) -> u64 {
    let page = ffi::page_size();
    let mut resident = 0u64;
    for r in chunks(len, 1 << 30) {
        resident += ffi::resident_pages(addr + r.start, r.len()).unwrap_or(0) as u64 * page as u64;
    }
    resident.min(len as u64)
}

/// Whether every page of `[addr, addr + len)` is mapped in this process: a way to see that a
/// released pool's memory is gone.
pub fn is_mapped(addr: usize, len: usize) -> bool {
    ffi::is_mapped(addr, len)
}

/// An anonymous private mapping of zeros whose pages are not touched yet — what `calloc` (or
/// `numpy.zeros`) gives for a large array: an engine's ordinary, unpinned memory, for
/// benchmarks and tests that lend such an array to a backend. Unmapped on drop.
#[derive(Debug)]
pub struct AnonymousMapping {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it hands out its address only.
unsafe impl Send for AnonymousMapping {}

impl AnonymousMapping {
    /// Maps `len` bytes (page-aligned, zero, untouched).
    pub fn new(len: usize) -> io::Result<AnonymousMapping> {
        let addr = ffi::map_anonymous(len.max(1), false).map_err(|(_, e)| e)?;
        Ok(AnonymousMapping { addr, len })
    }

    /// Address of the first byte (page-aligned).
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AnonymousMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is this value's; whoever was lent its address was required to be
        // done with it before the drop (the lending contracts of the backends).
        unsafe { ffi::unmap(self.addr.as_ptr(), self.len.max(1)) };
    }
}
