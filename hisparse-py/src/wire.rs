//! Commands and worker reports across processes: their wire bytes (`hisparse_core::wire`), and
//! pickling that carries them.
//!
//! A message's bytes carry the fingerprint of the layout it was planned for, and decoding needs
//! a layout to check it against (a receiver must never take a command of another layout for its
//! own). `from_bytes(blob, layout)` names that layout. Unpickling names none, so it checks the
//! blob against the layouts this process has planned (`plan_layout`, `Layout.from_json`): a
//! worker process that planned its layout before receiving pickled commands decodes them, and a
//! blob of any other layout — like a truncated, corrupted or foreign one — is a `WireError`.

use std::sync::Mutex;

use hisparse_core::ErrorKind;
use hisparse_core::wire::{LayoutFingerprint, WireError as CoreWireError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::{invalid, with_attributes};

pyo3::create_exception!(
    hisparse,
    WireError,
    crate::errors::InvalidArgumentError,
    "Bytes that are not a message this process can take: cut short, corrupted, not a hisparse message, of another kind or format version, or planned for another layout."
);

/// A `WireError` with `message`.
pub fn wire(message: String) -> PyErr {
    with_attributes(
        WireError::new_err(message.clone()),
        ErrorKind::InvalidArgument,
        message,
    )
}

/// The fingerprints of the layouts this process planned, newest last (a handful in practice;
/// the bound keeps a process that plans layouts in a loop from growing it without end).
static PLANNED: Mutex<Vec<LayoutFingerprint>> = Mutex::new(Vec::new());

const MAX_REMEMBERED: usize = 1024;

/// Remembers that this process planned a layout with fingerprint `fp`.
pub fn remember(fp: LayoutFingerprint) {
    let mut planned = PLANNED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = planned.iter().position(|&f| f == fp) {
        planned.remove(i);
    } else if planned.len() >= MAX_REMEMBERED {
        planned.remove(0);
    }
    planned.push(fp);
}

/// Decodes `bytes` with `decode` against the layouts this process planned (newest first):
/// the message and its layout's fingerprint.
pub fn decode_planned<T>(
    bytes: &[u8],
    what: &str,
    decode: impl Fn(&[u8], LayoutFingerprint) -> Result<T, CoreWireError>,
) -> PyResult<(T, LayoutFingerprint)> {
    let planned = PLANNED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut mismatch = None;
    for &fp in planned.iter().rev() {
        match decode(bytes, fp) {
            Ok(v) => return Ok((v, fp)),
            Err(e @ CoreWireError::LayoutMismatch { .. }) => mismatch = Some(e),
            // Cut short, corrupted, foreign: the same answer whichever layout is tried.
            Err(e) => return Err(wire(e.to_string())),
        }
    }
    match mismatch {
        Some(CoreWireError::LayoutMismatch { found, .. }) => Err(wire(format!(
            "{what}: the blob was planned for a layout (fingerprint {found:016x}) this process has not planned; plan the same layout here (plan_layout with the same arguments, or Layout.from_json) before receiving, or use {what}.from_bytes(blob, layout)"
        ))),
        _ => Err(invalid(format!(
            "{what}: no layout has been planned in this process, so a pickled {what} cannot be checked; plan the layout (plan_layout or Layout.from_json) before receiving, or use {what}.from_bytes(blob, layout)"
        ))),
    }
}

/// What `__reduce__` returns for a message pickled as its wire bytes `data`: the module
/// function `unpickle` of `hisparse._hisparse` and its argument.
pub fn reduce<'py>(
    data: Bound<'py, PyBytes>,
    unpickle: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    let py = data.py();
    let f = py.import("hisparse._hisparse")?.getattr(unpickle)?;
    Ok((f, PyTuple::new(py, [data])?))
}

/// The error for a message of layout `found` handed to something of layout `expected`.
pub fn layout_mismatch(what: &str, found: LayoutFingerprint, expected: LayoutFingerprint) -> PyErr {
    wire(format!(
        "{what} was planned for another layout (fingerprint {found}) than this one's ({expected}); send it to a coordinator or runtime of the layout it was planned for"
    ))
}
