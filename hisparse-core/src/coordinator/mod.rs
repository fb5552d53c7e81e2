//! The coordinator: managers for every KV-cache group, admission, the page lifecycle, reclaim,
//! spill and row-mirror planning, worker reports, prefix caching and the per-step
//! [`OffloadCommand`] (contract §4). Pure and deterministic: no I/O, no clocks.
//!
//! # Managers
//!
//! Per request the coordinator keeps one table per manager, all indexed by page (one page = one
//! block of `block_tokens` tokens):
//! * **source** (host pool): a host block for every page — the durable home of every sparse row;
//! * **indexer** and **regular** (GPU pool): ordinary paging; sliding-window groups give back
//!   blocks that fall out of the window;
//! * **resident** (GPU pool, one table per bucket): the GPU copy of each page, or the null block
//!   (`0`) once the page is reclaimed ("read from host");
//! * **hot** (GPU pool, one region per bucket): exactly `hot_blocks_per_request` blocks,
//!   allocated all at once when the request first needs to read from host.
//!
//! Each is a manager type (`SourceManager`, `PagedManager` for the indexer and regular groups,
//! `ResidentManager`, `HotManager`) that owns the rules of its table; the coordinator owns the
//! pools and the decisions that cross managers.
//!
//! # Module map
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Coordinator`] facade: its state, settings, queries, preemption, finish and the release of a request's blocks |
//! | `managers/` | `source.rs`, `paged.rs`, `resident.rs` (with [`PageState`]), `hot.rs`: one manager and its per-request table each |
//! | `request.rs` | the per-request record: tokens, progress, one table per manager |
//! | `admission.rs` | [`Coordinator::admit`], appending tokens, [`Coordinator::start`] (prefix hits, copy-on-write tail, accounting for every tier) |
//! | `schedule.rs` | [`Coordinator::schedule`] and the built-in step policy [`Coordinator::schedule_step`] |
//! | `queries.rs` | admission queries for engines with their own scheduler: [`Coordinator::can_start`], [`Coordinator::can_schedule`], [`Coordinator::free`], [`Coordinator::needs`] |
//! | `staging.rs` | prefill over host-only context: a prefill chunk's context staged on the GPU, the budget rule, dropping cached GPU copies |
//! | `reclaim.rs` | [`Coordinator::reclaim_resident_blocks`] (each pass planned without side effects, then carried out), the low watermark, reused unpinned pages falling back, wait-instead-of-preempt |
//! | `rollback.rs` | [`Coordinator::rollback`]: rejected speculative tokens given back |
//! | `import.rs` | imported requests: [`Coordinator::reserve_import`], [`Coordinator::complete_import`], their start |
//! | `indexer.rs` | indexer keys as durable as the KV rows: backups beside the mirrors and spills, restores of imported keys |
//! | `transfers.rs` | row mirrors and spills under transfer ids, [`Coordinator::report`] and the [`WorkerReport`] it takes, durability |
//! | `command.rs` | [`OffloadCommand`] and the types it carries; [`Coordinator::build_offload_command`] |
//! | `rows.rs` | the `i32` table rows the data plane reads |
//! | `invariants.rs` | [`Coordinator::check_invariants`] |
//! | `error.rs` | [`CoordError`], [`PoolKind`] |
//! | `divisor.rs` | division by the layout's page and row sizes on the decode path (shifts for powers of two) |
//!
//! # Page lifecycle
//!
//! `dirty` (GPU only) → `pending` (host transfer in flight) → `clean` (host copy durable) →
//! `unpinned` (GPU blocks back in the free queue, bytes still valid and read from the GPU) →
//! `reclaimed` (the pool handed a block to someone else: resident entries null, read from
//! host). A page is reclaimable only when clean, outside the active tail (the page the next
//! token writes and the one before it, [`ACTIVE_TAIL_PAGES`] pages), and its request has (or is
//! given) a hot region. Nothing is unpinned before its host copy is durable.
//!
//! Lazy reclaim: unpinning costs the data plane nothing — no table changes; the page falls
//! back to host, once, in the command whose allocations reuse one of its blocks (before the
//! forward pass that overwrites it). A low watermark (the larger of one request's hot region
//! and a tenth of the GPU pool) is kept free ahead of need at the end of a step by unpinning
//! clean pages of requests that hold hot regions (with hysteresis: a pass runs once the pool
//! dropped by an eighth of the watermark since the last); an allocation that finds the pool
//! short still reclaims, converting requests to hot regions as needed.
//!
//! Prefix caching publishes a durable page's host block and, with it, its GPU copy: a later
//! request hitting the page reads the GPU copy (shares its blocks) while the pool has not
//! handed them out, and needs a hot region only for hit pages read from host. Pages whose host
//! copies are still in flight when their request finishes or is preempted are published once
//! durable (detached publication). Copy-on-write sources stay allocated until every worker has
//! completed the batch of the step that copied them.
//!
//! # Transfers and workers
//!
//! All device→host copies planned during a step (row mirrors of the rows the step writes when
//! `eager_host_mirror` is on, whole-page spills otherwise or when reclaim forces them) form one
//! batch with one *transfer id* ([`OffloadCommand::transfer_id`]); ids increase by one per batch.
//! Each worker (tensor-parallel rank) executes every batch and reports it *enqueued*, then
//! *completed*, in FIFO order ([`Coordinator::report`]). A batch is complete when every worker
//! has completed it; then the pages it sealed become clean, pages marked release-after-transfer
//! are reclaimed, blocks of finished requests that the batch touched return to their pools, the
//! request's durable prefix ([`Coordinator::ready_prefix_pages`]) grows and its pages' hashes
//! are published in the host prefix cache.
//!
//! # Driving it
//!
//! [`Coordinator::admit`] queues a request; [`Coordinator::step`] schedules one step (running
//! requests first — prefill chunks and decode tokens — then waiting ones, FCFS, within
//! `max_batched_tokens`; when memory runs out it reclaims resident pages, waits when reclamation
//! is in flight, and preempts the newest running request otherwise) and returns the command for
//! the engine. The engine runs the forward pass and the copies, reports them, appends sampled
//! tokens ([`Coordinator::append_tokens`]) and finally [`Coordinator::finish`]es the request.
//! A request the step cannot serve at all (its context outgrew what a prefill can hold on the
//! GPU) does not stop the others: the command reports it in [`OffloadCommand::refused`], with
//! the reason, for the engine to fail (and finish) it.
//! With speculative decoding (`max_query_len = 1 + s`) the engine appends `s` draft tokens with
//! each sampled one, a step computes them together, and the engine gives back the drafts the
//! verifier rejected with [`Coordinator::rollback`] before the next step.
//!
//! An engine that keeps its own scheduler calls [`Coordinator::start`],
//! [`Coordinator::schedule`], [`Coordinator::rollback`], [`Coordinator::preempt`] and
//! [`Coordinator::finish`] itself and ends the step with
//! [`Coordinator::build_offload_command`]; before it picks a batch it asks, without changing
//! anything, what those calls would answer ([`Coordinator::can_start`],
//! [`Coordinator::can_schedule`]: scheduled, wait or no space and which pool, or the error),
//! what each tier has free ([`Coordinator::free`]) and what a request needs
//! ([`Coordinator::needs`]).
//!
//! Prefill over host-only context (`staging.rs`): a prefill chunk reads every earlier page of
//! its context on the GPU, so pages that live only on host are staged (restored host → device,
//! in the chunk's command) and the request's pages stay put for the rest of the step. A prompt
//! whose context could never be held on the GPU is refused at admission
//! ([`CoordError::PrefillNeverFits`]; a restart whose recomputed context outgrew the pool gets
//! the same error from [`Coordinator::schedule`], and is refused by [`Coordinator::step`]:
//! [`OffloadCommand::refused`]).
//!
//! Liveness: with workers reporting, a request whose context fits the layout and whose
//! prefill fits the GPU pool always finishes
//! (the layout guarantees that one `max_model_len` request fits both pools, and
//! [`KvCacheConfig::validate`] refuses one that does not). The step policy shrinks a prefill
//! chunk (or a speculative decode) to the pages the free pool holds before it preempts anyone;
//! a prefix hit whose pinned blocks, staged pages and first page could never fit the pool is not
//! used (the prefix is recomputed); and an allocation waits instead of preempting while a
//! release, or a conversion to a hot region that only in-flight transfers hold back, is
//! pending — so a request alone in the pool is never preempted.
//! Ordering contract: blocks released by a step's scheduling (reclaim) or by a report may be
//! handed out by the next scheduling and written by that step's forward pass, so an engine runs
//! the forward passes of consecutive steps in order on one compute stream (the usual case), and
//! executes a command's table updates before its forward pass.
//!
//! The per-request tables the data plane reads are exported as `i32` rows by
//! [`Coordinator::resident_row`], [`Coordinator::host_row`], [`Coordinator::hot_row`] and
//! [`Coordinator::block_table_row`].
//!
//! ```
//! use hisparse_core::config::HiSparseConfig;
//! use hisparse_core::coordinator::{Coordinator, CoordinatorConfig};
//! use hisparse_core::layout::{plan_layout, LayoutInput};
//! use hisparse_core::presets::DEEPSEEK_V32;
//!
//! // Plan a small pool: 2000 GPU blocks, host room for 64 K tokens.
//! let cfg = HiSparseConfig::new(DEEPSEEK_V32.top_k, 1100 * (2561024 + 515328));
//! let mut input = LayoutInput::new(&DEEPSEEK_V32, &cfg, 0, 65536);
//! input.num_gpu_blocks_override = Some(2000);
//! let kv = plan_layout(&input).unwrap();
//! let mut coord = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
//!
//! // Admit a 1000-token prompt and prefill it in chunks of at most 512 tokens.
//! let prompt: Vec<u32> = (0..1000).collect();
//! coord.admit(7, &prompt).unwrap();
//! let mut resident = vec![0i32; coord.max_pages() as usize];
//! loop {
//!     let cmd = coord.step().unwrap();
//!     // The engine would now apply `cmd` (tables, hot regions, copy-on-write), run the forward
//!     // pass, and execute the after-forward copies of `cmd.transfer_id`.
//!     coord.resident_row(7, 0, &mut resident).unwrap();
//!     if let Some(id) = cmd.transfer_id {
//!         coord.report(0, &[id], &[id]).unwrap();
//!     }
//!     if coord.num_computed(7) == Some(coord.num_tokens(7).unwrap()) {
//!         if coord.num_tokens(7) == Some(1064) {
//!             break;
//!         }
//!         coord.append_tokens(7, &[42]).unwrap(); // the sampled token
//!     }
//! }
//! // 1064 tokens = 16 full pages + 40 rows; all 16 full pages are durable on host.
//! assert_eq!(coord.ready_prefix_pages(7), Some(16));
//! assert!(resident[0] > 0); // still resident: no memory pressure
//! coord.finish(7).unwrap();
//! coord.check_invariants().unwrap();
//! assert_eq!(coord.gpu_pool().num_held(), 0);
//! ```

mod admission;
mod command;
mod divisor;
mod error;
mod import;
mod indexer;
mod invariants;
mod managers;
mod queries;
mod reclaim;
mod request;
mod rollback;
mod rows;
mod schedule;
mod staging;
#[cfg(test)]
mod tests;
mod transfers;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

pub use crate::layout::ACTIVE_TAIL_PAGES;
use crate::layout::KvCacheConfig;
use crate::pool::BlockPool;

pub use command::{
    HotAssignment, OffloadCommand, PageTransfer, RefusedRequest, RowMirror, ScheduledRequest,
    TableUpdate,
};
use divisor::Divisor;
use error::out_of_memory;
pub use error::{CoordError, PoolKind, RefusalReason};
pub use invariants::InvariantViolation;
pub use managers::PageState;
use managers::{HotManager, PagedManager, Release, ResidentManager, SourceManager, Unpinned};
pub use queries::{Admission, Needs, TierFree};
use request::{NO_ROW, Req, Status, empty_req};
pub use transfers::WorkerReport;
use transfers::{PendingPage, WorkerState};

/// Caller-chosen request identifier.
pub type RequestId = u64;

/// Largest [`CoordinatorConfig::num_workers`]: a report scans every worker's progress, so the
/// bound keeps a report cheap (tensor-parallel groups are far smaller).
pub const MAX_WORKERS: u32 = 1024;

/// Scheduler settings that are not part of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CoordinatorConfig {
    /// Requests that can run at once: the number of per-request state rows (slots) the data plane
    /// allocates, at most `i32::MAX` (rows are `i32` in the data plane). The coordinator's own
    /// per-row bookkeeping grows with the rows actually used, not with this bound.
    pub max_running: u32,
    /// Tokens one step may compute (prefill chunks + decode tokens).
    pub max_batched_tokens: u32,
    /// Whole-page spills planned per step when `eager_host_mirror` is off.
    pub max_spill_pages_per_step: u32,
    /// Workers that execute every command (tensor-parallel ranks); a transfer is complete when
    /// all have reported it. At most [`MAX_WORKERS`].
    pub num_workers: u32,
    /// Reuse durable host pages (and the GPU indexer/regular blocks of the same prefix) across
    /// requests. Sliding-window groups need only the blocks of the window before the first
    /// recomputed token to be still cached on the GPU.
    pub enable_prefix_caching: bool,
    /// When an allocation finds the GPU pool short, reclaim at least this many blocks (a
    /// low-watermark: one reclaim pass then serves many page allocations instead of one).
    /// 0 = exactly the shortfall.
    pub reclaim_min_blocks: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            max_running: 256,
            max_batched_tokens: 512,
            max_spill_pages_per_step: 64,
            num_workers: 1,
            enable_prefix_caching: true,
            reclaim_min_blocks: 64,
        }
    }
}

/// Outcome of trying to give a request the blocks a step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Alloc {
    /// The blocks are allocated; the tokens are scheduled in this step.
    Scheduled,
    /// Not enough memory now, but reclamation (or a release) is in flight: try next step rather
    /// than preempt.
    Wait,
    /// Not enough memory and nothing in flight: preempt someone (or wait for a finish).
    NoSpace(PoolKind),
}

/// What one [`Coordinator::schedule_step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StepSummary {
    /// Requests scheduled.
    pub scheduled: u32,
    /// Tokens scheduled.
    pub tokens: u32,
    /// Requests preempted.
    pub preempted: u32,
    /// Requests that wait for reclamation in flight.
    pub waiting_on_reclaim: u32,
    /// Requests started from the waiting queue.
    pub started: u32,
    /// Requests refused ([`OffloadCommand::refused`]).
    pub refused: u32,
}

/// The scheduler side of HiSparse for one model instance. See the module docs.
#[derive(Clone, Debug)]
pub struct Coordinator {
    kv: KvCacheConfig,
    cfg: CoordinatorConfig,
    gpu: BlockPool,
    host: BlockPool,
    /// Host blocks, prefix hashes and the host prefix cache.
    source: SourceManager,
    /// The indexer and regular groups.
    paged: PagedManager,
    /// The resident groups and the page lifecycle.
    resident: ResidentManager,
    /// Hot regions.
    hot: HotManager,
    /// Boxed so that taking a request out and putting it back moves a pointer.
    reqs: Vec<Option<Box<Req>>>,
    spare: Option<Box<Req>>,
    /// Indices of `reqs` given back by finished requests (reused last-in first-out before
    /// `reqs` grows).
    free_slots: Vec<u32>,
    /// Data-plane rows given back (reused last-in first-out before a fresh row is issued).
    free_rows: Vec<u32>,
    /// Per issued row (`0..row_owner.len()`, at most `max_running`): the index in `reqs` of
    /// the request holding it, or `NO_ROW`.
    row_owner: Vec<u32>,
    ids: BTreeMap<RequestId, u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    generation: u32,
    step_no: u64,
    /// Id the current step's copy batch gets if it has copies.
    current_xfer: u64,
    durable: u64,
    workers: Vec<WorkerState>,
    pending_pages: VecDeque<PendingPage>,
    deferred: VecDeque<(u64, PoolKind, u32)>,
    /// Host pages of released requests published once a transfer is durable: `(transfer id,
    /// host block, prefix hash)`; a deferred free holds each block until then.
    detached: VecDeque<(u64, u32, u64)>,
    in_flight_release: u32,
    /// Copy-on-write sources of the current step: released once the step's transfer batch,
    /// which every worker completes after the step's before-forward copies, is durable.
    after_build: Vec<(PoolKind, u32)>,
    /// Scratch: the requests' parts of a reclaim pass.
    reclaim_steps: Vec<reclaim::ReclaimStep>,
    /// Scratch: unpinned blocks found reused.
    reused: Vec<Unpinned>,
    /// Scratch: pages to spill.
    spill_scratch: Vec<u32>,
    /// Free GPU blocks after the last low-watermark pass (`u32::MAX`: none yet).
    free_after_watermark: u32,
    /// Pages restored host → device to stage prefill context, since the start.
    staged_pages: u64,
    /// `kv.block_tokens`, `kv.block_size` and `kv.sparse_compress_ratio` as divisors (the
    /// decode path divides by each for every request and step).
    page_tokens: Divisor,
    page_rows: Divisor,
    row_tokens: Divisor,
    /// Whether all three are powers of two (shifts on the decode path).
    pow2_layout: bool,
    /// The layout's indexer rows, backed up with the KV rows (`None`: no indexer layer).
    indexer_rows: Option<indexer::IndexerRows>,
    /// `ResidentManager::host_only_flips` when the last command was built: the "fully
    /// resident" answers of this step's entries stand while it has not moved.
    host_only_flips_built: u64,
    out: OffloadCommand,
    scratch: Vec<(u32, u32)>,
}

impl Coordinator {
    /// A coordinator with empty pools for the planned layout.
    ///
    /// Refuses a zero or oversized setting ([`CoordError::ZeroConfig`],
    /// [`CoordError::ConfigTooLarge`]), a layout that breaks a planner rule
    /// ([`CoordError::InvalidLayout`], from [`KvCacheConfig::validate`]), and pools whose
    /// bookkeeping cannot be allocated ([`CoordError::Pool`]); it allocates nothing in
    /// proportion to `max_running`.
    pub fn new(kv: KvCacheConfig, cfg: CoordinatorConfig) -> Result<Self, CoordError> {
        for (field, v) in [
            ("max_running", cfg.max_running),
            ("max_batched_tokens", cfg.max_batched_tokens),
            ("max_spill_pages_per_step", cfg.max_spill_pages_per_step),
            ("num_workers", cfg.num_workers),
        ] {
            if v == 0 {
                return Err(CoordError::ZeroConfig { field });
            }
        }
        for (field, v, max) in [
            ("max_running", cfg.max_running, i32::MAX as u32),
            ("num_workers", cfg.num_workers, MAX_WORKERS),
        ] {
            if v > max {
                return Err(CoordError::ConfigTooLarge {
                    field,
                    value: v.into(),
                    max: max.into(),
                });
            }
        }
        kv.validate()?;
        let gpu = BlockPool::new(kv.num_gpu_blocks)?;
        let host = BlockPool::new(kv.host_num_blocks)?;
        let paged = PagedManager::new(&kv);
        let caching = cfg.enable_prefix_caching;
        let n = cfg.num_workers as usize;
        let mut workers = Vec::new();
        workers
            .try_reserve_exact(n)
            .map_err(|_| out_of_memory::<WorkerState>("num_workers", n))?;
        workers.resize(n, WorkerState::default());
        let mut out = OffloadCommand::default();
        out.clear();
        Ok(Coordinator {
            source: SourceManager::new(kv.block_tokens, caching),
            paged,
            resident: ResidentManager::new(kv.num_buckets, kv.block_tokens),
            hot: HotManager::new(kv.num_buckets, kv.hot_blocks_per_request),
            gpu,
            host,
            reqs: Vec::new(),
            spare: Some(Box::new(empty_req())),
            free_slots: Vec::new(),
            free_rows: Vec::new(),
            row_owner: Vec::new(),
            ids: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            generation: 0,
            step_no: 0,
            current_xfer: 1,
            durable: 0,
            workers,
            pending_pages: VecDeque::new(),
            deferred: VecDeque::new(),
            detached: VecDeque::new(),
            in_flight_release: 0,
            after_build: Vec::new(),
            reclaim_steps: Vec::new(),
            reused: Vec::new(),
            spill_scratch: Vec::new(),
            free_after_watermark: u32::MAX,
            staged_pages: 0,
            page_tokens: Divisor::new(kv.block_tokens),
            page_rows: Divisor::new(kv.block_size),
            row_tokens: Divisor::new(kv.sparse_compress_ratio),
            pow2_layout: Divisor::new(kv.block_tokens).is_pow2()
                && Divisor::new(kv.block_size).is_pow2()
                && Divisor::new(kv.sparse_compress_ratio).is_pow2(),
            indexer_rows: indexer::IndexerRows::of(&kv),
            host_only_flips_built: 0,
            out,
            scratch: Vec::new(),
            kv,
            cfg,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &KvCacheConfig {
        &self.kv
    }

    /// The scheduler settings.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.cfg
    }

    /// The GPU pool.
    pub fn gpu_pool(&self) -> &BlockPool {
        &self.gpu
    }

    /// The host pool.
    pub fn host_pool(&self) -> &BlockPool {
        &self.host
    }

    /// Columns of every per-request page table (`max_pages_per_request`).
    pub fn max_pages(&self) -> u32 {
        self.kv.max_pages_per_request
    }

    /// Largest transfer id every worker has completed.
    pub fn durable_transfer(&self) -> u64 {
        self.durable
    }

    /// Number of requests waiting to start.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Number of running requests.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Ids of the running requests, oldest first.
    pub fn running_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running
            .iter()
            .filter_map(|&s| self.reqs[s as usize].as_ref().map(|r| r.id))
    }

    /// Whether any request is known (waiting or running).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn slot_of_id(&self, id: RequestId) -> Result<u32, CoordError> {
        self.ids
            .get(&id)
            .copied()
            .ok_or(CoordError::UnknownRequest { id })
    }

    fn req(&self, id: RequestId) -> Option<&Req> {
        let s = *self.ids.get(&id)?;
        self.reqs[s as usize].as_deref()
    }

    /// The data-plane state row (`0..max_running`) of a running request.
    pub fn slot_of(&self, id: RequestId) -> Option<u32> {
        self.req(id)
            .filter(|r| r.status == Status::Running)
            .map(|r| r.row)
    }

    /// Tokens of the request (prompt + appended).
    pub fn num_tokens(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.tokens.len() as u32)
    }

    /// Tokens whose KV is computed (or scheduled in the current step).
    pub fn num_computed(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.num_computed)
    }

    /// Length in pages of the request's contiguous durable prefix.
    pub fn ready_prefix_pages(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.source.ready_prefix)
    }

    /// Lifecycle state of page `page` of a running request.
    pub fn page_state(&self, id: RequestId, page: u32) -> Option<PageState> {
        let r = self.req(id)?;
        r.resident.state_of(page)
    }

    /// Why request `id` was refused while a step was scheduled ([`OffloadCommand::refused`]),
    /// if it was; `None` for a request that was not (or is unknown).
    pub fn refusal(&self, id: RequestId) -> Option<RefusalReason> {
        match self.req(id)?.status {
            Status::Refused(reason) => Some(reason),
            _ => None,
        }
    }

    /// Whether the request has a hot region.
    pub fn has_hot_region(&self, id: RequestId) -> Option<bool> {
        self.req(id).map(|r| !r.hot.blocks.is_empty())
    }

    /// Pages of the request whose resident entries are null (read from host).
    pub fn host_only_pages(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.resident.host_only())
    }

    /// GPU blocks one page costs across the paged and resident managers.
    #[inline]
    fn gpu_cost_per_page(&self) -> u64 {
        self.paged.blocks_per_page() + u64::from(self.resident.num_buckets())
    }

    /// Gives back every block of `r` (deferring those an issued, unfinished transfer touches)
    /// and purges its entries from the current step's command. Sealed pages whose host copies
    /// are durable, or will be once the transfers in flight complete, are published in the host
    /// prefix cache (at once, or when durable: detached publication), not dropped.
    fn release_blocks(&mut self, r: &mut Req) {
        let issued = self.current_xfer - 1;
        // The last issued batch that can still touch the request's blocks: its own last one,
        // or, when that is the unbuilt batch (purged below), any issued before it.
        let last_issued = r.last_xfer.min(issued);
        let defer_until = (last_issued > self.durable).then_some(last_issued);
        if r.status == Status::Running {
            self.publish_detached(r, issued, defer_until);
            // Pages its last step filled were held back from the GPU prefix cache while a
            // rollback could reach them; leaving, it can roll nothing back.
            if self.source.caching() {
                let sealed = (r.num_computed / self.kv.block_tokens)
                    .min(r.source.hashes.len() as u32)
                    .min(r.pages);
                let from = r.gpu_published.max(r.hit_pages);
                if from < sealed {
                    self.paged
                        .publish(&r.paged, &mut self.gpu, &r.source.hashes, from..sealed);
                }
            }
        }
        if r.row != NO_ROW {
            self.out.purge_slot(r.row);
        }
        self.out.purge_request_copies(
            r.last_xfer == self.current_xfer,
            &r.source.blocks,
            |b| r.paged.holds(b),
            r.resident.blocks(),
            |b| self.resident.held_blocks(&r.resident).any(|h| h == b),
            &r.paged.indexer,
        );
        // GPU: resident pages, then regular and indexer, then the hot region (reverse order);
        // then host.
        let mut release = Release {
            defer_until,
            deferred: &mut self.deferred,
        };
        self.in_flight_release -=
            self.resident
                .release(&mut r.resident, &mut self.gpu, &mut release);
        self.paged
            .release(&mut r.paged, &mut self.gpu, &mut release);
        self.hot
            .release(&mut r.hot, &mut self.gpu, &mut self.out, r.row);
        self.source
            .release(&mut r.source, &mut self.host, &mut release);
        if r.row != NO_ROW {
            self.row_owner[r.row as usize] = NO_ROW;
            self.free_rows.push(r.row);
            r.row = NO_ROW;
        }
        r.pages = 0;
        r.num_computed = 0;
        r.rollback_floor = 0;
        r.gpu_published = 0;
        r.hit_pages = 0;
        r.last_xfer = 0;
        r.import = request::Import::None;
        self.generation = self.generation.wrapping_add(1);
        r.generation = self.generation;
    }

    /// Host pages of `r` (about to be released) that are sealed, past its durable prefix and
    /// durable or in flight in a batch up to `issued`: their prefix hashes are published now if
    /// durable, else queued until transfer `defer_until` (which holds their blocks) is.
    fn publish_detached(&mut self, r: &Req, issued: u64, defer_until: Option<u64>) {
        if !self.source.caching() {
            return;
        }
        let sealed = (r.num_computed / self.kv.block_tokens)
            .min(r.source.hashes.len() as u32)
            .min(r.resident.pages());
        for p in r.source.ready_prefix..sealed {
            let i = p as usize;
            let (state, xfer) = self.resident.page_state(&r.resident, p);
            if state == PageState::Dirty || xfer > issued {
                continue;
            }
            let (block, hash) = (r.source.blocks[i], r.source.hashes[i]);
            match defer_until {
                Some(x) if xfer > self.durable => self.detached.push_back((x, block, hash)),
                _ => self.source.publish(&mut self.host, block, hash),
            }
        }
    }

    /// Preempts running request `id`: gives back its blocks and queues it at the front of the
    /// waiting queue; its tokens are recomputed when it restarts (durable prefix pages are found
    /// again through the host prefix cache).
    pub fn preempt(&mut self, id: RequestId) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        match self.reqs[slot as usize].as_ref() {
            Some(r) if r.status == Status::Running => {}
            Some(r) => return Err(r.status_error()),
            None => return Err(CoordError::UnknownRequest { id }),
        }
        self.preempt_slot(slot)
    }

    fn preempt_slot(&mut self, slot: u32) -> Result<(), CoordError> {
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownSlot { slot });
        };
        self.release_blocks(&mut r);
        r.status = Status::Waiting;
        self.out.preempted.push(r.id);
        self.reqs[slot as usize] = Some(r);
        if let Some(pos) = self.running.iter().position(|&s| s == slot) {
            self.running.remove(pos);
        }
        self.waiting.push_front(slot);
        Ok(())
    }

    /// Refuses the request in `reqs[slot]` (running or waiting) for the error its scheduling
    /// met: gives back its blocks, takes it out of its queue and reports it in the step's
    /// command; it stays known (refused) until the engine finishes it.
    fn refuse_slot(&mut self, slot: u32, e: &CoordError) {
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return;
        };
        self.release_blocks(&mut r);
        let reason = RefusalReason::of(e);
        r.status = Status::Refused(reason);
        self.out.refused.push(RefusedRequest { id: r.id, reason });
        self.reqs[slot as usize] = Some(r);
        if let Some(pos) = self.running.iter().position(|&s| s == slot) {
            self.running.remove(pos);
        }
        if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
            self.waiting.remove(pos);
        }
    }

    /// Finishes (or aborts) request `id`, waiting or running: gives back its blocks.
    pub fn finish(&mut self, id: RequestId) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownRequest { id });
        };
        self.release_blocks(&mut r);
        self.ids.remove(&id);
        if let Some(pos) = self.running.iter().position(|&s| s == slot) {
            self.running.remove(pos);
        }
        if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
            self.waiting.remove(pos);
        }
        self.free_slots.push(slot);
        Ok(())
    }
}
