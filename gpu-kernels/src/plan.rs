//! What to launch: one planner per operation, shared by the CUDA and ROCm backends.
//!
//! A planner takes an operation's descriptor (already checked by the core), the device addresses
//! of its buffers and what it needs to know about the device ([`Target`]), and returns a [`Plan`]:
//! the host-side lists to stage in device-readable memory ([`Plan::staged`]), the size of the
//! stream's resolver workspace ([`Plan::workspace_bytes`]) and the launches in stream order, each
//! with its grid, block, dynamic shared memory and packed arguments ([`Launch`]). A backend only
//! places the staged parts and the workspace, resolves the symbolic pointers
//! ([`crate::args::Args::resolve`]) and enqueues the launches; it never decides a launch shape.
//!
//! Every rule about launch shapes lives here once: the grid of grid-stride kernels, the
//! resolver's shared wanted-row table and workspace, the gather's layer chunks, and the splitting
//! of page and row copies into launches that honour the core's copy-conflict rule
//! ([`hisparse_core::ops::copy::copy_batches`]).

use core::fmt;
use core::ops::Range;

use hisparse_core::ops::copy::{ByteRange, CopyFootprint, copy_batches};
use hisparse_core::ops::{
    BlockPair, Direction, GatherDesc, HotResetDesc, IndexerBackupDesc, InvalidateDesc, LayerPair,
    PageLayout, RemapDesc, RemapModesDesc, ResolveDesc, RowCopyDesc, RowSpan, SlotMappingDesc,
    TableWrite, TableWriteDesc,
};

use crate::args::Args;
use crate::{
    COPY_THREADS, DIRECTION_DEVICE_TO_HOST, DIRECTION_HOST_TO_DEVICE, GATHER_MAX_LAYERS,
    GATHER_ROWS, GATHER_THREADS, GatherLayers, INDEXER_GROUP, INDEXER_THREADS, INVALIDATE_THREADS,
    Kernel, LayerPairAbi, PageJob, Pair, REMAP_COMPACT, REMAP_COUNTS, REMAP_HAS_MAP,
    REMAP_MAX_THREADS, REMAP_STAGE_MAX_BYTES, REMAP_STAGED, RESOLVE_GLOBAL_STATE,
    RESOLVE_STATIC_SHARED_BYTES, RESOLVE_THREADS, SLOT_THREADS, Span, TABLE_THREADS, TableWriteAbi,
    resolve_global_shared_bytes, resolve_global_workspace_entries, resolve_shared_bytes,
    resolve_table_entries, resolve_table_goal, resolve_workspace_entries,
};

/// What the planners need to know about the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Multiprocessors (CUDA SMs, AMD compute units).
    pub multiprocessors: u32,
    /// Shared memory one block may use, static and dynamic together (CUDA: the opt-in maximum).
    pub shared_per_block: u64,
    /// Shared memory of one multiprocessor (what blocks resident together share).
    pub shared_per_multiprocessor: u64,
}

/// Blocks per multiprocessor the grid of a grid-stride kernel provides for.
pub const STRIDE_BLOCKS_PER_MULTIPROCESSOR: u64 = 8;

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The kernel (its symbol and parameters).
    pub kernel: Kernel,
    /// Grid `(x, y, z)`.
    pub grid: [u32; 3],
    /// Threads per block (one dimension).
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub shared: u32,
    /// The arguments, in the kernel's ABI order.
    pub args: Args,
}

/// Whether a staged list changes from call to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PartKind {
    /// This call's own list (pairs, spans, writes, rows): staged for the call (or, for work
    /// being captured into a graph, kept for the device's life: [`crate::arena`]).
    PerCall,
    /// A list fixed by the layout, the same on every call of its group (a copy's layer table):
    /// a backend keeps it in device memory once ([`crate::arena`]) instead of staging it again.
    Constant,
}

/// One host-side list the launches of a plan read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedPart {
    /// The list's bytes.
    pub bytes: Vec<u8>,
    /// Whether it changes from call to call.
    pub kind: PartKind,
}

/// Everything one operation enqueues.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Host-side lists the kernels read, to place in device-readable memory before the launches
    /// (each part at a 16-byte aligned address; arguments name them by index).
    pub staged: Vec<StagedPart>,
    /// Bytes of the stream's resolver workspace the launches use (0: none). Launches that use it
    /// also take the stream's resolver counters ([`crate::args::Place::Counters`]:
    /// [`crate::WORKSPACE_COUNTER_BYTES`] that must be zero before the first such launch on the
    /// stream; every launch leaves them zero again, so the backend clears them once, when it
    /// makes the stream, never before a launch, and a workspace may grow at any time, during a
    /// graph capture too, without clearing anything).
    pub workspace_bytes: u64,
    /// The launches, in stream order.
    pub launches: Vec<Launch>,
}

impl Plan {
    /// A plan that enqueues nothing.
    pub fn empty() -> Plan {
        Plan::default()
    }

    fn one(launch: Launch) -> Plan {
        Plan {
            launches: vec![launch],
            ..Plan::default()
        }
    }

    fn stage(&mut self, bytes: Vec<u8>, kind: PartKind) -> usize {
        self.staged.push(StagedPart { bytes, kind });
        self.staged.len() - 1
    }
}

/// An operation these kernels cannot express.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A size beyond what one launch handles.
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The largest value the kernels handle.
        limit: u64,
    },
    /// A row geometry, page placement or buffer address the copy kernels cannot address.
    Geometry {
        /// The field or address, named as the caller knows it.
        what: &'static str,
        /// Its value.
        value: u64,
        /// What the kernels need of it.
        need: &'static str,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::TooLarge { what, value, limit } => write!(
                f,
                "{what} = {value} exceeds what one launch of these kernels handles ({limit}); \
                 split the call"
            ),
            PlanError::Geometry { what, value, need } => write!(
                f,
                "{what} = {value}: the copy kernels need {need}; lay the pool out accordingly"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

fn limit(what: &'static str, value: u64, limit: u64) -> Result<(), PlanError> {
    if value > limit {
        Err(PlanError::TooLarge { what, value, limit })
    } else {
        Ok(())
    }
}

fn geometry(ok: bool, what: &'static str, value: u64, need: &'static str) -> Result<(), PlanError> {
    if ok {
        Ok(())
    } else {
        Err(PlanError::Geometry { what, value, need })
    }
}

/// What the copy kernels (`hs_gather_rows`, `hs_resolve_gather`, `hs_copy_pages`,
/// `hs_copy_rows`) rely on in a layout: pages at 16-byte aligned offsets (`base`,
/// `block_stride`), value parts of whole 16-byte chunks, scale parts of whole 4-byte words
/// (copied in [`crate::scale_word`]-byte words), and, for contiguous rows, whole 16-byte chunks.
/// Every row part is then aligned to the width it is copied with (a page's tail past its last
/// 16-byte chunk moves as 4-byte words). The core's `PageLayout::check` refuses the same
/// layouts; the planners check again because they are what relies on it.
pub fn check_layout(l: &PageLayout) -> Result<(), PlanError> {
    const CHUNK: &str =
        "a multiple of 16 (pages start 16-byte aligned; rows move in 16-byte chunks)";
    geometry(l.base.is_multiple_of(16), "layout.base", l.base, CHUNK)?;
    geometry(
        l.block_stride.is_multiple_of(16),
        "layout.block_stride",
        l.block_stride,
        CHUNK,
    )?;
    geometry(
        l.value_bytes > 0 && l.value_bytes.is_multiple_of(16),
        "layout.value_bytes",
        l.value_bytes.into(),
        "a positive multiple of 16 (value parts move in 16-byte chunks)",
    )?;
    geometry(
        l.value_bytes <= l.row_bytes,
        "layout.row_bytes",
        l.row_bytes.into(),
        "at least value_bytes",
    )?;
    let scale = l.row_bytes - l.value_bytes;
    geometry(
        scale.is_multiple_of(4),
        "layout scale part (row_bytes - value_bytes)",
        scale.into(),
        "a multiple of 4 (scale parts move in 4-, 8- or 16-byte words)",
    )
}

/// [`check_layout`] for both layouts of every layer.
fn check_layers(layers: &[LayerPair]) -> Result<(), PlanError> {
    for l in layers {
        check_layout(&l.host)?;
        check_layout(&l.device)?;
    }
    Ok(())
}

/// The device address of a pool the copy kernels access in 16-byte chunks.
fn check_pool(what: &'static str, addr: u64) -> Result<(), PlanError> {
    geometry(
        addr.is_multiple_of(16),
        what,
        addr,
        "a 16-byte aligned address (pages are read in 16-byte chunks)",
    )
}

/// Blocks of a grid-stride kernel over `work` items of `per_block` each: enough for the work, at
/// most [`STRIDE_BLOCKS_PER_MULTIPROCESSOR`] per multiprocessor.
pub fn stride_grid(t: &Target, work: u64, per_block: u64) -> u32 {
    let cap = u64::from(t.multiprocessors.max(1)) * STRIDE_BLOCKS_PER_MULTIPROCESSOR;
    work.div_ceil(per_block.max(1)).clamp(1, cap) as u32
}

// ------------------------------------------------------------------------------------------------
// Remap
// ------------------------------------------------------------------------------------------------

/// Device addresses of a remap's buffers (`idx_mapping`, `counts` and `stats` 0 when absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per buffer of `RemapArgs`
pub struct RemapAddrs {
    pub req_id: u64,
    pub block_table: u64,
    pub topk: u64,
    pub idx_mapping: u64,
    pub out: u64,
    pub counts: u64,
    /// The stats buffer's start (its slot's offset is added from the descriptor's
    /// `stats_slot`).
    pub stats: u64,
}

/// The address of the stats slot `slot` of the stats buffer at `buffer`, or 0 (null: no stats)
/// when `buffer` is 0 — what the decode-path kernels take as `stats`.
pub fn stats_slot_address(buffer: u64, slot: u32) -> Result<u64, PlanError> {
    if buffer == 0 {
        return Ok(0);
    }
    buffer
        .checked_add(hisparse_core::ops::stats::slot_offset(slot))
        .ok_or(PlanError::Geometry {
            what: "stats buffer address + 16 * stats_slot",
            value: buffer,
            need: "a slot address inside the address space",
        })
}

/// Whether a call of `num_tokens` rows launches nothing: an empty batch without stats (with
/// stats, one block counts the call).
fn nothing_to_launch(num_tokens: u32, stats: u64) -> bool {
    num_tokens == 0 && stats == 0
}

/// Threads per block of `hs_remap` for rows of `top_k` entries: one 16-byte vector (4 entries)
/// per thread when `top_k` is a multiple of 4, else one entry, rounded up to a multiple of 64
/// (whole warps of 32 and whole wavefronts of 64), between 64 and [`REMAP_MAX_THREADS`] (longer
/// rows take several passes).
pub const fn remap_threads(top_k: u32) -> u32 {
    let per_thread = if top_k.is_multiple_of(4) {
        top_k / 4
    } else {
        top_k
    };
    let t = per_thread.div_ceil(64) * 64;
    if t < 64 {
        64
    } else if t > REMAP_MAX_THREADS {
        REMAP_MAX_THREADS
    } else {
        t
    }
}

/// Blocks of `hs_remap` one multiprocessor holds at once (its launch bounds on CUDA: four
/// blocks of 512 threads).
pub const REMAP_BLOCKS_PER_MULTIPROCESSOR: u32 = 4;

/// The launch shape `hs_remap` and `hs_remap_modes` share: flags, dynamic shared memory, grid and
/// block.
struct RemapShape {
    flags: u32,
    shared: u32,
    grid: [u32; 3],
    block: u32,
}

fn remap_shape(t: &Target, d: &RemapDesc) -> Result<RemapShape, PlanError> {
    limit("remap num_tokens", d.num_tokens.into(), i32::MAX as u64)?;
    let mut flags = 0;
    if d.idx_mapping_len.is_some() {
        flags |= REMAP_HAS_MAP;
    }
    if d.write_counts {
        flags |= REMAP_COUNTS;
    }
    if d.compact {
        flags |= REMAP_COMPACT;
    }
    let staged_bytes = u64::from(d.top_k) * 4;
    let shared = if d.compact && staged_bytes <= u64::from(REMAP_STAGE_MAX_BYTES) {
        flags |= REMAP_STAGED;
        staged_bytes as u32
    } else {
        0
    };
    let resident = t
        .multiprocessors
        .max(1)
        .saturating_mul(REMAP_BLOCKS_PER_MULTIPROCESSOR);
    // At least one block: an empty batch with stats counts the call.
    let rows = d.num_tokens.min(resident).max(1);
    let (tiles, block) = if d.write_counts || d.compact {
        (1, remap_threads(d.top_k))
    } else {
        remap_tiles(t, d.num_tokens, d.top_k)
    };
    Ok(RemapShape {
        flags,
        shared,
        grid: [rows, tiles, 1],
        block,
    })
}

/// Blocks a plain remap of few rows aims for per multiprocessor: its rows are cut into column
/// tiles until the launch has about this many blocks per multiprocessor (or tiles of one
/// 64-thread block each), so that a decode-size batch's table loads are spread over the whole
/// device instead of queueing on a few multiprocessors.
pub const REMAP_TILE_BLOCKS_PER_MULTIPROCESSOR: u32 = 2;

/// Column tiles per row and threads per block of a plain remap (no counts, no compaction: each
/// tile is independent) of `num_tokens` rows of `top_k` entries: as many tiles as
/// [`REMAP_TILE_BLOCKS_PER_MULTIPROCESSOR`] asks for, each at least 64 threads (one 16-byte vector
/// each when `top_k` is a multiple of 4); `(1, remap_threads(top_k))` for a batch that fills the
/// device already.
pub fn remap_tiles(t: &Target, num_tokens: u32, top_k: u32) -> (u32, u32) {
    let per_thread = if top_k.is_multiple_of(4) {
        top_k / 4
    } else {
        top_k
    };
    let row_threads = per_thread.div_ceil(64).max(1) * 64;
    let wanted = t
        .multiprocessors
        .max(1)
        .saturating_mul(REMAP_TILE_BLOCKS_PER_MULTIPROCESSOR)
        / num_tokens.max(1);
    let tiles = wanted.clamp(1, row_threads / 64);
    if tiles == 1 {
        return (1, remap_threads(top_k));
    }
    let threads = (row_threads.div_ceil(tiles).div_ceil(64) * 64).min(REMAP_MAX_THREADS);
    (row_threads.div_ceil(threads), threads)
}

/// The buffers both remap kernels take first, in their ABI order.
fn remap_args(args: &mut Args, d: &RemapDesc, a: &RemapAddrs) -> Result<(), PlanError> {
    args.ptr(a.req_id)
        .ptr(a.block_table)
        .ptr(a.topk)
        .ptr(a.idx_mapping)
        .ptr(a.out)
        .ptr(a.counts)
        .ptr(stats_slot_address(a.stats, d.stats_slot)?);
    Ok(())
}

/// `hs_remap`: one block per token row while the device holds them all at once, else as many
/// blocks as it holds, each taking rows grid-stride with the next row's inputs loaded ahead; a
/// plain remap of fewer rows than the device has room for cuts each row into column tiles
/// ([`remap_tiles`]). A
/// compaction of rows of at most [`REMAP_STAGE_MAX_BYTES`] / 4 entries is staged in dynamic
/// shared memory ([`REMAP_STAGED`]). An empty batch launches nothing, or with stats one block
/// that counts the call.
pub fn remap(t: &Target, d: &RemapDesc, a: &RemapAddrs) -> Result<Plan, PlanError> {
    if nothing_to_launch(d.num_tokens, a.stats) {
        return Ok(Plan::empty());
    }
    let shape = remap_shape(t, d)?;
    let mut args = Args::default();
    remap_args(&mut args, d, a)?;
    args.u32(d.num_tokens)
        .u32(d.top_k)
        .u32(d.table_rows)
        .u32(d.max_blocks)
        .u32(d.block_size)
        .u32(d.block_stride_rows)
        .u32(d.idx_mapping_len.unwrap_or(0))
        .u32(shape.flags);
    Ok(Plan::one(Launch {
        kernel: Kernel::Remap,
        grid: shape.grid,
        block: shape.block,
        shared: shape.shared,
        args,
    }))
}

/// Device addresses of a remap with modes: the plain remap's buffers and the prefill
/// workspace's (0 without a workspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemapModesAddrs {
    /// The plain remap's buffers.
    pub remap: RemapAddrs,
    /// `i32[num_tokens]` prefill request of each row.
    pub prefill_req_id: u64,
    /// `i32[prefill_requests]` first workspace row of each prefill request.
    pub workspace_starts: u64,
}

/// A remap with modes: [`remap`] (the plain kernel) when no mode is on, else one
/// `hs_remap_modes` launch with [`remap`]'s shape. The descriptor is checked by the core first
/// (`RemapModesDesc::check`).
pub fn remap_modes(t: &Target, d: &RemapModesDesc, a: &RemapModesAddrs) -> Result<Plan, PlanError> {
    if !d.has_modes() {
        return remap(t, &d.remap, &a.remap);
    }
    let r = &d.remap;
    if nothing_to_launch(r.num_tokens, a.remap.stats) {
        return Ok(Plan::empty());
    }
    let shape = remap_shape(t, r)?;
    let (prefill_requests, prefill, starts) = match d.prefill_requests {
        Some(p) => (p, a.prefill_req_id, a.workspace_starts),
        None => (0, 0, 0),
    };
    let dcp = d.dcp.map_or([0, 0, 0], |s| [s.size, s.rank, s.interleave]);
    let mut args = Args::default();
    remap_args(&mut args, r, &a.remap)?;
    args.ptr(prefill)
        .ptr(starts)
        .u32(r.num_tokens)
        .u32(r.top_k)
        .u32(r.table_rows)
        .u32(r.max_blocks)
        .u32(r.block_size)
        .u32(r.block_stride_rows)
        .u32(r.idx_mapping_len.unwrap_or(0))
        .u32(shape.flags)
        .u32(prefill_requests)
        .u32(dcp[0])
        .u32(dcp[1])
        .u32(dcp[2]);
    Ok(Plan::one(Launch {
        kernel: Kernel::RemapModes,
        grid: shape.grid,
        block: shape.block,
        shared: shape.shared,
        args,
    }))
}

// ------------------------------------------------------------------------------------------------
// Resolve
// ------------------------------------------------------------------------------------------------

/// Device addresses of a resolve's buffers (`ResolveArgs::map` of the buffers' addresses; an
/// absent `idx_mapping` or `stats` is `None`). The stats slot's offset is added from the
/// descriptor's `stats_slot`.
pub type ResolveAddrs = hisparse_core::ops::ResolveBuffers<u64>;

/// How `hs_resolve` keeps a request's state, decided per launch by [`resolve_shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResolveShape {
    /// LRU copy, partition and bitmap in the workspace instead of shared memory.
    pub global_state: bool,
    /// Entries of the shared wanted-row table (a power of two, or 0: every table in the
    /// workspace).
    pub shared_table: u32,
    /// Dynamic shared memory of each block.
    pub shared_bytes: u64,
    /// 16-byte workspace entries (0: no workspace).
    pub workspace_entries: u64,
}

/// The one rule for the resolver's memory: the per-request state (LRU copy, partition, bitmap)
/// stays in shared memory when it fits one block's share (else every block takes it from the
/// workspace: global-state mode, or always when `force_global`); the shared wanted-row table is
/// the largest power of two that fits what is left, but no larger than the biggest request of
/// the launch could need (all its rows one request). A block's share is the whole per-block
/// maximum while there are no more rows than multiprocessors (one block each), else half a
/// multiprocessor's shared memory (two blocks resident together). Requests whose table does not
/// fit take it from the workspace.
pub fn resolve_shape(t: &Target, d: &ResolveDesc, force_global: bool) -> ResolveShape {
    let per_block = t
        .shared_per_block
        .saturating_sub(RESOLVE_STATIC_SHARED_BYTES);
    let share = if d.num_tokens > t.multiprocessors {
        per_block.min((t.shared_per_multiprocessor / 2).saturating_sub(RESOLVE_STATIC_SHARED_BYTES))
    } else {
        per_block
    };
    let (n, k) = (d.hot_slots, d.top_k);
    let global_state = force_global || resolve_shared_bytes(n, 0) > share;
    let bytes = |table: u64| {
        if global_state {
            resolve_global_shared_bytes(table as u32)
        } else {
            resolve_shared_bytes(n, table as u32)
        }
    };
    // The table the planner aims for (resolve_table_goal), halved until it fits.
    let needed = resolve_table_entries(u64::from(d.num_tokens) * u64::from(k));
    let mut table = resolve_table_goal(d.num_tokens, k).min(1 << 30);
    while table >= 16 && bytes(table) > share {
        table /= 2;
    }
    if table < 16 {
        table = 0;
    }
    let tables_in_workspace = needed > table;
    let workspace_entries = if global_state {
        resolve_global_workspace_entries(d.num_tokens, k, d.num_requests, n, tables_in_workspace)
    } else if tables_in_workspace {
        resolve_workspace_entries(d.num_tokens, k)
    } else {
        0
    };
    ResolveShape {
        global_state,
        shared_table: table as u32,
        shared_bytes: bytes(table),
        workspace_entries,
    }
}

/// `hs_resolve`: one block per token row (the first row of each request resolves it). An empty
/// batch launches nothing, or with stats one block (no workspace) that counts the call.
pub fn resolve(
    t: &Target,
    d: &ResolveDesc,
    a: &ResolveAddrs,
    force_global: bool,
) -> Result<Plan, PlanError> {
    let (idx_mapping, stats) = (a.idx_mapping.unwrap_or(0), a.stats.unwrap_or(0));
    if nothing_to_launch(d.num_tokens, stats) {
        return Ok(Plan::empty());
    }
    let entries = u64::from(d.num_tokens) * u64::from(d.top_k);
    limit("resolve num_tokens * top_k", entries, (1 << 28) - 1)?;
    limit("resolve num_tokens", d.num_tokens.into(), i32::MAX as u64)?;
    let shape = resolve_shape(t, d, force_global);
    limit(
        "resolve workspace entries",
        shape.workspace_entries,
        u32::MAX.into(),
    )?;
    let table_arg = if shape.global_state {
        shape.shared_table | RESOLVE_GLOBAL_STATE
    } else {
        shape.shared_table
    };
    let mut args = Args::default();
    args.ptr(a.req_id)
        .ptr(a.topk)
        .ptr(a.resident_table)
        .ptr(a.host_table)
        .ptr(a.hot_table)
        .ptr(a.slot_host_rows)
        .ptr(a.lru)
        .ptr(a.indices)
        .ptr(a.valid_counts)
        .ptr(a.hit_counts)
        .ptr(a.miss_counts)
        .ptr(a.miss_src)
        .ptr(a.miss_dst);
    let workspace_bytes = if shape.workspace_entries > 0 {
        args.workspace(0).counters();
        16 * shape.workspace_entries
    } else {
        args.ptr(0).ptr(0);
        0
    };
    args.u32(shape.workspace_entries as u32)
        .u32(table_arg)
        .u32(d.num_tokens)
        .u32(d.top_k)
        .u32(d.num_requests)
        .u32(d.max_pages)
        .u32(d.block_size)
        .u32(d.hot_slots)
        .u32(d.attention_block_stride)
        .u32(d.host_num_blocks);
    // Batch-row order: the kernel reads state rows through idx_mapping (null: state-row order).
    // The backend checked the descriptor against its arguments (`ResolveDesc::check`), so an
    // address is present exactly in batch-row order.
    geometry(
        d.num_state_rows.is_some() == (idx_mapping != 0),
        "resolve idx_mapping address",
        idx_mapping,
        "non-null exactly when num_state_rows is given (batch-row order)",
    )?;
    args.ptr(idx_mapping)
        .u32(d.num_state_rows.unwrap_or(0))
        .ptr(stats_slot_address(stats, d.stats_slot)?);
    Ok(Plan {
        staged: Vec::new(),
        workspace_bytes,
        launches: vec![Launch {
            kernel: Kernel::Resolve,
            grid: [d.num_tokens.max(1), 1, 1],
            block: RESOLVE_THREADS,
            shared: shape.shared_bytes as u32,
            args,
        }],
    })
}

// ------------------------------------------------------------------------------------------------
// Gather
// ------------------------------------------------------------------------------------------------

/// Device addresses of a gather's buffers (`host`: the device address of the mapped host pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per buffer of `GatherArgs`
pub struct GatherAddrs {
    pub plan_src: u64,
    pub plan_dst: u64,
    pub plan_counts: u64,
    pub host: u64,
    pub device: u64,
}

/// Blocks of 128 threads one multiprocessor holds while gathering (the kernel's launch bounds on
/// CUDA: at most 64 registers per thread).
pub const GATHER_BLOCKS_PER_MULTIPROCESSOR: u64 = 8;

/// `hs_gather_rows`: a persistent grid per chunk of at most [`GATHER_MAX_LAYERS`] layers (grid z),
/// each block walking work items of [`GATHER_ROWS`] plan entries, first entries of every row
/// first; the grid holds every item at once when the device can, else fills the device.
pub fn gather(t: &Target, d: &GatherDesc<'_>, a: &GatherAddrs) -> Result<Plan, PlanError> {
    if d.num_tokens == 0 || d.layers.is_empty() {
        return Ok(Plan::empty());
    }
    let items = u64::from(d.top_k.div_ceil(GATHER_ROWS)) * u64::from(d.num_tokens);
    limit("gather num_tokens * top_k / 16", items, u32::MAX.into())?;
    check_layers(d.layers)?;
    check_pool("gather host pool address", a.host)?;
    check_pool("gather device pool address", a.device)?;
    let mut plan = Plan::empty();
    for chunk in d.layers.chunks(GATHER_MAX_LAYERS) {
        let resident = u64::from(t.multiprocessors.max(1)) * GATHER_BLOCKS_PER_MULTIPROCESSOR;
        let per_layer = (resident / chunk.len() as u64).max(1);
        let grid_x = items.min(per_layer).max(1) as u32;
        let mut args = Args::default();
        args.ptr(a.plan_src)
            .ptr(a.plan_dst)
            .ptr(a.plan_counts)
            .ptr(a.host)
            .ptr(a.device)
            .u32(d.num_tokens)
            .u32(d.top_k)
            .gather_layers(&GatherLayers::new(chunk));
        plan.launches.push(Launch {
            kernel: Kernel::GatherRows,
            grid: [grid_x, 1, chunk.len() as u32],
            block: GATHER_THREADS,
            shared: 0,
            args,
        });
    }
    Ok(plan)
}

// ------------------------------------------------------------------------------------------------
// Resolve and gather in one launch
// ------------------------------------------------------------------------------------------------

/// Token rows from which the production swap-in is one [`resolve_gather`] launch; below, it is
/// [`resolve`] then [`gather`] (the backends' `Device::resolve_and_gather`). A fused launch copies
/// with one block per token row: with few rows too few blocks keep the bus busy. Measured on an
/// H200 (`cuda_bench`, 2048 × 9.1 % misses): 1 request 40.3 µs fused against 29.0 µs for the
/// pair; 64 requests 191.3 against 198.8 µs; 256 requests 695.2 against 726.7 µs.
pub const FUSED_MIN_ROWS: u32 = 64;

/// Whether the production swap-in of `d` is one fused launch ([`FUSED_MIN_ROWS`]).
pub fn swap_in_fused(d: &ResolveDesc) -> bool {
    d.num_tokens >= FUSED_MIN_ROWS
}

/// A resolve followed by the gather of its miss plan (the swap-in critical path), in one
/// `hs_resolve_gather` launch: [`resolve`]'s grid, shape and workspace, each resolving block
/// copying its own request's misses, for the first [`GATHER_MAX_LAYERS`] of
/// `layers`; further layers follow as [`gather`] launches over the plan. `host` and `device` are
/// the device addresses of the mapped host pool and the device pool. Results equal [`resolve`]
/// then [`gather`] with `plan_src`, `plan_dst` and `plan_counts` the resolve's `miss_src`,
/// `miss_dst` and `miss_counts`; no layers is a plain resolve.
#[allow(clippy::too_many_arguments)]
pub fn resolve_gather(
    t: &Target,
    d: &ResolveDesc,
    a: &ResolveAddrs,
    layers: &[LayerPair],
    host: u64,
    device: u64,
    force_global: bool,
) -> Result<Plan, PlanError> {
    if layers.is_empty() || d.num_tokens == 0 {
        // Nothing to gather: a plain resolve (an empty batch counts its call there).
        return resolve(t, d, a, force_global);
    }
    let mut plan = resolve(t, d, a, force_global)?;
    let Some(fused) = plan.launches.first_mut() else {
        return Ok(plan);
    };
    check_layers(layers)?;
    check_pool("resolve_gather host pool address", host)?;
    check_pool("resolve_gather device pool address", device)?;
    let (first, rest) = layers.split_at(layers.len().min(GATHER_MAX_LAYERS));
    fused.kernel = Kernel::ResolveGather;
    fused
        .args
        .ptr(host)
        .ptr(device)
        .gather_layers(&GatherLayers::new(first));
    if !rest.is_empty() {
        let more = gather(
            t,
            &GatherDesc {
                num_tokens: d.num_tokens,
                top_k: d.top_k,
                layers: rest,
            },
            &GatherAddrs {
                plan_src: a.miss_src,
                plan_dst: a.miss_dst,
                plan_counts: a.miss_counts,
                host,
                device,
            },
        )?;
        plan.launches.extend(more.launches);
    }
    Ok(plan)
}

// ------------------------------------------------------------------------------------------------
// Indexer backup
// ------------------------------------------------------------------------------------------------

/// Device addresses of an indexer backup's buffers (`host`: the device address of the mapped
/// indexer host cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per buffer of `IndexerBackupArgs`
pub struct IndexerBackupAddrs {
    pub device_slots: u64,
    pub host_slots: u64,
    pub device: u64,
    pub host: u64,
}

/// `hs_indexer_backup`: one launch for every layer and token, groups of
/// [`crate::INDEXER_GROUP`] threads per row, grid-stride; the layer table is a constant list
/// (the same indexer layers on every call). The descriptor is checked by the core first
/// (`IndexerBackupDesc::check`: rows of 4-byte words, pages on 16-byte boundaries).
pub fn indexer_backup(
    t: &Target,
    d: &IndexerBackupDesc<'_>,
    a: &IndexerBackupAddrs,
) -> Result<Plan, PlanError> {
    if d.num_tokens == 0 || d.layers.is_empty() {
        return Ok(Plan::empty());
    }
    limit(
        "indexer_backup layers",
        d.layers.len() as u64,
        u32::MAX.into(),
    )?;
    check_pool("indexer_backup device pool address", a.device)?;
    check_pool("indexer_backup host cache address", a.host)?;
    let layer_abi: Vec<LayerPairAbi> = d.layers.iter().map(LayerPairAbi::from).collect();
    let mut plan = Plan::empty();
    let lp = plan.stage(
        bytemuck::cast_slice(&layer_abi).to_vec(),
        PartKind::Constant,
    );
    let rows = d.layers.len() as u64 * u64::from(d.num_tokens);
    let per_block = u64::from(INDEXER_THREADS / INDEXER_GROUP);
    let mut args = Args::default();
    args.ptr(a.device_slots)
        .ptr(a.host_slots)
        .u32(d.num_tokens)
        .staged(lp, 0)
        .u32(d.layers.len() as u32)
        .ptr(a.device)
        .ptr(a.host);
    plan.launches.push(Launch {
        kernel: Kernel::IndexerBackup,
        grid: [stride_grid(t, rows, per_block), 1, 1],
        block: INDEXER_THREADS,
        shared: 0,
        args,
    });
    Ok(plan)
}

// ------------------------------------------------------------------------------------------------
// Page and row copies
// ------------------------------------------------------------------------------------------------

/// Splits the tiles of a `layers × items` copy (tile `l * items + i`, the reference's order)
/// at the batch boundaries of the copy-conflict rule, into launch rectangles
/// `(layer range, item range)` in stream order: one rectangle when nothing conflicts.
fn rectangles(batches: &[Range<usize>], items: usize) -> Vec<(Range<usize>, Range<usize>)> {
    let mut out = Vec::new();
    for b in batches {
        let (mut at, end) = (b.start, b.end);
        while at < end {
            let (l, i) = (at / items, at % items);
            if i == 0 && end - at >= items {
                // Whole layers.
                let layers = (end - at) / items;
                out.push((l..l + layers, 0..items));
                at += layers * items;
            } else {
                let stop = (end - at).min(items - i);
                out.push((l..l + 1, i..i + stop));
                at += stop;
            }
        }
    }
    out
}

/// Whole-page copies: `jobs[l] = (source layout, destination layout)` of layer `l`, each pair
/// copied for every layer, in the reference's order (layer by layer); `src`, `dst` the buffers'
/// device addresses, `same_buffer` when they are one buffer (host copy-on-write). Launches
/// `hs_copy_pages` over layers × pairs, split where the copy-conflict rule says.
pub fn copy_pages(
    t: &Target,
    jobs: &[(PageLayout, PageLayout)],
    pairs: &[BlockPair],
    src: u64,
    dst: u64,
    same_buffer: bool,
) -> Result<Plan, PlanError> {
    if jobs.is_empty() || pairs.is_empty() {
        return Ok(Plan::empty());
    }
    limit("copy_pages layers", jobs.len() as u64, u32::MAX.into())?;
    limit("copy_pages pairs", pairs.len() as u64, u32::MAX.into())?;
    for (s, d) in jobs {
        check_layout(s)?;
        check_layout(d)?;
        geometry(
            s.page_bytes() == d.page_bytes(),
            "copy_pages destination page bytes",
            d.page_bytes(),
            "the source's page bytes",
        )?;
    }
    check_pool("copy_pages source address", src)?;
    check_pool("copy_pages destination address", dst)?;
    let mut tiles = Vec::with_capacity(jobs.len() * pairs.len());
    for (s, d) in jobs {
        for p in pairs {
            tiles.push(CopyFootprint::contiguous(
                s.page_offset(p.src),
                d.page_offset(p.dst),
                s.page_bytes(),
            ));
        }
    }
    let job_abi: Vec<PageJob> = jobs
        .iter()
        .map(|(s, d)| PageJob {
            src_base: s.base,
            src_stride: s.block_stride,
            dst_base: d.base,
            dst_stride: d.block_stride,
            page_bytes: s.page_bytes(),
        })
        .collect();
    let pair_abi: Vec<Pair> = pairs
        .iter()
        .map(|p| Pair {
            src: p.src,
            dst: p.dst,
        })
        .collect();
    let mut plan = Plan::empty();
    let jp = plan.stage(bytemuck::cast_slice(&job_abi).to_vec(), PartKind::Constant);
    let pp = plan.stage(bytemuck::cast_slice(&pair_abi).to_vec(), PartKind::PerCall);
    for (layers, items) in rectangles(&copy_batches(&tiles, same_buffer), pairs.len()) {
        let (nl, np) = (layers.len() as u32, items.len() as u32);
        let mut args = Args::default();
        args.staged(jp, (layers.start * size_of::<PageJob>()) as u64)
            .u32(nl)
            .staged(pp, (items.start * size_of::<Pair>()) as u64)
            .u32(np)
            .ptr(src)
            .ptr(dst);
        plan.launches.push(Launch {
            kernel: Kernel::CopyPages,
            grid: [stride_grid(t, u64::from(nl) * u64::from(np), 1), 1, 1],
            block: COPY_THREADS,
            shared: 0,
            args,
        });
    }
    Ok(plan)
}

/// Row-span copies of `desc` (`host` the device address of the mapped host pool, `device` of the
/// device pool): `hs_copy_rows` over layers × non-empty spans, split where the copy-conflict rule
/// says (repeated destination rows).
pub fn copy_rows(
    t: &Target,
    desc: &RowCopyDesc<'_>,
    spans: &[RowSpan],
    host: u64,
    device: u64,
) -> Result<Plan, PlanError> {
    let spans: Vec<RowSpan> = spans.iter().copied().filter(|s| s.num_rows > 0).collect();
    if spans.is_empty() || desc.layers.is_empty() {
        return Ok(Plan::empty());
    }
    limit(
        "copy_rows layers",
        desc.layers.len() as u64,
        u32::MAX.into(),
    )?;
    limit("copy_rows spans", spans.len() as u64, u32::MAX.into())?;
    check_layers(desc.layers)?;
    for l in desc.layers {
        geometry(
            (l.host.row_bytes, l.host.value_bytes) == (l.device.row_bytes, l.device.value_bytes),
            "copy_rows device row_bytes",
            l.device.row_bytes.into(),
            "the host layout's row geometry (row_bytes and value_bytes)",
        )?;
    }
    check_pool("copy_rows host pool address", host)?;
    check_pool("copy_rows device pool address", device)?;
    let mut tiles = Vec::with_capacity(desc.layers.len() * spans.len());
    for l in desc.layers {
        let (sl, dl) = match desc.direction {
            Direction::DeviceToHost => (&l.device, &l.host),
            Direction::HostToDevice => (&l.host, &l.device),
        };
        for s in &spans {
            let (sb, db) = match desc.direction {
                Direction::DeviceToHost => (s.device_block, s.host_block),
                Direction::HostToDevice => (s.host_block, s.device_block),
            };
            let n = u64::from(s.num_rows);
            let part = |layout: &PageLayout, block: u32| {
                let [(v, vl), (c, cl)] = layout.row_parts(block, s.first_row);
                [ByteRange::new(v, vl * n), ByteRange::new(c, cl * n)]
            };
            tiles.push(CopyFootprint {
                src: part(sl, sb),
                dst: part(dl, db),
            });
        }
    }
    let layer_abi: Vec<LayerPairAbi> = desc.layers.iter().map(LayerPairAbi::from).collect();
    let span_abi: Vec<Span> = spans
        .iter()
        .map(|s| Span {
            device_block: s.device_block,
            host_block: s.host_block,
            first_row: s.first_row,
            num_rows: s.num_rows,
        })
        .collect();
    let direction = match desc.direction {
        Direction::DeviceToHost => DIRECTION_DEVICE_TO_HOST,
        Direction::HostToDevice => DIRECTION_HOST_TO_DEVICE,
    };
    let mut plan = Plan::empty();
    let lp = plan.stage(
        bytemuck::cast_slice(&layer_abi).to_vec(),
        PartKind::Constant,
    );
    let sp = plan.stage(bytemuck::cast_slice(&span_abi).to_vec(), PartKind::PerCall);
    // Different buffers: only destinations can conflict.
    for (layers, items) in rectangles(&copy_batches(&tiles, false), spans.len()) {
        let (nl, ns) = (layers.len() as u32, items.len() as u32);
        let mut args = Args::default();
        args.staged(lp, (layers.start * size_of::<LayerPairAbi>()) as u64)
            .u32(nl)
            .staged(sp, (items.start * size_of::<Span>()) as u64)
            .u32(ns)
            .u32(direction)
            .ptr(host)
            .ptr(device);
        plan.launches.push(Launch {
            kernel: Kernel::CopyRows,
            grid: [stride_grid(t, u64::from(nl) * u64::from(ns), 1), 1, 1],
            block: COPY_THREADS,
            shared: 0,
            args,
        });
    }
    Ok(plan)
}

// ------------------------------------------------------------------------------------------------
// Small operations
// ------------------------------------------------------------------------------------------------

/// `hs_invalidate` over every hot slot (`ranges`, `slot_host_rows`: device addresses).
pub fn invalidate(t: &Target, d: &InvalidateDesc, ranges: u64, slot_host_rows: u64) -> Plan {
    let total = u64::from(d.num_requests) * u64::from(d.hot_slots);
    if total == 0 || d.num_ranges == 0 {
        return Plan::empty();
    }
    let mut args = Args::default();
    args.ptr(ranges)
        .u32(d.num_ranges)
        .ptr(slot_host_rows)
        .u64(total);
    Plan::one(Launch {
        kernel: Kernel::Invalidate,
        grid: [stride_grid(t, total, INVALIDATE_THREADS.into()), 1, 1],
        block: INVALIDATE_THREADS,
        shared: 0,
        args,
    })
}

/// Device addresses of a compressed slot mapping's buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // one field per buffer of `SlotMappingArgs`
pub struct SlotMappingAddrs {
    pub positions: u64,
    pub slot_mapping: u64,
    pub table_row: u64,
    pub block_table: u64,
    pub out: u64,
}

/// `hs_compressed_slot_mapping`: one thread per token.
pub fn slot_mapping(d: &SlotMappingDesc, a: &SlotMappingAddrs) -> Plan {
    if d.num_tokens == 0 {
        return Plan::empty();
    }
    let mut args = Args::default();
    args.ptr(a.positions)
        .ptr(a.slot_mapping)
        .ptr(a.table_row)
        .ptr(a.block_table)
        .ptr(a.out)
        .u32(d.num_tokens)
        .u32(d.ratio)
        .u32(d.block_size)
        .u32(d.table_rows)
        .u32(d.max_blocks);
    Plan::one(Launch {
        kernel: Kernel::CompressedSlotMapping,
        grid: [d.num_tokens.div_ceil(SLOT_THREADS), 1, 1],
        block: SLOT_THREADS,
        shared: 0,
        args,
    })
}

/// `hs_write_table` with the write list staged (`table`: device address). An empty list
/// enqueues nothing.
pub fn write_table(
    t: &Target,
    d: &TableWriteDesc,
    writes: &[TableWrite],
    table: u64,
) -> Result<Plan, PlanError> {
    if writes.is_empty() {
        return Ok(Plan::empty());
    }
    limit("write_table writes", writes.len() as u64, u32::MAX.into())?;
    let list: Vec<TableWriteAbi> = writes.iter().map(TableWriteAbi::from).collect();
    let mut plan = Plan::empty();
    let part = plan.stage(bytemuck::cast_slice(&list).to_vec(), PartKind::PerCall);
    let n = writes.len() as u32;
    let mut args = Args::default();
    args.staged(part, 0).u32(n).ptr(table).u32(d.table_len);
    plan.launches.push(Launch {
        kernel: Kernel::WriteTable,
        grid: [stride_grid(t, n.into(), TABLE_THREADS.into()), 1, 1],
        block: TABLE_THREADS,
        shared: 0,
        args,
    });
    Ok(plan)
}

/// `hs_reset_hot_state` with the row list staged (`slot_host_rows`, `lru`: device addresses). An empty list
/// enqueues nothing.
pub fn reset_hot_state(
    t: &Target,
    d: &HotResetDesc,
    rows: &[u32],
    slot_host_rows: u64,
    lru: u64,
) -> Result<Plan, PlanError> {
    if rows.is_empty() {
        return Ok(Plan::empty());
    }
    limit("reset_hot_state rows", rows.len() as u64, u32::MAX.into())?;
    let mut plan = Plan::empty();
    let part = plan.stage(bytemuck::cast_slice(rows).to_vec(), PartKind::PerCall);
    let n = rows.len() as u32;
    let work = u64::from(n) * u64::from(d.hot_slots);
    let mut args = Args::default();
    args.staged(part, 0)
        .u32(n)
        .ptr(slot_host_rows)
        .ptr(lru)
        .u32(d.num_requests)
        .u32(d.hot_slots);
    plan.launches.push(Launch {
        kernel: Kernel::ResetHotState,
        grid: [stride_grid(t, work, TABLE_THREADS.into()), 1, 1],
        block: TABLE_THREADS,
        shared: 0,
        args,
    });
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_core::ops::LayerPair;

    const H200: Target = Target {
        multiprocessors: 132,
        shared_per_block: 227 * 1024,
        shared_per_multiprocessor: 228 * 1024,
    };
    const MI300: Target = Target {
        multiprocessors: 304,
        shared_per_block: 64 * 1024,
        shared_per_multiprocessor: 64 * 1024,
    };

    fn resolve_desc(t: u32, k: u32, n: u32) -> ResolveDesc {
        ResolveDesc {
            num_tokens: t,
            top_k: k,
            num_requests: t.max(1),
            max_pages: 1024,
            block_size: 64,
            hot_slots: n,
            attention_block_stride: 64,
            host_num_blocks: 1 << 16,
            num_state_rows: None,
            stats_slot: 0,
        }
    }

    #[test]
    fn every_launch_matches_its_abi() {
        let a = ResolveAddrs::default();
        let mut plans = vec![
            resolve(&H200, &resolve_desc(64, 2048, 4096), &a, false).unwrap(),
            resolve(&MI300, &resolve_desc(3, 2048, 32768), &a, false).unwrap(),
            remap(
                &H200,
                &RemapDesc {
                    num_tokens: 3,
                    top_k: 2048,
                    table_rows: 3,
                    max_blocks: 8,
                    block_size: 64,
                    block_stride_rows: 64,
                    idx_mapping_len: Some(3),
                    write_counts: true,
                    compact: true,
                    stats_slot: 0,
                },
                &RemapAddrs::default(),
            )
            .unwrap(),
            invalidate(
                &H200,
                &InvalidateDesc {
                    num_requests: 2,
                    hot_slots: 16,
                    num_ranges: 1,
                },
                1,
                2,
            ),
            slot_mapping(
                &SlotMappingDesc {
                    num_tokens: 9,
                    ratio: 4,
                    block_size: 64,
                    table_rows: 1,
                    max_blocks: 4,
                },
                &SlotMappingAddrs::default(),
            ),
            write_table(
                &H200,
                &TableWriteDesc { table_len: 4 },
                &[TableWrite { index: 1, value: 2 }],
                8,
            )
            .unwrap(),
            reset_hot_state(
                &H200,
                &HotResetDesc {
                    num_requests: 2,
                    hot_slots: 8,
                },
                &[1, 1],
                8,
                16,
            )
            .unwrap(),
        ];
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        plans.push(
            gather(
                &H200,
                &GatherDesc {
                    num_tokens: 2,
                    top_k: 40,
                    layers: &[LayerPair { host: l, device: l }; 20],
                },
                &GatherAddrs::default(),
            )
            .unwrap(),
        );
        plans.push(
            copy_pages(
                &H200,
                &[(l, l); 3],
                &[BlockPair { src: 1, dst: 2 }],
                0,
                0,
                true,
            )
            .unwrap(),
        );
        for p in plans {
            assert!(!p.launches.is_empty());
            for mut l in p.launches {
                l.args.matches(&l.kernel.abi()).unwrap();
                assert!(l.block <= l.kernel.abi().block_threads);
                let staged: Vec<u64> = (0..p.staged.len() as u64).map(|i| 4096 * (i + 1)).collect();
                l.args.resolve(&staged, 1 << 20, 1 << 19).unwrap();
                assert!(l.args.pointers().is_ok());
            }
        }
    }

    /// The fused launch: one block per token row, the gather's arguments after the resolve's,
    /// the counters placed only with a workspace; the pair below FUSED_MIN_ROWS.
    #[test]
    fn fused_launch_has_the_resolve_grid_and_the_gather_arguments() {
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        let layers = [LayerPair { host: l, device: l }; 2];
        let fused = |t: u32| {
            let d = resolve_desc(t, 2048, 4096);
            let p =
                resolve_gather(&H200, &d, &ResolveAddrs::default(), &layers, 0, 0, false).unwrap();
            let l = p.launches[0].clone();
            assert_eq!(l.kernel, Kernel::ResolveGather);
            l.args.matches(&l.kernel.abi()).unwrap();
            (l.grid[0], l.args.has_pending())
        };
        assert!(!swap_in_fused(&resolve_desc(1, 2048, 4096)));
        assert!(swap_in_fused(&resolve_desc(64, 2048, 4096)));
        // 64 requests: their tables need the global workspace and its counters.
        assert_eq!(fused(64), (64, true));
        assert_eq!(fused(256), (256, true));
        // One request: its table fits shared memory, so no workspace and no counters.
        assert_eq!(fused(1), (1, false));
    }

    /// A plain remap of few rows is cut into column tiles until the launch has about two blocks
    /// per multiprocessor; counts and compaction keep one block per row.
    #[test]
    fn few_plain_remap_rows_are_cut_into_column_tiles() {
        assert_eq!(remap_tiles(&H200, 1, 2048), (8, 64));
        assert_eq!(remap_tiles(&H200, 16, 2048), (8, 64));
        assert_eq!(remap_tiles(&H200, 64, 2048), (4, 128));
        assert_eq!(remap_tiles(&H200, 128, 2048), (2, 256));
        assert_eq!(remap_tiles(&H200, 256, 2048), (1, 512));
        assert_eq!(remap_tiles(&H200, 1, 4096), (16, 64));
        assert_eq!(remap_tiles(&H200, 1, 100), (1, 64));
        assert_eq!(remap_tiles(&H200, 1, 2047), (32, 64));
        let shape = |write_counts: bool, compact: bool| {
            let d = RemapDesc {
                num_tokens: 1,
                top_k: 2048,
                table_rows: 4,
                max_blocks: 64,
                block_size: 64,
                block_stride_rows: 64,
                idx_mapping_len: None,
                write_counts,
                compact,
                stats_slot: 0,
            };
            let l = remap(&H200, &d, &RemapAddrs::default()).unwrap().launches[0].clone();
            (l.grid, l.block)
        };
        assert_eq!(shape(false, false), ([1, 8, 1], 64));
        assert_eq!(shape(true, false), ([1, 1, 1], 512));
        assert_eq!(shape(false, true), ([1, 1, 1], 512));
        // Every tile count covers the row exactly once.
        for tokens in [1, 3, 17, 64, 200, 300] {
            for k in [1, 4, 64, 100, 2047, 2048, 4096, 8192] {
                let (tiles, threads) = remap_tiles(&H200, tokens, k);
                let per = if k % 4 == 0 { 4 } else { 1 };
                assert!(threads % 64 == 0 && threads <= REMAP_MAX_THREADS);
                assert!(
                    u64::from(tiles) * u64::from(threads) * per
                        >= u64::from(k).min(u64::from(REMAP_MAX_THREADS) * per)
                );
                assert!((tiles - 1) * threads * (per as u32) < k.max(64 * per as u32));
            }
        }
    }

    #[test]
    fn remap_modes_take_their_own_kernel_with_the_plain_shape() {
        let plain = RemapDesc {
            num_tokens: 700,
            top_k: 2048,
            table_rows: 4,
            max_blocks: 64,
            block_size: 64,
            block_stride_rows: 64,
            idx_mapping_len: None,
            write_counts: true,
            compact: true,
            stats_slot: 0,
        };
        let a = RemapModesAddrs {
            prefill_req_id: 32,
            workspace_starts: 48,
            ..RemapModesAddrs::default()
        };
        let p = remap_modes(&H200, &RemapModesDesc::plain(plain), &a).unwrap();
        assert_eq!(
            p.launches[0].kernel,
            Kernel::Remap,
            "no mode: the plain kernel"
        );
        let base = remap(&H200, &plain, &a.remap).unwrap().launches.remove(0);
        for (dcp, prefill) in [
            (
                Some(hisparse_core::ops::DcpSplit {
                    size: 4,
                    rank: 1,
                    interleave: 2,
                }),
                None,
            ),
            (None, Some(3)),
        ] {
            let d = RemapModesDesc {
                remap: plain,
                dcp,
                prefill_requests: prefill,
            };
            let mut l = remap_modes(&H200, &d, &a).unwrap().launches.remove(0);
            assert_eq!(l.kernel, Kernel::RemapModes);
            assert_eq!(
                (l.grid, l.block, l.shared),
                (base.grid, base.block, base.shared)
            );
            l.args.matches(&Kernel::RemapModes.abi()).unwrap();
            let ptrs = l.args.pointers().unwrap();
            // The workspace buffers are passed only with a workspace.
            assert_eq!(ptrs.len(), Kernel::RemapModes.abi().params.len());
            let at = |name: &str| {
                let params = Kernel::RemapModes.abi().params;
                let i = params.iter().position(|p| p.name == name).unwrap();
                u64::from_ne_bytes(l.args.value(i).unwrap().try_into().unwrap())
            };
            assert_eq!(
                (at("prefill_req_id"), at("workspace_starts")),
                if prefill.is_some() { (32, 48) } else { (0, 0) }
            );
        }
    }

    /// The `stats` argument of a launch (its address).
    fn stats_arg(l: &Launch) -> u64 {
        let i = l.kernel.abi().params.iter().position(|p| p.name == "stats");
        u64::from_ne_bytes(l.args.value(i.unwrap()).unwrap().try_into().unwrap())
    }

    #[test]
    fn stats_take_their_slot_address_and_an_empty_batch_one_block() {
        let remap_desc = |num_tokens, stats_slot| RemapDesc {
            num_tokens,
            top_k: 8,
            table_rows: 1,
            max_blocks: 2,
            block_size: 4,
            block_stride_rows: 4,
            idx_mapping_len: None,
            write_counts: false,
            compact: false,
            stats_slot,
        };
        let counted = RemapAddrs {
            stats: 4096,
            ..RemapAddrs::default()
        };
        let p = remap(&H200, &remap_desc(3, 2), &counted).unwrap();
        assert_eq!(stats_arg(&p.launches[0]), 4096 + 32);
        // Without stats the argument is null and an empty batch launches nothing.
        let p = remap(&H200, &remap_desc(3, 2), &RemapAddrs::default()).unwrap();
        assert_eq!(stats_arg(&p.launches[0]), 0);
        assert!(
            remap(&H200, &remap_desc(0, 0), &RemapAddrs::default())
                .unwrap()
                .launches
                .is_empty()
        );
        // With stats an empty batch is one block that counts the call.
        let p = remap(&H200, &remap_desc(0, 1), &counted).unwrap();
        assert_eq!((p.launches.len(), p.launches[0].grid), (1, [1, 1, 1]));
        assert_eq!(stats_arg(&p.launches[0]), 4096 + 16);

        let d = ResolveDesc {
            stats_slot: 5,
            ..resolve_desc(0, 64, 128)
        };
        let counted = ResolveAddrs {
            stats: Some(8192),
            ..ResolveAddrs::default()
        };
        assert!(
            resolve(&H200, &d, &ResolveAddrs::default(), false)
                .unwrap()
                .launches
                .is_empty()
        );
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        let layers = [LayerPair { host: l, device: l }];
        for p in [
            resolve(&H200, &d, &counted, false).unwrap(),
            resolve_gather(&H200, &d, &counted, &layers, 64, 128, false).unwrap(),
        ] {
            assert_eq!(p.launches.len(), 1);
            let l = &p.launches[0];
            assert_eq!((l.kernel, l.grid), (Kernel::Resolve, [1, 1, 1]));
            assert_eq!(stats_arg(l), 8192 + 80);
            assert_eq!(p.workspace_bytes, 0, "an empty batch takes no workspace");
        }
        let p = resolve_gather(
            &H200,
            &resolve_desc(64, 64, 128),
            &counted,
            &layers,
            64,
            128,
            false,
        )
        .unwrap();
        assert_eq!(p.launches[0].kernel, Kernel::ResolveGather);
        assert_eq!(stats_arg(&p.launches[0]), 8192);
        // A slot address beyond the address space is refused, not wrapped.
        let far = ResolveAddrs {
            stats: Some(u64::MAX - 8),
            ..ResolveAddrs::default()
        };
        assert!(resolve(&H200, &d, &far, false).is_err());
    }

    #[test]
    fn remap_blocks_cover_a_row_with_vectors() {
        assert_eq!(remap_threads(2048), 512);
        assert_eq!(remap_threads(512), 128);
        assert_eq!(remap_threads(8), 64);
        assert_eq!(remap_threads(2052), REMAP_MAX_THREADS);
        assert_eq!(remap_threads(130), 192);
        assert_eq!(remap_threads(100), 64);
        assert_eq!(remap_threads(1 << 20), REMAP_MAX_THREADS);
    }

    #[test]
    fn resolver_memory_follows_one_rule_on_every_device() {
        // H200, 64 requests of one row: the table the whole launch could need does not fit; the
        // largest that does (8192 entries, room for two rows) is shared, the rest in workspace.
        let s = resolve_shape(&H200, &resolve_desc(64, 2048, 4096), false);
        assert!(!s.global_state);
        assert_eq!(s.shared_table, 8192);
        assert_eq!(s.shared_bytes, resolve_shared_bytes(4096, 8192));
        assert_eq!(s.workspace_entries, resolve_workspace_entries(64, 2048));
        // One row: a quarter-full table (twice what it needs), nothing in the workspace.
        let s = resolve_shape(&H200, &resolve_desc(1, 2048, 4096), false);
        assert_eq!((s.shared_table, s.workspace_entries), (8192, 0));
        // More rows than multiprocessors: two blocks share one.
        let s = resolve_shape(&H200, &resolve_desc(200, 2048, 4096), false);
        assert!(s.shared_bytes <= 114 * 1024 - RESOLVE_STATIC_SHARED_BYTES);
        // 64 KiB (AMD): state of 32768 slots does not fit, global-state mode.
        let s = resolve_shape(&MI300, &resolve_desc(2, 2048, 32768), false);
        assert!(s.global_state);
        assert!(s.shared_bytes <= 64 * 1024 - RESOLVE_STATIC_SHARED_BYTES);
        let s = resolve_shape(&MI300, &resolve_desc(2, 2048, 4096), false);
        assert!(!s.global_state);
        assert_eq!(s.shared_table, 2048);
        assert!(s.workspace_entries > 0);
        // Forced global-state mode.
        assert!(resolve_shape(&H200, &resolve_desc(2, 64, 4096), true).global_state);
        // A device without shared memory to speak of: everything in the workspace.
        let tiny = Target {
            shared_per_block: 256,
            ..MI300
        };
        let s = resolve_shape(&tiny, &resolve_desc(2, 64, 4096), false);
        assert!(s.global_state);
        assert_eq!(s.shared_table, 0);
    }

    /// The host work of a call is its plan: the decode path stages nothing (one launch, its
    /// arguments by value), and a copy's layer table is marked constant, so a backend keeps it
    /// once instead of staging it on every call (`crate::arena`); only the call's own list is
    /// staged.
    #[test]
    fn decode_plans_stage_nothing_and_copies_mark_their_layer_table_constant() {
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        let layers = [LayerPair { host: l, device: l }; 3];
        let a = ResolveAddrs::default();
        for p in [
            resolve(&H200, &resolve_desc(64, 2048, 4096), &a, false).unwrap(),
            resolve(&H200, &resolve_desc(4, 2048, 4096), &a, false).unwrap(),
            resolve_gather(
                &H200,
                &resolve_desc(64, 2048, 4096),
                &a,
                &layers,
                64,
                128,
                false,
            )
            .unwrap(),
            gather(
                &H200,
                &GatherDesc {
                    num_tokens: 4,
                    top_k: 2048,
                    layers: &layers,
                },
                &GatherAddrs {
                    host: 64,
                    device: 128,
                    ..GatherAddrs::default()
                },
            )
            .unwrap(),
        ] {
            assert!(p.staged.is_empty(), "{p:?}");
            assert_eq!(p.launches.len(), 1);
        }
        let span = |device_block| RowSpan {
            device_block,
            host_block: 1,
            first_row: 0,
            num_rows: 3,
        };
        let desc = RowCopyDesc {
            direction: Direction::DeviceToHost,
            layers: &layers,
        };
        let a = copy_rows(&H200, &desc, &[span(1)], 64, 128).unwrap();
        let b = copy_rows(&H200, &desc, &[span(2), span(3)], 64, 128).unwrap();
        let kinds = |p: &Plan| p.staged.iter().map(|s| s.kind).collect::<Vec<_>>();
        assert_eq!(kinds(&a), [PartKind::Constant, PartKind::PerCall]);
        // The same layers give the same constant bytes whatever the spans: one arena entry.
        assert_eq!(a.staged[0].bytes, b.staged[0].bytes);
        assert_ne!(a.staged[1].bytes, b.staged[1].bytes);
        let pages = copy_pages(
            &H200,
            &[(l, l)],
            &[BlockPair { src: 1, dst: 2 }],
            64,
            128,
            false,
        )
        .unwrap();
        assert_eq!(kinds(&pages), [PartKind::Constant, PartKind::PerCall]);
    }

    #[test]
    fn copies_split_only_where_tiles_conflict() {
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        let pairs = [
            BlockPair { src: 1, dst: 2 },
            BlockPair { src: 3, dst: 4 },
            BlockPair { src: 5, dst: 6 },
        ];
        // Between buffers: one launch over 3 layers × 3 pairs... with distinct layer bases.
        let jobs: Vec<(PageLayout, PageLayout)> = (0..3)
            .map(|i| {
                let m = PageLayout {
                    base: i * 8 * 1024,
                    ..l
                };
                (m, m)
            })
            .collect();
        let p = copy_pages(&H200, &jobs, &pairs, 0, 1 << 30, false).unwrap();
        assert_eq!(p.launches.len(), 1);
        assert_eq!(p.staged.len(), 2);
        // A chain in one buffer (2 -> 3 after 1 -> 2): split before the second pair.
        let chain = [BlockPair { src: 1, dst: 2 }, BlockPair { src: 2, dst: 3 }];
        let p = copy_pages(&H200, &[(l, l)], &chain, 0, 0, true).unwrap();
        assert_eq!(p.launches.len(), 2);
        // Rectangles: batches cut inside layers become per-layer pair ranges.
        let all: Vec<Range<usize>> = core::iter::once(0..9).collect();
        let whole = rectangles(&all, 3);
        assert_eq!((whole.len(), whole[0].clone()), (1, (0..3, 0..3)));
        assert_eq!(
            rectangles(&[0..4, 4..9], 3),
            [(0..1, 0..3), (1..2, 0..1), (1..2, 1..3), (2..3, 0..3)]
        );
    }

    #[test]
    fn copies_plan_scale_words_and_refuse_what_the_kernels_cannot_address() {
        let split = |row: u32, value: u32| PageLayout {
            value_bytes: value,
            ..PageLayout::contiguous(0, 37_440, 8, 64, row)
        };
        // One rule for the scale words, in every layout a planner packs.
        for (row, value, word) in [
            (656, 656, 16),
            (656, 640, 16),
            (584, 576, 8),
            (132, 128, 4),
            (20, 16, 4),
        ] {
            let l = split(row, value);
            assert_eq!(crate::scale_word(&l), word, "{row} = {value} + scale");
            assert_eq!(crate::Layout::from(&l).scale_word, word);
            check_layout(&l).unwrap();
            let g = gather(
                &H200,
                &GatherDesc {
                    num_tokens: 1,
                    top_k: 8,
                    layers: &[LayerPair { host: l, device: l }],
                },
                &GatherAddrs::default(),
            )
            .unwrap();
            assert_eq!(g.launches.len(), 1);
        }
        let refused = |l: PageLayout| {
            let e = copy_pages(
                &H200,
                &[(l, l)],
                &[BlockPair { src: 0, dst: 1 }],
                0,
                0,
                false,
            )
            .unwrap_err();
            let PlanError::Geometry { what, .. } = e else {
                panic!("{e:?}");
            };
            what
        };
        assert_eq!(
            refused(PageLayout {
                base: 8,
                ..split(584, 576)
            }),
            "layout.base"
        );
        assert_eq!(
            refused(PageLayout {
                block_stride: 37_448,
                ..split(584, 576)
            }),
            "layout.block_stride"
        );
        assert_eq!(
            refused(split(22, 16)),
            "layout scale part (row_bytes - value_bytes)"
        );
        // A contiguous row is all values: whole 16-byte chunks.
        assert_eq!(refused(split(584, 584)), "layout.value_bytes");
        assert_eq!(refused(split(584, 568)), "layout.value_bytes");
        assert_eq!(refused(split(576, 592)), "layout.row_bytes");
        // Pool addresses the 16-byte chunks cannot start at.
        let l = split(584, 576);
        let e = copy_pages(
            &H200,
            &[(l, l)],
            &[BlockPair { src: 0, dst: 1 }],
            4,
            0,
            false,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("copy_pages source address = 4"),
            "{e}"
        );
        let e = gather(
            &H200,
            &GatherDesc {
                num_tokens: 1,
                top_k: 8,
                layers: &[LayerPair { host: l, device: l }],
            },
            &GatherAddrs {
                device: 8,
                ..GatherAddrs::default()
            },
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("gather device pool address = 8"),
            "{e}"
        );
        let spans = [RowSpan {
            device_block: 0,
            host_block: 1,
            first_row: 0,
            num_rows: 3,
        }];
        let bad = PageLayout {
            base: 4,
            ..split(132, 128)
        };
        let desc = RowCopyDesc {
            direction: Direction::HostToDevice,
            layers: &[LayerPair {
                host: split(132, 128),
                device: bad,
            }],
        };
        assert!(matches!(
            copy_rows(&H200, &desc, &spans, 0, 0),
            Err(PlanError::Geometry {
                what: "layout.base",
                value: 4,
                ..
            })
        ));
    }

    #[test]
    fn gather_grid_holds_every_item_or_fills_the_device() {
        let l = PageLayout::contiguous(0, 1024, 8, 16, 64);
        let layer = [LayerPair { host: l, device: l }];
        let g = |t: u32| {
            gather(
                &H200,
                &GatherDesc {
                    num_tokens: t,
                    top_k: 2048,
                    layers: &layer,
                },
                &GatherAddrs::default(),
            )
            .unwrap()
            .launches[0]
                .grid
        };
        assert_eq!(g(1), [128, 1, 1]);
        assert_eq!(g(64), [132 * 8, 1, 1]);
        assert!(
            gather(
                &H200,
                &GatherDesc {
                    num_tokens: 0,
                    top_k: 8,
                    layers: &layer
                },
                &GatherAddrs::default()
            )
            .unwrap()
            .launches
            .is_empty()
        );
    }
}
