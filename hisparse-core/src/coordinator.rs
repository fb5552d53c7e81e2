//! The coordinator: managers for every KV-cache group, admission, the page lifecycle, reclaim,
//! spill and row-mirror planning, worker reports, prefix caching and the per-step
//! [`OffloadCommand`] (SPEC §4). Pure and deterministic: no I/O, no clocks.
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
//! # Page lifecycle
//!
//! `dirty` (GPU only) → `pending` (host transfer in flight) → `clean` (host copy durable) →
//! `reclaimed` (GPU blocks back in the pool, resident entries null). A page is reclaimable only
//! when clean, not among the last [`ACTIVE_TAIL_PAGES`] pages, and its request has (or is given)
//! a hot region. Nothing is reclaimed before its host copy is durable.
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
//! let cfg = HiSparseConfig::new(DEEPSEEK_V32.top_k, 1100 * 2561024);
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

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

pub use crate::layout::ACTIVE_TAIL_PAGES;
use crate::layout::{GroupKind, KvCacheConfig};
use crate::ops::{BlockPair, RowSpan};
use crate::pool::{BlockKey, BlockPool, PoolError};

/// Caller-chosen request identifier.
pub type RequestId = u64;

/// Scheduler settings that are not part of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CoordinatorConfig {
    /// Requests that can run at once: the number of per-request state rows (slots) the data plane
    /// allocates.
    pub max_running: u32,
    /// Tokens one step may compute (prefill chunks + decode tokens).
    pub max_batched_tokens: u32,
    /// Whole-page spills planned per step when `eager_host_mirror` is off.
    pub max_spill_pages_per_step: u32,
    /// Workers that execute every command (tensor-parallel ranks); a transfer is complete when
    /// all have reported it.
    pub num_workers: u32,
    /// Reuse durable host pages (and the GPU indexer/regular blocks of the same prefix) across
    /// requests. Models with sliding-window groups never hit (their window blocks are not
    /// cached).
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

/// Which pool ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PoolKind {
    /// The GPU pool.
    Gpu,
    /// The pinned host pool.
    Host,
}

/// A scheduling or reporting error. Every variant names the request, worker or value at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CoordError {
    /// A [`CoordinatorConfig`] field is zero.
    ZeroConfig {
        /// Field name.
        field: &'static str,
    },
    /// The layout's pools are unusable (a pool error while building them).
    Pool(PoolError),
    /// The request id is already known.
    DuplicateRequest {
        /// The id.
        id: RequestId,
    },
    /// No such request.
    UnknownRequest {
        /// The id.
        id: RequestId,
    },
    /// A request must have at least one prompt token.
    EmptyPrompt {
        /// The id.
        id: RequestId,
    },
    /// The request would exceed `max_model_len`.
    TooLong {
        /// The id.
        id: RequestId,
        /// Tokens it would have.
        tokens: u64,
        /// The limit.
        max_model_len: u32,
    },
    /// The request can never fit the pools, even alone.
    NeverFits {
        /// The id.
        id: RequestId,
        /// The pool that is too small.
        pool: PoolKind,
        /// Blocks it needs.
        needed: u64,
        /// Usable blocks in the pool.
        capacity: u64,
    },
    /// `schedule` asked for more tokens than the request has uncomputed.
    NotEnoughTokens {
        /// The id.
        id: RequestId,
        /// Tokens asked for.
        requested: u32,
        /// Tokens available.
        available: u32,
    },
    /// The request is not running (waiting requests are started by [`Coordinator::step`] or
    /// [`Coordinator::start`]).
    NotRunning {
        /// The id.
        id: RequestId,
    },
    /// No free slot (state row) to start a request.
    NoFreeSlot,
    /// No running request holds this state row.
    UnknownSlot {
        /// The state row.
        slot: u32,
    },
    /// The layout handed to [`Coordinator::new`] is inconsistent (hand-edited).
    InvalidLayout {
        /// What is wrong.
        what: &'static str,
    },
    /// A worker index is out of range.
    UnknownWorker {
        /// The worker.
        worker: u32,
        /// Workers configured.
        num_workers: u32,
    },
    /// A worker reported a transfer out of FIFO order or one never issued / never enqueued.
    OutOfOrderReport {
        /// The worker.
        worker: u32,
        /// `"enqueued"` or `"completed"`.
        what: &'static str,
        /// The id reported.
        id: u64,
        /// The id expected next.
        expected: u64,
    },
}

impl From<PoolError> for CoordError {
    fn from(e: PoolError) -> Self {
        CoordError::Pool(e)
    }
}

impl fmt::Display for CoordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CoordError::ZeroConfig { field } => {
                write!(f, "coordinator: `{field}` must be greater than 0")
            }
            CoordError::Pool(e) => e.fmt(f),
            CoordError::DuplicateRequest { id } => {
                write!(f, "coordinator: request {id} already exists")
            }
            CoordError::UnknownRequest { id } => write!(f, "coordinator: no request {id}"),
            CoordError::EmptyPrompt { id } => {
                write!(f, "coordinator: request {id} has an empty prompt")
            }
            CoordError::TooLong {
                id,
                tokens,
                max_model_len,
            } => write!(
                f,
                "coordinator: request {id} would have {tokens} tokens, above max_model_len {max_model_len}; finish it or plan a larger max_model_len"
            ),
            CoordError::NeverFits {
                id,
                pool,
                needed,
                capacity,
            } => write!(
                f,
                "coordinator: request {id} needs {needed} {} blocks but the pool has {capacity}; plan larger pools",
                match pool {
                    PoolKind::Gpu => "GPU",
                    PoolKind::Host => "host",
                }
            ),
            CoordError::NotEnoughTokens {
                id,
                requested,
                available,
            } => write!(
                f,
                "coordinator: request {id}: {requested} tokens scheduled but only {available} are uncomputed; append tokens first"
            ),
            CoordError::NotRunning { id } => write!(f, "coordinator: request {id} is not running"),
            CoordError::NoFreeSlot => {
                f.write_str("coordinator: every slot is taken; raise max_running")
            }
            CoordError::UnknownSlot { slot } => {
                write!(f, "coordinator: no running request holds state row {slot}")
            }
            CoordError::InvalidLayout { what } => write!(
                f,
                "coordinator: inconsistent layout ({what}); plan it with `plan_layout`"
            ),
            CoordError::UnknownWorker {
                worker,
                num_workers,
            } => write!(
                f,
                "coordinator: worker {worker} does not exist ({num_workers} configured)"
            ),
            CoordError::OutOfOrderReport {
                worker,
                what,
                id,
                expected,
            } => write!(
                f,
                "coordinator: worker {worker} reported transfer {id} {what}, but {expected} is next (FIFO, issued ids only)"
            ),
        }
    }
}

impl crate::error::Error for CoordError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for CoordError {}

/// Outcome of trying to give a request the blocks a step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alloc {
    /// The blocks are allocated; the tokens are scheduled in this step.
    Scheduled,
    /// Not enough memory now, but reclamation (or a release) is in flight: try next step rather
    /// than preempt.
    Wait,
    /// Not enough memory and nothing in flight: preempt someone (or wait for a finish).
    NoSpace(PoolKind),
}

/// A request scheduled in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ScheduledRequest {
    /// The request.
    pub id: RequestId,
    /// Its state row in every per-request table of the data plane.
    pub slot: u32,
    /// First token computed in this step.
    pub first_token: u32,
    /// Tokens computed in this step.
    pub num_tokens: u32,
    /// Whether every page of the request is resident (no host reads).
    pub fully_resident: bool,
}

/// A change of one per-request table entry (page → block; block 0 = null).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TableUpdate {
    /// State row.
    pub slot: u32,
    /// Group index in the layout (`KvCacheConfig::groups`).
    pub group: u32,
    /// Page.
    pub page: u32,
    /// New block (0 = null: for resident groups, "read from host").
    pub block: u32,
}

/// A hot region given to a request: reset the slot's LRU to the identity and its `dgi` to `-1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HotAssignment {
    /// State row.
    pub slot: u32,
    /// Hot group index in the layout.
    pub group: u32,
    /// The `hot_blocks_per_request` GPU blocks of the region.
    pub blocks: Vec<u32>,
}

/// A page copy between a GPU block and a host block, for the layers of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PageTransfer {
    /// Bucket (resident group `2 + bucket`): the layers to copy.
    pub bucket: u32,
    /// GPU block.
    pub device_block: u32,
    /// Host block.
    pub host_block: u32,
}

/// Rows of one page to mirror device → host, for the layers of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RowMirror {
    /// Bucket: the layers to copy.
    pub bucket: u32,
    /// The rows.
    pub span: RowSpan,
}

/// Everything the workers do in one step, as plain data.
///
/// Order of execution: (1) reset the `started` rows, release `hot_release` regions, apply
/// `host_blocks`, `residency`, `block_tables`, `hot_assign`,
/// to the tables and hot states; invalidate hot entries caching rows of
/// `new_host_blocks`; (2) `host_cow` (host → host pages), then `restores` (host → device pages,
/// which read the copied host blocks), then `gpu_cow` (whole GPU blocks); (3) the forward pass;
/// (4) the after-forward copies `row_mirrors` and `page_transfers` (device → host), as the batch
/// `transfer_id`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct OffloadCommand {
    /// Step number (from 1).
    pub step: u64,
    /// Id of the after-forward copy batch, if the step has any.
    pub transfer_id: Option<u64>,
    /// Requests computed in this step.
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests preempted in this step (their slots are free; their tokens will be recomputed).
    pub preempted: Vec<RequestId>,
    /// State rows given to a request in this step: reset them first (resident and block tables
    /// to 0, host table to -1, no hot region), then apply the updates.
    pub started: Vec<u32>,
    /// Every scheduled request is fully resident: the fast path (remap only, no resolve).
    pub fully_resident: bool,
    /// Resident-table changes (per request, per resident group).
    pub residency: Vec<TableUpdate>,
    /// Host-table changes (group = the source group, 0).
    pub host_blocks: Vec<TableUpdate>,
    /// Indexer and regular block-table changes.
    pub block_tables: Vec<TableUpdate>,
    /// Host blocks newly given to requests: invalidate hot entries caching their old rows.
    pub new_host_blocks: Vec<u32>,
    /// Host copy-on-write pairs (`src` → `dst` host blocks), before the forward.
    pub host_cow: Vec<BlockPair>,
    /// GPU copy-on-write pairs (`src` → `dst` whole GPU blocks), before the forward.
    pub gpu_cow: Vec<BlockPair>,
    /// Host → device page restores (a copy-on-write tail page made resident), before the forward.
    pub restores: Vec<PageTransfer>,
    /// Hot regions given out.
    pub hot_assign: Vec<HotAssignment>,
    /// Slots whose hot regions were released.
    pub hot_release: Vec<u32>,
    /// After-forward row mirrors (device → host).
    pub row_mirrors: Vec<RowMirror>,
    /// After-forward whole-page spills (device → host).
    pub page_transfers: Vec<PageTransfer>,
}

impl OffloadCommand {
    fn clear(&mut self) {
        self.transfer_id = None;
        self.scheduled.clear();
        self.preempted.clear();
        self.started.clear();
        self.fully_resident = true;
        self.residency.clear();
        self.host_blocks.clear();
        self.block_tables.clear();
        self.new_host_blocks.clear();
        self.host_cow.clear();
        self.gpu_cow.clear();
        self.restores.clear();
        self.hot_assign.clear();
        self.hot_release.clear();
        self.row_mirrors.clear();
        self.page_transfers.clear();
    }

    fn has_copies(&self) -> bool {
        !self.row_mirrors.is_empty() || !self.page_transfers.is_empty()
    }

    fn purge_slot(&mut self, slot: u32) {
        self.started.retain(|&s| s != slot);
        self.scheduled.retain(|s| s.slot != slot);
        self.residency.retain(|u| u.slot != slot);
        self.host_blocks.retain(|u| u.slot != slot);
        self.block_tables.retain(|u| u.slot != slot);
        self.hot_assign.retain(|h| h.slot != slot);
    }
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
}

/// A broken invariant found by [`Coordinator::check_invariants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvariantViolation {
    /// What is wrong.
    pub what: &'static str,
    /// The request concerned, if any.
    pub request: Option<RequestId>,
    /// The page or block concerned, if any.
    pub index: Option<u32>,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant violated: {}", self.what)?;
        if let Some(r) = self.request {
            write!(f, " (request {r})")?;
        }
        if let Some(i) = self.index {
            write!(f, " (index {i})")?;
        }
        Ok(())
    }
}

fn violation(
    what: &'static str,
    request: Option<RequestId>,
    index: Option<u32>,
) -> InvariantViolation {
    InvariantViolation {
        what,
        request,
        index,
    }
}

// Page states.
const DIRTY: u8 = 0;
const PENDING: u8 = 1;
const PENDING_RELEASE: u8 = 2;
const CLEAN: u8 = 3;
const RECLAIMED: u8 = 4;

/// Lifecycle state of one page of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Only on the GPU.
    Dirty,
    /// Host transfer in flight.
    Pending,
    /// Host transfer in flight; the GPU copy is released when it completes.
    PendingRelease,
    /// Host copy durable, GPU copy still readable.
    Clean,
    /// GPU copy released; read from host.
    Reclaimed,
}

fn page_state(s: u8) -> PageState {
    match s {
        DIRTY => PageState::Dirty,
        PENDING => PageState::Pending,
        PENDING_RELEASE => PageState::PendingRelease,
        CLEAN => PageState::Clean,
        _ => PageState::Reclaimed,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
}

#[derive(Clone, Debug)]
struct Req {
    id: RequestId,
    generation: u32,
    status: Status,
    /// Index in `Coordinator::reqs`.
    slot: u32,
    /// Data-plane state row while running (`NO_ROW` otherwise).
    row: u32,
    tokens: Vec<u32>,
    num_computed: u32,
    /// Pages with GPU blocks (indexer, regular, resident).
    pages: u32,
    host: Vec<u32>,
    indexer: Vec<u32>,
    /// `page * num_regular + g`.
    regular: Vec<u32>,
    /// `page * num_buckets + b`.
    resident: Vec<u32>,
    state: Vec<u8>,
    /// Transfer id that made the page durable (0 = durable from the start).
    xfer: Vec<u64>,
    hashes: Vec<u64>,
    /// `bucket * hot_blocks_per_request + i`; empty = no hot region.
    hot: Vec<u32>,
    /// Pages below are reclaimed, marked for release, or prefix hits.
    reclaim_cursor: u32,
    /// Non-eager: pages below have a transfer planned.
    spill_cursor: u32,
    /// Pages with null resident entries.
    host_only: u32,
    /// Pages marked release-after-transfer.
    pending_release: u32,
    ready_prefix: u32,
    /// Prefix-hit pages (read from host from the start).
    hit_pages: u32,
    /// Per regular group: pages below were given back (sliding window).
    window_cursor: Vec<u32>,
    /// Largest transfer id that touches this request's blocks.
    last_xfer: u64,
}

#[derive(Clone, Copy, Debug)]
struct PendingPage {
    xfer: u64,
    slot: u32,
    generation: u32,
    page: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct WorkerState {
    enqueued: u64,
    completed: u64,
}

const NO_ROW: u32 = u32::MAX;

const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = parent ^ 0x9E37_79B9_7F4A_7C15;
    for &t in tokens {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        h ^= h >> 29;
    }
    h
}

/// The scheduler side of HiSparse for one model instance. See the module docs.
#[derive(Clone, Debug)]
pub struct Coordinator {
    kv: KvCacheConfig,
    cfg: CoordinatorConfig,
    gpu: BlockPool,
    host: BlockPool,
    num_buckets: u32,
    hot_per: u32,
    /// Regular group layout indices, and whether each has a sliding window.
    regular_groups: Vec<(u32, Option<u32>)>,
    has_window: bool,
    /// Boxed so that taking a request out and putting it back moves a pointer.
    reqs: Vec<Option<Box<Req>>>,
    spare: Option<Box<Req>>,
    free_slots: Vec<u32>,
    free_rows: Vec<u32>,
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
    in_flight_release: u32,
    /// References released when the current command is built (copy-on-write sources).
    after_build: Vec<(PoolKind, u32)>,
    out: OffloadCommand,
    scratch: Vec<(u32, u32)>,
    scratch_blocks: Vec<u32>,
}

impl Coordinator {
    /// A coordinator with empty pools for the planned layout.
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
        check_layout(&kv)?;
        let gpu = BlockPool::new(kv.num_gpu_blocks)?;
        let host = BlockPool::new(kv.host_num_blocks)?;
        let regular_groups: Vec<(u32, Option<u32>)> = kv
            .regular_groups()
            .map(|g| (g as u32, kv.groups[g].sliding_window))
            .collect();
        let has_window = regular_groups.iter().any(|g| g.1.is_some());
        let n = cfg.max_running;
        let mut out = OffloadCommand::default();
        out.clear();
        Ok(Coordinator {
            num_buckets: kv.num_buckets,
            hot_per: kv.hot_blocks_per_request,
            regular_groups,
            has_window,
            gpu,
            host,
            reqs: (0..n).map(|_| None).collect(),
            spare: Some(Box::new(empty_req())),
            free_slots: (0..n).rev().collect(),
            free_rows: (0..n).rev().collect(),
            row_owner: vec![NO_ROW; n as usize],
            ids: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            generation: 0,
            step_no: 0,
            current_xfer: 1,
            durable: 0,
            workers: vec![WorkerState::default(); cfg.num_workers as usize],
            pending_pages: VecDeque::new(),
            deferred: VecDeque::new(),
            in_flight_release: 0,
            after_build: Vec::new(),
            out,
            scratch: Vec::new(),
            scratch_blocks: Vec::new(),
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
        self.req(id).map(|r| r.ready_prefix)
    }

    /// Lifecycle state of page `page` of a running request.
    pub fn page_state(&self, id: RequestId, page: u32) -> Option<PageState> {
        let r = self.req(id)?;
        r.state.get(page as usize).map(|&s| page_state(s))
    }

    /// Whether the request has a hot region.
    pub fn has_hot_region(&self, id: RequestId) -> Option<bool> {
        self.req(id).map(|r| !r.hot.is_empty())
    }

    /// Pages of the request whose resident entries are null (read from host).
    pub fn host_only_pages(&self, id: RequestId) -> Option<u32> {
        self.req(id).map(|r| r.host_only)
    }

    /// Queues a request with its prompt. It starts in a later [`Coordinator::step`] (or
    /// [`Coordinator::start`]).
    pub fn admit(&mut self, id: RequestId, prompt: &[u32]) -> Result<(), CoordError> {
        if self.ids.contains_key(&id) {
            return Err(CoordError::DuplicateRequest { id });
        }
        if prompt.is_empty() {
            return Err(CoordError::EmptyPrompt { id });
        }
        if prompt.len() as u64 > u64::from(self.kv.max_model_len) {
            return Err(CoordError::TooLong {
                id,
                tokens: prompt.len() as u64,
                max_model_len: self.kv.max_model_len,
            });
        }
        self.check_fits(id, prompt.len() as u32)?;
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                // Request storage grows past `max_running`; data-plane rows do not.
                self.reqs.push(None);
                self.reqs.len() as u32 - 1
            }
        };
        self.generation = self.generation.wrapping_add(1);
        let nr = self.regular_groups.len();
        self.reqs[slot as usize] = Some(Box::new(Req {
            id,
            generation: self.generation,
            status: Status::Waiting,
            slot,
            row: NO_ROW,
            tokens: prompt.to_vec(),
            num_computed: 0,
            pages: 0,
            host: Vec::new(),
            indexer: Vec::new(),
            regular: Vec::new(),
            resident: Vec::new(),
            state: Vec::new(),
            xfer: Vec::new(),
            hashes: Vec::new(),
            hot: Vec::new(),
            reclaim_cursor: 0,
            spill_cursor: 0,
            host_only: 0,
            pending_release: 0,
            ready_prefix: 0,
            hit_pages: 0,
            window_cursor: vec![0; nr],
            last_xfer: 0,
        }));
        self.ids.insert(id, slot);
        self.waiting.push_back(slot);
        Ok(())
    }

    fn check_fits(&self, id: RequestId, tokens: u32) -> Result<(), CoordError> {
        let pages = u64::from(self.kv.pages_for(tokens));
        let host_cap = u64::from(self.kv.host_num_blocks) - 1;
        if pages > host_cap {
            return Err(CoordError::NeverFits {
                id,
                pool: PoolKind::Host,
                needed: pages,
                capacity: host_cap,
            });
        }
        let gpu_cap = u64::from(self.kv.num_gpu_blocks) - 1;
        let need = self.kv.gpu_blocks_per_request(tokens).min_needed();
        if need > gpu_cap {
            return Err(CoordError::NeverFits {
                id,
                pool: PoolKind::Gpu,
                needed: need,
                capacity: gpu_cap,
            });
        }
        Ok(())
    }

    /// Appends tokens (sampled or speculative) to a request; they are computed by later steps.
    pub fn append_tokens(&mut self, id: RequestId, tokens: &[u32]) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        let max = self.kv.max_model_len;
        let r = self.reqs[slot as usize]
            .as_mut()
            .ok_or(CoordError::UnknownRequest { id })?;
        let total = r.tokens.len() as u64 + tokens.len() as u64;
        if total > u64::from(max) {
            return Err(CoordError::TooLong {
                id,
                tokens: total,
                max_model_len: max,
            });
        }
        r.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Appends one token to the request in state row `slot` (the hot path for engines that key
    /// by slot). Returns the request's id.
    pub fn append_token_by_slot(&mut self, slot: u32, token: u32) -> Result<RequestId, CoordError> {
        let max = self.kv.max_model_len;
        let idx = self.row_owner.get(slot as usize).copied().unwrap_or(NO_ROW);
        let r = self
            .reqs
            .get_mut(idx as usize)
            .and_then(Option::as_mut)
            .ok_or(CoordError::UnknownSlot { slot })?;
        if r.tokens.len() as u64 >= u64::from(max) {
            return Err(CoordError::TooLong {
                id: r.id,
                tokens: r.tokens.len() as u64 + 1,
                max_model_len: max,
            });
        }
        r.tokens.push(token);
        Ok(r.id)
    }

    fn gpu_cost_per_page(&self) -> u64 {
        1 + self.regular_groups.len() as u64 + u64::from(self.num_buckets)
    }

    fn hot_cost(&self) -> u32 {
        self.num_buckets * self.hot_per
    }

    fn io_in_flight(&self) -> bool {
        self.in_flight_release > 0 || !self.deferred.is_empty()
    }

    /// Starts the waiting request `id` (prefix-cache lookup, host blocks for the whole prompt,
    /// hot region if it reads from host) and schedules its first chunk of at most `max_tokens`
    /// tokens. Admission accounts for every tier it needs before touching anything: host blocks
    /// for every page, GPU blocks for the chunk and re-pinned prefix blocks, and the hot region.
    pub fn start(&mut self, id: RequestId, max_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.slot_of_id(id)?;
        if self.reqs[slot as usize].as_ref().map(|r| r.status) != Some(Status::Waiting) {
            return Err(CoordError::NotRunning { id });
        }
        if self.free_rows.is_empty() {
            return Err(CoordError::NoFreeSlot);
        }
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownRequest { id });
        };
        let res = self.start_inner(&mut r, max_tokens);
        let ok = matches!(res, Ok(Alloc::Scheduled));
        self.reqs[slot as usize] = Some(r);
        if ok {
            if let Some(pos) = self.waiting.iter().position(|&s| s == slot) {
                self.waiting.remove(pos);
            }
            self.running.push(slot);
        }
        res
    }

    fn start_inner(&mut self, r: &mut Box<Req>, max_tokens: u32) -> Result<Alloc, CoordError> {
        let bt = self.kv.block_tokens;
        let len = r.tokens.len() as u32;
        let total_pages = self.kv.pages_for(len);
        // Prefix hashes of the full pages.
        r.hashes.clear();
        let mut h = HASH_SEED;
        for p in 0..len / bt {
            h = chain_hash(h, &r.tokens[(p * bt) as usize..((p + 1) * bt) as usize]);
            r.hashes.push(h);
        }
        // Longest prefix durable on host whose indexer/regular blocks are still on the GPU.
        let mut hit = 0u32;
        if self.cfg.enable_prefix_caching && !self.has_window {
            while (hit as usize) < r.hashes.len() {
                let hash = r.hashes[hit as usize];
                let src = BlockKey { group: 0, hash };
                let idx = BlockKey { group: 1, hash };
                if self.host.lookup(src).is_none() || self.gpu.lookup(idx).is_none() {
                    break;
                }
                if self
                    .regular_groups
                    .iter()
                    .any(|&(g, _)| self.gpu.lookup(BlockKey { group: g, hash }).is_none())
                {
                    break;
                }
                hit += 1;
            }
        }
        // The last token is always computed: a hit on every page makes the last page a
        // copy-on-write tail.
        let cow_tail = hit > 0 && hit * bt >= len;
        let shared = if cow_tail { hit - 1 } else { hit };
        let computed0 = if cow_tail { len - 1 } else { hit * bt };
        let chunk = (len - computed0).min(max_tokens.max(1));
        let target = computed0 + chunk;
        let target_pages = self.kv.pages_for(target);

        // Pin every hit block first: re-pinning takes a free cached block out of the free
        // queue, and no later allocation (reclaim's hot regions included) may evict it.
        let nb = self.num_buckets as usize;
        let nr = self.regular_groups.len();
        for p in 0..hit {
            let hash = r.hashes[p as usize];
            let hb = self.host.lookup(BlockKey { group: 0, hash }).unwrap_or(0);
            let ib = self.gpu.lookup(BlockKey { group: 1, hash }).unwrap_or(0);
            self.host.touch(hb)?;
            self.gpu.touch(ib)?;
            r.host.push(hb);
            r.indexer.push(ib);
            for gi in 0..nr {
                let g = self.regular_groups[gi].0;
                let b = self.gpu.lookup(BlockKey { group: g, hash }).unwrap_or(0);
                self.gpu.touch(b)?;
                r.regular.push(b);
            }
        }
        // Account for every tier before allocating anything.
        let host_need = u64::from(total_pages - shared);
        let new_gpu_pages = u64::from(target_pages - shared);
        let hot = if shared > 0 {
            u64::from(self.hot_cost())
        } else {
            0
        };
        let gpu_need = new_gpu_pages * self.gpu_cost_per_page() + hot;
        let mut short = None;
        if u64::from(self.host.num_free()) < host_need {
            short = Some(PoolKind::Host);
        } else if u64::from(self.gpu.num_free()) < gpu_need {
            let want = (gpu_need - u64::from(self.gpu.num_free()))
                .max(u64::from(self.cfg.reclaim_min_blocks));
            self.reclaim_resident_blocks(want.min(u64::from(u32::MAX)) as u32);
            if u64::from(self.gpu.num_free()) < gpu_need {
                short = Some(PoolKind::Gpu);
            }
        }
        if let Some(pool) = short {
            // Unpin (the blocks keep their hashes and go to the tail of the LRU queue).
            let _ = self.host.free_reverse(&r.host);
            let _ = self.gpu.free_reverse(&r.regular);
            let _ = self.gpu.free_reverse(&r.indexer);
            r.host.clear();
            r.indexer.clear();
            r.regular.clear();
            return Ok(if self.io_in_flight() {
                Alloc::Wait
            } else {
                Alloc::NoSpace(pool)
            });
        }

        // Commit.
        r.status = Status::Running;
        let row = self.free_rows.pop().unwrap_or(NO_ROW);
        self.row_owner[row as usize] = r.slot;
        r.row = row;
        self.out.started.push(row);
        let slot = row;
        let cap = self.kv.max_pages_per_request as usize;
        r.host.reserve(cap);
        r.state.reserve(cap);
        r.xfer.reserve(cap);
        r.indexer.reserve(cap);
        r.resident.reserve(cap * nb);
        r.regular.reserve(cap * nr);
        for _ in 0..hit {
            for _ in 0..nb {
                r.resident.push(0);
            }
            r.state.push(RECLAIMED);
            r.xfer.push(0);
        }
        if cow_tail {
            // The shared last page gets private copies: host → host, GPU → GPU, and resident
            // blocks restored from the private host copy.
            let p = (hit - 1) as usize;
            let old = r.host[p];
            let nbk = self.host.allocate().unwrap_or(0);
            self.out.host_cow.push(BlockPair { src: old, dst: nbk });
            self.out.new_host_blocks.push(nbk);
            // The copy-on-write source is released when the command is built, so no request
            // of this step can be handed it (its copy runs before the forward pass).
            self.after_build.push((PoolKind::Host, old));
            r.host[p] = nbk;
            for b in core::iter::once(&mut r.indexer[p]).chain(&mut r.regular[p * nr..(p + 1) * nr])
            {
                let nbk = self.gpu.allocate().unwrap_or(0);
                self.out.gpu_cow.push(BlockPair { src: *b, dst: nbk });
                self.after_build.push((PoolKind::Gpu, *b));
                *b = nbk;
            }
            for bk in 0..nb {
                let rb = self.gpu.allocate().unwrap_or(0);
                r.resident[p * nb + bk] = rb;
                self.out.restores.push(PageTransfer {
                    bucket: bk as u32,
                    device_block: rb,
                    host_block: nbk,
                });
            }
            // Rows 0..block_size-1 are restored; the last row is written by the forward.
            r.state[p] = DIRTY;
        }
        for p in 0..hit {
            let pu = p as usize;
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: p,
                block: r.host[pu],
            });
            self.out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p,
                block: r.indexer[pu],
            });
            for gi in 0..nr {
                self.out.block_tables.push(TableUpdate {
                    slot,
                    group: self.regular_groups[gi].0,
                    page: p,
                    block: r.regular[pu * nr + gi],
                });
            }
            for bk in 0..nb {
                self.out.residency.push(TableUpdate {
                    slot,
                    group: self.kv.resident_group(bk as u32) as u32,
                    page: p,
                    block: r.resident[pu * nb + bk],
                });
            }
        }
        r.pages = hit;
        r.hit_pages = shared;
        r.host_only = shared;
        r.reclaim_cursor = shared;
        r.spill_cursor = shared;
        r.ready_prefix = shared;
        r.num_computed = computed0;
        for c in r.window_cursor.iter_mut() {
            *c = 0;
        }
        // Host blocks for the rest of the prompt.
        for p in hit..total_pages {
            let b = self.host.allocate().unwrap_or(0);
            r.host.push(b);
            self.out.new_host_blocks.push(b);
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: p,
                block: b,
            });
        }
        if shared > 0 {
            self.give_hot_region(r);
        }
        let res = self.schedule_inner(r, chunk);
        if !matches!(res, Ok(Alloc::Scheduled)) {
            // Accounting said it fits; undo everything if it did not.
            self.release_blocks(r);
            r.status = Status::Waiting;
        }
        res
    }

    fn give_hot_region(&mut self, r: &mut Req) {
        if !r.hot.is_empty() {
            return;
        }
        let cost = self.hot_cost();
        if self.gpu.num_free() < cost {
            // Callers account for the region first; never hand out a partial one.
            return;
        }
        r.hot.reserve(cost as usize);
        for _ in 0..cost {
            if let Some(b) = self.gpu.allocate() {
                r.hot.push(b);
            }
        }
        for b in 0..self.num_buckets {
            let s = (b * self.hot_per) as usize;
            self.out.hot_assign.push(HotAssignment {
                slot: r.row,
                group: self.kv.hot_group(b) as u32,
                blocks: r.hot[s..s + self.hot_per as usize].to_vec(),
            });
        }
    }

    /// Schedules `num_tokens` more tokens of running request `id` in the current step:
    /// allocates pages in every group (reclaiming resident pages when the GPU pool is short),
    /// plans the row mirrors of the rows it writes, and seals full pages.
    pub fn schedule(&mut self, id: RequestId, num_tokens: u32) -> Result<Alloc, CoordError> {
        let slot = self.slot_of_id(id)?;
        self.schedule_slot(slot, num_tokens)
    }

    fn schedule_slot(&mut self, slot: u32, num_tokens: u32) -> Result<Alloc, CoordError> {
        let Some(mut r) = self.reqs[slot as usize].take() else {
            return Err(CoordError::UnknownSlot { slot });
        };
        let res = if r.status != Status::Running {
            Err(CoordError::NotRunning { id: r.id })
        } else {
            self.schedule_inner(&mut r, num_tokens)
        };
        self.reqs[slot as usize] = Some(r);
        res
    }

    fn schedule_inner(&mut self, r: &mut Box<Req>, n: u32) -> Result<Alloc, CoordError> {
        let available = r.tokens.len() as u32 - r.num_computed;
        if n > available || n == 0 {
            return Err(CoordError::NotEnoughTokens {
                id: r.id,
                requested: n,
                available,
            });
        }
        let target = r.num_computed + n;
        let target_pages = self.kv.pages_for(target);
        let new_pages = target_pages.saturating_sub(r.pages);
        let host_need = target_pages.saturating_sub(r.host.len() as u32);
        if host_need > self.host.num_free() {
            return Ok(if self.io_in_flight() {
                Alloc::Wait
            } else {
                Alloc::NoSpace(PoolKind::Host)
            });
        }
        let gpu_need = |c: &Self, r: &Req| {
            let hot = if (r.host_only > 0 || r.pending_release > 0) && r.hot.is_empty() {
                u64::from(c.hot_cost())
            } else {
                0
            };
            u64::from(new_pages) * c.gpu_cost_per_page() + hot
        };
        let need = gpu_need(self, r);
        if need > u64::from(self.gpu.num_free()) {
            let short = need - u64::from(self.gpu.num_free());
            // The request itself is a reclaim candidate: put it back while reclaiming.
            let slot = r.slot;
            let spare = self.spare.take().unwrap_or_else(|| Box::new(empty_req()));
            self.reqs[slot as usize] = Some(core::mem::replace(r, spare));
            let want = short.max(u64::from(self.cfg.reclaim_min_blocks));
            self.reclaim_resident_blocks(want.min(u64::from(u32::MAX)) as u32);
            let back = self.reqs[slot as usize]
                .take()
                .unwrap_or_else(|| Box::new(empty_req()));
            self.spare = Some(core::mem::replace(r, back));
            if gpu_need(self, r) > u64::from(self.gpu.num_free()) {
                return Ok(if self.io_in_flight() {
                    Alloc::Wait
                } else {
                    Alloc::NoSpace(PoolKind::Gpu)
                });
            }
        }
        if (r.host_only > 0 || r.pending_release > 0) && r.hot.is_empty() {
            self.give_hot_region(r);
        }
        let slot = r.row;
        let nb = self.num_buckets;
        // Host blocks for decode growth.
        while (r.host.len() as u32) < target_pages {
            let b = self.host.allocate().unwrap_or(0);
            self.out.new_host_blocks.push(b);
            self.out.host_blocks.push(TableUpdate {
                slot,
                group: 0,
                page: r.host.len() as u32,
                block: b,
            });
            r.host.push(b);
        }
        // GPU pages.
        for p in r.pages..target_pages {
            let b = self.gpu.allocate().unwrap_or(0);
            r.indexer.push(b);
            self.out.block_tables.push(TableUpdate {
                slot,
                group: 1,
                page: p,
                block: b,
            });
            for &(g, _) in &self.regular_groups {
                let b = self.gpu.allocate().unwrap_or(0);
                r.regular.push(b);
                self.out.block_tables.push(TableUpdate {
                    slot,
                    group: g,
                    page: p,
                    block: b,
                });
            }
            for bk in 0..nb {
                let b = self.gpu.allocate().unwrap_or(0);
                r.resident.push(b);
                self.out.residency.push(TableUpdate {
                    slot,
                    group: 2 + bk,
                    page: p,
                    block: b,
                });
            }
            r.state.push(DIRTY);
            r.xfer.push(0);
        }
        r.pages = target_pages;
        let first = r.num_computed;
        r.num_computed = target;
        self.out.scheduled.push(ScheduledRequest {
            id: r.id,
            slot,
            first_token: first,
            num_tokens: n,
            fully_resident: r.host_only == 0 && r.pending_release == 0,
        });
        // Rows written and pages sealed by this step.
        let ratio = self.kv.sparse_compress_ratio;
        let bs = self.kv.block_size;
        let bt = self.kv.block_tokens;
        let (row0, row1) = (first / ratio, target / ratio);
        let sealed0 = first / bt;
        let sealed1 = target / bt;
        let id_now = self.current_xfer;
        if self.kv.config.eager_host_mirror && row1 > row0 {
            let mut row = row0;
            while row < row1 {
                let page = row / bs;
                let end = ((page + 1) * bs).min(row1);
                for bk in 0..nb {
                    self.out.row_mirrors.push(RowMirror {
                        bucket: bk,
                        span: RowSpan {
                            device_block: r.resident[(page * nb + bk) as usize],
                            host_block: r.host[page as usize],
                            first_row: row % bs,
                            num_rows: end - row,
                        },
                    });
                }
                row = end;
            }
            r.last_xfer = id_now;
            for p in sealed0..sealed1 {
                if r.state[p as usize] == DIRTY {
                    r.state[p as usize] = PENDING;
                    r.xfer[p as usize] = id_now;
                    self.pending_pages.push_back(PendingPage {
                        xfer: id_now,
                        slot: r.slot,
                        generation: r.generation,
                        page: p,
                    });
                }
            }
            r.spill_cursor = r.spill_cursor.max(sealed1);
        }
        // Hashes of newly full pages; publish GPU-only groups now (host pages publish when
        // durable).
        while (r.hashes.len() as u32) < sealed1 {
            let p = r.hashes.len() as u32;
            let parent = if p == 0 {
                HASH_SEED
            } else {
                r.hashes[p as usize - 1]
            };
            let h = chain_hash(
                parent,
                &r.tokens[(p * bt) as usize..((p + 1) * bt) as usize],
            );
            r.hashes.push(h);
        }
        if self.cfg.enable_prefix_caching && !self.has_window {
            for p in sealed0.max(r.hit_pages)..sealed1 {
                let hash = r.hashes[p as usize];
                let _ = self
                    .gpu
                    .cache(r.indexer[p as usize], BlockKey { group: 1, hash });
                let nr = self.regular_groups.len();
                for (gi, &(g, _)) in self.regular_groups.iter().enumerate() {
                    let _ = self
                        .gpu
                        .cache(r.regular[p as usize * nr + gi], BlockKey { group: g, hash });
                }
            }
        }
        // Sliding windows: give back blocks wholly before `num_computed - window`.
        if self.has_window {
            let nr = self.regular_groups.len();
            for gi in 0..nr {
                let (g, Some(w)) = self.regular_groups[gi] else {
                    continue;
                };
                let keep_from = target.saturating_sub(w) / bt;
                while r.window_cursor[gi] < keep_from {
                    let p = r.window_cursor[gi];
                    let i = p as usize * nr + gi;
                    let b = core::mem::replace(&mut r.regular[i], 0);
                    if b != 0 {
                        self.gpu.free(b)?;
                        self.out.block_tables.push(TableUpdate {
                            slot,
                            group: g,
                            page: p,
                            block: 0,
                        });
                    }
                    r.window_cursor[gi] += 1;
                }
            }
        }
        Ok(Alloc::Scheduled)
    }

    /// Frees GPU blocks by reclaiming clean resident pages (SPEC §4): visits running requests
    /// with the most candidates first, oldest pages first; releases clean pages at once, marks
    /// pending ones release-after-transfer (and, without eager mirroring, plans the spill of
    /// dirty full pages with release-after-transfer); converts a request without a hot region
    /// only when the pages it frees exceed the region's cost. Returns the blocks freed now.
    pub fn reclaim_resident_blocks(&mut self, shortfall: u32) -> u32 {
        let mut scratch = core::mem::take(&mut self.scratch);
        scratch.clear();
        for &idx in &self.running {
            if let Some(r) = &self.reqs[idx as usize] {
                let c = candidates(r, self.kv.block_tokens);
                if c > 0 {
                    scratch.push((c, idx));
                }
            }
        }
        // Most candidates first; ties by age (running order is admission order).
        scratch.sort_by_key(|a| core::cmp::Reverse(a.0));
        let nb = self.num_buckets;
        let hot_cost = self.hot_cost();
        let mut freed = 0u32;
        let mut progress = 0u32;
        for &(c, idx) in &scratch {
            if progress >= shortfall {
                break;
            }
            let Some(mut r) = self.reqs[idx as usize].take() else {
                continue;
            };
            let limit = reclaim_limit(&r, self.kv.block_tokens);
            let converting = r.hot.is_empty();
            if converting {
                // Worth it only when the pages it frees exceed the region's cost, and possible
                // only when the region can be paid once its clean pages are released.
                let clean = (r.reclaim_cursor..limit)
                    .filter(|&p| r.state[p as usize] == CLEAN)
                    .count() as u32;
                if c <= self.hot_per || self.gpu.num_free() + clean * nb < hot_cost {
                    self.reqs[idx as usize] = Some(r);
                    continue;
                }
            }
            let mut p = r.reclaim_cursor;
            // A converted request gives up every candidate: the region is paid for once.
            while p < limit && (converting || progress < shortfall) {
                match r.state[p as usize] {
                    CLEAN => {
                        self.release_page(&mut r, p);
                        freed += nb;
                        progress += nb;
                    }
                    PENDING => {
                        r.state[p as usize] = PENDING_RELEASE;
                        r.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    DIRTY => {
                        // Full but not yet transferred (eager mirroring off): spill it now.
                        self.plan_spill(&mut r, p);
                        r.state[p as usize] = PENDING_RELEASE;
                        r.pending_release += 1;
                        self.in_flight_release += nb;
                        progress += nb;
                    }
                    _ => {}
                }
                p += 1;
            }
            r.reclaim_cursor = p;
            if converting {
                self.give_hot_region(&mut r);
                freed = freed.saturating_sub(hot_cost);
                progress = progress.saturating_sub(hot_cost);
            }
            self.reqs[idx as usize] = Some(r);
        }
        self.scratch = scratch;
        freed
    }

    fn release_page(&mut self, r: &mut Req, p: u32) {
        let nb = self.num_buckets;
        for bk in 0..nb {
            let i = (p * nb + bk) as usize;
            let b = core::mem::replace(&mut r.resident[i], 0);
            if b != 0 {
                let _ = self.gpu.free(b);
            }
            self.out.residency.push(TableUpdate {
                slot: r.row,
                group: 2 + bk,
                page: p,
                block: 0,
            });
        }
        r.state[p as usize] = RECLAIMED;
        r.host_only += 1;
    }

    fn plan_spill(&mut self, r: &mut Req, p: u32) {
        let id_now = self.current_xfer;
        for bk in 0..self.num_buckets {
            self.out.page_transfers.push(PageTransfer {
                bucket: bk,
                device_block: r.resident[(p * self.num_buckets + bk) as usize],
                host_block: r.host[p as usize],
            });
        }
        r.state[p as usize] = PENDING;
        r.xfer[p as usize] = id_now;
        r.last_xfer = id_now;
        self.pending_pages.push_back(PendingPage {
            xfer: id_now,
            slot: r.slot,
            generation: r.generation,
            page: p,
        });
        if p >= r.spill_cursor {
            r.spill_cursor = p + 1;
        }
    }

    /// Runs the built-in policy for one step (see the module docs) without building the
    /// command; [`Coordinator::build_offload_command`] ends the step.
    pub fn schedule_step(&mut self) -> Result<StepSummary, CoordError> {
        let mut sum = StepSummary::default();
        let mut budget = self.cfg.max_batched_tokens;
        let mql = self.kv.config.max_query_len;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let Some(r) = self.reqs[slot as usize].as_ref() else {
                i += 1;
                continue;
            };
            let left = r.tokens.len() as u32 - r.num_computed;
            let prefilling = r.num_computed < r.tokens.len() as u32 - 1;
            if left == 0 {
                i += 1;
                continue;
            }
            let n = if prefilling {
                left.min(budget)
            } else {
                left.min(mql).min(budget)
            };
            match self.schedule_slot(slot, n)? {
                Alloc::Scheduled => {
                    sum.scheduled += 1;
                    sum.tokens += n;
                    budget -= n;
                    i += 1;
                }
                Alloc::Wait => {
                    sum.waiting_on_reclaim += 1;
                    i += 1;
                }
                Alloc::NoSpace(_) => {
                    // Preempt the newest running request; possibly this one.
                    let victim = *self.running.last().unwrap_or(&slot);
                    self.preempt_slot(victim)?;
                    sum.preempted += 1;
                    if victim == slot {
                        // `running[i]` is now the next request.
                        continue;
                    }
                }
            }
        }
        // Start waiting requests while budget and slots allow; never preempt for them, and not
        // at all in a step where a running request had to wait or be preempted (the memory it
        // needs comes first; a victim must not restart at once).
        let pressed = sum.preempted > 0 || sum.waiting_on_reclaim > 0;
        while !pressed && budget > 0 && (self.running.len() as u32) < self.cfg.max_running {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            let Some(id) = self.reqs[slot as usize].as_ref().map(|r| r.id) else {
                self.waiting.pop_front();
                continue;
            };
            match self.start(id, budget)? {
                Alloc::Scheduled => {
                    let n = self.out.scheduled.last().map_or(0, |s| s.num_tokens);
                    sum.scheduled += 1;
                    sum.started += 1;
                    sum.tokens += n;
                    budget = budget.saturating_sub(n);
                }
                Alloc::Wait => {
                    sum.waiting_on_reclaim += 1;
                    break;
                }
                Alloc::NoSpace(_) => break,
            }
        }
        Ok(sum)
    }

    /// Runs [`Coordinator::schedule_step`] and returns the step's command.
    pub fn step(&mut self) -> Result<OffloadCommand, CoordError> {
        self.schedule_step()?;
        Ok(self.build_offload_command())
    }

    /// Ends the current step and returns its command (see [`OffloadCommand`]).
    pub fn build_offload_command(&mut self) -> OffloadCommand {
        let mut cmd = OffloadCommand::default();
        self.build_offload_command_into(&mut cmd);
        cmd
    }

    /// Like [`Coordinator::build_offload_command`], reusing `cmd`'s buffers (no allocation in
    /// steady state).
    pub fn build_offload_command_into(&mut self, cmd: &mut OffloadCommand) {
        // Spills when eager mirroring is off.
        if !self.kv.config.eager_host_mirror {
            let mut budget = self.cfg.max_spill_pages_per_step;
            let mut i = 0;
            while i < self.running.len() && budget > 0 {
                let slot = self.running[i];
                if let Some(mut r) = self.reqs[slot as usize].take() {
                    let sealed = r.num_computed / self.kv.block_tokens;
                    while r.spill_cursor < sealed && budget > 0 {
                        let p = r.spill_cursor;
                        if r.state[p as usize] == DIRTY {
                            self.plan_spill(&mut r, p);
                            budget -= 1;
                        }
                        r.spill_cursor = r.spill_cursor.max(p + 1);
                    }
                    self.reqs[slot as usize] = Some(r);
                }
                i += 1;
            }
        }
        self.step_no += 1;
        self.out.step = self.step_no;
        // Reclaim later in the step may have changed residency: decide now.
        let mut all = true;
        for s in self.out.scheduled.iter_mut() {
            let idx = self.row_owner[s.slot as usize];
            s.fully_resident = self.reqs[idx as usize]
                .as_ref()
                .is_some_and(|r| r.host_only == 0);
            all &= s.fully_resident;
        }
        self.out.fully_resident = all;
        if self.out.has_copies() {
            self.out.transfer_id = Some(self.current_xfer);
            self.current_xfer += 1;
        } else {
            self.out.transfer_id = None;
        }
        core::mem::swap(cmd, &mut self.out);
        self.out.clear();
        for (pool, b) in self.after_build.drain(..) {
            let _ = match pool {
                PoolKind::Gpu => self.gpu.free(b),
                PoolKind::Host => self.host.free(b),
            };
        }
    }

    /// Records a worker's progress: transfer ids it has `enqueued` and `completed`, each in FIFO
    /// order. When every worker has completed a transfer, its effects apply (see the module
    /// docs).
    pub fn report(
        &mut self,
        worker: u32,
        enqueued: &[u64],
        completed: &[u64],
    ) -> Result<(), CoordError> {
        let issued = self.current_xfer - 1;
        let w = self
            .workers
            .get_mut(worker as usize)
            .ok_or(CoordError::UnknownWorker {
                worker,
                num_workers: self.cfg.num_workers,
            })?;
        // Validate everything before changing anything.
        let (mut e, mut c) = (w.enqueued, w.completed);
        for &id in enqueued {
            if id != e + 1 || id > issued {
                return Err(CoordError::OutOfOrderReport {
                    worker,
                    what: "enqueued",
                    id,
                    expected: e + 1,
                });
            }
            e = id;
        }
        for &id in completed {
            if id != c + 1 || id > e {
                return Err(CoordError::OutOfOrderReport {
                    worker,
                    what: "completed",
                    id,
                    expected: c + 1,
                });
            }
            c = id;
        }
        w.enqueued = e;
        w.completed = c;
        let durable = self.workers.iter().map(|w| w.completed).min().unwrap_or(0);
        if durable > self.durable {
            self.durable = durable;
            self.apply_durable();
        }
        Ok(())
    }

    fn apply_durable(&mut self) {
        // Releases of finished requests wait for the last transfer that touched them; those
        // ids are not monotone across requests, so sweep the (short) queue.
        let durable = self.durable;
        let (gpu, host) = (&mut self.gpu, &mut self.host);
        self.deferred.retain(|&(x, pool, b)| {
            if x > durable {
                return true;
            }
            let _ = match pool {
                PoolKind::Gpu => gpu.free(b),
                PoolKind::Host => host.free(b),
            };
            false
        });
        let nb = self.num_buckets;
        while let Some(&pp) = self.pending_pages.front() {
            if pp.xfer > self.durable {
                break;
            }
            self.pending_pages.pop_front();
            let Some(mut r) = self.reqs[pp.slot as usize].take() else {
                continue;
            };
            if r.generation == pp.generation
                && r.status == Status::Running
                && r.xfer.get(pp.page as usize) == Some(&pp.xfer)
            {
                match r.state[pp.page as usize] {
                    PENDING => r.state[pp.page as usize] = CLEAN,
                    PENDING_RELEASE => {
                        self.release_page(&mut r, pp.page);
                        r.pending_release -= 1;
                        self.in_flight_release -= nb;
                    }
                    _ => {}
                }
                self.advance_ready(&mut r);
            }
            self.reqs[pp.slot as usize] = Some(r);
        }
    }

    fn advance_ready(&mut self, r: &mut Req) {
        let sealed = r.num_computed / self.kv.block_tokens;
        while r.ready_prefix < sealed
            && matches!(r.state[r.ready_prefix as usize], CLEAN | RECLAIMED)
        {
            let p = r.ready_prefix as usize;
            if self.cfg.enable_prefix_caching && !self.has_window && p < r.hashes.len() {
                let _ = self.host.cache(
                    r.host[p],
                    BlockKey {
                        group: 0,
                        hash: r.hashes[p],
                    },
                );
            }
            r.ready_prefix += 1;
        }
    }

    /// Gives back every block of `r` (deferring those an issued, unfinished transfer touches)
    /// and purges its entries from the current step's command.
    fn release_blocks(&mut self, r: &mut Req) {
        let issued = self.current_xfer - 1;
        let defer_until = if r.last_xfer > self.durable && r.last_xfer <= issued {
            Some(r.last_xfer)
        } else {
            None
        };
        if r.row != NO_ROW {
            self.out.purge_slot(r.row);
        }
        if r.last_xfer == self.current_xfer {
            // Its copies in the unbuilt batch must not run: drop them.
            let host = &r.host;
            let resident = &r.resident;
            self.out.row_mirrors.retain(|m| {
                !(host.contains(&m.span.host_block) && resident.contains(&m.span.device_block))
            });
            self.out
                .page_transfers
                .retain(|m| !(host.contains(&m.host_block) && resident.contains(&m.device_block)));
        }
        // Copy-on-write and restores into its blocks must not run either.
        if !(self.out.host_cow.is_empty()
            && self.out.gpu_cow.is_empty()
            && self.out.restores.is_empty())
        {
            let (host, idx, reg, res) = (&r.host, &r.indexer, &r.regular, &r.resident);
            self.out.host_cow.retain(|p| !host.contains(&p.dst));
            self.out
                .gpu_cow
                .retain(|p| !idx.contains(&p.dst) && !reg.contains(&p.dst));
            self.out.restores.retain(|t| !res.contains(&t.device_block));
        }
        // GPU: resident pages and hot region, then indexer and regular (reverse order).
        let mut scratch = core::mem::take(&mut self.scratch_blocks);
        scratch.clear();
        scratch.extend(r.indexer.iter().copied());
        scratch.extend(r.regular.iter().copied());
        scratch.extend(r.resident.iter().copied());
        for &b in scratch.iter().rev() {
            if b == 0 {
                continue;
            }
            match defer_until {
                Some(x) => self.deferred.push_back((x, PoolKind::Gpu, b)),
                None => {
                    let _ = self.gpu.free(b);
                }
            }
        }
        for &b in r.hot.iter().rev() {
            let _ = self.gpu.free(b);
        }
        for &b in r.host.iter().rev() {
            if b == 0 {
                continue;
            }
            match defer_until {
                Some(x) => self.deferred.push_back((x, PoolKind::Host, b)),
                None => {
                    let _ = self.host.free(b);
                }
            }
        }
        self.scratch_blocks = scratch;
        if !r.hot.is_empty() {
            self.out.hot_release.push(r.row);
        }
        if r.row != NO_ROW {
            self.row_owner[r.row as usize] = NO_ROW;
            self.free_rows.push(r.row);
            r.row = NO_ROW;
        }
        self.in_flight_release -= r.pending_release * self.num_buckets;
        r.pending_release = 0;
        r.hot.clear();
        r.host.clear();
        r.indexer.clear();
        r.regular.clear();
        r.resident.clear();
        r.state.clear();
        r.xfer.clear();
        r.pages = 0;
        r.num_computed = 0;
        r.host_only = 0;
        r.reclaim_cursor = 0;
        r.spill_cursor = 0;
        r.ready_prefix = 0;
        r.hit_pages = 0;
        r.last_xfer = 0;
        self.generation = self.generation.wrapping_add(1);
        r.generation = self.generation;
    }

    /// Preempts running request `id`: gives back its blocks and queues it at the front of the
    /// waiting queue; its tokens are recomputed when it restarts (durable prefix pages are found
    /// again through the host prefix cache).
    pub fn preempt(&mut self, id: RequestId) -> Result<(), CoordError> {
        let slot = self.slot_of_id(id)?;
        if self.reqs[slot as usize].as_ref().map(|r| r.status) != Some(Status::Running) {
            return Err(CoordError::NotRunning { id });
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

    fn running_req(&self, id: RequestId) -> Result<&Req, CoordError> {
        let r = self.req(id).ok_or(CoordError::UnknownRequest { id })?;
        if r.status != Status::Running {
            return Err(CoordError::NotRunning { id });
        }
        Ok(r)
    }

    /// Writes the request's resident table for `bucket` as an `i32` row: page → GPU block, `0`
    /// (the null block) for pages read from host and for pages beyond the request. Writes
    /// `min(out.len(), max_pages)` entries.
    pub fn resident_row(
        &self,
        id: RequestId,
        bucket: u32,
        out: &mut [i32],
    ) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let nb = self.num_buckets as usize;
        for (p, o) in out.iter_mut().enumerate() {
            *o = if p < r.pages as usize && (bucket as usize) < nb {
                r.resident[p * nb + bucket as usize] as i32
            } else {
                0
            };
        }
        Ok(())
    }

    /// Writes the request's host table as an `i32` row: page → host block, `-1` beyond the
    /// request.
    pub fn host_row(&self, id: RequestId, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        for (p, o) in out.iter_mut().enumerate() {
            *o = r.host.get(p).map_or(-1, |&b| b as i32);
        }
        Ok(())
    }

    /// Writes the request's hot region for `bucket` as an `i32` row of `hot_blocks_per_request`
    /// GPU blocks, or `-1`s when it has none.
    pub fn hot_row(&self, id: RequestId, bucket: u32, out: &mut [i32]) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let s = (u64::from(bucket) * u64::from(self.hot_per)).min(usize::MAX as u64) as usize;
        for (i, o) in out.iter_mut().enumerate() {
            *o = if i < self.hot_per as usize && bucket < self.num_buckets {
                r.hot.get(s + i).map_or(-1, |&b| b as i32)
            } else {
                -1
            };
        }
        Ok(())
    }

    /// Writes the request's block table of layout group `group` (indexer, resident or regular)
    /// as an `i32` row: page → GPU block, `0` for null entries and pages beyond the request.
    pub fn block_table_row(
        &self,
        id: RequestId,
        group: usize,
        out: &mut [i32],
    ) -> Result<(), CoordError> {
        let r = self.running_req(id)?;
        let kind = self.kv.groups.get(group).map(|g| g.kind);
        let nr = self.regular_groups.len();
        for (p, o) in out.iter_mut().enumerate() {
            *o = if p >= r.pages as usize {
                0
            } else {
                match kind {
                    Some(GroupKind::Indexer) => r.indexer[p] as i32,
                    Some(GroupKind::Resident) => {
                        let b = self.kv.groups[group].bucket.unwrap_or(0) as usize;
                        r.resident[p * self.num_buckets as usize + b] as i32
                    }
                    Some(GroupKind::Regular) => {
                        let gi = group - self.kv.regular_groups().start;
                        r.regular[p * nr + gi] as i32
                    }
                    Some(GroupKind::Source) => r.host[p] as i32,
                    _ => 0,
                }
            };
        }
        Ok(())
    }

    /// Checks every invariant (O(everything); for tests and debugging): pool accounting (every
    /// block's reference count equals the references requests, hot regions and deferred frees
    /// hold — no leak, no double free), no page reclaimed before its host copy is durable, the
    /// last `ACTIVE_TAIL_PAGES` pages of a running request never reclaimed, host prefix hashes
    /// only on durable pages, hot regions whole and present whenever a page reads from host, and
    /// slot bookkeeping.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.gpu
            .check_invariants()
            .map_err(|w| violation(w, None, None))?;
        self.host
            .check_invariants()
            .map_err(|w| violation(w, None, None))?;
        let mut gpu_refs = vec![0u32; self.kv.num_gpu_blocks as usize];
        let mut host_refs = vec![0u32; self.kv.host_num_blocks as usize];
        let nb = self.num_buckets as usize;
        let bt = self.kv.block_tokens;
        let mut in_flight = 0u32;
        let mut seen = 0usize;
        for (slot, r) in self.reqs.iter().enumerate() {
            let Some(r) = r else { continue };
            seen += 1;
            let rid = Some(r.id);
            if r.slot as usize != slot || self.ids.get(&r.id) != Some(&(slot as u32)) {
                return Err(violation("slot bookkeeping", rid, Some(slot as u32)));
            }
            let running = self.running.contains(&(slot as u32));
            let waiting = self.waiting.contains(&(slot as u32));
            if running == waiting || running != (r.status == Status::Running) {
                return Err(violation("request in exactly one queue", rid, None));
            }
            if r.status == Status::Waiting {
                if !(r.host.is_empty() && r.resident.is_empty() && r.hot.is_empty()) {
                    return Err(violation("waiting request holds blocks", rid, None));
                }
                continue;
            }
            for &b in r
                .indexer
                .iter()
                .chain(&r.regular)
                .chain(&r.resident)
                .chain(&r.hot)
            {
                if b != 0 {
                    gpu_refs[b as usize] += 1;
                }
            }
            for &b in &r.host {
                host_refs[b as usize] += 1;
            }
            if !r.hot.is_empty() && r.hot.len() != self.hot_cost() as usize {
                return Err(violation("partial hot region", rid, None));
            }
            if (r.host_only > 0 || r.pending_release > 0) && r.hot.is_empty() {
                return Err(violation("reads from host without a hot region", rid, None));
            }
            let pages = r.pages;
            if r.state.len() != pages as usize || r.resident.len() != pages as usize * nb {
                return Err(violation("table length", rid, None));
            }
            let (mut host_only, mut pend) = (0, 0);
            for p in 0..pages {
                let s = r.state[p as usize];
                let null = r.resident[p as usize * nb..(p as usize + 1) * nb]
                    .iter()
                    .all(|&b| b == 0);
                let any_null = r.resident[p as usize * nb..(p as usize + 1) * nb].contains(&0);
                if (s == RECLAIMED) != null || (s != RECLAIMED && any_null) {
                    return Err(violation(
                        "resident entries disagree with page state",
                        rid,
                        Some(p),
                    ));
                }
                if s == RECLAIMED {
                    host_only += 1;
                    if r.xfer[p as usize] > self.durable {
                        return Err(violation(
                            "page reclaimed before its host copy is durable",
                            rid,
                            Some(p),
                        ));
                    }
                    if p >= r.hit_pages && p + ACTIVE_TAIL_PAGES >= pages {
                        return Err(violation("active tail page reclaimed", rid, Some(p)));
                    }
                }
                if s == PENDING_RELEASE {
                    pend += 1;
                    if p + ACTIVE_TAIL_PAGES >= pages {
                        return Err(violation(
                            "active tail page marked for release",
                            rid,
                            Some(p),
                        ));
                    }
                }
                if (s == CLEAN || s == RECLAIMED) && r.xfer[p as usize] > self.durable {
                    return Err(violation("clean page not durable", rid, Some(p)));
                }
                if (s != DIRTY) && (p + 1) * bt > r.num_computed {
                    return Err(violation(
                        "unsealed page left the dirty state",
                        rid,
                        Some(p),
                    ));
                }
            }
            if host_only != r.host_only || pend != r.pending_release {
                return Err(violation("page counters", rid, None));
            }
            in_flight += pend * self.num_buckets;
            for p in 0..r.host.len() as u32 {
                let durable = p < r.ready_prefix;
                if !durable && self.host.key_of(r.host[p as usize]).is_some() {
                    return Err(violation(
                        "host prefix hash published past the durable prefix",
                        rid,
                        Some(p),
                    ));
                }
            }
            for p in 0..r.ready_prefix {
                if !matches!(r.state[p as usize], CLEAN | RECLAIMED) {
                    return Err(violation(
                        "ready prefix covers a page that is not durable",
                        rid,
                        Some(p),
                    ));
                }
            }
        }
        if seen != self.ids.len() {
            return Err(violation("id map size", None, None));
        }
        if in_flight != self.in_flight_release {
            return Err(violation("in-flight release counter", None, None));
        }
        for &(pool, b) in &self.after_build {
            match pool {
                PoolKind::Gpu => gpu_refs[b as usize] += 1,
                PoolKind::Host => host_refs[b as usize] += 1,
            }
        }
        for &(x, pool, b) in &self.deferred {
            if x <= self.durable {
                return Err(violation("deferred free past durable", None, Some(b)));
            }
            match pool {
                PoolKind::Gpu => gpu_refs[b as usize] += 1,
                PoolKind::Host => host_refs[b as usize] += 1,
            }
        }
        for (b, &want) in gpu_refs.iter().enumerate().skip(1) {
            if self.gpu.ref_count(b as u32) != want {
                return Err(violation(
                    "GPU block reference count (leak or double free)",
                    None,
                    Some(b as u32),
                ));
            }
        }
        for (b, &want) in host_refs.iter().enumerate().skip(1) {
            if self.host.ref_count(b as u32) != want {
                return Err(violation(
                    "host block reference count (leak or double free)",
                    None,
                    Some(b as u32),
                ));
            }
        }
        Ok(())
    }
}

/// Structural checks of a layout (one from `plan_layout` always passes), so that a hand-edited
/// one gives a typed error instead of a panic.
fn check_layout(kv: &KvCacheConfig) -> Result<(), CoordError> {
    let bad = |what| Err(CoordError::InvalidLayout { what });
    let nb = kv.num_buckets as usize;
    if kv.block_tokens == 0 || kv.block_size == 0 || kv.sparse_compress_ratio == 0 {
        return bad("zero block size");
    }
    if u64::from(kv.block_size) * u64::from(kv.sparse_compress_ratio) != u64::from(kv.block_tokens)
    {
        return bad("block_tokens != block_size * sparse_compress_ratio");
    }
    if nb == 0 || kv.hot_blocks_per_request == 0 {
        return bad("no buckets or no hot blocks");
    }
    if kv.max_model_len == 0
        || kv.max_pages_per_request != kv.max_model_len.div_ceil(kv.block_tokens)
    {
        return bad("max_pages_per_request");
    }
    if kv.groups.len() < 2 + 2 * nb
        || kv.groups[0].kind != GroupKind::Source
        || kv.groups[1].kind != GroupKind::Indexer
    {
        return bad("group order");
    }
    for b in 0..nb {
        if kv.groups[2 + b].kind != GroupKind::Resident
            || kv.groups[2 + nb + b].kind != GroupKind::Hot
        {
            return bad("group order");
        }
    }
    if kv.groups[2 + 2 * nb..]
        .iter()
        .any(|g| g.kind != GroupKind::Regular || g.layers.is_empty())
    {
        return bad("regular groups");
    }
    Ok(())
}

fn reclaim_limit(r: &Req, bt: u32) -> u32 {
    let sealed = r.num_computed / bt;
    r.pages.saturating_sub(ACTIVE_TAIL_PAGES).min(sealed)
}

fn candidates(r: &Req, bt: u32) -> u32 {
    reclaim_limit(r, bt).saturating_sub(r.reclaim_cursor)
}

fn empty_req() -> Req {
    Req {
        id: 0,
        generation: 0,
        status: Status::Waiting,
        slot: 0,
        row: NO_ROW,
        tokens: Vec::new(),
        num_computed: 0,
        pages: 0,
        host: Vec::new(),
        indexer: Vec::new(),
        regular: Vec::new(),
        resident: Vec::new(),
        state: Vec::new(),
        xfer: Vec::new(),
        hashes: Vec::new(),
        hot: Vec::new(),
        reclaim_cursor: 0,
        spill_cursor: 0,
        host_only: 0,
        pending_release: 0,
        ready_prefix: 0,
        hit_pages: 0,
        window_cursor: Vec::new(),
        last_xfer: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HiSparseConfig;
    use crate::layout::{LayoutInput, plan_layout};
    use crate::model::{LayerSpec, ModelSpec};

    /// Two sparse leaders (16 B rows, 16 B indexer rows), 4-token blocks: one bucket of both
    /// layers, so a page costs 2 GPU blocks (indexer + resident) and a hot region 2 blocks.
    const LAYERS: [LayerSpec; 2] = [
        LayerSpec::sparse_leader(16, 16),
        LayerSpec::sparse_leader(16, 16),
    ];
    const MODEL: ModelSpec<'static> = ModelSpec {
        name: "tiny",
        block_tokens: 4,
        top_k: 4,
        layers: &LAYERS,
    };

    fn coord(gpu_blocks: u32, eager: bool, workers: u32) -> Coordinator {
        coord_len(gpu_blocks, eager, workers, 48)
    }

    fn coord_len(gpu_blocks: u32, eager: bool, workers: u32, max_len: u32) -> Coordinator {
        let mut cfg = HiSparseConfig::new(4, 64 * 128);
        cfg.device_buffer_size = Some(8);
        cfg.eager_host_mirror = eager;
        let mut input = LayoutInput::new(&MODEL, &cfg, 0, max_len);
        input.num_gpu_blocks_override = Some(gpu_blocks);
        let kv = plan_layout(&input).unwrap();
        assert_eq!(
            (
                kv.num_buckets,
                kv.hot_blocks_per_request,
                kv.host_num_blocks
            ),
            (1, 2, 64)
        );
        Coordinator::new(
            kv,
            CoordinatorConfig {
                max_running: 4,
                max_batched_tokens: 64,
                max_spill_pages_per_step: 2,
                num_workers: workers,
                enable_prefix_caching: true,
                reclaim_min_blocks: 0,
            },
        )
        .unwrap()
    }

    fn toks(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    fn row(c: &Coordinator, id: RequestId) -> Vec<i32> {
        let mut v = vec![0; c.max_pages() as usize];
        c.resident_row(id, 0, &mut v).unwrap();
        v
    }

    #[test]
    fn prefill_mirrors_then_reclaim_converts_oldest_first() {
        let mut c = coord(40, true, 1);
        c.admit(1, &toks(40)).unwrap();
        let cmd = c.step().unwrap();
        assert_eq!(cmd.started, [0]);
        assert_eq!(cmd.scheduled.len(), 1);
        assert_eq!(cmd.scheduled[0].num_tokens, 40);
        assert!(cmd.fully_resident);
        // Page p: indexer block 1 + 2p, resident block 2 + 2p; host blocks 1..=10.
        assert_eq!(&row(&c, 1)[..10], &[2, 4, 6, 8, 10, 12, 14, 16, 18, 20]);
        // One coalesced mirror span per page.
        assert_eq!(cmd.row_mirrors.len(), 10);
        assert_eq!(
            cmd.row_mirrors[3].span,
            RowSpan {
                device_block: 8,
                host_block: 4,
                first_row: 0,
                num_rows: 4
            }
        );
        assert_eq!(cmd.transfer_id, Some(1));
        assert_eq!(c.page_state(1, 0), Some(PageState::Pending));
        assert_eq!(c.ready_prefix_pages(1), Some(0));
        // Nothing is clean yet: reclaim marks pending pages and frees nothing now.
        c.report(0, &[1], &[]).unwrap();
        assert_eq!(c.ready_prefix_pages(1), Some(0));
        c.report(0, &[], &[1]).unwrap();
        assert_eq!(c.ready_prefix_pages(1), Some(10));
        assert_eq!(c.page_state(1, 9), Some(PageState::Clean));
        // 8 candidates (10 pages minus the 2-page tail) > 2 hot blocks: convert, releasing all 8
        // clean pages (8 blocks) and paying 2 for the hot region.
        assert_eq!(c.reclaim_resident_blocks(3), 6);
        assert_eq!(&row(&c, 1)[..10], &[0, 0, 0, 0, 0, 0, 0, 0, 18, 20]);
        assert_eq!(c.page_state(1, 7), Some(PageState::Reclaimed));
        assert_eq!(c.page_state(1, 8), Some(PageState::Clean));
        // Blocks 21..=39 were free; the hot region takes the head of the LRU queue.
        let mut hot = [0i32; 2];
        c.hot_row(1, 0, &mut hot).unwrap();
        assert_eq!(hot, [21, 22]);
        let cmd = c.build_offload_command();
        assert_eq!(cmd.residency.len(), 8);
        assert!(cmd.residency.iter().all(|u| u.block == 0 && u.group == 2));
        assert_eq!(cmd.hot_assign.len(), 1);
        assert_eq!(cmd.hot_assign[0].blocks, [21, 22]);
        assert_eq!(cmd.hot_assign[0].group, 3);
        c.check_invariants().unwrap();
        // Decode: the next token reads from host.
        c.append_tokens(1, &[9]).unwrap();
        let cmd = c.step().unwrap();
        assert!(!cmd.fully_resident);
        assert_eq!(cmd.scheduled[0].first_token, 40);
        c.finish(1).unwrap();
        c.check_invariants().unwrap();
    }

    #[test]
    fn wait_while_reclaim_in_flight_then_admit() {
        let mut c = coord(25, true, 1);
        c.admit(1, &toks(40)).unwrap();
        c.step().unwrap(); // 20 blocks, transfer 1 in flight
        let other: Vec<u32> = (100..112).collect(); // no prefix in common
        c.admit(2, &other).unwrap(); // needs 6 blocks, 4 free
        let sum = c.schedule_step().unwrap();
        // Request 1's 8 old pages are marked release-after-transfer (it gets its hot region
        // now), so request 2 waits instead of preempting anyone.
        assert_eq!(sum.waiting_on_reclaim, 1);
        assert_eq!(sum.preempted, 0);
        assert_eq!(c.page_state(1, 0), Some(PageState::PendingRelease));
        assert_eq!(c.has_hot_region(1), Some(true));
        let cmd = c.build_offload_command();
        assert_eq!(cmd.transfer_id, None);
        assert!(cmd.residency.is_empty());
        c.check_invariants().unwrap();
        c.report(0, &[1], &[1]).unwrap();
        assert_eq!(c.page_state(1, 0), Some(PageState::Reclaimed));
        // 24 usable - 20 (request 1) - 2 (its hot region) + 8 released.
        assert_eq!(c.gpu_pool().num_free(), 10);
        let cmd = c.step().unwrap();
        // The releases travel in the next command, with request 2's start.
        assert_eq!(cmd.residency.iter().filter(|u| u.block == 0).count(), 8);
        assert_eq!(cmd.scheduled.len(), 1);
        assert_eq!(cmd.scheduled[0].id, 2);
        c.check_invariants().unwrap();
    }

    #[test]
    fn no_space_preempts_the_newest() {
        // 8 usable blocks: two 2-page requests fill them; growth needs a page.
        let mut c = coord_len(9, true, 1, 12);
        c.admit(1, &toks(8)).unwrap();
        c.admit(2, &toks(8)).unwrap();
        let cmd = c.step().unwrap();
        assert_eq!(cmd.scheduled.len(), 2);
        c.report(0, &[1], &[1]).unwrap();
        c.append_tokens(1, &[1]).unwrap();
        c.append_tokens(2, &[1]).unwrap();
        let cmd = c.step().unwrap();
        assert_eq!(cmd.preempted, [2]);
        assert_eq!(cmd.scheduled.len(), 1);
        assert_eq!(cmd.scheduled[0].id, 1);
        assert_eq!(c.slot_of(2), None);
        assert_eq!(c.num_waiting(), 1);
        c.check_invariants().unwrap();
        // Request 2 restarts later and recomputes its 9 tokens.
        c.finish(1).unwrap();
        c.report(0, &[2], &[2]).unwrap();
        let cmd = c.step().unwrap();
        assert_eq!(cmd.scheduled[0].id, 2);
        c.check_invariants().unwrap();
    }

    #[test]
    fn several_workers_and_fifo_reports() {
        let mut c = coord(40, true, 2);
        c.admit(1, &toks(8)).unwrap();
        assert_eq!(c.step().unwrap().transfer_id, Some(1));
        c.append_tokens(1, &[5]).unwrap();
        assert_eq!(c.step().unwrap().transfer_id, Some(2));
        assert_eq!(
            c.report(2, &[1], &[]),
            Err(CoordError::UnknownWorker {
                worker: 2,
                num_workers: 2
            })
        );
        assert_eq!(
            c.report(0, &[2], &[]),
            Err(CoordError::OutOfOrderReport {
                worker: 0,
                what: "enqueued",
                id: 2,
                expected: 1
            })
        );
        assert_eq!(
            c.report(0, &[1], &[2]),
            Err(CoordError::OutOfOrderReport {
                worker: 0,
                what: "completed",
                id: 2,
                expected: 1
            })
        );
        assert!(c.report(0, &[3], &[]).is_err()); // never issued
        c.report(0, &[1, 2], &[1, 2]).unwrap();
        assert_eq!(c.durable_transfer(), 0);
        assert_eq!(c.ready_prefix_pages(1), Some(0));
        c.report(1, &[1], &[1]).unwrap();
        assert_eq!(c.durable_transfer(), 1);
        assert_eq!(c.ready_prefix_pages(1), Some(2));
        c.report(1, &[2], &[2]).unwrap();
        assert_eq!(c.durable_transfer(), 2);
        c.check_invariants().unwrap();
    }

    #[test]
    fn prefix_hits_and_copy_on_write_tail() {
        let mut c = coord(40, true, 1);
        c.admit(1, &toks(8)).unwrap();
        c.step().unwrap();
        let mut host_a = vec![0; c.max_pages() as usize];
        c.host_row(1, &mut host_a).unwrap();
        // Not durable yet: no hit.
        c.admit(2, &toks(12)).unwrap();
        let cmd = c.step().unwrap();
        assert_eq!(cmd.scheduled[0].first_token, 0);
        c.finish(2).unwrap();
        c.report(0, &[1, 2], &[1, 2]).unwrap();
        c.finish(1).unwrap();
        // Same 8-token prompt: both pages hit, the last one becomes a copy-on-write tail and
        // only the last token is computed.
        c.admit(3, &toks(8)).unwrap();
        let cmd = c.step().unwrap();
        let s = cmd.scheduled[0];
        assert_eq!(
            (s.first_token, s.num_tokens, s.fully_resident),
            (7, 1, false)
        );
        assert_eq!(cmd.host_cow.len(), 1);
        assert_eq!(cmd.host_cow[0].src, host_a[1] as u32);
        assert_eq!(cmd.gpu_cow.len(), 1);
        assert_eq!(cmd.restores.len(), 1);
        assert_eq!(cmd.hot_assign.len(), 1);
        let mut host_c = vec![0; c.max_pages() as usize];
        c.host_row(3, &mut host_c).unwrap();
        assert_eq!(host_c[0], host_a[0]);
        assert_eq!(host_c[1], cmd.host_cow[0].dst as i32);
        let r = row(&c, 3);
        assert_eq!(r[0], 0);
        assert_eq!(r[1], cmd.restores[0].device_block as i32);
        assert_eq!(c.ready_prefix_pages(3), Some(1));
        assert_eq!(c.page_state(3, 0), Some(PageState::Reclaimed));
        assert_eq!(c.page_state(3, 1), Some(PageState::Pending));
        // The tail's last row is mirrored into the private host copy.
        assert_eq!(cmd.row_mirrors.len(), 1);
        assert_eq!(cmd.row_mirrors[0].span.first_row, 3);
        assert_eq!(cmd.row_mirrors[0].span.host_block, host_c[1] as u32);
        c.check_invariants().unwrap();
        // A longer prompt with the same 8-token prefix hits both pages without copy-on-write.
        c.admit(4, &toks(10)).unwrap();
        let cmd = c.step().unwrap();
        let s = cmd.scheduled[0];
        assert_eq!((s.first_token, s.num_tokens), (8, 2));
        assert!(cmd.host_cow.is_empty());
        assert_eq!(c.host_only_pages(4), Some(2));
        c.check_invariants().unwrap();
    }

    #[test]
    fn spills_under_a_budget_without_eager_mirroring() {
        let mut c = coord(40, false, 1);
        c.admit(1, &toks(40)).unwrap();
        let cmd = c.step().unwrap();
        assert!(cmd.row_mirrors.is_empty());
        assert_eq!(cmd.page_transfers.len(), 2);
        assert_eq!(
            cmd.page_transfers[0],
            PageTransfer {
                bucket: 0,
                device_block: 2,
                host_block: 1
            }
        );
        assert_eq!(c.page_state(1, 2), Some(PageState::Dirty));
        let cmd = c.step().unwrap();
        assert_eq!(cmd.page_transfers.len(), 2);
        assert_eq!(cmd.page_transfers[0].host_block, 3);
        c.report(0, &[1, 2], &[1, 2]).unwrap();
        assert_eq!(c.ready_prefix_pages(1), Some(4));
        // Reclaim forces the spill of dirty full pages with release-after-transfer.
        c.reclaim_resident_blocks(8);
        assert_eq!(c.page_state(1, 0), Some(PageState::Reclaimed));
        assert_eq!(c.page_state(1, 4), Some(PageState::PendingRelease));
        // 4 forced spills (pages 4..=7) plus this step's budget of 2 (pages 8 and 9).
        let cmd = c.build_offload_command();
        assert_eq!(cmd.page_transfers.len(), 6);
        assert_eq!(c.page_state(1, 8), Some(PageState::Pending));
        c.check_invariants().unwrap();
    }

    #[test]
    fn deepseek_v4_compressed_rows_and_sliding_window() {
        use crate::presets::DEEPSEEK_V4;
        let cfg = HiSparseConfig::new(DEEPSEEK_V4.top_k, 64 << 30);
        let mut input = LayoutInput::new(&DEEPSEEK_V4, &cfg, 0, 65536);
        input.num_gpu_blocks_override = Some(4000);
        let kv = plan_layout(&input).unwrap();
        let swa = kv.regular_groups().start as u32;
        assert_eq!(kv.groups[swa as usize].sliding_window, Some(128));
        let mut c = Coordinator::new(
            kv,
            CoordinatorConfig {
                max_batched_tokens: 4096,
                ..CoordinatorConfig::default()
            },
        )
        .unwrap();
        c.admit(1, &toks(1000)).unwrap();
        let cmd = c.step().unwrap();
        // 1000 tokens = 250 compressed rows = pages of 64 rows: 64, 64, 64 and 58 rows; one span
        // per page per bucket (6 buckets).
        assert_eq!(cmd.row_mirrors.len(), 4 * 6);
        let spans: Vec<(u32, u32)> = cmd
            .row_mirrors
            .iter()
            .filter(|m| m.bucket == 0)
            .map(|m| (m.span.first_row, m.span.num_rows))
            .collect();
        assert_eq!(spans, [(0, 64), (0, 64), (0, 64), (0, 58)]);
        // Pages 0..=2 (tokens 0..768) are sealed; page 3 is still being written.
        assert_eq!(c.page_state(1, 2), Some(PageState::Pending));
        assert_eq!(c.page_state(1, 3), Some(PageState::Dirty));
        // The sliding-window group (128 tokens) keeps only the blocks covering tokens 872..1000:
        // pages 0..=2 are given back.
        let freed: Vec<u32> = cmd
            .block_tables
            .iter()
            .filter(|u| u.group == swa && u.block == 0)
            .map(|u| u.page)
            .collect();
        assert_eq!(freed, [0, 1, 2]);
        let mut t = vec![0; c.max_pages() as usize];
        c.block_table_row(1, swa as usize, &mut t).unwrap();
        assert_eq!(&t[..3], &[0, 0, 0]);
        assert!(t[3] > 0);
        c.check_invariants().unwrap();
    }

    #[test]
    fn typed_errors() {
        let mut c = coord(40, true, 1);
        assert_eq!(c.admit(1, &[]), Err(CoordError::EmptyPrompt { id: 1 }));
        assert_eq!(
            c.admit(1, &toks(49)),
            Err(CoordError::TooLong {
                id: 1,
                tokens: 49,
                max_model_len: 48
            })
        );
        c.admit(1, &toks(4)).unwrap();
        assert_eq!(
            c.admit(1, &toks(4)),
            Err(CoordError::DuplicateRequest { id: 1 })
        );
        assert_eq!(c.schedule(1, 1), Err(CoordError::NotRunning { id: 1 }));
        assert_eq!(c.finish(9), Err(CoordError::UnknownRequest { id: 9 }));
        c.step().unwrap();
        assert_eq!(
            c.schedule(1, 1),
            Err(CoordError::NotEnoughTokens {
                id: 1,
                requested: 1,
                available: 0
            })
        );
        // The layout guarantees one max_model_len request fits; a hand-edited layout may not.
        let mut kv = c.layout().clone();
        kv.num_gpu_blocks = 10;
        let mut small = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
        assert!(matches!(
            small.admit(5, &toks(48)),
            Err(CoordError::NeverFits {
                pool: PoolKind::Gpu,
                ..
            })
        ));
        assert!(matches!(
            Coordinator::new(
                c.layout().clone(),
                CoordinatorConfig {
                    num_workers: 0,
                    ..CoordinatorConfig::default()
                }
            ),
            Err(CoordError::ZeroConfig {
                field: "num_workers"
            })
        ));
        assert!(std::format!("{}", CoordError::NoFreeSlot).contains("max_running"));
        let mut kv = c.layout().clone();
        kv.num_buckets = 3;
        assert!(matches!(
            Coordinator::new(kv, CoordinatorConfig::default()),
            Err(CoordError::InvalidLayout { .. })
        ));
        let mut kv = c.layout().clone();
        kv.block_tokens = 0;
        assert!(Coordinator::new(kv, CoordinatorConfig::default()).is_err());
        assert_eq!(
            c.append_token_by_slot(3, 1),
            Err(CoordError::UnknownSlot { slot: 3 })
        );
        let mut row = [0i32; 4];
        assert!(c.hot_row(1, u32::MAX, &mut row).is_ok());
        assert_eq!(row, [-1; 4]);
    }
}
