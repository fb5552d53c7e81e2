//! Which stream a call enqueues on: the `stream=` handle it was given, or else the caller's
//! current stream — PyTorch's, on the CUDA and ROCm backends once `torch` is imported (so that
//! `with torch.cuda.graph(g):` and `with torch.cuda.stream(s):` take the runtime's calls along,
//! as they take PyTorch's own ops). Each raw handle is lent to the runtime once
//! (`Runtime::adopt_stream`) and then named by its `StreamId`.
//!
//! The CPU backend runs every call to completion on the calling thread: it has no streams to
//! choose, and `stream=` is ignored there.

use hisparse_runtime::{AnyDevice, BackendKind, Runtime as Core, StreamId};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::lend::TapMessage;
use crate::errors::to_py;

/// The streams a runtime enqueues on, by raw handle, and the caller's current-stream lookup.
pub(crate) struct Streams {
    /// Whether calls follow the caller's stream (a backend with streams an engine shares).
    follows: bool,
    /// The device ordinal, for PyTorch's per-device current stream.
    device_index: i32,
    /// The raw handle lent at construction as the compute stream: calls on it name `None`.
    compute_raw: Option<u64>,
    /// Handles lent since, with their ids.
    adopted: Vec<(u64, StreamId)>,
    /// `sys.modules`, to notice `torch` once it is imported (without importing it).
    modules: Option<Py<PyDict>>,
    /// PyTorch's current-stream lookup, once `torch` is imported.
    current: Current,
}

/// What is known of PyTorch's current-stream lookup.
enum Current {
    /// `torch` is not imported (yet).
    NotImported,
    /// `torch` is imported without CUDA: there is no current stream to follow.
    NoCuda,
    /// `torch._C._cuda_getCurrentRawStream` (or an equivalent).
    Lookup(Py<PyAny>),
}

impl Streams {
    /// The streams of a runtime on `kind`, device `device_index`, whose compute stream is the
    /// engine's `compute_raw` when it lent one.
    pub(crate) fn new(kind: BackendKind, device_index: i32, compute_raw: Option<u64>) -> Self {
        Streams {
            follows: matches!(kind, BackendKind::Cuda | BackendKind::Rocm),
            device_index,
            compute_raw,
            adopted: Vec::new(),
            modules: None,
            current: Current::NotImported,
        }
    }

    /// The stream a call enqueues on: `explicit` when given, else the caller's current stream
    /// (the compute stream when there is none to follow).
    pub(crate) fn on(
        &mut self,
        py: Python<'_>,
        rt: &mut Core<AnyDevice>,
        explicit: Option<u64>,
    ) -> PyResult<Option<StreamId>> {
        if !self.follows {
            return Ok(None);
        }
        let raw = match explicit {
            Some(raw) => raw,
            None => match self.current_raw(py)? {
                Some(raw) => raw,
                None => return Ok(None),
            },
        };
        self.id_of(rt, raw)
    }

    /// The id of raw handle `raw`, lending it to the runtime the first time.
    fn id_of(&mut self, rt: &mut Core<AnyDevice>, raw: u64) -> PyResult<Option<StreamId>> {
        if self.compute_raw == Some(raw) {
            return Ok(None);
        }
        if let Some(&(_, id)) = self.adopted.iter().find(|(r, _)| *r == raw) {
            return Ok(Some(id));
        }
        // SAFETY: the handle is the engine's live stream of this device (PyTorch's current
        // stream, or one the caller passed as `stream=`); the Python API documents that a
        // stream passed to the runtime must outlive it (PyTorch keeps its streams, pooled, for
        // the process's life). The backend checks the stream's context.
        let stream = unsafe {
            rt.device()
                .lend_stream(raw as usize as *mut core::ffi::c_void)
        }
        .map_err(|e| to_py(e).tap_message("stream"))?;
        let id = rt.adopt_stream(stream).map_err(to_py)?;
        self.adopted.push((raw, id));
        Ok(Some(id))
    }

    /// PyTorch's current stream of this device, if `torch` is imported and has CUDA.
    fn current_raw(&mut self, py: Python<'_>) -> PyResult<Option<u64>> {
        if let Current::NotImported = self.current {
            self.current = self.find_torch(py)?;
        }
        match &self.current {
            Current::Lookup(lookup) => {
                let raw = lookup.call1(py, (self.device_index,))?;
                Ok(Some(raw.extract::<u64>(py)?))
            }
            _ => Ok(None),
        }
    }

    /// Looks for an imported `torch` and, when it has CUDA (or ROCm), its current-stream lookup.
    fn find_torch(&mut self, py: Python<'_>) -> PyResult<Current> {
        let modules = match &self.modules {
            Some(m) => m.bind(py).clone(),
            None => {
                let m = py
                    .import("sys")?
                    .getattr("modules")?
                    .cast_into::<PyDict>()?;
                self.modules = Some(m.clone().unbind());
                m
            }
        };
        let Some(torch) = modules.get_item("torch")? else {
            return Ok(Current::NotImported);
        };
        let has_cuda = torch
            .getattr("cuda")
            .and_then(|c| c.call_method0("is_available"))
            .and_then(|a| a.extract::<bool>())
            .unwrap_or(false);
        if !has_cuda {
            return Ok(Current::NoCuda);
        }
        // The raw lookup PyTorch's own compiled code uses (no Stream object per call); older
        // releases without it get the public spelling.
        let lookup = match torch
            .getattr("_C")
            .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
        {
            Ok(f) => f,
            Err(_) => py.eval(
                c"lambda i: __import__('torch').cuda.current_stream(i).cuda_stream",
                None,
                None,
            )?,
        };
        Ok(Current::Lookup(lookup.unbind()))
    }
}
