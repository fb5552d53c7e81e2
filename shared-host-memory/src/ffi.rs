//! The POSIX calls: `shm_open`, `ftruncate`, `fstat`, `mmap`, `munmap`, `shm_unlink`.

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;

use crate::ShmError;

fn c_name(name: &str) -> CString {
    // Checked by the caller: no NUL, only letters, digits and '-_.'.
    CString::new(format!("/{name}")).expect("a checked name has no NUL byte")
}

fn os(call: &'static str, name: &str) -> ShmError {
    ShmError::Os {
        call,
        name: name.to_string(),
        source: io::Error::last_os_error(),
    }
}

/// Maps `len` bytes of `fd` shared, read-write; closes `fd`.
fn map(fd: libc::c_int, len: usize, name: &str) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh mapping chosen by the kernel (no fixed address), of a descriptor this
    // function owns; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    let err = (p == libc::MAP_FAILED).then(|| os("mmap", name));
    // SAFETY: `fd` is open and owned here; the mapping keeps the segment alive without it.
    unsafe { libc::close(fd) };
    match err {
        Some(e) => Err(e),
        None => Ok(NonNull::new(p.cast()).expect("mmap does not return null on success")),
    }
}

/// Creates `/name` (exclusively), sizes it to `len` zeroed bytes and maps it.
pub(crate) fn create_and_map(name: &str, len: usize) -> Result<NonNull<u8>, ShmError> {
    let c = c_name(name);
    let size = libc::off_t::try_from(len).map_err(|_| ShmError::Os {
        call: "ftruncate",
        name: name.to_string(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    // SAFETY: `c` is a NUL-terminated name; flags and mode are valid.
    let fd = unsafe {
        libc::shm_open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            0o600,
        )
    };
    if fd < 0 {
        return Err(os("shm_open", name));
    }
    // SAFETY: `fd` is the segment just created.
    if unsafe { libc::ftruncate(fd, size) } != 0 {
        let e = os("ftruncate", name);
        // SAFETY: as above; the name is removed again so a failed create leaves nothing behind.
        unsafe {
            libc::close(fd);
            libc::shm_unlink(c.as_ptr());
        }
        return Err(e);
    }
    map(fd, len, name).inspect_err(|_| unlink(name))
}

/// Opens existing `/name`, checks it holds at least `len` bytes and maps them.
pub(crate) fn open_and_map(name: &str, len: usize) -> Result<NonNull<u8>, ShmError> {
    let c = c_name(name);
    // SAFETY: `c` is a NUL-terminated name; flags are valid.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(os("shm_open", name));
    }
    // SAFETY: `st` is plain data the call fills; `fd` is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        let e = os("fstat", name);
        // SAFETY: `fd` is open and owned here.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let actual = st.st_size.max(0) as u64;
    if actual < len as u64 {
        // SAFETY: `fd` is open and owned here.
        unsafe { libc::close(fd) };
        return Err(ShmError::TooSmall {
            name: name.to_string(),
            actual,
            needed: len as u64,
        });
    }
    map(fd, len, name)
}

/// Unmaps a mapping made by this module.
pub(crate) fn unmap(addr: NonNull<u8>, len: usize) {
    // SAFETY: `addr..addr+len` is a mapping this module made and nothing uses after the drop
    // that calls this.
    unsafe { libc::munmap(addr.as_ptr().cast(), len) };
}

/// Removes `/name` (mappings stay valid).
pub(crate) fn unlink(name: &str) {
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
