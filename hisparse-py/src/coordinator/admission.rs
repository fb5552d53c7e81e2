//! What a scheduler asks before it picks a batch — would this request fit now, and why not
//! (`Admission`), what each tier has free, what a request needs — and the requests a step
//! refused, as Python values.

use hisparse_core::coordinator::{Admission as CoreAdmission, Needs, RefusalReason, TierFree};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{outcome_name, pool_name, short_pool};

/// What `Coordinator.can_start` or `can_schedule` found: the answer the operation would give
/// now, without changing anything — `outcome` (`"scheduled"`, `"wait"`, `"no_space"`), `pool`
/// (the short pool for `"no_space"`), `tokens` (what it would schedule: a start's first chunk),
/// `reclaims` (whether it would reclaim resident pages first). True only when it would
/// schedule.
#[pyclass(module = "hisparse", frozen, name = "Admission")]
pub struct Admission {
    pub(super) inner: CoreAdmission,
}

#[pymethods]
impl Admission {
    /// `"scheduled"`, `"wait"` or `"no_space"`.
    #[getter]
    fn outcome(&self) -> &'static str {
        outcome_name(self.inner.outcome)
    }

    /// The pool that is short (`"gpu"` or `"host"`) for `"no_space"`, else `None`.
    #[getter]
    fn pool(&self) -> Option<&'static str> {
        short_pool(self.inner.outcome)
    }

    /// Whether the operation would schedule.
    #[getter]
    fn scheduled(&self) -> bool {
        self.inner.outcome == hisparse_core::coordinator::Alloc::Scheduled
    }

    /// Tokens it would schedule (0 unless scheduled).
    #[getter]
    fn tokens(&self) -> u32 {
        self.inner.tokens
    }

    /// Whether it would reclaim resident pages first (the free GPU pool alone is short).
    #[getter]
    fn reclaims(&self) -> bool {
        self.inner.reclaims
    }

    fn __bool__(&self) -> bool {
        self.scheduled()
    }

    fn __repr__(&self) -> String {
        let pool = self
            .pool()
            .map_or(String::new(), |p| format!(", pool={p:?}"));
        format!(
            "Admission({:?}{pool}, tokens={}, reclaims={})",
            self.outcome(),
            self.inner.tokens,
            if self.inner.reclaims { "True" } else { "False" }
        )
    }
}

/// `Coordinator.free()`.
pub(super) fn free_dict<'py>(py: Python<'py>, f: &TierFree) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in [
        ("gpu_blocks", f.gpu_blocks),
        ("gpu_capacity", f.gpu_capacity),
        ("gpu_cached", f.gpu_cached),
        ("host_blocks", f.host_blocks),
        ("host_capacity", f.host_capacity),
        ("host_cached", f.host_cached),
        ("hot_region_blocks", f.hot_region_blocks),
        ("hot_regions_free", f.hot_regions_free),
        ("hot_regions_held", f.hot_regions_held),
        ("rows", f.rows),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// `Coordinator.needs(id, n)`.
pub(super) fn needs_dict<'py>(py: Python<'py>, n: &Needs) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tokens", n.tokens)?;
    d.set_item("context_tokens", n.context_tokens)?;
    for (k, v) in [
        ("gpu_blocks", n.gpu_blocks),
        ("hot_region_blocks", n.hot_region_blocks),
        ("host_blocks", n.host_blocks),
        ("context_gpu_blocks", n.context_gpu_blocks),
        ("context_prefill_gpu_blocks", n.context_prefill_gpu_blocks),
        ("context_host_blocks", n.context_host_blocks),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// A refusal as a dict: `{"reason", "message", ...}` with the reason's figures (`reason`:
/// `"prefill_never_fits"`, `"never_fits"`, `"out_of_memory"` or `"internal"`).
pub(crate) fn refusal_dict<'py>(
    py: Python<'py>,
    r: &RefusalReason,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match *r {
        RefusalReason::PrefillNeverFits {
            context_tokens,
            needed,
            capacity,
        } => {
            d.set_item("reason", "prefill_never_fits")?;
            d.set_item("context_tokens", context_tokens)?;
            d.set_item("needed", needed)?;
            d.set_item("capacity", capacity)?;
        }
        RefusalReason::NeverFits {
            pool,
            needed,
            capacity,
        } => {
            d.set_item("reason", "never_fits")?;
            d.set_item("pool", pool_name(pool))?;
            d.set_item("needed", needed)?;
            d.set_item("capacity", capacity)?;
        }
        RefusalReason::OutOfMemory { bytes } => {
            d.set_item("reason", "out_of_memory")?;
            d.set_item("bytes", bytes)?;
        }
        _ => d.set_item("reason", "internal")?,
    }
    d.set_item("message", r.to_string())?;
    Ok(d)
}
