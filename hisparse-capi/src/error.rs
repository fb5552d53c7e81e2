//! Status codes, the thread-local last-error message, and the guard every entry point runs its
//! body in (failures become a status and a message; a panic never crosses the C boundary).
//!
//! The pointer helpers here are the crate's only dereferences of caller pointers: each entry
//! point's `# Safety` section states what the caller guarantees, and these helpers refuse the
//! null pointers it may pass by mistake.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use hisparse_core::ErrorKind;

/// What an entry point returns. `HS_STATUS_OK` is success; every other value comes with a
/// message from `hs_last_error()`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HsStatus {
    /// Success.
    Ok = 0,
    /// A malformed call, layout, command or buffer: fix the call; retrying cannot help.
    InvalidArgument = 1,
    /// Device memory is exhausted: free buffers or plan a smaller pool.
    OutOfDeviceMemory = 2,
    /// Pinned host memory could not be had: lower the host budget.
    OutOfPinnedMemory = 3,
    /// No driver, runtime library or device: install it or pick another backend.
    NotFound = 4,
    /// The device, backend or build lacks a capability the call needs.
    Unsupported = 5,
    /// A kernel failed to compile or load.
    Compilation = 6,
    /// The device was lost or a launch faulted: recreate the runtime.
    DeviceLost = 7,
    /// Another backend failure; the message says more.
    Other = 8,
    /// A required pointer argument was NULL.
    NullArgument = 9,
    /// A bug inside HiSparse (a Rust panic, caught at the boundary); the handle involved may be
    /// left in an unknown state: free it.
    Internal = 10,
}

impl HsStatus {
    fn of(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => HsStatus::InvalidArgument,
            ErrorKind::OutOfDeviceMemory => HsStatus::OutOfDeviceMemory,
            ErrorKind::OutOfPinnedMemory => HsStatus::OutOfPinnedMemory,
            ErrorKind::NotFound => HsStatus::NotFound,
            ErrorKind::Unsupported => HsStatus::Unsupported,
            ErrorKind::Compilation => HsStatus::Compilation,
            ErrorKind::DeviceLost => HsStatus::DeviceLost,
            _ => HsStatus::Other,
        }
    }

    fn name(self) -> &'static CStr {
        match self {
            HsStatus::Ok => c"ok",
            HsStatus::InvalidArgument => c"invalid argument",
            HsStatus::OutOfDeviceMemory => c"out of device memory",
            HsStatus::OutOfPinnedMemory => c"out of pinned memory",
            HsStatus::NotFound => c"not found",
            HsStatus::Unsupported => c"unsupported",
            HsStatus::Compilation => c"compilation",
            HsStatus::DeviceLost => c"device lost",
            HsStatus::Other => c"other",
            HsStatus::NullArgument => c"null argument",
            HsStatus::Internal => c"internal error",
        }
    }
}

/// A failed call: its status and message.
pub(crate) struct Failure {
    status: HsStatus,
    message: String,
}

impl<E: hisparse_core::Error> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            status: HsStatus::of(e.kind()),
            message: e.to_string(),
        }
    }
}

/// An invalid-argument failure.
pub(crate) fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        status: HsStatus::InvalidArgument,
        message: message.into(),
    }
}

/// A NULL-argument failure naming the argument.
pub(crate) fn null(what: &str) -> Failure {
    Failure {
        status: HsStatus::NullArgument,
        message: format!("`{what}` is NULL; pass a valid pointer"),
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message never holds a NUL byte from our side; one from a backend's text is replaced.
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs an entry point's body: `Ok` → `HS_STATUS_OK`; a failure or a panic → its status, with
/// the message stored for `hs_last_error()`.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> HsStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => HsStatus::Ok,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!(
                "internal error in hisparse (please report it): {what}"
            ));
            HsStatus::Internal
        }
    }
}

/// The message of the last failed call on this thread (empty if none failed yet). The pointer
/// stays valid until the next failing call on this thread; copy the text to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn hs_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A short, static name of `status` (e.g. "invalid argument").
#[unsafe(no_mangle)]
pub extern "C" fn hs_status_name(status: HsStatus) -> *const c_char {
    status.name().as_ptr()
}

/// `&*p`, or a NULL-argument failure.
///
/// # Safety
///
/// `p` is NULL or points to a live `T` that nothing mutates for `'a`.
pub(crate) unsafe fn deref<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: forwarded contract; NULL is refused by `as_ref`.
    unsafe { p.as_ref() }.ok_or_else(|| null(what))
}

/// `&mut *p`, or a NULL-argument failure.
///
/// # Safety
///
/// `p` is NULL or points to a live `T` that nothing else accesses for `'a`.
pub(crate) unsafe fn deref_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: forwarded contract; NULL is refused by `as_mut`.
    unsafe { p.as_mut() }.ok_or_else(|| null(what))
}

/// The `len` elements at `p` (NULL allowed when `len` is 0).
///
/// # Safety
///
/// When `len > 0`, `p` points to `len` initialised `T`s that nothing mutates for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: forwarded contract; `p` is non-null.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The `len` elements at `p`, writable (NULL allowed when `len` is 0).
///
/// # Safety
///
/// When `len > 0`, `p` points to `len` writable `T`s that nothing else accesses for `'a`.
pub(crate) unsafe fn slice_mut<'a, T>(
    p: *mut T,
    len: usize,
    what: &str,
) -> Result<&'a mut [T], Failure> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: forwarded contract; `p` is non-null.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// A UTF-8 string argument (NULL → `default`).
///
/// # Safety
///
/// `p` is NULL or a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn string<'a>(
    p: *const c_char,
    what: &str,
    default: &'a str,
) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Ok(default);
    }
    // SAFETY: forwarded contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("`{what}` is not UTF-8")))
}

/// Stores `value` into `*out` (a NULL `out` is refused).
///
/// # Safety
///
/// `out` is NULL or points to writable memory for a `T`.
pub(crate) unsafe fn put<T>(out: *mut T, what: &str, value: T) -> Result<(), Failure> {
    if out.is_null() {
        return Err(null(what));
    }
    // SAFETY: forwarded contract; `out` is non-null. `write` does not drop the old contents,
    // which may be uninitialised.
    unsafe { out.write(value) };
    Ok(())
}
