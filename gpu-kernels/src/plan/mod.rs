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

use hisparse_core::ops::{LayerPair, PageLayout};

use crate::Kernel;
use crate::args::Args;

mod copy;
mod gather;
mod remap;
mod resolve;
mod tables;
#[cfg(test)]
mod tests;

pub use copy::{IndexerBackupAddrs, copy_pages, copy_rows, indexer_backup};
pub use gather::{
    FUSED_MIN_ROWS, GATHER_BLOCKS_PER_MULTIPROCESSOR, GATHER_IN_ORDER_BLOCKS, GATHER_LOCAL_SPAN,
    GATHER_ROWS_IN_FLIGHT, GatherAddrs, GatherWalk, gather, gather_in_order, gather_in_order_grid,
    resolve_gather, swap_in_fused,
};
pub use remap::{
    REMAP_BLOCKS_PER_MULTIPROCESSOR, REMAP_TILE_BLOCKS_PER_MULTIPROCESSOR, REMAP_WIDE_MAX_ROWS,
    RemapAddrs, RemapLayout, RemapModesAddrs, remap, remap_as, remap_layout, remap_modes,
    remap_pairs, remap_threads, remap_tiles,
};
pub use resolve::{ResolveAddrs, ResolveShape, resolve, resolve_shape};
pub use tables::{SlotMappingAddrs, invalidate, reset_hot_state, slot_mapping, write_table};

/// What the planners need to know about the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Multiprocessors (CUDA SMs, AMD compute units).
    pub multiprocessors: u32,
    /// Shared memory one block may use, static and dynamic together (CUDA: the opt-in maximum).
    pub shared_per_block: u64,
    /// Shared memory of one multiprocessor (what blocks resident together share).
    pub shared_per_multiprocessor: u64,
    /// Resolver blocks ([`crate::RESOLVE_THREADS`] threads) one multiprocessor runs at once as
    /// far as its registers and threads allow, before shared memory: the loaded resolver
    /// kernels' occupancy (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, HIP's equivalent),
    /// the smallest over [`Kernel::RESOLVERS`]. 0 counts as 1. The resolver
    /// splits a multiprocessor's shared memory only between blocks that can run there together
    /// ([`resolve_shape`]).
    pub resolve_blocks_per_multiprocessor: u32,
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
