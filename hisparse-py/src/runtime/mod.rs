//! The engine runtime over a backend chosen by name (`Runtime`), with the engine's arrays and
//! stream lent to it.
//!
//! # Threads
//!
//! A `Runtime` may be used from any thread, one call at a time: its state sits behind a lock
//! that each call takes without waiting, and a call made while another thread's call is still
//! running in the same runtime raises `ConcurrentUseError` (never blocks, never panics). The
//! backends' device types are `Send` (the CUDA and ROCm backends make their context current on
//! the calling thread at every call), which is what makes this sound. Blocking calls (`drain`,
//! `synchronize`) let go of the GIL while they wait.

mod build;
mod lend;
mod modes;
mod per_layer;
mod reports;
mod streams;
mod tables;

use std::sync::{Mutex, MutexGuard, TryLockError};

use hisparse_core::Device;
use hisparse_core::ops::BufferLen;
use hisparse_runtime::{AnyDevice, ReportError, Runtime as Core, RuntimeConfig};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::args::{Int, IntList, take_args};
use crate::arrays::Array;
use crate::coordinator::{Command, Coordinator};
use crate::errors::{concurrent_use, invalid, poisoned, to_py};
use crate::layout::Layout;
use crate::report::WorkerReport;
use crate::wire::layout_mismatch;
use hisparse_core::wire::LayoutFingerprint;

pub use per_layer::LayerCall;
pub use tables::DeviceArray;

use hisparse_runtime::Swap;
use per_layer::{LayerArrays, Op};
use streams::Streams;

/// The runtime of a `State`: there from construction until `State`'s drop hands it on.
pub(crate) struct Owned(Option<Core<AnyDevice>>);

impl Owned {
    pub(crate) fn new(rt: Core<AnyDevice>) -> Self {
        Owned(Some(rt))
    }
}

impl std::ops::Deref for Owned {
    type Target = Core<AnyDevice>;
    fn deref(&self) -> &Core<AnyDevice> {
        // Taken only by `State::drop`, after which nothing reaches the state.
        self.0
            .as_ref()
            .expect("a runtime is taken only when its state drops")
    }
}

impl std::ops::DerefMut for Owned {
    fn deref_mut(&mut self) -> &mut Core<AnyDevice> {
        self.0
            .as_mut()
            .expect("a runtime is taken only when its state drops")
    }
}

/// What a `Runtime` holds behind its lock.
pub(crate) struct State {
    /// Dropped before `lent`: the runtime's buffers over lent memory end first.
    pub(crate) rt: Owned,
    /// The pools' Python objects (or their DLPack capsules), kept alive while the runtime
    /// uses their memory.
    pub(crate) lent: Vec<Array>,
    /// The engine's streams lent so far, and how to find the caller's current one.
    pub(crate) streams: Streams,
    /// The device ordinal (CUDA, ROCm).
    pub(crate) device_index: i32,
    /// The layout's fingerprint: commands must carry it, reports carry it.
    pub(crate) fingerprint: LayoutFingerprint,
    /// Whether the host pool is the engine's memory, registered here and large enough that
    /// unregistering it takes a while: the drop then hands the runtime and the lent objects to
    /// a release thread instead of unregistering on the engine's thread.
    pub(crate) release_in_background: bool,
}

impl State {
    /// Refuses a command planned for another layout.
    fn check_command(&self, cmd: &Command) -> PyResult<()> {
        if cmd.fingerprint != self.fingerprint {
            return Err(layout_mismatch(
                "this Command",
                cmd.fingerprint,
                self.fingerprint,
            ));
        }
        Ok(())
    }

    /// A report of this runtime.
    fn report(&self, r: hisparse_runtime::WorkerReport) -> WorkerReport {
        WorkerReport::new(r, Some(self.fingerprint))
    }

    /// The stream a call enqueues on (see `streams`).
    pub(crate) fn on(
        &mut self,
        py: Python<'_>,
        stream: Option<u64>,
    ) -> PyResult<Option<hisparse_runtime::StreamId>> {
        self.streams.on(py, &mut self.rt, stream)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // Lent memory must outlive the work enqueued on it: finish it before the objects go.
        // A failure here has nowhere to go (the device is then lost anyway).
        let _ = self.rt.drain();
        if self.release_in_background {
            // The runtime unregisters the lent pool when dropped (a second or more for tens of
            // GiB); the engine's objects, which own the memory, go after it. Their references
            // are let go without the GIL there: Python drops them when it next runs.
            let rt = self.rt.0.take();
            let lent = std::mem::take(&mut self.lent);
            let _ = hisparse_runtime::host_memory::release::in_background(move || {
                drop(rt);
                drop(lent);
            });
        }
    }
}

/// The HiSparse engine runtime: executes each step's `Command` on a backend, on pools and a
/// stream it owns or that the engine lends (PyTorch tensors, numpy arrays, PyTorch's stream).
#[pyclass(module = "hisparse", name = "Runtime", frozen)]
pub struct Runtime {
    state: Mutex<State>,
}

impl Runtime {
    /// The runtime's state, or `ConcurrentUseError` while another thread's call holds it.
    pub(crate) fn lock(&self) -> PyResult<MutexGuard<'_, State>> {
        self.lock_detached().map_err(Detached::into_py)
    }
}

/// `nbytes` from byte `offset` of a pool of `len` bytes, refused before anything is allocated
/// when the range leaves the pool.
fn check_range(what: &str, offset: usize, nbytes: usize, len: u64) -> PyResult<()> {
    let end = (offset as u64).checked_add(nbytes as u64);
    match end {
        Some(end) if end <= len => Ok(()),
        _ => Err(invalid(format!(
            "offset {offset} + nbytes {nbytes} reaches past the {what}'s {len} bytes; read within it"
        ))),
    }
}

#[pymethods]
impl Runtime {
    /// A runtime for `layout` on backend `backend` (`"cpu"`, `"cuda"`, `"vulkan"`, `"rocm"`),
    /// device `device` (an ordinal for CUDA and ROCm, an index or name for Vulkan).
    ///
    /// `state_rows` is the coordinator's `max_running`; `max_step_tokens` the most token rows
    /// one per-layer call carries; `max_batched_tokens` the most tokens one step computes (the
    /// coordinator's `max_batched_tokens`: the width of the slot mapping; default the larger of
    /// 512 and `max_step_tokens`). Pools the engine owns are lent with `device_pool` (a CUDA
    /// tensor for `cuda`, a numpy array for `cpu`; at least `layout.gpu_pool_bytes` bytes) and
    /// `host_pool` (pinned or plain host memory, page-aligned, at least
    /// `layout.host_pool_bytes`); a pool not given is allocated by the runtime. The two must
    /// not share memory. `stream` is an engine stream handle to use as the runtime's compute
    /// stream (where calls go that name no stream and find no current one).
    ///
    /// Lent memory must stay untouched by the engine while the runtime's work on it may be in
    /// flight, except in stream order; the runtime keeps the objects alive and finishes its
    /// work before it lets them go. A stream handle given to the runtime (here or as a call's
    /// `stream=`) must outlive it.
    ///
    /// Workers of one node may share one host pool: a layout planned with
    /// `shared_host_pool=True`, and each worker's `host_pool` an array over the same shared
    /// memory (`multiprocessing.shared_memory`). Exactly one of them writes it (row mirrors,
    /// spills, host copy-on-write: `writes_host=True`, the default); the others pass
    /// `writes_host=False` and only read it. Each reports as its own `worker`, so a page is
    /// durable once every worker has reported it.
    #[new]
    #[pyo3(signature = (
        layout,
        backend = "cpu",
        device = "",
        *,
        state_rows,
        max_step_tokens,
        max_batched_tokens = None,
        worker = Int::new(0),
        stats_every = Int::new(1),
        device_pool = None,
        host_pool = None,
        stream = None,
        writes_host = true,
    ),
    // The defaults as Python shows them (`Int` defaults have no literal form for PyO3 to print).
    text_signature = "(layout, backend='cpu', device='', *, state_rows, max_step_tokens, max_batched_tokens=None, worker=0, stats_every=1, device_pool=None, host_pool=None, stream=None, writes_host=True)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        layout: &Layout,
        backend: &str,
        device: &str,
        state_rows: Int<u32>,
        max_step_tokens: Int<u32>,
        max_batched_tokens: Option<Int<u32>>,
        worker: Int<u32>,
        stats_every: Int<u32>,
        device_pool: Option<&Bound<'_, PyAny>>,
        host_pool: Option<&Bound<'_, PyAny>>,
        stream: Option<Int<u64>>,
        writes_host: bool,
    ) -> PyResult<Self> {
        take_args!(
            state_rows,
            max_step_tokens,
            max_batched_tokens,
            worker,
            stats_every,
            stream
        );
        let mut cfg = RuntimeConfig::new(state_rows, max_step_tokens);
        if let Some(t) = max_batched_tokens {
            cfg.max_batched_tokens = t;
        }
        cfg.worker = worker;
        cfg.stats_every = stats_every;
        cfg.writes_host = writes_host;
        let state = build::build(build::Request {
            layout,
            backend,
            device,
            cfg,
            device_pool,
            host_pool,
            stream,
        })?;
        Ok(Runtime {
            state: Mutex::new(state),
        })
    }

    /// The backend's name.
    #[getter]
    fn backend(&self) -> PyResult<&'static str> {
        Ok(self.lock()?.rt.device().backend())
    }

    /// The device's name.
    #[getter]
    fn device_name(&self) -> PyResult<String> {
        Ok(self.lock()?.rt.device().device_name().to_string())
    }

    /// State rows of every table and hot state.
    #[getter]
    fn state_rows(&self) -> PyResult<u32> {
        Ok(self.lock()?.rt.config().state_rows)
    }

    /// Token rows one per-layer call may carry.
    #[getter]
    fn max_step_tokens(&self) -> PyResult<u32> {
        Ok(self.lock()?.rt.config().max_step_tokens)
    }

    /// Whether the device pool is lent by the engine.
    #[getter]
    fn lends_pools(&self) -> PyResult<bool> {
        Ok(!self.lock()?.lent.is_empty())
    }

    /// How the host pool was set up, in words (threads, NUMA node, pages, pinnings), or `None`
    /// where the backend did not set it up (an array lent already pinned, a CPU-backend array
    /// lent, the Vulkan backend). For an array over `/dev/shm` (`multiprocessing.shared_memory`)
    /// it names the mount's huge-page setting, and for 4 KiB pages the remount that speeds up
    /// the set-up (`docs/host-pool.md`).
    #[getter]
    fn host_pool_setup(&self) -> PyResult<Option<String>> {
        Ok(self
            .lock()?
            .rt
            .pools()
            .host
            .setup()
            .map(ToString::to_string))
    }

    /// Before the forward pass: table updates, hot-state resets, invalidation, copy-on-write,
    /// restores, the step's slot mapping — enqueued on `stream` (default: the caller's current
    /// stream). Commands run once each, in order. Before-replay work: refused while `stream` is
    /// being captured into a graph.
    #[pyo3(signature = (cmd, *, stream = None))]
    fn begin_step(&self, py: Python<'_>, cmd: &Command, stream: Option<Int<u64>>) -> PyResult<()> {
        take_args!(stream);
        let mut state = self.lock()?;
        state.check_command(cmd)?;
        let on = state.on(py, stream)?;
        state.rt.begin_step_on(&cmd.inner, on).map_err(to_py)
    }

    /// Sets this step's batch: `state_rows[t]` is token row `t`'s state row (`-1` = padding),
    /// each a request scheduled in the open step. Written into the runtime's batch table
    /// (`batch_buffer()`) on `stream`, stream-ordered. Before replaying a graph that captured
    /// per-layer calls of `T` token rows, pass `pad_to=T` (refused for a `T` no capture had, or
    /// one below `len(state_rows)`). Before-replay work: refused while `stream` is being
    /// captured.
    #[pyo3(signature = (state_rows, *, pad_to = None, stream = None))]
    fn set_batch(
        &self,
        py: Python<'_>,
        state_rows: IntList<i32>,
        pad_to: Option<Int<u32>>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        take_args!(state_rows, pad_to, stream);
        let mut state = self.lock()?;
        let on = state.on(py, stream)?;
        state
            .rt
            .set_batch_on(&state_rows, pad_to, on)
            .map_err(to_py)
    }

    /// Resolves index group `group`'s top-k (`topk`, int32 `[num_tokens, top_k]` token
    /// positions, -1 = none) into attention rows (`rows`, int32, same shape: physical rows of the
    /// flat device-pool view, -1 = none) and swaps in every layer of the group; `counts`
    /// (int32 `[num_tokens]`) receives the valid entries per row when given. `state_rows`
    /// (int32 `[num_tokens]`) overrides the batch of `set_batch`. On `stream` (default: the
    /// caller's current stream); recorded into a graph when that stream is being captured.
    // Accepted twins (CONTRIBUTING.md, "One rule, one place"): the three top-k entry points
    // (resolve_index_group, resolve_leader, remap_prefill) share their Python signature; each
    // body is one call into one_shot with its own operation.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn resolve_index_group(
        &self,
        py: Python<'_>,
        group: Int<usize>,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<Int<u32>>,
        state_rows: Option<&Bound<'_, PyAny>>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        let call = (group, topk, rows, counts, num_tokens, state_rows, stream);
        self.one_shot(py, call, Op::Decode(Swap::IndexGroup))
    }

    /// As `resolve_index_group`, swapping in the leader layer only; each follower layer then
    /// calls `apply_plan(layer)`.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn resolve_leader(
        &self,
        py: Python<'_>,
        group: Int<usize>,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<Int<u32>>,
        state_rows: Option<&Bound<'_, PyAny>>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        let call = (group, topk, rows, counts, num_tokens, state_rows, stream);
        self.one_shot(py, call, Op::Decode(Swap::Leader))
    }

    /// A prefill chunk's read of index group `group`: remaps the top-k of its token rows through
    /// the resident tables (the chunk's whole context is on the GPU; nothing is swapped in).
    /// Arguments as for `resolve_index_group`.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn remap_prefill(
        &self,
        py: Python<'_>,
        group: Int<usize>,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<Int<u32>>,
        state_rows: Option<&Bound<'_, PyAny>>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        let call = (group, topk, rows, counts, num_tokens, state_rows, stream);
        self.one_shot(py, call, Op::RemapPrefill)
    }

    /// The resident remap of index group `group` with modes (the fully-resident path: top-k
    /// positions → rows through the resident tables; nothing swapped in): `dcp=(size, rank,
    /// interleave)` spreads each request's context over `size` decode-context-parallel ranks in
    /// runs of `interleave` tokens (this runtime is rank `rank`: tokens of other ranks map to
    /// -1, its own by their local index); `workspace=(request_of_row, starts)` reads prefill
    /// rows from a gathered workspace (`request_of_row` int32 `[T]`: each token row's prefill
    /// request, -1 for a decode row; `starts` int32 `[P]`: the workspace row of each prefill
    /// request's token 0, so entry `tok` maps to `starts[p] + tok`). Other arguments as for
    /// `resolve_index_group`; inside a step.
    #[pyo3(signature = (group, topk, rows, counts = None, *, num_tokens = None, state_rows = None, dcp = None, workspace = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn remap_modes(
        &self,
        py: Python<'_>,
        group: Int<usize>,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        num_tokens: Option<Int<u32>>,
        state_rows: Option<&Bound<'_, PyAny>>,
        dcp: Option<(Int<u32>, Int<u32>, Int<u32>)>,
        workspace: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        take_args!(group, num_tokens, stream);
        let dcp = match dcp {
            Some((size, rank, interleave)) => {
                take_args!(size, rank, interleave);
                Some((size, rank, interleave))
            }
            None => None,
        };
        let mut state = self.lock()?;
        let on = state.on(py, stream)?;
        let mut arrays = LayerArrays::new(&state, topk, rows, counts, state_rows)?;
        modes::remap_modes(
            &mut state,
            &mut arrays,
            group,
            modes::dcp_split(dcp),
            workspace.as_ref().map(|(a, b)| (a, b)),
            num_tokens,
            on,
        )
    }

    /// The compressed slot mapping of the indexer caches: for each token (`positions`,
    /// `slot_mapping` — only its sign is read, negative = padding — and `state_rows`, int32
    /// `[T]`) the indexer row it writes, into `out` (int32 `[T]`): in the device pool's
    /// indexer blocks (through `indexer_table()`), or with `host=True` in the indexer host
    /// cache (through `host_table()`); -1 for a token that writes no indexer row (a compressed
    /// indexer writes one row per `R` tokens). The rows are `block * rows_per_page + row`, as
    /// the indexer backup addresses them. Raises for a layout without an indexer layer.
    #[pyo3(signature = (positions, slot_mapping, state_rows, out, *, host = false, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn compressed_slot_mapping(
        &self,
        py: Python<'_>,
        positions: &Bound<'_, PyAny>,
        slot_mapping: &Bound<'_, PyAny>,
        state_rows: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        host: bool,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        take_args!(stream);
        let mut state = self.lock()?;
        let on = state.on(py, stream)?;
        modes::compressed_slot_mapping(
            &mut state,
            [positions, slot_mapping, state_rows, out],
            host,
            on,
        )
    }

    /// A prepared per-layer call of index group `group`: the arrays are read, checked and lent
    /// to the device once, and each call of the returned object does only the runtime's work
    /// (`call()` or `call(num_tokens=t)` for the first `t` token rows). `swap` is
    /// `"index_group"` (every layer of the group, as `resolve_index_group`), `"leader"` (as
    /// `resolve_leader`) or `"prefill"` (as `remap_prefill`). `stream` fixes the stream of every
    /// call; by default each call enqueues on the caller's current stream. The arrays stay
    /// lent (and alive) while the object lives: a graph that captured the call reads and
    /// writes them at replay.
    #[pyo3(signature = (group, topk, rows, counts = None, *, state_rows = None, swap = "index_group", stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn layer_call(
        slf: &Bound<'_, Self>,
        group: Int<usize>,
        topk: &Bound<'_, PyAny>,
        rows: &Bound<'_, PyAny>,
        counts: Option<&Bound<'_, PyAny>>,
        state_rows: Option<&Bound<'_, PyAny>>,
        swap: &str,
        stream: Option<Int<u64>>,
    ) -> PyResult<LayerCall> {
        take_args!(group, stream);
        let op = Op::parse(swap)?;
        let arrays = {
            let state = slf.get().lock()?;
            let groups = state.rt.layout().index_groups.len();
            if group >= groups {
                return Err(invalid(format!(
                    "group = {group}, but the layout has {groups} index groups; pass 0 to {}",
                    groups.saturating_sub(1)
                )));
            }
            LayerArrays::new(&state, topk, rows, counts, state_rows)?
        };
        Ok(LayerCall::new(
            slf.clone().unbind(),
            group,
            op,
            stream,
            arrays,
        ))
    }

    /// Swaps in follower layer `layer` with its leader's plan of this step, on `stream` (that
    /// of the leader's call; default: the caller's current stream).
    #[pyo3(signature = (layer, *, stream = None))]
    fn apply_plan(
        &self,
        py: Python<'_>,
        layer: Int<u32>,
        stream: Option<Int<u64>>,
    ) -> PyResult<()> {
        take_args!(layer, stream);
        let mut state = self.lock()?;
        let on = state.on(py, stream)?;
        state.rt.apply_plan_on(layer, on).map_err(to_py)
    }

    /// After the forward pass: row mirrors and spills on the copy stream, after an event
    /// recorded on `stream` (default: the caller's current stream). Before-replay work:
    /// refused while `stream` is being captured.
    #[pyo3(signature = (cmd, *, stream = None))]
    fn end_step(&self, py: Python<'_>, cmd: &Command, stream: Option<Int<u64>>) -> PyResult<()> {
        take_args!(stream);
        let mut state = self.lock()?;
        state.check_command(cmd)?;
        let on = state.on(py, stream)?;
        state.rt.end_step_on(&cmd.inner, on).map_err(to_py)
    }

    /// Transfer batches enqueued and completed since the last poll, without blocking:
    /// `{"worker", "enqueued", "completed"}` (the arguments of `Coordinator.report`).
    fn poll(&self) -> PyResult<WorkerReport> {
        let mut state = self.lock()?;
        let r = state.rt.poll().map_err(to_py)?;
        Ok(state.report(r))
    }

    /// `poll()`, then hands the result to `coordinator` as this runtime's worker report.
    fn poll_and_report(&self, coordinator: &Bound<'_, Coordinator>) -> PyResult<WorkerReport> {
        let mut c = coordinator
            .try_borrow_mut()
            .map_err(|_| concurrent_use("Coordinator"))?;
        let mut state = self.lock()?;
        if c.fingerprint != state.fingerprint {
            return Err(layout_mismatch(
                "this runtime's report",
                state.fingerprint,
                c.fingerprint,
            ));
        }
        let r = state
            .rt
            .poll_and_report(&mut c.inner)
            .map_err(|e| match e {
                ReportError::Runtime(e) => to_py(e),
                ReportError::Coordinator(e) => to_py(e),
            })?;
        Ok(state.report(r))
    }

    /// Blocks until every transfer and counter copy in flight completed, then polls.
    fn drain(&self, py: Python<'_>) -> PyResult<WorkerReport> {
        let (r, fingerprint) = py
            .detach(|| {
                let mut state = self.lock_detached()?;
                Ok((state.rt.drain(), state.fingerprint))
            })
            .map_err(Detached::into_py)?;
        Ok(WorkerReport::new(r.map_err(to_py)?, Some(fingerprint)))
    }

    /// Blocks until the work enqueued on `stream` (default: the caller's current stream; the
    /// runtime's compute stream when there is none) is done.
    #[pyo3(signature = (*, stream = None))]
    fn synchronize(&self, py: Python<'_>, stream: Option<Int<u64>>) -> PyResult<()> {
        take_args!(stream);
        let on = self.lock()?.on(py, stream)?;
        // Errors leave the closure as (kind, message): Python exceptions need the GIL.
        let failed = |e: &dyn hisparse_core::Error| (e.kind(), e.to_string());
        py.detach(|| {
            let state = self.lock_detached()?;
            Ok(match state.rt.stream(on) {
                Ok(s) => state.rt.device().synchronize(s).map_err(|e| failed(&e)),
                Err(e) => Err(failed(&e)),
            })
        })
        .map_err(Detached::into_py)?
        .map_err(|(kind, message)| crate::errors::error(kind, message))
    }

    /// Totals since the runtime was built (hits, misses, bytes each way, …, `hit_rate`).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        reports::counters_dict(py, self.lock()?.rt.counters())
    }

    /// Transfer batches enqueued and not yet seen complete.
    #[getter]
    fn pending_transfers(&self) -> PyResult<usize> {
        Ok(self.lock()?.rt.pending_transfers())
    }

    /// The resident table row of `state_row` in `bucket` as the device holds it once this
    /// step's updates are enqueued: page → GPU block, 0 for pages read from host. A debugging
    /// aid: the device table itself is `resident_table(bucket)`.
    fn resident_row(&self, bucket: Int<u32>, state_row: Int<u32>) -> PyResult<Vec<i32>> {
        take_args!(bucket, state_row);
        let state = self.lock()?;
        state
            .rt
            .resident_row(bucket, state_row)
            .map(<[i32]>::to_vec)
            .ok_or_else(|| {
                invalid(format!(
                    "bucket {bucket} or state row {state_row} is outside the runtime ({} buckets, {} state rows)",
                    state.rt.layout().num_buckets,
                    state.rt.config().state_rows
                ))
            })
    }

    /// The host table row of `state_row`: page → host block, -1 for none.
    fn host_row(&self, state_row: Int<u32>) -> PyResult<Vec<i32>> {
        take_args!(state_row);
        let state = self.lock()?;
        state
            .rt
            .host_row(state_row)
            .map(<[i32]>::to_vec)
            .ok_or_else(|| {
                invalid(format!(
                    "state row {state_row} is outside the runtime's {} rows",
                    state.rt.config().state_rows
                ))
            })
    }

    /// The device resident table of `bucket`: int32 `[state_rows, max_pages_per_request]`,
    /// page → GPU block, 0 for pages read from host (see `DeviceArray`).
    fn resident_table(slf: &Bound<'_, Self>, bucket: Int<u32>) -> PyResult<DeviceArray> {
        take_args!(bucket);
        tables::resident(slf, bucket)
    }

    /// The device hot table of `bucket`: int32 `[state_rows, hot_blocks_per_request]`, each
    /// request's hot blocks, -1 for none.
    fn hot_table(slf: &Bound<'_, Self>, bucket: Int<u32>) -> PyResult<DeviceArray> {
        take_args!(bucket);
        tables::hot(slf, bucket)
    }

    /// The device host table: int32 `[state_rows, max_pages_per_request]`, page → host block,
    /// -1 for none.
    fn host_table(slf: &Bound<'_, Self>) -> PyResult<DeviceArray> {
        tables::host(slf)
    }

    /// The device block table of the indexer group: int32 `[state_rows,
    /// max_pages_per_request]`, page → GPU block, 0 for none.
    fn indexer_table(slf: &Bound<'_, Self>) -> PyResult<DeviceArray> {
        tables::indexer(slf)
    }

    /// The device block table of regular layout group `group`: int32 `[state_rows, width]`
    /// (a column per block of the group's own size), 0 for none.
    fn regular_table(slf: &Bound<'_, Self>, group: Int<usize>) -> PyResult<DeviceArray> {
        take_args!(group);
        tables::regular(slf, group)
    }

    /// The device slot mapping of the open step: int32 `[write groups, max_batched_tokens]`.
    /// For each write group (`slot_mapping_groups`: every resident bucket, the indexer group,
    /// every regular group) and each token the step computes — the command's scheduled requests
    /// in order, each request's tokens in order — the row the token writes in the view of each
    /// of the group's layers (`Layout.gpu_views()`), -1 for a token that writes no row of the
    /// group and beyond the step's `step_tokens`. Rewritten by every `begin_step`, in stream
    /// order; its address is fixed. The forward pass writes its KV through it with one
    /// `index_copy_` per layer (numpy: `view[slots[valid]] = rows[valid]`).
    fn slot_mapping(slf: &Bound<'_, Self>) -> PyResult<DeviceArray> {
        tables::slot_mapping(slf)
    }

    /// The layout group of each row of `slot_mapping()`.
    fn slot_mapping_groups(&self) -> PyResult<Vec<usize>> {
        Ok(self.lock()?.rt.slot_mapping_groups())
    }

    /// Tokens the open (or last) step computes: the valid prefix of each slot-mapping row.
    #[getter]
    fn step_tokens(&self) -> PyResult<u32> {
        Ok(self.lock()?.rt.step_tokens())
    }

    /// The device batch table `set_batch` writes: int32 `[max_step_tokens]`, token row → state
    /// row, -1 for padding. Per-layer calls without their own `state_rows` read it; its address
    /// is fixed (graphs capture it).
    fn batch_buffer(slf: &Bound<'_, Self>) -> PyResult<DeviceArray> {
        tables::batch(slf)
    }

    /// Token-row counts of the per-layer calls captured into graphs so far (what `set_batch`'s
    /// `pad_to` may name).
    #[getter]
    fn captured_token_rows(&self) -> PyResult<Vec<u32>> {
        Ok(self.lock()?.rt.captured_token_rows().to_vec())
    }

    /// Tokens one step may compute (the slot mapping's width).
    #[getter]
    fn max_batched_tokens(&self) -> PyResult<u32> {
        Ok(self.lock()?.rt.config().max_batched_tokens)
    }

    /// Writes `data` into the device pool at byte `offset` (synchronously): how an engine
    /// without a lent pool writes its forward pass's KV rows.
    fn write_device_pool(&self, offset: Int<usize>, data: &[u8]) -> PyResult<()> {
        take_args!(offset);
        let mut state = self.lock()?;
        let (dev, pools) = state.rt.device_and_pools_mut();
        check_range("device pool", offset, data.len(), pools.device.byte_len())?;
        dev.upload(&mut pools.device, offset, data).map_err(to_py)
    }

    /// `nbytes` of the device pool from byte `offset` (synchronously). A range outside the pool
    /// is refused before anything is allocated.
    fn read_device_pool<'py>(
        &self,
        py: Python<'py>,
        offset: Int<usize>,
        nbytes: Int<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        take_args!(offset, nbytes);
        let state = self.lock()?;
        let pool = &state.rt.pools().device;
        check_range("device pool", offset, nbytes, pool.byte_len())?;
        PyBytes::new_with(py, nbytes, |out| {
            state.rt.device().download(pool, offset, out).map_err(to_py)
        })
    }

    /// `nbytes` of the host pool from byte `offset` (synchronously; call `drain()` first for
    /// rows still being copied). A range outside the pool is refused before anything is
    /// allocated.
    fn read_host_pool<'py>(
        &self,
        py: Python<'py>,
        offset: Int<usize>,
        nbytes: Int<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        take_args!(offset, nbytes);
        let state = self.lock()?;
        let pool = &state.rt.pools().host;
        check_range("host pool", offset, nbytes, pool.byte_len())?;
        PyBytes::new_with(py, nbytes, |out| {
            state
                .rt
                .device()
                .read_pinned(pool, offset, out)
                .map_err(to_py)
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        let state = self.lock()?;
        let rt = &state.rt;
        Ok(format!(
            "Runtime(backend={:?}, device={:?}, state_rows={}, max_step_tokens={}, lent_pools={})",
            rt.device().backend(),
            rt.device().device_name(),
            rt.config().state_rows,
            rt.config().max_step_tokens,
            state.lent.len()
        ))
    }
}

/// Why a call that let go of the GIL could not take the runtime's lock (turned into a Python
/// exception once the GIL is back).
enum Detached {
    Busy,
    Poisoned,
}

impl Detached {
    fn into_py(self) -> PyErr {
        match self {
            Detached::Busy => concurrent_use("Runtime"),
            Detached::Poisoned => poisoned("Runtime"),
        }
    }
}

/// The arguments of a one-shot per-layer call: group, topk, rows, counts, num_tokens,
/// state_rows, stream.
type OneShot<'a, 'py> = (
    Int<usize>,
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
    Option<Int<u32>>,
    Option<&'a Bound<'py, PyAny>>,
    Option<Int<u64>>,
);

impl Runtime {
    /// `resolve_index_group`, `resolve_leader`, `remap_prefill`: the arrays lent for this call
    /// only.
    fn one_shot(&self, py: Python<'_>, call: OneShot<'_, '_>, op: Op) -> PyResult<()> {
        let (group, topk, rows, counts, num_tokens, state_rows, stream) = call;
        take_args!(group, num_tokens, stream);
        let mut state = self.lock()?;
        let on = state.on(py, stream)?;
        let mut arrays = LayerArrays::new(&state, topk, rows, counts, state_rows)?;
        arrays.run(&mut state.rt, group, op, num_tokens, on)
    }

    /// [`Runtime::lock`] for code running without the GIL (no Python exception made there).
    fn lock_detached(&self) -> Result<MutexGuard<'_, State>, Detached> {
        match self.state.try_lock() {
            Ok(state) => Ok(state),
            Err(TryLockError::WouldBlock) => Err(Detached::Busy),
            Err(TryLockError::Poisoned(_)) => Err(Detached::Poisoned),
        }
    }
}
