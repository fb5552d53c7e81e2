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
