//! One step's command (`Command`): plain data the runtime executes, and its wire bytes.

use hisparse_core::coordinator::{OffloadCommand, RequestId};
use hisparse_core::wire::LayoutFingerprint;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::errors::invalid;
use crate::layout::Layout;
use crate::wire::{decode_planned, reduce, wire};

/// One step's command: plain data the runtime executes (`Runtime.begin_step`/`end_step`).
/// `to_dict()` gives every field; the most used ones are attributes. `to_bytes()` and
/// `Command.from_bytes(blob, layout)` carry it to a worker in another process, and so does
/// pickling.
#[pyclass(module = "hisparse", frozen, name = "Command")]
pub struct Command {
    pub(crate) inner: OffloadCommand,
    /// The layout it was planned for.
    pub(crate) fingerprint: LayoutFingerprint,
}

impl Command {
    pub(crate) fn new(inner: OffloadCommand, fingerprint: LayoutFingerprint) -> Self {
        Command { inner, fingerprint }
    }
}

/// Unpickles a command (`Command.__reduce__`): its bytes, checked against the layouts this
/// process planned.
#[pyfunction]
pub fn _command_from_pickle(data: &[u8]) -> PyResult<Command> {
    let (inner, fingerprint) = decode_planned(data, "Command", OffloadCommand::from_bytes)?;
    Ok(Command::new(inner, fingerprint))
}

#[pymethods]
impl Command {
    /// The command's wire bytes (`hisparse_core::wire`: a versioned header with the layout's
    /// fingerprint, the fields, a checksum).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes(self.fingerprint))
    }

    /// The command `data` holds, checked against `layout` (the receiver's own plan of the
    /// sender's layout): a blob cut short, corrupted, foreign, of another format version or
    /// planned for another layout is a `WireError`, and nothing is built.
    #[staticmethod]
    fn from_bytes(data: &[u8], layout: &Layout) -> PyResult<Command> {
        let inner = OffloadCommand::from_bytes(data, layout.fingerprint)
            .map_err(|e| wire(e.to_string()))?;
        Ok(Command::new(inner, layout.fingerprint))
    }

    /// Pickles as its wire bytes (see `_command_from_pickle`).
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        reduce(self.to_bytes(py), "_command_from_pickle")
    }

    /// The fingerprint of the layout it was planned for.
    #[getter]
    fn fingerprint(&self) -> u64 {
        self.fingerprint.as_u64()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Command>()
            .is_ok_and(|o| o.get().inner == self.inner && o.get().fingerprint == self.fingerprint)
    }

    /// Step number (from 1).
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step
    }
    /// Id of the after-forward copy batch, if the step has one.
    #[getter]
    fn transfer_id(&self) -> Option<u64> {
        self.inner.transfer_id
    }
    /// Every scheduled request is fully resident (the remap path).
    #[getter]
    fn fully_resident(&self) -> bool {
        self.inner.fully_resident
    }
    /// Requests computed in this step: `{"id", "slot", "first_token", "num_tokens",
    /// "fully_resident"}` each.
    #[getter]
    fn scheduled<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .scheduled
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("id", s.id)?;
                d.set_item("slot", s.slot)?;
                d.set_item("first_token", s.first_token)?;
                d.set_item("num_tokens", s.num_tokens)?;
                d.set_item("fully_resident", s.fully_resident)?;
                Ok(d)
            })
            .collect()
    }
    /// State rows of the scheduled requests, in order (the batch of `Runtime.set_batch`).
    #[getter]
    fn slots(&self) -> Vec<i32> {
        self.inner.scheduled.iter().map(|s| s.slot as i32).collect()
    }
    /// Requests refused in this step (a restart whose context outgrew the GPU pool, …): `{"id",
    /// "reason", "message", ...}` each. The step went on for the others; a refused request holds
    /// no block and runs no more — fail it and `Coordinator.finish` it.
    #[getter]
    fn refused<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .refused
            .iter()
            .map(|r| {
                let d = super::admission::refusal_dict(py, &r.reason)?;
                d.set_item("id", r.id)?;
                Ok(d)
            })
            .collect()
    }

    /// Requests preempted in this step.
    #[getter]
    fn preempted(&self) -> Vec<RequestId> {
        self.inner.preempted.clone()
    }
    /// Every field, as `hisparse-core`'s `OffloadCommand` serialises.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = serde_json::to_string(&self.inner).map_err(|e| invalid(e.to_string()))?;
        py.import("json")?.call_method1("loads", (text,))
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        let py_bool = |b: bool| if b { "True" } else { "False" };
        let transfer = c
            .transfer_id
            .map_or_else(|| "None".to_string(), |t| t.to_string());
        format!(
            "Command(step={}, scheduled={}, fully_resident={}, transfer_id={transfer}, residency={}, row_mirrors={}, page_transfers={})",
            c.step,
            c.scheduled.len(),
            py_bool(c.fully_resident),
            c.residency.len(),
            c.row_mirrors.len(),
            c.page_transfers.len()
        )
    }
}
