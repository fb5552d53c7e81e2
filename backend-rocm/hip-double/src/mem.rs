//! Raw memory of the double: every read and write of "device" memory goes through here.
//!
//! Allocations are host memory from the global allocator, page-aligned, filled with a garbage
//! pattern (a backend that forgets to zero memory it promises zeroed sees `0xCD` bytes).

use std::alloc::Layout;

use crate::state::{Alloc, Kind, State};

/// Byte every fresh allocation is filled with.
pub const GARBAGE: u8 = 0xCD;
/// Alignment of every allocation (a page, like `hipHostMalloc`; `hipMalloc` promises 256).
pub const ALIGN: usize = 4096;

/// Allocates `len` bytes and registers them. Returns the address, or `None` when the allocator
/// refuses.
pub fn alloc(state: &mut State, len: usize, kind: Kind) -> Option<usize> {
    let reserved = len.max(1);
    let layout = Layout::from_size_align(reserved, ALIGN).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` points at `reserved` freshly allocated, writable bytes.
    unsafe { std::ptr::write_bytes(p, GARBAGE, reserved) };
    state.allocs.insert(
        p as usize,
        Alloc {
            len,
            kind,
            reserved,
        },
    );
    Some(p as usize)
}

/// Registers `len` bytes of caller-owned host memory at `addr` (`hipHostRegister`): reads and
/// writes go straight to it; [`free`] only unregisters it. When the range overlaps a known
/// allocation nothing is registered and the overlapped allocation's kind is returned.
pub fn register(state: &mut State, addr: usize, len: usize) -> Result<(), Kind> {
    // Allocations are disjoint: only the last one starting before the range's end can overlap.
    if let Some((&start, a)) = state.allocs.range(..addr.saturating_add(len)).next_back()
        && start + a.len.max(1) > addr
    {
        return Err(a.kind);
    }
    state.allocs.insert(
        addr,
        Alloc {
            len,
            kind: Kind::Registered,
            reserved: 0,
        },
    );
    Ok(())
}

/// Unregisters and frees the allocation starting at `addr` (registered host memory is only
/// unregistered: it belongs to the caller). Returns its kind, or `None` when no allocation
/// starts there.
pub fn free(state: &mut State, addr: usize) -> Option<Kind> {
    let a = state.allocs.remove(&addr)?;
    if a.kind == Kind::Registered {
        return Some(a.kind);
    }
    let layout = Layout::from_size_align(a.reserved, ALIGN).expect("layout was valid at alloc");
    // SAFETY: `addr` was returned by `std::alloc::alloc` with exactly this layout (registered in
    // `alloc`) and is removed from the registry, so it is freed once.
    unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
    Some(a.kind)
}

/// Copies `len` bytes at `addr` out of a registered allocation.
///
/// Panics if the range is not inside one allocation: callers validate ranges first, so this is an
/// internal invariant of the double.
pub fn read(state: &State, addr: usize, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    assert!(
        state.find(addr, len).is_some(),
        "double: read outside allocations"
    );
    let mut out = vec![0u8; len];
    // SAFETY: `[addr, addr + len)` lies inside a live registered allocation (checked above; the
    // state lock is held, so it cannot be freed meanwhile) and `out` is a distinct buffer.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
    out
}

/// Writes `bytes` at `addr` inside a registered allocation (panics otherwise, as [`read`]).
pub fn write(state: &State, addr: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    assert!(
        state.find(addr, bytes.len()).is_some(),
        "double: write outside allocations"
    );
    // SAFETY: the destination range lies inside a live registered allocation (checked above,
    // under the state lock); `bytes` is a distinct Rust buffer.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
}

/// Copies `len` bytes from a caller's (possibly unregistered) host pointer.
///
/// # Safety
/// `src` is valid for reading `len` bytes (the HIP contract of synchronous copies).
pub unsafe fn read_host(src: *const u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if len > 0 {
        // SAFETY: per the caller's contract; `out` is distinct.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) };
    }
    out
}

/// Copies `bytes` to a caller's (possibly unregistered) host pointer.
///
/// # Safety
/// `dst` is valid for writing `bytes.len()` bytes.
pub unsafe fn write_host(dst: *mut u8, bytes: &[u8]) {
    if !bytes.is_empty() {
        // SAFETY: per the caller's contract; `bytes` is distinct.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    }
}
