//! A worker's report (`WorkerReport`): the transfer batches a runtime enqueued and completed since
//! its last report — what `Runtime.poll()` returns and `Coordinator.report(...)` takes — and its
//! wire bytes.

use hisparse_core::wire::LayoutFingerprint;
use hisparse_runtime::WorkerReport as Core;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::args::{Int, IntList, take_args};
use crate::layout::Layout;
use crate::wire::{decode_planned, reduce, wire};

/// A worker's report: `worker` (its rank), `enqueued` and `completed` (transfer ids, oldest
/// first). Also reads as the dict `Runtime.poll()` returned before (`report["completed"]`).
/// `to_bytes()` / `WorkerReport.from_bytes(blob, layout)` and pickling carry it to the
/// scheduler's process.
#[pyclass(module = "hisparse", name = "WorkerReport", frozen)]
pub struct WorkerReport {
    pub(crate) inner: Core,
    /// The layout of the runtime that made it (or that it was decoded or built for).
    pub(crate) fingerprint: Option<LayoutFingerprint>,
}

impl WorkerReport {
    pub(crate) fn new(inner: Core, fingerprint: Option<LayoutFingerprint>) -> Self {
        WorkerReport { inner, fingerprint }
    }
}

/// Unpickles a worker report (`WorkerReport.__reduce__`): its bytes, checked against the
/// layouts this process planned.
#[pyfunction]
pub fn _report_from_pickle(data: &[u8]) -> PyResult<WorkerReport> {
    let (inner, fp) = decode_planned(data, "WorkerReport", Core::from_bytes)?;
    Ok(WorkerReport::new(inner, Some(fp)))
}

#[pymethods]
impl WorkerReport {
    /// A report built by the engine itself; `layout` (the layout its transfers belong to) is
    /// needed to send it as bytes.
    #[new]
    #[pyo3(signature = (worker, enqueued, completed, *, layout = None))]
    fn py_new(
        worker: Int<u32>,
        enqueued: IntList<u64>,
        completed: IntList<u64>,
        layout: Option<&Layout>,
    ) -> PyResult<Self> {
        take_args!(worker, enqueued, completed);
        let inner = Core {
            worker,
            enqueued,
            completed,
        };
        Ok(WorkerReport::new(inner, layout.map(|l| l.fingerprint)))
    }

    /// The report's wire bytes (`hisparse_core::wire`, with its layout's fingerprint).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let fp = self.fingerprint.ok_or_else(|| {
            crate::errors::invalid(
                "this WorkerReport was built without a layout; pass layout= when building it",
            )
        })?;
        Ok(PyBytes::new(py, &self.inner.to_bytes(fp)))
    }

    /// The report `data` holds, checked against `layout`: a blob cut short, corrupted,
    /// foreign, of another format version or planned for another layout is a `WireError`.
    #[staticmethod]
    fn from_bytes(data: &[u8], layout: &Layout) -> PyResult<WorkerReport> {
        let inner = Core::from_bytes(data, layout.fingerprint).map_err(|e| wire(e.to_string()))?;
        Ok(WorkerReport::new(inner, Some(layout.fingerprint)))
    }

    /// Pickles as its wire bytes (see `_report_from_pickle`).
    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        reduce(self.to_bytes(py)?, "_report_from_pickle")
    }

    /// The worker (tensor-parallel rank) that reports.
    #[getter]
    fn worker(&self) -> u32 {
        self.inner.worker
    }

    /// Transfer batches enqueued since the last report, oldest first.
    #[getter]
    fn enqueued(&self) -> Vec<u64> {
        self.inner.enqueued.clone()
    }

    /// Transfer batches completed since the last report, oldest first.
    #[getter]
    fn completed(&self) -> Vec<u64> {
        self.inner.completed.clone()
    }

    /// Whether there is nothing to report.
    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// `"worker"`, `"enqueued"` or `"completed"`, as the dict this object replaced.
    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        match key {
            "worker" => Ok(self.worker().into_pyobject(py)?.into_any()),
            "enqueued" => self.enqueued().into_pyobject(py),
            "completed" => self.completed().into_pyobject(py),
            _ => Err(PyKeyError::new_err(format!(
                "{key:?}: a worker report has \"worker\", \"enqueued\" and \"completed\""
            ))),
        }
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<WorkerReport>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "WorkerReport(worker={}, enqueued={:?}, completed={:?})",
            self.inner.worker, self.inner.enqueued, self.inner.completed
        )
    }
}
