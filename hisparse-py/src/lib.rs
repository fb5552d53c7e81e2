#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod args;
mod arrays;
mod coordinator;
mod errors;
mod layout;
mod report;
mod runtime;
mod wire;

use pyo3::prelude::*;

/// The compiled part of the `hisparse` Python package.
#[pymodule]
fn _hisparse(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<layout::Layout>()?;
    m.add_class::<coordinator::Coordinator>()?;
    m.add_class::<coordinator::Command>()?;
    m.add_class::<coordinator::Alloc>()?;
    m.add_class::<coordinator::Admission>()?;
    m.add_class::<report::WorkerReport>()?;
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<runtime::LayerCall>()?;
    m.add_class::<runtime::DeviceArray>()?;
    m.add_function(wrap_pyfunction!(layout::plan_layout, m)?)?;
    m.add_function(wrap_pyfunction!(layout::presets, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(releases_in_flight, m)?)?;
    m.add_function(wrap_pyfunction!(wait_for_releases, m)?)?;
    m.add_function(wrap_pyfunction!(coordinator::_command_from_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(report::_report_from_pickle, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Names of the backends compiled into this build.
#[pyfunction]
fn backends() -> Vec<&'static str> {
    hisparse_runtime::BackendKind::ALL
        .into_iter()
        .filter(|k| k.is_compiled())
        .map(|k| k.name())
        .collect()
}

/// Host pools of this process still being released on a thread of their own: a runtime's own
/// pool, or a pool the engine lent (the runtime unregisters it, then lets go of the engine's
/// object) — dropping a runtime returns before either is done.
#[pyfunction]
fn releases_in_flight() -> usize {
    hisparse_runtime::host_memory::releases_in_flight()
}

/// Waits until every release of this process has finished (at most `timeout` seconds, or for
/// ever with `None`), without holding the GIL; whether they all did. A runtime built while
/// releases run waits for them by itself when host memory is short.
#[pyfunction]
#[pyo3(signature = (timeout = None))]
fn wait_for_releases(py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
    let limit = match timeout {
        None => std::time::Duration::MAX,
        Some(t) if t.is_finite() && t >= 0.0 => std::time::Duration::from_secs_f64(t.min(1e9)),
        Some(t) => {
            return Err(errors::invalid(format!(
                "timeout = {t} is not a number of seconds; pass a non-negative number or None"
            )));
        }
    };
    Ok(py.detach(|| hisparse_runtime::host_memory::wait_for_releases(limit)))
}
