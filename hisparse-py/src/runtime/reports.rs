//! Counters as a Python dict: every field of the runtime's `Counters` (by their serde names, so
//! the dict follows the struct), and `hit_rate`.

use hisparse_runtime::Counters;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::invalid;

pub(super) fn counters_dict<'py>(py: Python<'py>, c: &Counters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let fields = serde_json::to_value(c).map_err(|e| invalid(e.to_string()))?;
    for (k, v) in fields.as_object().into_iter().flatten() {
        d.set_item(k, v.as_u64())?;
    }
    d.set_item("hit_rate", c.hit_rate())?;
    Ok(d)
}
