//! The runtime's device buffers as arrays an engine's kernels read: [`DeviceArray`], exposing
//! `__cuda_array_interface__` (CUDA: `torch.as_tensor(a, device="cuda")` views it without a
//! copy) or `__array_interface__` (CPU: `numpy.asarray(a)` views it without a copy).

use hisparse_core::ops::BufferLen;
use hisparse_runtime::AnyBuffer;
use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::{Runtime, State};
use crate::arrays::Memory;
use crate::errors::invalid;

/// A read-only view of one of the runtime's device buffers (int32), holding the
/// runtime alive. The runtime rewrites it in stream order (tables in `begin_step`); read it on
/// the runtime's compute stream (the engine's, when lent), or after `synchronize()`.
///
/// Its address is fixed for the runtime's life: a CUDA graph may capture kernels that read it.
#[pyclass(module = "hisparse", name = "DeviceArray", frozen)]
pub struct DeviceArray {
    /// Keeps the buffer alive.
    _runtime: Py<Runtime>,
    name: String,
    ptr: u64,
    shape: Vec<usize>,
    memory: Memory,
}

/// Where `buf`'s memory is: its address and kind (`device`: the runtime's device ordinal).
fn locate(buf: &AnyBuffer, device: i32) -> PyResult<(u64, Memory)> {
    let _ = device;
    match buf {
        #[cfg(feature = "cpu")]
        AnyBuffer::Cpu(b) => Ok((b.address() as u64, Memory::Host)),
        #[cfg(feature = "cuda")]
        AnyBuffer::Cuda(b) => Ok((b.device_address(), Memory::Cuda(device))),
        #[cfg(feature = "rocm")]
        AnyBuffer::Rocm(b) => Ok((b.device_address(), Memory::Rocm(device))),
        #[allow(unreachable_patterns)]
        _ => Err(crate::errors::error(
            hisparse_core::ErrorKind::Unsupported,
            "this backend's device buffers have no address an array interface can carry; use the cpu, cuda or rocm backend".into(),
        )),
    }
}

/// The view of the buffer `pick` chooses, as int32 of the shape it gives.
pub(super) fn view(
    slf: &Bound<'_, Runtime>,
    name: String,
    pick: impl FnOnce(&State) -> PyResult<(&AnyBuffer, Vec<usize>)>,
) -> PyResult<DeviceArray> {
    let runtime = slf.get();
    let state = runtime.lock()?;
    let (buf, shape) = pick(&state)?;
    let (ptr, memory) = locate(buf, state.device_index)?;
    let bytes = shape.iter().product::<usize>() as u64 * 4;
    if bytes > buf.byte_len() {
        return Err(crate::errors::error(
            hisparse_core::ErrorKind::Other,
            format!(
                "{name}: the runtime's buffer holds {} bytes, fewer than its shape {shape:?} needs (a bug; please report it)",
                buf.byte_len()
            ),
        ));
    }
    Ok(DeviceArray {
        _runtime: slf.clone().unbind(),
        name,
        ptr,
        shape,
        memory,
    })
}

/// `[state_rows, width]`.
fn per_row(s: &State, width: u32) -> Vec<usize> {
    vec![s.rt.config().state_rows as usize, width as usize]
}

fn bucket_error(bucket: u32, state: &State) -> PyErr {
    let n = state.rt.layout().num_buckets;
    invalid(format!(
        "bucket = {bucket}, but the layout has {n} buckets; pass 0 to {}",
        n.saturating_sub(1)
    ))
}

/// `Runtime.slot_mapping()`.
pub(super) fn slot_mapping(slf: &Bound<'_, Runtime>) -> PyResult<DeviceArray> {
    view(slf, "slot_mapping()".into(), |s| {
        let rows = s.rt.slot_mapping_groups().len();
        let width = s.rt.config().max_batched_tokens as usize;
        Ok((s.rt.slot_mapping(), vec![rows, width]))
    })
}

/// `Runtime.batch_buffer()`.
pub(super) fn batch(slf: &Bound<'_, Runtime>) -> PyResult<DeviceArray> {
    view(slf, "batch_buffer()".into(), |s| {
        let width = s.rt.config().max_step_tokens as usize;
        Ok((s.rt.batch_buffer(), vec![width]))
    })
}

/// `Runtime.resident_table(bucket)`.
pub(super) fn resident(slf: &Bound<'_, Runtime>, bucket: u32) -> PyResult<DeviceArray> {
    view(slf, format!("resident_table({bucket})"), |s| {
        let buf =
            s.rt.resident_table(bucket)
                .ok_or_else(|| bucket_error(bucket, s))?;
        Ok((buf, per_row(s, s.rt.layout().max_pages_per_request)))
    })
}

/// `Runtime.hot_table(bucket)`.
pub(super) fn hot(slf: &Bound<'_, Runtime>, bucket: u32) -> PyResult<DeviceArray> {
    view(slf, format!("hot_table({bucket})"), |s| {
        let buf =
            s.rt.hot_table(bucket)
                .ok_or_else(|| bucket_error(bucket, s))?;
        Ok((buf, per_row(s, s.rt.layout().hot_blocks_per_request)))
    })
}

/// `Runtime.host_table()`.
pub(super) fn host(slf: &Bound<'_, Runtime>) -> PyResult<DeviceArray> {
    view(slf, "host_table()".into(), |s| {
        Ok((
            s.rt.host_table(),
            per_row(s, s.rt.layout().max_pages_per_request),
        ))
    })
}

/// `Runtime.indexer_table()`.
pub(super) fn indexer(slf: &Bound<'_, Runtime>) -> PyResult<DeviceArray> {
    view(slf, "indexer_table()".into(), |s| {
        Ok((
            s.rt.indexer_table(),
            per_row(s, s.rt.layout().max_pages_per_request),
        ))
    })
}

/// `Runtime.regular_table(group)`.
pub(super) fn regular(slf: &Bound<'_, Runtime>, group: usize) -> PyResult<DeviceArray> {
    view(slf, format!("regular_table({group})"), |s| {
        let kv = s.rt.layout();
        let buf = s.rt.regular_table(group).ok_or_else(|| {
            let r = kv.regular_groups();
            if r.is_empty() {
                invalid(format!(
                    "group = {group}, but the layout has no regular groups"
                ))
            } else {
                invalid(format!(
                    "group = {group} is not a regular group of the layout; pass {} to {}",
                    r.start,
                    r.end - 1
                ))
            }
        })?;
        Ok((buf, per_row(s, kv.table_width(group))))
    })
}

impl DeviceArray {
    /// The array-interface dict (version 3) of the view: read-only, C-contiguous int32.
    fn interface<'py>(&self, py: Python<'py>, cuda: bool) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", "<i4")?;
        // numpy honours the read-only flag; PyTorch refuses a CUDA array that sets it, so the
        // CUDA view says writable (the class docs: the engine never writes it).
        d.set_item("data", (self.ptr, !cuda))?;
        d.set_item("strides", py.None())?;
        if cuda {
            // Stream-ordered by the engine (see the class docs): no stream to wait for here.
            d.set_item("stream", py.None())?;
        }
        Ok(d)
    }
}

#[pymethods]
impl DeviceArray {
    /// numpy's array interface, for arrays in host memory (the CPU backend).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.memory != Memory::Host {
            return Err(PyAttributeError::new_err(format!(
                "{} lives in device memory: use __cuda_array_interface__ (torch.as_tensor(array, device=\"cuda\"))",
                self.name
            )));
        }
        self.interface(py, false)
    }

    /// The CUDA array interface, for arrays in CUDA device memory.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !matches!(self.memory, Memory::Cuda(_)) {
            return Err(PyAttributeError::new_err(format!(
                "{} is not in CUDA memory: use __array_interface__ (numpy.asarray(array))",
                self.name
            )));
        }
        self.interface(py, true)
    }

    /// Which buffer this is (`"resident_table(0)"`, …).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The shape (a tuple).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// Always `"int32"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        "int32"
    }

    /// The address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.ptr
    }

    /// `"cpu"`, `"cuda"` or `"rocm"`.
    #[getter]
    fn device(&self) -> &'static str {
        match self.memory {
            Memory::Host => "cpu",
            Memory::Cuda(_) => "cuda",
            Memory::Rocm(_) => "rocm",
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray({}, shape={:?}, dtype=int32, device={:?})",
            self.name,
            self.shape,
            self.device()
        )
    }
}
