//! Planners of the remap (`hs_remap`, with its decode-size column tiles) and of the remap with
//! modes (`hs_remap_modes`).

use hisparse_core::ops::{RemapDesc, RemapModesDesc};

use super::{Launch, Plan, PlanError, Target, limit, nothing_to_launch, stats_slot_address};
use crate::args::Args;
use crate::{
    Kernel, REMAP_COMPACT, REMAP_COUNTS, REMAP_HAS_MAP, REMAP_MAX_THREADS, REMAP_PAIR,
    REMAP_STAGE_MAX_BYTES, REMAP_STAGED, REMAP_WIDE_THREADS,
};

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
    let mut flags = map_flag(d);
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

/// Whether a plain remap (no compaction) of `num_tokens` rows of `top_k` entries gives each
/// thread two 16-byte vectors ([`REMAP_PAIR`]): when its rows at one vector per thread need
/// more blocks than the device holds at once, so that every row runs in the first wave with
/// twice the loads in flight per thread (on the H200, 1,024 rows of 2,048 with counts: 5.2
/// instead of 5.7 µs; at 256 rows, which fit, the two are even). `top_k` a multiple of 8 whose
/// row one block covers.
pub fn remap_pairs(t: &Target, num_tokens: u32, top_k: u32, compact: bool) -> bool {
    let threads = u64::from(remap_threads(top_k));
    let room = u64::from(t.multiprocessors.max(1))
        * u64::from(REMAP_BLOCKS_PER_MULTIPROCESSOR)
        * u64::from(REMAP_MAX_THREADS);
    !compact
        && top_k.is_multiple_of(8)
        && top_k / 8 <= REMAP_MAX_THREADS
        && u64::from(num_tokens) * threads > room
}

/// Rows up to which a plain remap takes `hs_remap_wide` (one entry a thread) instead of
/// `hs_remap`'s vectors. Measured with stats, as the runtime remaps (`cuda_bench`, top-k 2048,
/// L2 warm): on the H100 machine (2026-12-05) 1.67 against 2.06 µs at 1 token, 2.04 against
/// 2.23 at 16, 2.14 against 2.23 at 24, 2.37 against 2.31 at 32, 2.74 against 2.44 at 64; on
/// the H200 the two crossed near 25 rows too (linear between 1 and 64). `cuda_bench` times both
/// layouts at 1–1024 tokens ([`remap_as`]), the figures to move it by.
pub const REMAP_WIDE_MAX_ROWS: u32 = 24;

/// The two layouts of a remap: live alternatives, one chosen per launch by [`remap_layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemapLayout {
    /// `hs_remap`: whole 16-byte vectors a thread, column tiles or pairs by the row count, every
    /// mode (counts, compaction).
    Vectors,
    /// `hs_remap_wide`: one top-k entry a thread, grid (ceil(top_k / 128), rows); plain remaps
    /// only (no counts or compaction).
    Wide,
}

/// The layout [`remap`] takes for `d`: [`RemapLayout::Wide`] for plain rows (no counts or
/// compaction), at least one and at most [`REMAP_WIDE_MAX_ROWS`], else
/// [`RemapLayout::Vectors`].
pub fn remap_layout(d: &RemapDesc) -> RemapLayout {
    if !d.write_counts && !d.compact && (1..=REMAP_WIDE_MAX_ROWS).contains(&d.num_tokens) {
        RemapLayout::Wide
    } else {
        RemapLayout::Vectors
    }
}

/// Rows of a grid's y dimension a launch may have (CUDA's and HIP's limit): `hs_remap_wide`'s
/// token rows.
const GRID_Y_MAX: u32 = 65_535;

/// The flag every remap kernel reads for an `idx_mapping` ([`REMAP_HAS_MAP`], or none).
fn map_flag(d: &RemapDesc) -> u32 {
    if d.idx_mapping_len.is_some() {
        REMAP_HAS_MAP
    } else {
        0
    }
}

/// The sizes and flags every remap kernel takes after its buffers, in their ABI order.
fn remap_sizes(args: &mut Args, d: &RemapDesc, flags: u32) {
    args.u32(d.num_tokens)
        .u32(d.top_k)
        .u32(d.table_rows)
        .u32(d.max_blocks)
        .u32(d.block_size)
        .u32(d.block_stride_rows)
        .u32(d.idx_mapping_len.unwrap_or(0))
        .u32(flags);
}

/// The buffers every remap kernel takes first, in their ABI order.
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
/// ([`remap_tiles`]); a plain remap of more rows than the device holds at once gives each thread
/// two vectors ([`remap_pairs`]). A compaction of rows of at most [`REMAP_STAGE_MAX_BYTES`] / 4
/// entries is staged in dynamic shared memory ([`REMAP_STAGED`]). An empty batch launches
/// nothing, or with stats one block that counts the call.
pub fn remap(t: &Target, d: &RemapDesc, a: &RemapAddrs) -> Result<Plan, PlanError> {
    remap_as(t, d, a, remap_layout(d))
}

/// [`remap`] in the given layout instead of the rule's (a benchmark times both on the same
/// inputs; the rule is set from such figures). [`RemapLayout::Wide`] takes plain remaps only:
/// counts or compaction are a [`PlanError::Geometry`].
pub fn remap_as(
    t: &Target,
    d: &RemapDesc,
    a: &RemapAddrs,
    layout: RemapLayout,
) -> Result<Plan, PlanError> {
    if nothing_to_launch(d.num_tokens, a.stats) {
        return Ok(Plan::empty());
    }
    if layout == RemapLayout::Wide {
        if d.write_counts || d.compact {
            return Err(PlanError::Geometry {
                what: "remap layout",
                value: u64::from(d.write_counts) | u64::from(d.compact) << 1,
                need: "plain rows (no counts or compaction) for the one-entry-a-thread layout",
            });
        }
        limit(
            "remap num_tokens (wide layout)",
            d.num_tokens.into(),
            GRID_Y_MAX.into(),
        )?;
        let mut args = Args::default();
        remap_args(&mut args, d, a)?;
        remap_sizes(&mut args, d, map_flag(d));
        return Ok(Plan::one(Launch {
            kernel: Kernel::RemapWide,
            grid: [d.top_k.div_ceil(REMAP_WIDE_THREADS), d.num_tokens, 1],
            block: REMAP_WIDE_THREADS,
            shared: 0,
            args,
        }));
    }
    let mut shape = remap_shape(t, d)?;
    if remap_pairs(t, d.num_tokens, d.top_k, d.compact) {
        // The rows outnumber the device's room at once (so one tile each): half the threads per
        // block, so twice the blocks at once.
        shape.flags |= REMAP_PAIR;
        shape.block = remap_threads(d.top_k / 2);
        let per_multiprocessor =
            REMAP_BLOCKS_PER_MULTIPROCESSOR * (REMAP_MAX_THREADS / shape.block);
        shape.grid[0] = d
            .num_tokens
            .min(t.multiprocessors.max(1).saturating_mul(per_multiprocessor));
    }
    let mut args = Args::default();
    remap_args(&mut args, d, a)?;
    remap_sizes(&mut args, d, shape.flags);
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
    args.ptr(prefill).ptr(starts);
    remap_sizes(&mut args, r, shape.flags);
    args.u32(prefill_requests)
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
