//! Status codes, the thread-local last-error message, and the guard every entry point runs its
//! body in (failures become a status and a message; a panic never crosses the C boundary).
//!
//! The pointer helpers here are the crate's only dereferences of caller pointers: each entry
//! point's `# Safety` section states what the caller guarantees, and these helpers refuse the
//! null pointers it may pass by mistake.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};

use hisparse_core::ErrorKind;
use hisparse_core::coordinator::CoordError;
use hisparse_core::layout::LayoutError;
use hisparse_runtime::plan::PlanError;
use hisparse_runtime::{AnyError, OpenError, RuntimeError};

// The header's `HsStatus` (include/hisparse.h) is generated from this enum by cbindgen: a
// generated twin (CONTRIBUTING.md, "One rule, one place"), not a second list (tests/header.rs
// fails when the header is stale).
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
    /// The caller's output array is smaller than the answer: the call wrote the size needed to
    /// its count argument and nothing else; call again with an array at least that large.
    BufferTooSmall = 11,
    /// Before-replay work (`hs_runtime_begin_step`, `hs_runtime_set_batch`,
    /// `hs_runtime_end_step`, polling, draining) on a stream that is being captured into a graph:
    /// call it outside the capture, before replaying the graph, on the stream the graph is
    /// replayed on.
    Capture = 12,
    /// `hs_runtime_set_batch`'s `pad_to` names no token-row count a captured graph has, or is
    /// smaller than the batch: pad to the token rows of the graph being replayed.
    GraphShape = 13,
    /// Another thread's call on the same handle is still running: a handle takes one call at a
    /// time (from any thread); wait for that call, or give each thread a handle of its own.
    ConcurrentUse = 14,
}

impl HsStatus {
    /// Every status, for looking one up by its number.
    const ALL: [HsStatus; 15] = [
        HsStatus::Ok,
        HsStatus::InvalidArgument,
        HsStatus::OutOfDeviceMemory,
        HsStatus::OutOfPinnedMemory,
        HsStatus::NotFound,
        HsStatus::Unsupported,
        HsStatus::Compilation,
        HsStatus::DeviceLost,
        HsStatus::Other,
        HsStatus::NullArgument,
        HsStatus::Internal,
        HsStatus::BufferTooSmall,
        HsStatus::Capture,
        HsStatus::GraphShape,
        HsStatus::ConcurrentUse,
    ];

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
            HsStatus::BufferTooSmall => c"buffer too small",
            HsStatus::Capture => c"capture",
            HsStatus::GraphShape => c"graph shape",
            HsStatus::ConcurrentUse => c"concurrent use",
        }
    }
}

/// A failed call: its status and message.
#[derive(Debug)]
pub(crate) struct Failure {
    status: HsStatus,
    message: String,
}

impl Failure {
    /// The status the failure returns.
    #[cfg(test)]
    pub(crate) fn status(&self) -> HsStatus {
        self.status
    }

    /// A failure whose status follows the error's portable kind.
    fn of_kind(e: &impl hisparse_core::Error) -> Self {
        Failure {
            status: HsStatus::of(e.kind()),
            message: e.to_string(),
        }
    }
}

/// Errors whose status follows their portable kind, each converted explicitly (no blanket
/// conversion: an error type with statuses of its own must not slip through as its kind).
macro_rules! status_by_kind {
    ($($error:ty),* $(,)?) => {
        $(
            impl From<$error> for Failure {
                fn from(e: $error) -> Self {
                    Failure::of_kind(&e)
                }
            }
        )*
    };
}

status_by_kind!(CoordError, LayoutError, AnyError, OpenError, PlanError);

impl From<RuntimeError<AnyError>> for Failure {
    fn from(e: RuntimeError<AnyError>) -> Self {
        let status = match &e {
            RuntimeError::Capture { .. } => HsStatus::Capture,
            RuntimeError::GraphShape { .. } => HsStatus::GraphShape,
            _ => return Failure::of_kind(&e),
        };
        Failure {
            status,
            message: e.to_string(),
        }
    }
}

/// A too-small output array: `needed` elements of `what` were wanted, `capacity` given.
pub(crate) fn too_small(what: &str, needed: usize, capacity: usize) -> Failure {
    Failure {
        status: HsStatus::BufferTooSmall,
        message: format!(
            "`{what}` holds {capacity} elements but the answer has {needed}; pass an array of at least {needed} (a NULL array with capacity 0 asks only for the size)"
        ),
    }
}

/// An invalid-argument failure.
pub(crate) fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        status: HsStatus::InvalidArgument,
        message: message.into(),
    }
}

/// A capability the backend or build lacks.
pub(crate) fn unsupported(message: impl Into<String>) -> Failure {
    Failure {
        status: HsStatus::Unsupported,
        message: message.into(),
    }
}

/// A call on a handle another thread's call still holds.
pub(crate) fn concurrent_use(what: &str) -> Failure {
    Failure {
        status: HsStatus::ConcurrentUse,
        message: format!(
            "`{what}` is in use by a call on another thread; a handle takes one call at a time: wait for that call to return, or give each thread a handle of its own"
        ),
    }
}

/// A bug inside HiSparse found by a check (not a panic).
pub(crate) fn internal(message: impl Into<String>) -> Failure {
    Failure {
        status: HsStatus::Internal,
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

/// Frees a handle made by `Box::into_raw` (NULL is ignored). A panic while dropping it (a bug)
/// is caught, as in [`guard`], and only recorded for `hs_last_error()`: the free functions
/// return nothing.
///
/// # Safety
///
/// `handle` is NULL or came from `Box::into_raw` and is not freed yet.
pub(crate) unsafe fn free_handle<T>(handle: *mut T) {
    if handle.is_null() {
        return;
    }
    // The status has nowhere to go; the message stays for `hs_last_error()`.
    let _ = guard(|| {
        // SAFETY: forwarded contract: the handle came from `Box::into_raw`, not freed yet.
        drop(unsafe { Box::from_raw(handle) });
        Ok(())
    });
}

/// A new handle owning `value` (freed by [`free_handle`]).
pub(crate) fn handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// A caller's output location, found non-NULL before the call does anything: every entry point
/// takes its outputs first, so a NULL one fails the call with nothing done (and, for a call
/// that changes state, nothing lost).
pub(crate) struct Out<'a, T>(&'a mut MaybeUninit<T>);

impl<T> Out<'_, T> {
    /// Stores the answer (the old contents, which may be uninitialised, are not dropped).
    pub(crate) fn set(self, value: T) {
        self.0.write(value);
    }
}

/// The output location `p`, or a NULL-argument failure naming `what`.
///
/// # Safety
///
/// `p` is NULL or points to memory writable as a `T` that nothing else accesses for `'a`.
pub(crate) unsafe fn output<'a, T>(p: *mut T, what: &str) -> Result<Out<'a, T>, Failure> {
    // SAFETY: forwarded contract; `MaybeUninit<T>` has `T`'s layout and accepts any contents.
    unsafe { p.cast::<MaybeUninit<T>>().as_mut() }
        .map(Out)
        .ok_or_else(|| null(what))
}

/// The optional output location `p` (NULL: the caller does not want the answer).
///
/// # Safety
///
/// As [`output`].
pub(crate) unsafe fn output_opt<'a, T>(p: *mut T) -> Option<Out<'a, T>> {
    // SAFETY: forwarded contract.
    unsafe { p.cast::<MaybeUninit<T>>().as_mut() }.map(Out)
}

/// A caller's output array: `capacity` elements at `out` and the count to report, checked
/// before the call does anything (see [`Out`]).
pub(crate) struct OutArray<'a, T> {
    /// NULL `out` with capacity 0: the caller asks only for the count.
    elements: Option<&'a mut [MaybeUninit<T>]>,
    count: Out<'a, usize>,
    what: &'static str,
}

impl<T: Copy> OutArray<'_, T> {
    /// Reports the answer's length, and copies the answer if the array holds it; a smaller
    /// array gets `HS_STATUS_BUFFER_TOO_SMALL` with nothing copied.
    pub(crate) fn fill(self, src: &[T]) -> Result<(), Failure> {
        self.count.set(src.len());
        let Some(dst) = self.elements else {
            return Ok(());
        };
        if dst.len() < src.len() {
            return Err(too_small(self.what, src.len(), dst.len()));
        }
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(*s);
        }
        Ok(())
    }
}

/// The output array `out` of `capacity` elements (`what`) and its count `count`: NULL `out`
/// with capacity 0 asks only for the count; NULL with a capacity, or a NULL `count`, is a
/// NULL-argument failure.
///
/// # Safety
///
/// `out` is NULL or points to `capacity` elements writable as `T`s, and `count` is NULL or
/// writable, none of which anything else accesses for `'a`.
pub(crate) unsafe fn output_array<'a, T>(
    out: *mut T,
    capacity: usize,
    count: *mut usize,
    what: &'static str,
) -> Result<OutArray<'a, T>, Failure> {
    // SAFETY: forwarded contract.
    let count = unsafe { output(count, "count") }?;
    let elements = if out.is_null() && capacity == 0 {
        None
    } else {
        // SAFETY: forwarded contract; `MaybeUninit<T>` has `T`'s layout.
        Some(unsafe { slice_mut(out.cast::<MaybeUninit<T>>(), capacity, what) }?)
    };
    Ok(OutArray {
        elements,
        count,
        what,
    })
}

/// The body of an entry point that answers an array of a handle's value: `array` of the value
/// behind `handle` (named `what`), copied into `out` as [`OutArray::fill`] does.
///
/// # Safety
///
/// `handle` is NULL or points to a live `H` that nothing mutates during the call; `out`,
/// `capacity` and `count` as [`output_array`] takes them.
pub(crate) unsafe fn answer_array<H, T: Copy>(
    handle: *const H,
    what: &str,
    out: *mut T,
    capacity: usize,
    count: *mut usize,
    array: impl FnOnce(&H) -> &[T],
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (h, out) = unsafe {
            (
                deref(handle, what)?,
                output_array(out, capacity, count, "out")?,
            )
        };
        out.fill(array(h))
    })
}

/// Refuses an element count whose bytes exceed what one Rust slice may span (`isize::MAX`):
/// such a length cannot describe caller memory, and building a slice of it would be undefined.
fn check_len<T>(len: usize, what: &str) -> Result<(), Failure> {
    let max = isize::MAX as usize / size_of::<T>().max(1);
    if len > max {
        return Err(invalid(format!(
            "`{what}` has a length of {len} elements, beyond any array ({max} at most); pass the array's real length"
        )));
    }
    Ok(())
}

/// The message of the last failed call on this thread (empty if none failed yet). The pointer
/// stays valid until the next failing call on this thread; copy the text to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn hs_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A short, static name of `status` (e.g. "invalid argument"); "unknown status" for a number
/// that is no `HsStatus` (the argument is an integer so that any value is safe to pass).
#[unsafe(no_mangle)]
pub extern "C" fn hs_status_name(status: i32) -> *const c_char {
    HsStatus::ALL
        .iter()
        .find(|s| **s as i32 == status)
        .map_or(c"unknown status", |s| s.name())
        .as_ptr()
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
    check_len::<T>(len, what)?;
    // SAFETY: forwarded contract; `p` is non-null and `len` elements fit a slice.
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
    check_len::<T>(len, what)?;
    // SAFETY: forwarded contract; `p` is non-null and `len` elements fit a slice.
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
