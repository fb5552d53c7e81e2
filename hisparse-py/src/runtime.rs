//! The engine runtime over a backend chosen by name (`Runtime`), with the engine's arrays and
//! stream lent to it.

use hisparse_core::Device;
use hisparse_runtime::{
    AnyBuffer, AnyDevice, BackendKind, Counters, Indices, Pools, ReportError, Runtime as Core,
    RuntimeConfig, TopK, WorkerReport,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrays::{Array, Memory, array, check_disjoint};
use crate::coordinator::{Command, Coordinator};
use crate::errors::{invalid, to_py};
use crate::layout::Layout;

/// The HiSparse engine runtime: executes each step's `Command` on a backend, on pools and a
/// stream it owns or that the engine lends (PyTorch tensors, numpy arrays, PyTorch's stream).
#[pyclass(module = "hisparse", name = "Runtime", unsendable)]
pub struct Runtime {
    /// Dropped before `lent`: the runtime's buffers over lent memory end first.
    rt: Core<AnyDevice>,
    /// The pools' Python objects (or their DLPack capsules), kept alive while the runtime
    /// uses their memory.
    lent: Vec<Array>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Lent memory must outlive the work enqueued on it: finish it before the objects go.
        // A failure here has nowhere to go (the device is then lost anyway).
        let _ = self.rt.drain();
    }
}

/// Whether memory `m` can be device data of backend `kind`.
fn device_memory_ok(kind: BackendKind, m: Memory) -> bool {
    match kind {
        BackendKind::Cpu => m == Memory::Host,
        BackendKind::Cuda => matches!(m, Memory::Cuda(_)),
        BackendKind::Rocm => matches!(m, Memory::Rocm(_)),
        // The Vulkan backend answers every lending call with its own `Unsupported` error.
        BackendKind::Vulkan => true,
    }
}

fn device_memory_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cpu => "host memory (a numpy array or a CPU tensor)",
        BackendKind::Cuda => "CUDA device memory (a CUDA tensor)",
        BackendKind::Rocm => "ROCm device memory",
        BackendKind::Vulkan => "runtime-owned memory",
    }
}

/// Lends `arr` to `dev` as a device buffer, after checking where it lives.
fn lend_device(dev: &AnyDevice, arr: &Array, what: &str) -> PyResult<AnyBuffer> {
    let kind = dev.kind();
    arr.expect_memory(
        what,
        device_memory_name(kind),
        device_memory_ok(kind, arr.memory),
    )?;
    if arr.bytes == 0 {
        return Err(invalid(format!(
            "{what} is empty; pass at least one element"
        )));
    }
    // SAFETY: the array's Python object (or DLPack capsule) is held in `arr` for the length of
    // the call that uses the buffer (and, for pools, for the runtime's life, drained on drop);
    // its memory is where `expect_memory` checked, the backend checks what its driver can tell
    // (device, extent), and the engine's duty not to touch the memory unordered while work is
    // in flight is stated in the Python API's documentation.
    unsafe { dev.wrap_device_memory(arr.ptr, arr.bytes) }.map_err(|e| to_py(e).tap_message(what))
}

/// Adds the array's name to a lending error.
trait TapMessage {
    fn tap_message(self, what: &str) -> PyErr;
}

impl TapMessage for PyErr {
    fn tap_message(self, what: &str) -> PyErr {
        Python::attach(|py| {
            let v = self.value(py);
            if let Ok(m) = v.getattr("message").and_then(|m| m.extract::<String>()) {
                let m = format!("{what}: {m}");
                let _ = v.setattr("message", m.clone());
                let _ = v.setattr("args", (m,));
            }
        });
        self
    }
}

fn report_dict<'py>(py: Python<'py>, r: &WorkerReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("worker", r.worker)?;
    d.set_item("enqueued", r.enqueued.clone())?;
    d.set_item("completed", r.completed.clone())?;
    Ok(d)
}

fn counters_dict<'py>(py: Python<'py>, c: &Counters) -> PyResult<Bound<'py, PyDict>> {
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

/// Which layers a per-layer call swaps in.
#[derive(Clone, Copy)]
enum Swap {
    Group,
    Leader,
}

impl Runtime {
    #[allow(clippy::too_many_arguments)]
    fn per_layer(
        &mut self,
        group: usize,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u32>,
        state_rows: Option<&Bound<'_, PyAny>>,
        swap: Swap,
    ) -> PyResult<()> {
        let k = self.rt.layout().config.top_k as usize;
        let topk = array(topk, "topk")?;
        topk.expect_i32("topk")?;
        let rows = array(rows, "rows")?;
        rows.expect_i32("rows")?;
        rows.expect_writable("rows")?;
        let counts = counts.map(|c| array(c, "counts")).transpose()?;
        let state = state_rows.map(|s| array(s, "state_rows")).transpose()?;
        if let Some(c) = &counts {
            c.expect_i32("counts")?;
            c.expect_writable("counts")?;
        }
        if let Some(s) = &state {
            s.expect_i32("state_rows")?;
        }
        let t = match num_tokens {
            Some(t) => t as usize,
            None if topk.shape.len() == 2 => topk.shape[0],
            None => topk.len() / k.max(1),
        };
        if topk.shape.len() == 2 && topk.shape[1] != k {
            return Err(invalid(format!(
                "topk has {} columns but the layout's top_k is {k}; pass [num_tokens, {k}]",
                topk.shape[1]
            )));
        }
        for (what, arr, need) in [
            ("topk", Some(&topk), t * k),
            ("rows", Some(&rows), t * k),
            ("counts", counts.as_ref(), t),
            ("state_rows", state.as_ref(), t),
        ] {
            if let Some(a) = arr
                && a.len() < need
            {
                return Err(invalid(format!(
                    "{what} holds {} elements but {t} token rows need {need}",
                    a.len()
                )));
            }
        }
        let mut named: Vec<(&str, &Array)> = vec![("topk", &topk), ("rows", &rows)];
        if let Some(c) = &counts {
            named.push(("counts", c));
        }
        if let Some(s) = &state {
            named.push(("state_rows", s));
        }
        for pool in &self.lent {
            named.push(("a pool of this runtime", pool));
        }
        check_disjoint(&named)?;
        let dev = self.rt.device();
        let topk_buf = lend_device(dev, &topk, "topk")?;
        let mut rows_buf = lend_device(dev, &rows, "rows")?;
        let mut counts_buf = counts
            .as_ref()
            .map(|c| lend_device(dev, c, "counts"))
            .transpose()?;
        let state_buf = state
            .as_ref()
            .map(|s| lend_device(dev, s, "state_rows"))
            .transpose()?;
        let input = TopK {
            positions: &topk_buf,
            num_tokens: u32::try_from(t).map_err(|_| invalid("num_tokens exceeds 2^32"))?,
            state_rows: state_buf.as_ref(),
        };
        let out = Indices {
            rows: &mut rows_buf,
            counts: counts_buf.as_mut(),
        };
        match swap {
            Swap::Group => self.rt.resolve_index_group(group, &input, out),
            Swap::Leader => self.rt.resolve_leader(group, &input, out),
        }
        .map_err(to_py)
    }
}

#[pymethods]
impl Runtime {
    /// A runtime for `layout` on backend `backend` (`"cpu"`, `"cuda"`, `"vulkan"`, `"rocm"`),
    /// device `device` (an ordinal for CUDA and ROCm, an index or name for Vulkan).
    ///
    /// `state_rows` is the coordinator's `max_running`; `max_step_tokens` the most token rows
    /// one per-layer call carries. Pools the engine owns are lent with `device_pool` (a CUDA
    /// tensor for `cuda`, a numpy array for `cpu`; at least `layout.gpu_pool_bytes` bytes) and
    /// `host_pool` (pinned or plain host memory, page-aligned, at least
    /// `layout.host_pool_bytes`); a pool not given is allocated by the runtime. `stream` is
    /// the engine's stream handle (`torch.cuda.current_stream().cuda_stream`): the runtime's
    /// before-forward and decode-path work is then ordered with the engine's on it.
    ///
    /// Lent memory must stay untouched by the engine while the runtime's work on it may be in
    /// flight, except in stream order; the runtime keeps the objects alive and finishes its
    /// work before it lets them go.
    #[new]
    #[pyo3(signature = (
        layout,
        backend = "cpu",
        device = "",
        *,
        state_rows,
        max_step_tokens,
        worker = 0,
        stats_every = 1,
        device_pool = None,
        host_pool = None,
        stream = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        layout: &Layout,
        backend: &str,
        device: &str,
        state_rows: u32,
        max_step_tokens: u32,
        worker: u32,
        stats_every: u32,
        device_pool: Option<&Bound<'_, PyAny>>,
        host_pool: Option<&Bound<'_, PyAny>>,
        stream: Option<u64>,
    ) -> PyResult<Self> {
        let kind: BackendKind = backend.parse().map_err(|e| invalid(format!("{e}")))?;
        let dev = AnyDevice::open(kind, device).map_err(to_py)?;
        let kv = layout.kv.clone();
        let mut cfg = RuntimeConfig::new(state_rows, max_step_tokens);
        cfg.worker = worker;
        cfg.stats_every = stats_every;
        if device_pool.is_none() && host_pool.is_none() && stream.is_none() {
            let rt = Core::new(dev, kv, cfg).map_err(to_py)?;
            return Ok(Runtime {
                rt,
                lent: Vec::new(),
            });
        }
        let mut lent = Vec::new();
        let device_buf = match device_pool {
            Some(obj) => {
                let arr = array(obj, "device_pool")?;
                arr.expect_writable("device_pool")?;
                let buf = lend_device(&dev, &arr, "device_pool")?;
                lent.push(arr);
                buf
            }
            None => {
                let bytes = usize::try_from(kv.gpu_pool_bytes())
                    .map_err(|_| invalid("the device pool exceeds the address space"))?;
                dev.alloc(bytes).map_err(to_py)?
            }
        };
        let host_buf = match host_pool {
            Some(obj) => {
                let arr = array(obj, "host_pool")?;
                arr.expect_writable("host_pool")?;
                arr.expect_memory(
                    "host_pool",
                    "host memory (pinned or not)",
                    arr.memory == Memory::Host,
                )?;
                // SAFETY: as for `lend_device`: the object is kept in `lent` for the runtime's
                // life and the runtime drains its work before dropping it; the backend checks
                // alignment and, on GPUs, pins or checks the pinning with the driver.
                let buf = unsafe { dev.wrap_host_memory(arr.ptr as usize as *mut u8, arr.bytes) }
                    .map_err(|e| to_py(e).tap_message("host_pool"))?;
                lent.push(arr);
                buf
            }
            None => {
                let bytes = usize::try_from(kv.host_pool_bytes())
                    .map_err(|_| invalid("the host pool exceeds the address space"))?;
                dev.alloc_pinned(bytes).map_err(to_py)?
            }
        };
        let stream = match stream {
            // SAFETY: the engine passes a live stream handle of this device and keeps it alive
            // for the runtime's life (documented above); the backend checks its context.
            Some(raw) => Some(
                unsafe { dev.wrap_stream(raw as usize as *mut core::ffi::c_void) }
                    .map_err(|e| to_py(e).tap_message("stream"))?,
            ),
            None => None,
        };
        let pools = Pools {
            device: device_buf,
            host: host_buf,
        };
        let rt = Core::with_pools(dev, kv, cfg, pools, stream).map_err(to_py)?;
        Ok(Runtime { rt, lent })
    }

    /// The backend's name.
    #[getter]
    fn backend(&self) -> &'static str {
        self.rt.device().backend()
    }

    /// The device's name.
    #[getter]
    fn device_name(&self) -> String {
        self.rt.device().device_name().to_string()
    }

    /// State rows of every table and hot state.
    #[getter]
    fn state_rows(&self) -> u32 {
        self.rt.config().state_rows
    }

    /// Token rows one per-layer call may carry.
    #[getter]
    fn max_step_tokens(&self) -> u32 {
        self.rt.config().max_step_tokens
    }

    /// Whether the device pool is lent by the engine.
    #[getter]
    fn lends_pools(&self) -> bool {
        !self.lent.is_empty()
    }

    /// Before the forward pass: table updates, hot-state resets, invalidation, copy-on-write,
    /// restores — enqueued on the compute stream.
    fn begin_step(&mut self, cmd: &Command) -> PyResult<()> {
        self.rt.begin_step(&cmd.inner).map_err(to_py)
    }

    /// Sets this step's batch: `state_rows[t]` is token row `t`'s state row (`-1` = padding).
    fn set_batch(&mut self, state_rows: Vec<i32>) -> PyResult<()> {
        self.rt.set_batch(&state_rows).map_err(to_py)
    }

    /// Resolves index group `group`'s top-k (`topk`, int32 `[num_tokens, top_k]` token
    /// positions, -1 = none) into attention rows (`rows`, int32, same shape: physical rows of the
    /// flat device-pool view, -1 = none) and swaps in every layer of the group; `counts`
    /// (int32 `[num_tokens]`) receives the valid entries per row when given. `state_rows`
    /// (int32 `[num_tokens]`) overrides the batch of `set_batch`.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None))]
    fn resolve_index_group(
        &mut self,
        group: usize,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u32>,
        state_rows: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.per_layer(
            group,
            topk,
            rows,
            counts,
            num_tokens,
            state_rows,
            Swap::Group,
        )
    }

    /// As `resolve_index_group`, swapping in the leader layer only; each follower layer then
    /// calls `apply_plan(layer)`.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None))]
    fn resolve_leader(
        &mut self,
        group: usize,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<u32>,
        state_rows: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.per_layer(
            group,
            topk,
            rows,
            counts,
            num_tokens,
            state_rows,
            Swap::Leader,
        )
    }

    /// Swaps in follower layer `layer` with its leader's plan of this step.
    fn apply_plan(&mut self, layer: u32) -> PyResult<()> {
        self.rt.apply_plan(layer).map_err(to_py)
    }

    /// After the forward pass: row mirrors and spills on the copy stream, after an event.
    fn end_step(&mut self, cmd: &Command) -> PyResult<()> {
        self.rt.end_step(&cmd.inner).map_err(to_py)
    }

    /// Transfer batches enqueued and completed since the last poll, without blocking:
    /// `{"worker", "enqueued", "completed"}` (the arguments of `Coordinator.report`).
    fn poll<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.rt.poll().map_err(to_py)?;
        report_dict(py, &r)
    }

    /// `poll()`, then hands the result to `coordinator` as this runtime's worker report.
    fn poll_and_report<'py>(
        &mut self,
        py: Python<'py>,
        coordinator: &Bound<'py, Coordinator>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut c = coordinator.borrow_mut();
        let r = self.rt.poll_and_report(&mut c.inner).map_err(|e| match e {
            ReportError::Runtime(e) => to_py(e),
            ReportError::Coordinator(e) => to_py(e),
        })?;
        report_dict(py, &r)
    }

    /// Blocks until every transfer and counter copy in flight completed, then polls.
    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.rt.drain().map_err(to_py)?;
        report_dict(py, &r)
    }

    /// Blocks until the compute stream's work is done.
    fn synchronize(&self) -> PyResult<()> {
        self.rt
            .device()
            .synchronize(self.rt.compute_stream())
            .map_err(to_py)
    }

    /// Totals since the runtime was built (hits, misses, bytes each way, …, `hit_rate`).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counters_dict(py, self.rt.counters())
    }

    /// Transfer batches enqueued and not yet seen complete.
    #[getter]
    fn pending_transfers(&self) -> usize {
        self.rt.pending_transfers()
    }

    /// The resident table row of `state_row` in `bucket` as the device holds it once this
    /// step's updates are enqueued: page → GPU block, 0 for pages read from host.
    fn resident_row(&self, bucket: u32, state_row: u32) -> PyResult<Vec<i32>> {
        self.rt
            .resident_row(bucket, state_row)
            .map(<[i32]>::to_vec)
            .ok_or_else(|| {
                invalid(format!(
                    "bucket {bucket} or state row {state_row} is outside the runtime ({} buckets, {} state rows)",
                    self.rt.layout().num_buckets,
                    self.rt.config().state_rows
                ))
            })
    }

    /// The host table row of `state_row`: page → host block, -1 for none.
    fn host_row(&self, state_row: u32) -> PyResult<Vec<i32>> {
        self.rt
            .host_row(state_row)
            .map(<[i32]>::to_vec)
            .ok_or_else(|| {
                invalid(format!(
                    "state row {state_row} is outside the runtime's {} rows",
                    self.rt.config().state_rows
                ))
            })
    }

    /// Writes `data` into the device pool at byte `offset` (synchronously): how an engine
    /// without a lent pool writes its forward pass's KV rows.
    fn write_device_pool(&mut self, offset: usize, data: &[u8]) -> PyResult<()> {
        let (dev, pools) = self.rt.device_and_pools_mut();
        dev.upload(&mut pools.device, offset, data).map_err(to_py)
    }

    /// `nbytes` of the device pool from byte `offset` (synchronously).
    fn read_device_pool<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; nbytes];
        self.rt
            .device()
            .download(&self.rt.pools().device, offset, &mut out)
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// `nbytes` of the host pool from byte `offset` (synchronously; call `drain()` first for
    /// rows still being copied).
    fn read_host_pool<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; nbytes];
        self.rt
            .device()
            .read_pinned(&self.rt.pools().host, offset, &mut out)
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    fn __repr__(&self) -> String {
        format!(
            "Runtime(backend={:?}, device={:?}, state_rows={}, max_step_tokens={}, lent_pools={})",
            self.rt.device().backend(),
            self.rt.device().device_name(),
            self.rt.config().state_rows,
            self.rt.config().max_step_tokens,
            self.lent.len()
        )
    }
}
