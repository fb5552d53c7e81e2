//! Every call into the operating system, each `unsafe` block with why it is sound: mappings (`mmap`, `munmap`, `madvise`, `mbind`, `mincore`), page locking (`mlock`), limits
//! (`getrlimit`, `statvfs`), thread placement (`sched_getaffinity`, `sched_setaffinity`) and POSIX
//! shared memory (`shm_open`, `ftruncate`, `fstat`, `shm_unlink`).

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;

/// Size of a base page (every mapping is a multiple of it).
pub(crate) fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system; no pointers.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

fn last_error(call: &'static str) -> (&'static str, io::Error) {
    (call, io::Error::last_os_error())
}

/// A failed call: its name and the error.
pub(crate) type OsResult<T> = Result<T, (&'static str, io::Error)>;

/// A private, anonymous, read-write mapping of `len` bytes (`huge_tlb`: from the explicit huge
/// page pool, `MAP_HUGETLB`, `len` a multiple of its page size). Its pages are the kernel's zero
/// pages until first written.
pub(crate) fn map_anonymous(len: usize, huge_tlb: bool) -> OsResult<NonNull<u8>> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if huge_tlb {
        flags |= libc::MAP_HUGETLB;
    }
    // SAFETY: a fresh mapping chosen by the kernel (no fixed address, no descriptor); the result
    // is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    Ok(NonNull::new(p.cast()).expect("mmap does not return null on success"))
}

/// Unmaps `[addr, addr + len)`.
///
/// # Safety
///
/// The range is (part of) a mapping the caller owns, page-aligned, and nothing reads or writes
/// it any more (no reference, no device work).
pub(crate) unsafe fn unmap(addr: *mut u8, len: usize) {
    // SAFETY: the caller's contract; munmap of an owned, unused range cannot affect other memory.
    unsafe { libc::munmap(addr.cast(), len) };
}

/// `madvise(addr, len, advice)` for advice that never changes the contents of memory
/// (`MADV_HUGEPAGE`, `MADV_POPULATE_WRITE`).
pub(crate) fn advise(addr: *mut u8, len: usize, advice: libc::c_int) -> OsResult<()> {
    debug_assert!(matches!(
        advice,
        libc::MADV_HUGEPAGE | libc::MADV_POPULATE_WRITE
    ));
    // SAFETY: the advice values allowed here only change how the kernel backs the range
    // (huge pages) or fault its pages in writable without changing their contents (populate);
    // on a range that is not mapped the call fails with ENOMEM and changes nothing.
    if unsafe { libc::madvise(addr.cast(), len, advice) } == 0 {
        Ok(())
    } else {
        Err(last_error("madvise"))
    }
}

/// Places the pages of `[addr, addr + len)` on NUMA node `node` when they are first touched
/// (`mbind`, `MPOL_PREFERRED`: another node when that one is full, never an allocation failure).
pub(crate) fn prefer_node(addr: *mut u8, len: usize, node: u32) -> OsResult<()> {
    const MPOL_PREFERRED: libc::c_long = 1;
    const MASK_BITS: usize = 1024;
    if node as usize >= MASK_BITS {
        return Err(("mbind", io::Error::from(io::ErrorKind::InvalidInput)));
    }
    let mut mask = [0u64; MASK_BITS / 64];
    mask[node as usize / 64] |= 1 << (node % 64);
    // SAFETY: `mask` is a valid node mask of MASK_BITS bits that lives across the call; mbind
    // only sets the placement policy of the range (no contents change) and fails on an
    // unmapped range.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_PREFERRED,
            mask.as_ptr(),
            MASK_BITS as libc::c_ulong + 1,
            0 as libc::c_uint,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(last_error("mbind"))
    }
}

/// Writes a zero into the first byte of every `step` bytes of `[addr, addr + len)`: faults each
/// page in, backed by memory the kernel zeroed.
///
/// # Safety
///
/// The range is writable memory the caller owns exclusively, and it holds only zeros (a fresh
/// anonymous mapping or a new shared segment), so the writes change nothing a reader could see.
pub(crate) unsafe fn touch_zeroed(addr: *mut u8, len: usize, step: usize) {
    for at in (0..len).step_by(step) {
        // SAFETY: `at < len`, inside the caller's exclusive, writable range.
        unsafe { addr.add(at).write_volatile(0) };
    }
}

/// Reads and writes back the first byte of every `step` bytes of `[addr, addr + len)`: faults
/// each page in writable and leaves the contents as they were.
///
/// # Safety
///
/// The range is readable and writable memory that nothing else reads or writes during the call.
pub(crate) unsafe fn touch_preserving(addr: *mut u8, len: usize, step: usize) {
    for at in (0..len).step_by(step) {
        // SAFETY: `at < len`, inside the caller's range, which no one else uses meanwhile.
        unsafe {
            let p = addr.add(at);
            p.write_volatile(p.read_volatile());
        }
    }
}

/// Locks `[addr, addr + len)` into RAM (`mlock`; counts against `RLIMIT_MEMLOCK`).
pub(crate) fn lock(addr: *mut u8, len: usize) -> OsResult<()> {
    // SAFETY: mlock only changes whether the range may be paged out, never its contents; it
    // fails on a range that is not mapped.
    if unsafe { libc::mlock(addr.cast(), len) } == 0 {
        Ok(())
    } else {
        Err(last_error("mlock"))
    }
}

/// Unlocks `[addr, addr + len)` (`munlock`).
pub(crate) fn unlock(addr: *mut u8, len: usize) {
    // SAFETY: as `lock`: only the paging of the range changes.
    unsafe { libc::munlock(addr.cast(), len) };
}

/// Whether every page of `[addr, addr + len)` is mapped in this process (`mincore` answers
/// ENOMEM for a range with an unmapped page).
pub(crate) fn is_mapped(addr: usize, len: usize) -> bool {
    let page = page_size();
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len.max(1)) else {
        return false;
    };
    let pages = (end - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` holds one byte per page of the range, as mincore requires; mincore only
    // queries the page tables of `[start, end)` and writes into `vec`.
    unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) == 0 }
}

/// Pages of `[addr, addr + len)` resident in RAM (`mincore`), or `None` when the kernel cannot
/// report the range (a page of it is not mapped).
pub(crate) fn resident_pages(addr: usize, len: usize) -> Option<usize> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = addr.checked_add(len.max(1))?;
    let mut vec = vec![0u8; (end - start).div_ceil(page)];
    // SAFETY: as in `is_mapped`: one byte per page, a query of the page tables only.
    let ok =
        unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) } == 0;
    ok.then(|| vec.iter().filter(|&&v| v & 1 != 0).count())
}

/// `RLIMIT_MEMLOCK`'s soft limit in bytes, or `None` when unlimited or unknown.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Sets `RLIMIT_MEMLOCK`'s soft limit (tests: a child process with a low limit).
#[cfg(test)]
pub(crate) fn set_memlock_limit(bytes: u64) -> OsResult<()> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err(last_error("getrlimit"));
    }
    r.rlim_cur = bytes.min(r.rlim_max);
    // SAFETY: `r` is a valid rlimit; lowering the soft limit is always allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return Err(last_error("setrlimit"));
    }
    Ok(())
}

/// Drops `CAP_IPC_LOCK` from the calling thread's effective and permitted capabilities, so the
/// locked-memory limit applies to it as to an unprivileged process (tests run as root).
#[cfg(test)]
pub(crate) fn drop_lock_capability() -> OsResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a version-3 header and the two data words version 3 reads and writes.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(last_error("capget"));
    }
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above; dropping a capability of the calling thread is always allowed.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(last_error("capset"));
    }
    Ok(())
}

/// Free bytes of the file system holding `path` for an unprivileged writer (`statvfs`).
pub(crate) fn free_space(path: &str) -> Option<u64> {
    let c = CString::new(path).ok()?;
    // SAFETY: plain data the call fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
}

/// The CPUs this thread may run on (`sched_getaffinity`).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid out-pointer of the size passed.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the size of the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Binds the calling thread to `cpus` (`sched_setaffinity`); nothing happens for an empty list.
pub(crate) fn bind_thread(cpus: &[usize]) -> OsResult<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: a cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid CPU set of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } == 0 {
        Ok(())
    } else {
        Err(last_error("sched_setaffinity"))
    }
}

// ------------------------------------------------------------------------------------------------
// POSIX shared memory
// ------------------------------------------------------------------------------------------------

fn c_name(name: &str) -> CString {
    // Checked by the caller: no NUL, only letters, digits and '-_.'.
    CString::new(format!("/{name}")).expect("a checked name has no NUL byte")
}

/// Reserves `len` bytes of address space (no access, no memory), starting at a multiple of
/// `align` (a power of two, a multiple of the page size), for files to be mapped over.
pub(crate) fn reserve(len: usize, align: usize) -> OsResult<NonNull<u8>> {
    let span = len
        .checked_add(align)
        .ok_or(("mmap", io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: a fresh, inaccessible mapping chosen by the kernel (no fixed address, no
    // descriptor); the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    let raw = p as usize;
    let start = raw.next_multiple_of(align);
    let end = start + len.next_multiple_of(page_size());
    // SAFETY: the head and tail trimmed off lie inside the reservation just made, unused.
    unsafe {
        if start > raw {
            libc::munmap(p, start - raw);
        }
        if raw + span > end {
            libc::munmap(end as *mut libc::c_void, raw + span - end);
        }
    }
    Ok(NonNull::new(start as *mut u8).expect("a mapping does not start at 0"))
}

/// Creates `/name` (exclusively) of `len` zeroed bytes; its descriptor. The name is removed
/// again when sizing it fails.
pub(crate) fn shm_create(name: &str, len: usize) -> OsResult<libc::c_int> {
    let c = c_name(name);
    let size = libc::off_t::try_from(len)
        .map_err(|_| ("ftruncate", io::Error::from(io::ErrorKind::InvalidInput)))?;
    // SAFETY: `c` is a NUL-terminated name; flags and mode are valid.
    let fd = unsafe {
        libc::shm_open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            0o600,
        )
    };
    if fd < 0 {
        return Err(last_error("shm_open"));
    }
    // SAFETY: `fd` is the segment just created.
    if unsafe { libc::ftruncate(fd, size) } != 0 {
        let e = last_error("ftruncate");
        // SAFETY: as above; the name is removed again so a failed create leaves nothing behind.
        unsafe {
            libc::close(fd);
            libc::shm_unlink(c.as_ptr());
        }
        return Err(e);
    }
    Ok(fd)
}

/// Opens existing `/name`; its descriptor and size in bytes.
pub(crate) fn shm_open_sized(name: &str) -> OsResult<(libc::c_int, u64)> {
    let c = c_name(name);
    // SAFETY: `c` is a NUL-terminated name; flags are valid.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(last_error("shm_open"));
    }
    // SAFETY: `st` is plain data the call fills; `fd` is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = last_error("fstat");
        close(fd);
        return Err(e);
    }
    Ok((fd, st.st_size.max(0) as u64))
}

/// Closes descriptor `fd`.
pub(crate) fn close(fd: libc::c_int) {
    // SAFETY: the caller owns `fd` and does not use it again.
    unsafe { libc::close(fd) };
}

/// Maps the first `len` bytes of `fd` shared and read-write at `addr`, over the caller's
/// reservation; closes `fd` (the mapping keeps the file alive).
///
/// # Safety
///
/// `[addr, addr + len)` lies inside a reservation of [`reserve`] the caller owns, that nothing
/// else maps or uses.
pub(crate) unsafe fn map_shared_at(fd: libc::c_int, addr: NonNull<u8>, len: usize) -> OsResult<()> {
    // SAFETY: MAP_FIXED replaces only the caller's own unused reservation (the contract); the
    // result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            addr.as_ptr().cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    let err = (p == libc::MAP_FAILED).then(|| last_error("mmap"));
    close(fd);
    err.map_or(Ok(()), Err)
}

/// Removes `/name` (mappings stay valid).
pub(crate) fn shm_unlink(name: &str) {
    let c = c_name(name);
    // SAFETY: a NUL-terminated name.
    unsafe { libc::shm_unlink(c.as_ptr()) };
}

/// Writes one byte of a mapping (tests).
#[cfg(test)]
pub(crate) fn write_byte(addr: NonNull<u8>, at: usize, v: u8) {
    // SAFETY: tests pass an offset inside a live mapping they own.
    unsafe { addr.as_ptr().add(at).write_volatile(v) }
}

/// Reads one byte of a mapping (tests).
#[cfg(test)]
pub(crate) fn read_byte(addr: NonNull<u8>, at: usize) -> u8 {
    // SAFETY: tests pass an offset inside a live mapping they own.
    unsafe { addr.as_ptr().add(at).read_volatile() }
}
