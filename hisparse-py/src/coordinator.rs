//! The coordinator (`Coordinator`) and its per-step command (`Command`).

use hisparse_core::coordinator::{
    Coordinator as Core, CoordinatorConfig, OffloadCommand, RequestId,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{invalid, to_py};
use crate::layout::Layout;

/// The scheduler side of HiSparse for one model instance: admits requests, plans each step
/// (`step()` → `Command`), takes the workers' transfer reports.
#[pyclass(module = "hisparse", name = "Coordinator")]
pub struct Coordinator {
    pub(crate) inner: Core,
}

/// One step's command: plain data the runtime executes (`Runtime.begin_step`/`end_step`).
/// `to_dict()` gives every field; the most used ones are attributes.
#[pyclass(module = "hisparse", frozen, name = "Command")]
pub struct Command {
    pub(crate) inner: OffloadCommand,
}

#[pymethods]
impl Coordinator {
    /// A coordinator with empty pools for `layout`. `max_running` is the number of state rows
    /// (slots); give the runtime the same `state_rows`.
    #[new]
    #[pyo3(signature = (
        layout,
        *,
        max_running = 256,
        max_batched_tokens = 512,
        max_spill_pages_per_step = 64,
        num_workers = 1,
        enable_prefix_caching = true,
        reclaim_min_blocks = 64,
    ))]
    fn new(
        layout: &Layout,
        max_running: u32,
        max_batched_tokens: u32,
        max_spill_pages_per_step: u32,
        num_workers: u32,
        enable_prefix_caching: bool,
        reclaim_min_blocks: u32,
    ) -> PyResult<Self> {
        let cfg = CoordinatorConfig {
            max_running,
            max_batched_tokens,
            max_spill_pages_per_step,
            num_workers,
            enable_prefix_caching,
            reclaim_min_blocks,
        };
        Ok(Coordinator {
            inner: Core::new(layout.kv.clone(), cfg).map_err(to_py)?,
        })
    }

    /// Queues request `id` with its prompt tokens (started by a later `step()`).
    fn admit(&mut self, id: RequestId, prompt: Vec<u32>) -> PyResult<()> {
        self.inner.admit(id, &prompt).map_err(to_py)
    }

    /// Appends tokens (the sampled ones) to running request `id`.
    fn append_tokens(&mut self, id: RequestId, tokens: Vec<u32>) -> PyResult<()> {
        self.inner.append_tokens(id, &tokens).map_err(to_py)
    }

    /// Plans the next step and returns its command.
    fn step(&mut self) -> PyResult<Command> {
        Ok(Command {
            inner: self.inner.step().map_err(to_py)?,
        })
    }

    /// Records worker `worker`'s progress: transfer ids it enqueued and completed, each in FIFO
    /// order (what `Runtime.poll()` returns).
    #[pyo3(signature = (worker, enqueued, completed))]
    fn report(&mut self, worker: u32, enqueued: Vec<u64>, completed: Vec<u64>) -> PyResult<()> {
        self.inner
            .report(worker, &enqueued, &completed)
            .map_err(to_py)
    }

    /// Ends request `id` and frees its blocks.
    fn finish(&mut self, id: RequestId) -> PyResult<()> {
        self.inner.finish(id).map_err(to_py)
    }

    /// Preempts running request `id` (its tokens will be recomputed).
    fn preempt(&mut self, id: RequestId) -> PyResult<()> {
        self.inner.preempt(id).map_err(to_py)
    }

    /// Tokens of request `id` (prompt and appended), or `None` for an unknown request.
    fn num_tokens(&self, id: RequestId) -> Option<u32> {
        self.inner.num_tokens(id)
    }

    /// Tokens of request `id` computed so far, or `None` for an unknown request.
    fn num_computed(&self, id: RequestId) -> Option<u32> {
        self.inner.num_computed(id)
    }

    /// The state row of running request `id`, or `None`.
    fn slot_of(&self, id: RequestId) -> Option<u32> {
        self.inner.slot_of(id)
    }

    /// Whether no request is waiting or running.
    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Requests waiting to start.
    #[getter]
    fn num_waiting(&self) -> usize {
        self.inner.num_waiting()
    }

    /// Requests running.
    #[getter]
    fn num_running(&self) -> usize {
        self.inner.num_running()
    }

    /// Ids of the running requests.
    fn running_ids(&self) -> Vec<RequestId> {
        self.inner.running_ids().collect()
    }

    /// Block-pool occupancy: `{"gpu_used", "gpu_total", "host_used", "host_total"}` (null blocks
    /// excluded).
    fn pool_usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = hisparse_runtime::PoolUsage::of(&self.inner);
        let d = PyDict::new(py);
        d.set_item("gpu_used", u.gpu_used)?;
        d.set_item("gpu_total", u.gpu_total)?;
        d.set_item("host_used", u.host_used)?;
        d.set_item("host_total", u.host_total)?;
        Ok(d)
    }

    /// Request `id`'s resident table of `bucket`: page → GPU block, 0 for pages read from host.
    fn resident_row(&self, id: RequestId, bucket: u32) -> PyResult<Vec<i32>> {
        let mut out = vec![0; self.inner.max_pages() as usize];
        self.inner
            .resident_row(id, bucket, &mut out)
            .map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s host table: page → host block, -1 beyond the request.
    fn host_row(&self, id: RequestId) -> PyResult<Vec<i32>> {
        let mut out = vec![0; self.inner.max_pages() as usize];
        self.inner.host_row(id, &mut out).map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s hot region of `bucket`: its GPU blocks, or -1s when it has none.
    fn hot_row(&self, id: RequestId, bucket: u32) -> PyResult<Vec<i32>> {
        let mut out = vec![0; self.inner.layout().hot_blocks_per_request as usize];
        self.inner.hot_row(id, bucket, &mut out).map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s block table of layout group `group` (indexer, resident or regular).
    fn block_table_row(&self, id: RequestId, group: usize) -> PyResult<Vec<i32>> {
        if group >= self.inner.layout().groups.len() {
            return Err(invalid(format!(
                "group {group} is not part of the layout ({} groups)",
                self.inner.layout().groups.len()
            )));
        }
        let mut out = vec![0; self.inner.max_pages() as usize];
        self.inner
            .block_table_row(id, group, &mut out)
            .map_err(to_py)?;
        Ok(out)
    }

    /// Checks the coordinator's internal invariants (tests, debugging).
    fn check_invariants(&self) -> PyResult<()> {
        self.inner
            .check_invariants()
            .map_err(|v| invalid(format!("coordinator invariant violated: {v:?}")))
    }
}

#[pymethods]
impl Command {
    /// Step number (from 1).
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step
    }
    /// Id of the after-forward copy batch, if the step has one.
    #[getter]
    fn transfer_id(&self) -> Option<u64> {
        self.inner.transfer_id
    }
    /// Every scheduled request is fully resident (the remap path).
    #[getter]
    fn fully_resident(&self) -> bool {
        self.inner.fully_resident
    }
    /// Requests computed in this step: `{"id", "slot", "first_token", "num_tokens",
    /// "fully_resident"}` each.
    #[getter]
    fn scheduled<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .scheduled
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("id", s.id)?;
                d.set_item("slot", s.slot)?;
                d.set_item("first_token", s.first_token)?;
                d.set_item("num_tokens", s.num_tokens)?;
                d.set_item("fully_resident", s.fully_resident)?;
                Ok(d)
            })
            .collect()
    }
    /// State rows of the scheduled requests, in order (the batch of `Runtime.set_batch`).
    #[getter]
    fn slots(&self) -> Vec<i32> {
        self.inner.scheduled.iter().map(|s| s.slot as i32).collect()
    }
    /// Requests preempted in this step.
    #[getter]
    fn preempted(&self) -> Vec<RequestId> {
        self.inner.preempted.clone()
    }
    /// Every field, as `hisparse-core`'s `OffloadCommand` serialises.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = serde_json::to_string(&self.inner).map_err(|e| invalid(e.to_string()))?;
        py.import("json")?.call_method1("loads", (text,))
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Command(step={}, scheduled={}, fully_resident={}, transfer_id={:?}, residency={}, row_mirrors={}, page_transfers={})",
            c.step,
            c.scheduled.len(),
            c.fully_resident,
            c.transfer_id,
            c.residency.len(),
            c.row_mirrors.len(),
            c.page_transfers.len()
        )
    }
}
