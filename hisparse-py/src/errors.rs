//! Errors as Python exceptions: one class per [`ErrorKind`], all subclasses of `HiSparseError`,
//! each instance carrying `kind` (the kind's stable name, e.g. `"invalid argument"`) and
//! `message` (what went wrong and what to change).

use hisparse_core::{Error, ErrorKind};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    hisparse,
    HiSparseError,
    PyException,
    "Base class of every HiSparse error; `kind` names the error kind, `message` says what to change."
);
pyo3::create_exception!(
    hisparse,
    InvalidArgumentError,
    HiSparseError,
    "A malformed call, layout, command or array: fix the call; retrying cannot help."
);
pyo3::create_exception!(
    hisparse,
    ConcurrentUseError,
    InvalidArgumentError,
    "An object was called from one thread while a call on another thread was still running in it: use each `Runtime` (and its prepared calls) from one thread at a time."
);
pyo3::create_exception!(
    hisparse,
    OutOfDeviceMemoryError,
    HiSparseError,
    "Device memory is exhausted: free memory or plan a smaller pool."
);
pyo3::create_exception!(
    hisparse,
    OutOfPinnedMemoryError,
    HiSparseError,
    "Pinned host memory could not be had: lower the host budget."
);
pyo3::create_exception!(
    hisparse,
    NotFoundError,
    HiSparseError,
    "No driver, runtime library or device: install it or pick another backend."
);
pyo3::create_exception!(
    hisparse,
    UnsupportedError,
    HiSparseError,
    "The device, backend or build lacks a capability the call needs."
);
pyo3::create_exception!(
    hisparse,
    DeviceError,
    HiSparseError,
    "The device failed (lost, a kernel did not compile, another backend failure)."
);

/// The exception for `kind` with `message`, its `kind` and `message` attributes set.
pub fn error(kind: ErrorKind, message: String) -> PyErr {
    let err = match kind {
        ErrorKind::InvalidArgument => InvalidArgumentError::new_err(message.clone()),
        ErrorKind::OutOfDeviceMemory => OutOfDeviceMemoryError::new_err(message.clone()),
        ErrorKind::OutOfPinnedMemory => OutOfPinnedMemoryError::new_err(message.clone()),
        ErrorKind::NotFound => NotFoundError::new_err(message.clone()),
        ErrorKind::Unsupported => UnsupportedError::new_err(message.clone()),
        _ => DeviceError::new_err(message.clone()),
    };
    with_attributes(err, kind, message)
}

/// The exception for a HiSparse error of any crate.
pub fn to_py<E: Error>(e: E) -> PyErr {
    error(e.kind(), e.to_string())
}

/// An invalid-argument exception with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    error(ErrorKind::InvalidArgument, message.into())
}

/// Sets `kind` and `message` on a fresh exception. Setting attributes on a fresh exception
/// instance cannot fail short of memory exhaustion, in which case the exception still carries
/// its message.
pub fn with_attributes(err: PyErr, kind: ErrorKind, message: String) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        let _ = value.setattr("kind", kind.as_str());
        let _ = value.setattr("message", message);
    });
    err
}

/// The error for a call made while another thread's call is running in the same object.
pub fn concurrent_use(what: &str) -> PyErr {
    let message = format!(
        "this {what} is in a call on another thread; use it from one thread at a time (hold a lock around its calls)"
    );
    with_attributes(
        ConcurrentUseError::new_err(message.clone()),
        ErrorKind::InvalidArgument,
        message,
    )
}

/// The error for an object whose state an earlier call left unknown (it panicked).
pub fn poisoned(what: &str) -> PyErr {
    let message = format!(
        "an earlier call into this {what} failed midway (a bug; please report it), so its state is unknown; build a new one"
    );
    with_attributes(
        DeviceError::new_err(message.clone()),
        ErrorKind::Other,
        message,
    )
}

/// Registers the exception classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("HiSparseError", py.get_type::<HiSparseError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("ConcurrentUseError", py.get_type::<ConcurrentUseError>())?;
    m.add("WireError", py.get_type::<crate::wire::WireError>())?;
    m.add(
        "OutOfDeviceMemoryError",
        py.get_type::<OutOfDeviceMemoryError>(),
    )?;
    m.add(
        "OutOfPinnedMemoryError",
        py.get_type::<OutOfPinnedMemoryError>(),
    )?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    Ok(())
}
