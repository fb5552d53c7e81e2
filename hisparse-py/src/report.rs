//! A worker's report (`WorkerReport`): the transfer batches a runtime enqueued and completed since
//! its last report — what `Runtime.poll()` returns and `Coordinator.report(...)` takes.

use hisparse_runtime::WorkerReport as Core;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;

use crate::args::{Int, IntList, take_args};

/// A worker's report: `worker` (its rank), `enqueued` and `completed` (transfer ids, oldest
/// first). Also reads as the dict `Runtime.poll()` returned before (`report["completed"]`).
#[pyclass(module = "hisparse", name = "WorkerReport", frozen)]
pub struct WorkerReport {
    pub(crate) inner: Core,
}

impl WorkerReport {
    pub(crate) fn new(inner: Core) -> Self {
        WorkerReport { inner }
    }
}

#[pymethods]
impl WorkerReport {
    /// A report built by the engine itself.
    #[new]
    #[pyo3(signature = (worker, enqueued, completed))]
    fn py_new(worker: Int<u32>, enqueued: IntList<u64>, completed: IntList<u64>) -> PyResult<Self> {
        take_args!(worker, enqueued, completed);
        Ok(WorkerReport::new(Core {
            worker,
            enqueued,
            completed,
        }))
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
