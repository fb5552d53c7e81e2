//! Counters as a Python dict.

use hisparse_runtime::Counters;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(super) fn counters_dict<'py>(py: Python<'py>, c: &Counters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in [
        ("steps", c.steps),
        ("sampled_steps", c.sampled_steps),
        ("hot_hits", c.hot_hits),
        ("hot_misses", c.hot_misses),
        ("resident_reads", c.resident_reads),
        ("h2d_bytes", c.h2d_bytes),
        ("d2h_bytes", c.d2h_bytes),
        ("remap_calls", c.remap_calls),
        ("resolve_calls", c.resolve_calls),
        ("follower_gathers", c.follower_gathers),
        ("table_writes", c.table_writes),
        ("hot_resets", c.hot_resets),
        ("reclaimed_pages", c.reclaimed_pages),
        ("restored_pages", c.restored_pages),
        ("host_cow_pages", c.host_cow_pages),
        ("gpu_cow_blocks", c.gpu_cow_blocks),
        ("mirror_spans", c.mirror_spans),
        ("spilled_pages", c.spilled_pages),
        ("transfers_enqueued", c.transfers_enqueued),
        ("transfers_completed", c.transfers_completed),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("hit_rate", c.hit_rate())?;
    Ok(d)
}
