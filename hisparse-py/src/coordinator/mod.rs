//! The coordinator (`Coordinator`), its per-step command (`Command`) and the outcome of giving a
//! request the blocks of a step (`Alloc`).
//!
//! Two ways to drive it: the built-in policy (`step()`: running requests first, then waiting
//! ones, FCFS within `max_batched_tokens`, preempting the newest when memory runs out), or the
//! engine's own scheduler, which decides each step's batch itself with `start`, `schedule`,
//! `rollback`, `preempt` and `finish`, and ends the step with `build_offload_command()`.
//!
//! Calls hold the GIL for their (short) length, so a coordinator may be used from any thread.

mod admission;
mod command;

use hisparse_core::coordinator::{
    Alloc as CoreAlloc, Coordinator as Core, CoordinatorConfig, PageState, PoolKind, RequestId,
};
use hisparse_core::wire::LayoutFingerprint;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub use admission::Admission;
pub use command::{_command_from_pickle, Command};

use crate::args::{Int, IntList, take_args};
use crate::errors::{invalid, to_py};
use crate::layout::Layout;
use crate::report::WorkerReport;
use crate::wire::layout_mismatch;

/// The scheduler side of HiSparse for one model instance: admits requests, plans each step
/// (`step()` → `Command`, or the engine's own `start`/`schedule` calls, then
/// `build_offload_command()`), takes the workers' transfer reports.
#[pyclass(module = "hisparse", name = "Coordinator")]
pub struct Coordinator {
    pub(crate) inner: Core,
    /// Its layout's fingerprint (its commands carry it; reports must match it).
    pub(crate) fingerprint: LayoutFingerprint,
}

/// What giving a request the blocks of this step came to (`Coordinator.start`,
/// `Coordinator.schedule`): `"scheduled"` (the tokens are part of this step), `"wait"` (memory
/// is short but reclamation or a release is in flight: try again next step rather than
/// preempt) or `"no_space"` (memory is short and nothing is in flight: preempt someone or wait
/// for a finish; `pool` says which pool, `"gpu"` or `"host"`). True only when scheduled.
#[pyclass(module = "hisparse", frozen, name = "Alloc")]
#[derive(Clone, Copy)]
pub struct Alloc {
    inner: CoreAlloc,
}

fn pool_name(p: PoolKind) -> &'static str {
    match p {
        PoolKind::Gpu => "gpu",
        PoolKind::Host => "host",
    }
}

/// `"scheduled"`, `"wait"` or `"no_space"`.
fn outcome_name(a: CoreAlloc) -> &'static str {
    match a {
        CoreAlloc::Scheduled => "scheduled",
        CoreAlloc::Wait => "wait",
        CoreAlloc::NoSpace(_) => "no_space",
    }
}

/// The pool an outcome found short, if any.
fn short_pool(a: CoreAlloc) -> Option<&'static str> {
    match a {
        CoreAlloc::NoSpace(p) => Some(pool_name(p)),
        _ => None,
    }
}

#[pymethods]
impl Alloc {
    /// `"scheduled"`, `"wait"` or `"no_space"`.
    #[getter]
    fn outcome(&self) -> &'static str {
        outcome_name(self.inner)
    }

    /// The pool that is short (`"gpu"` or `"host"`) for `"no_space"`, else `None`.
    #[getter]
    fn pool(&self) -> Option<&'static str> {
        short_pool(self.inner)
    }

    /// Whether the tokens were scheduled.
    #[getter]
    fn scheduled(&self) -> bool {
        self.inner == CoreAlloc::Scheduled
    }

    fn __bool__(&self) -> bool {
        self.scheduled()
    }

    fn __repr__(&self) -> String {
        match self.pool() {
            Some(p) => format!("Alloc({:?}, pool={p:?})", self.outcome()),
            None => format!("Alloc({:?})", self.outcome()),
        }
    }
}

fn page_state_name(s: PageState) -> &'static str {
    match s {
        PageState::Dirty => "dirty",
        PageState::Pending => "pending",
        PageState::PendingRelease => "pending_release",
        PageState::Clean => "clean",
        PageState::Unpinned => "unpinned",
        PageState::Reclaimed => "reclaimed",
    }
}

#[pymethods]
impl Coordinator {
    /// A coordinator with empty pools for `layout`. `max_running` is the number of state rows
    /// (slots); give the runtime the same `state_rows`.
    #[new]
    #[pyo3(signature = (
        layout,
        *,
        max_running = Int::new(256),
        max_batched_tokens = Int::new(512),
        max_spill_pages_per_step = Int::new(64),
        num_workers = Int::new(1),
        enable_prefix_caching = true,
        reclaim_min_blocks = Int::new(64),
    ),
    // The defaults as Python shows them (`Int` defaults have no literal form for PyO3 to print).
    text_signature = "(layout, *, max_running=256, max_batched_tokens=512, max_spill_pages_per_step=64, num_workers=1, enable_prefix_caching=True, reclaim_min_blocks=64)"
    )]
    fn new(
        layout: &Layout,
        max_running: Int<u32>,
        max_batched_tokens: Int<u32>,
        max_spill_pages_per_step: Int<u32>,
        num_workers: Int<u32>,
        enable_prefix_caching: bool,
        reclaim_min_blocks: Int<u32>,
    ) -> PyResult<Self> {
        take_args!(
            max_running,
            max_batched_tokens,
            max_spill_pages_per_step,
            num_workers,
            reclaim_min_blocks
        );
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
            fingerprint: layout.fingerprint,
        })
    }

    /// Queues request `id` with its prompt tokens (started by a later `step()` or `start`).
    fn admit(&mut self, id: Int<RequestId>, prompt: IntList<u32>) -> PyResult<()> {
        take_args!(id, prompt);
        self.inner.admit(id, &prompt).map_err(to_py)
    }

    /// Appends tokens (the sampled ones) to running request `id`.
    fn append_tokens(&mut self, id: Int<RequestId>, tokens: IntList<u32>) -> PyResult<()> {
        take_args!(id, tokens);
        self.inner.append_tokens(id, &tokens).map_err(to_py)
    }

    /// Appends one token to the request in state row `slot` (the engine's hot path when it
    /// keys requests by slot); returns the request's id.
    fn append_token_by_slot(&mut self, slot: Int<u32>, token: Int<u32>) -> PyResult<RequestId> {
        take_args!(slot, token);
        self.inner.append_token_by_slot(slot, token).map_err(to_py)
    }

    /// Plans the next step with the built-in policy and returns its command.
    fn step(&mut self) -> PyResult<Command> {
        Ok(Command::new(
            self.inner.step().map_err(to_py)?,
            self.fingerprint,
        ))
    }

    /// Runs the built-in policy for one step without ending it (an engine may add its own
    /// `start`/`schedule` calls); `build_offload_command()` ends the step. Returns what it did:
    /// `{"scheduled", "tokens", "preempted", "waiting_on_reclaim", "started"}`.
    fn schedule_step<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.schedule_step().map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("scheduled", s.scheduled)?;
        d.set_item("tokens", s.tokens)?;
        d.set_item("preempted", s.preempted)?;
        d.set_item("waiting_on_reclaim", s.waiting_on_reclaim)?;
        d.set_item("started", s.started)?;
        d.set_item("refused", s.refused)?;
        Ok(d)
    }

    /// Starts waiting request `id` (prefix-cache lookup, host blocks for its whole prompt) and
    /// schedules its first chunk of at most `max_tokens` tokens in this step — fewer when the
    /// free GPU pool holds less. Everything it needs is accounted for before anything is
    /// taken: an `Alloc` that is not `"scheduled"` changed nothing.
    fn start(&mut self, id: Int<RequestId>, max_tokens: Int<u32>) -> PyResult<Alloc> {
        take_args!(id, max_tokens);
        let inner = self.inner.start(id, max_tokens).map_err(to_py)?;
        Ok(Alloc { inner })
    }

    /// What `start(id, max_tokens)` would answer now — the same error, or an `Admission`:
    /// outcome, first chunk, whether it would reclaim first — without changing anything.
    fn can_start(&self, id: Int<RequestId>, max_tokens: Int<u32>) -> PyResult<Admission> {
        take_args!(id, max_tokens);
        let inner = self.inner.can_start(id, max_tokens).map_err(to_py)?;
        Ok(Admission { inner })
    }

    /// What `schedule(id, num_tokens)` would answer now — the same error, or an `Admission` —
    /// without changing anything.
    fn can_schedule(&self, id: Int<RequestId>, num_tokens: Int<u32>) -> PyResult<Admission> {
        take_args!(id, num_tokens);
        let inner = self.inner.can_schedule(id, num_tokens).map_err(to_py)?;
        Ok(Admission { inner })
    }

    /// What each tier has free now: `{"gpu_blocks", "gpu_capacity", "gpu_cached",
    /// "host_blocks", "host_capacity", "host_cached", "hot_region_blocks", "hot_regions_free",
    /// "hot_regions_held", "rows"}` (free blocks count unpinned and prefix-cached ones; `rows`:
    /// state rows free).
    fn free<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        admission::free_dict(py, &self.inner.free())
    }

    /// What request `id` needs for its next `num_tokens` tokens (a start's first chunk for a
    /// waiting one) and for its whole context: `{"tokens", "gpu_blocks",
    /// "hot_region_blocks", "host_blocks", "context_tokens", "context_gpu_blocks",
    /// "context_prefill_gpu_blocks", "context_host_blocks"}`.
    fn needs<'py>(
        &self,
        py: Python<'py>,
        id: Int<RequestId>,
        num_tokens: Int<u32>,
    ) -> PyResult<Bound<'py, PyDict>> {
        take_args!(id, num_tokens);
        let needs = self.inner.needs(id, num_tokens).map_err(to_py)?;
        admission::needs_dict(py, &needs)
    }

    /// Why request `id` was refused while a step was scheduled (`Command.refused`):
    /// `{"reason", "message", ...}`, or `None` when it was not. A refused request holds no
    /// block and runs no more: fail it and `finish` it.
    fn refusal<'py>(
        &self,
        py: Python<'py>,
        id: Int<RequestId>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        take_args!(id);
        self.inner
            .refusal(id)
            .map(|r| admission::refusal_dict(py, &r))
            .transpose()
    }

    /// Schedules `num_tokens` more tokens of running request `id` in this step (all or none),
    /// reclaiming resident pages when the GPU pool is short.
    fn schedule(&mut self, id: Int<RequestId>, num_tokens: Int<u32>) -> PyResult<Alloc> {
        take_args!(id, num_tokens);
        let inner = self.inner.schedule(id, num_tokens).map_err(to_py)?;
        Ok(Alloc { inner })
    }

    /// Ends the current step (the built-in policy's or the engine's own `start`/`schedule`
    /// calls) and returns its command.
    fn build_offload_command(&mut self) -> Command {
        Command::new(self.inner.build_offload_command(), self.fingerprint)
    }

    /// Removes the last `num_tokens` tokens of running request `id`: speculative tokens the
    /// verifier rejected (at most `max_query_len - 1` computed ones, all of its last step), and
    /// any appended but not yet computed.
    fn rollback(&mut self, id: Int<RequestId>, num_tokens: Int<u32>) -> PyResult<()> {
        take_args!(id, num_tokens);
        self.inner.rollback(id, num_tokens).map_err(to_py)
    }

    /// Unpins the resident pages of at least `shortfall` GPU blocks ahead of need (clean pages
    /// of requests that hold or can be given hot regions); returns the blocks freed.
    fn reclaim_resident_blocks(&mut self, shortfall: Int<u32>) -> PyResult<u32> {
        take_args!(shortfall);
        Ok(self.inner.reclaim_resident_blocks(shortfall))
    }

    /// Admits request `id` whose KV for its first `imported` tokens (of `tokens`: the prompt
    /// and any tokens sampled so far) another party writes into the host pool; returns the
    /// host block of every page of those tokens, in page order. `complete_import(id)` once
    /// they are written.
    fn reserve_import(
        &mut self,
        id: Int<RequestId>,
        tokens: IntList<u32>,
        imported: Int<u32>,
    ) -> PyResult<Vec<u32>> {
        take_args!(id, tokens, imported);
        self.inner
            .reserve_import(id, &tokens, imported)
            .map_err(to_py)
    }

    /// The host blocks `reserve_import` named for `id` while its import is not complete, else
    /// `None`.
    fn import_blocks(&self, id: Int<RequestId>) -> PyResult<Option<Vec<u32>>> {
        take_args!(id);
        Ok(self.inner.import_blocks(id).map(<[u32]>::to_vec))
    }

    /// Every page `reserve_import` named for `id` is written: the request is queued.
    fn complete_import(&mut self, id: Int<RequestId>) -> PyResult<()> {
        take_args!(id);
        self.inner.complete_import(id).map_err(to_py)
    }

    /// Records a worker's progress: a `WorkerReport` (what `Runtime.poll()` returns), or
    /// `report(worker, enqueued, completed)` — the transfer ids it enqueued and completed, each
    /// in FIFO order.
    #[pyo3(signature = (worker, enqueued = None, completed = None))]
    fn report(
        &mut self,
        worker: &Bound<'_, PyAny>,
        enqueued: Option<IntList<u64>>,
        completed: Option<IntList<u64>>,
    ) -> PyResult<()> {
        if let Ok(r) = worker.cast::<WorkerReport>() {
            if enqueued.is_some() || completed.is_some() {
                return Err(invalid(
                    "pass a WorkerReport alone, or worker, enqueued and completed",
                ));
            }
            let r = r.get();
            if let Some(fp) = r.fingerprint
                && fp != self.fingerprint
            {
                return Err(layout_mismatch("this WorkerReport", fp, self.fingerprint));
            }
            let r = &r.inner;
            return self
                .inner
                .report(r.worker, &r.enqueued, &r.completed)
                .map_err(to_py);
        }
        let worker: Int<u32> = worker.extract()?;
        let (Some(enqueued), Some(completed)) = (enqueued, completed) else {
            return Err(invalid(
                "pass a WorkerReport, or worker, enqueued and completed",
            ));
        };
        take_args!(worker, enqueued, completed);
        self.inner
            .report(worker, &enqueued, &completed)
            .map_err(to_py)
    }

    /// Ends (or aborts) request `id`, waiting or running, and frees its blocks.
    fn finish(&mut self, id: Int<RequestId>) -> PyResult<()> {
        take_args!(id);
        self.inner.finish(id).map_err(to_py)
    }

    /// Preempts running request `id`: its blocks go back, it waits at the front of the queue,
    /// and its tokens are recomputed when it starts again.
    fn preempt(&mut self, id: Int<RequestId>) -> PyResult<()> {
        take_args!(id);
        self.inner.preempt(id).map_err(to_py)
    }

    /// Tokens of request `id` (prompt and appended), or `None` for an unknown request.
    fn num_tokens(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.num_tokens(id))
    }

    /// Tokens of request `id` computed so far (scheduled ones included), or `None` for an
    /// unknown request.
    fn num_computed(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.num_computed(id))
    }

    /// The state row of running request `id`, or `None`.
    fn slot_of(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.slot_of(id))
    }

    /// Pages of request `id` whose host copies are durable, from its first (its durable
    /// prefix), or `None`.
    fn ready_prefix_pages(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.ready_prefix_pages(id))
    }

    /// Lifecycle state of page `page` of request `id`: `"dirty"`, `"pending"`,
    /// `"pending_release"`, `"clean"`, `"unpinned"` or `"reclaimed"`; `None` for an unknown
    /// request or page.
    fn page_state(&self, id: Int<RequestId>, page: Int<u32>) -> PyResult<Option<&'static str>> {
        take_args!(id, page);
        Ok(self.inner.page_state(id, page).map(page_state_name))
    }

    /// Whether request `id` holds a hot region, or `None`.
    fn has_hot_region(&self, id: Int<RequestId>) -> PyResult<Option<bool>> {
        take_args!(id);
        Ok(self.inner.has_hot_region(id))
    }

    /// Pages of request `id` read from host (resident entry null), or `None`.
    fn host_only_pages(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.host_only_pages(id))
    }

    /// The token at which request `id`'s prefill ends (its decode starts), or `None`.
    fn prefill_end(&self, id: Int<RequestId>) -> PyResult<Option<u32>> {
        take_args!(id);
        Ok(self.inner.prefill_end(id))
    }

    /// The newest transfer id every worker has completed.
    #[getter]
    fn durable_transfer(&self) -> u64 {
        self.inner.durable_transfer()
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

    /// Block-pool occupancy: `{"gpu_used", "gpu_free", "gpu_total", "host_used", "host_free",
    /// "host_total"}` (null blocks excluded). Both `*_used` are 0 once every request finished
    /// and the workers reported their transfers complete.
    fn pool_usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let u = hisparse_runtime::PoolUsage::of(&self.inner);
        let d = PyDict::new(py);
        d.set_item("gpu_used", u.gpu_used)?;
        d.set_item("gpu_free", u.gpu_total - u.gpu_used)?;
        d.set_item("gpu_total", u.gpu_total)?;
        d.set_item("host_used", u.host_used)?;
        d.set_item("host_free", u.host_total - u.host_used)?;
        d.set_item("host_total", u.host_total)?;
        Ok(d)
    }

    /// Request `id`'s resident table of `bucket`: page → GPU block, 0 for pages read from host.
    fn resident_row(&self, id: Int<RequestId>, bucket: Int<u32>) -> PyResult<Vec<i32>> {
        take_args!(id, bucket);
        let mut out = vec![0; self.inner.max_pages() as usize];
        self.inner
            .resident_row(id, bucket, &mut out)
            .map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s host table: page → host block, -1 beyond the request.
    fn host_row(&self, id: Int<RequestId>) -> PyResult<Vec<i32>> {
        take_args!(id);
        let mut out = vec![0; self.inner.max_pages() as usize];
        self.inner.host_row(id, &mut out).map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s hot region of `bucket`: its GPU blocks, or -1s when it has none.
    fn hot_row(&self, id: Int<RequestId>, bucket: Int<u32>) -> PyResult<Vec<i32>> {
        take_args!(id, bucket);
        let mut out = vec![0; self.inner.layout().hot_blocks_per_request as usize];
        self.inner.hot_row(id, bucket, &mut out).map_err(to_py)?;
        Ok(out)
    }

    /// Request `id`'s block table of layout group `group` (indexer, resident or regular).
    fn block_table_row(&self, id: Int<RequestId>, group: Int<usize>) -> PyResult<Vec<i32>> {
        take_args!(id, group);
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
            .map_err(|v| invalid(format!("coordinator: {v}")))
    }

    /// Checks that the coordinator is back to empty once every request finished and every
    /// worker reported every transfer complete: no request, no transfer or release in flight,
    /// no GPU or host block held (prefix-cached free blocks count as empty), every invariant.
    /// Raises `InvalidArgumentError` naming the first thing left.
    fn check_drained(&self) -> PyResult<()> {
        self.inner
            .check_drained()
            .map_err(|v| invalid(format!("coordinator not drained: {v}")))
    }
}
