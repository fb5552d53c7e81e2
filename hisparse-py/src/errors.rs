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
pub fn error(py: Python<'_>, kind: ErrorKind, message: String) -> PyErr {
    let err = match kind {
        ErrorKind::InvalidArgument => InvalidArgumentError::new_err(message.clone()),
        ErrorKind::OutOfDeviceMemory => OutOfDeviceMemoryError::new_err(message.clone()),
        ErrorKind::OutOfPinnedMemory => OutOfPinnedMemoryError::new_err(message.clone()),
        ErrorKind::NotFound => NotFoundError::new_err(message.clone()),
        ErrorKind::Unsupported => UnsupportedError::new_err(message.clone()),
        _ => DeviceError::new_err(message.clone()),
    };
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory exhaustion,
    // in which case the exception still carries its message.
    let _ = value.setattr("kind", kind.as_str());
    let _ = value.setattr("message", message);
    err
}

/// The exception for a HiSparse error of any crate.
pub fn to_py<E: Error>(e: E) -> PyErr {
    Python::attach(|py| error(py, e.kind(), e.to_string()))
}

/// An invalid-argument exception with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    Python::attach(|py| error(py, ErrorKind::InvalidArgument, message.into()))
}

/// Registers the exception classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("HiSparseError", py.get_type::<HiSparseError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
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
