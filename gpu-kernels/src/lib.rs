//! Kernel sources shared by the HiSparse CUDA and ROCm backends, and the ABI they are launched with.
//!
//! There is **one** kernel source, [`COMMON_SOURCE`], written against a tiny set of `HS_*`
//! macros: the files of `kernels/` below, one per operation family, concatenated in this order
//! into one translation unit (each part uses what the parts before it define):
//!
//! | part | holds |
//! |---|---|
//! | `common.cuh` | types, the structs mirrored here, row and page arithmetic, memory hints, block scans |
//! | `remap.cuh` | `hs_remap` (with its decode-size lean path), `hs_remap_wide` (one entry a thread, for few plain rows) and `hs_remap_modes` |
//! | `resolve.cuh` | the resolver's launch contract, hash table, classification, state layout |
//! | `resolve_general.cuh` | the resolver's general body (several rows, batch-row order, tables in global memory) |
//! | `resolve_decode.cuh` | the resolver's decode path and the `hs_resolve` kernel |
//! | `gather.cuh` | `hs_gather_rows` and the fused `hs_resolve_gather` |
//! | `copy.cuh` | page copies, row-span copies, the indexer backup |
//! | `tables.cuh` | invalidation, the compressed slot mapping, table writes and hot-state resets |
//!
//! Each vendor has a prelude that defines the macros:
//! [`CUDA_PRELUDE`] (`kernels/vendor_cuda.h`, for NVRTC or nvcc) and [`HIP_PRELUDE`]
//! (`kernels/vendor_hip.h`, for hiprtc or `clang -x hip`). [`CUDA_SOURCE`] and [`HIP_SOURCE`] are
//! the ready-to-compile concatenations. Backends compile them at run time (NVRTC / hiprtc), so
//! building this crate needs no GPU toolkit.
//!
//! Every kernel reproduces a reference function of `hisparse_core::ops` bit for bit. The
//! [`Kernel`] enum names them; [`Kernel::abi`] gives each one's symbol, its parameters in order
//! ([`Param`]) and its block size, which is all a launcher (or a test double decoding launches)
//! needs. The `#[repr(C)]` structs here ([`Layout`], [`LayerPairAbi`], [`GatherLayers`],
//! [`PageJob`], [`Pair`], [`Span`], [`TableWriteAbi`], [`Wanted`]) mirror the C structs of the
//! source byte for byte and are `bytemuck::Pod`: lists are staged as their bytes, no hand packing.
//!
//! This crate also owns *what to launch*: [`plan`] has one planner per operation, shared by the
//! CUDA and ROCm backends, that turns a checked descriptor and buffer addresses into staged lists,
//! a workspace size and launches with grid, block, dynamic shared memory and arguments packed by
//! [`args::Args`] against the ABI table.
//!
//! Testing without a GPU: `emu/vendor_cpu.h` is a third prelude that turns the same source into
//! C++20 for the CPU (a block's threads as fibers on one OS thread, barriers and warp shuffles
//! emulated, the threads of each barrier interval run in varying orders), and
//! `tests/cpu_emulation/` compiles it with the system C++ compiler, executes the planners'
//! launches through wrappers generated from this ABI table, and compares the results bit for bit
//! with the core's reference on random inputs (`HISPARSE_REQUIRE_CXX=1` makes a missing compiler
//! a failure).
//!
//! [`lending`] holds the argument checks both backends apply to memory an engine lends them.
//!
//! What this crate deliberately does not do: load drivers, compile, or launch anything.

#![deny(missing_docs)]

pub mod arena;
pub mod args;
pub mod lending;
pub mod plan;

use bytemuck::{Pod, Zeroable};
use hisparse_core::ops::{LayerPair, PageLayout, TableWrite};

/// The kernel source's parts in order (the table of the crate docs), as one string literal:
/// the one list every user of the source reads (`backend-rocm/scripts/build-code-objects.sh`
/// takes the same order from these lines).
macro_rules! common_source {
    () => {
        concat!(
            include_str!("../kernels/common.cuh"),
            include_str!("../kernels/remap.cuh"),
            include_str!("../kernels/resolve.cuh"),
            include_str!("../kernels/resolve_general.cuh"),
            include_str!("../kernels/resolve_decode.cuh"),
            include_str!("../kernels/gather.cuh"),
            include_str!("../kernels/copy.cuh"),
            include_str!("../kernels/tables.cuh"),
        )
    };
}

/// The vendor-neutral kernel source (needs a prelude first).
pub const COMMON_SOURCE: &str = common_source!();
/// The CUDA prelude: defines the `HS_*` macros for NVRTC/nvcc.
pub const CUDA_PRELUDE: &str = include_str!("../kernels/vendor_cuda.h");
/// The HIP prelude: defines the `HS_*` macros for hiprtc/clang.
pub const HIP_PRELUDE: &str = include_str!("../kernels/vendor_hip.h");
/// Complete CUDA translation unit: [`CUDA_PRELUDE`] followed by [`COMMON_SOURCE`].
pub const CUDA_SOURCE: &str = concat!(include_str!("../kernels/vendor_cuda.h"), common_source!());
/// Complete HIP translation unit: [`HIP_PRELUDE`] followed by [`COMMON_SOURCE`].
pub const HIP_SOURCE: &str = concat!(include_str!("../kernels/vendor_hip.h"), common_source!());
/// File name to give the translation unit in compiler diagnostics (the concatenation of the
/// parts; a line number there counts from the first line of `common.cuh`).
pub const SOURCE_NAME: &str = "hisparse.cu";

/// Most threads per block of `hs_remap` (the planner picks the block size per row length:
/// [`plan::remap_threads`]).
pub const REMAP_MAX_THREADS: u32 = 512;
/// `hs_remap` flag: `idx_mapping` is given.
pub const REMAP_HAS_MAP: u32 = 1;
/// `hs_remap` flag: write per-row valid counts.
pub const REMAP_COUNTS: u32 = 2;
/// `hs_remap` flag: compact valid entries to the front.
pub const REMAP_COMPACT: u32 = 4;
/// `hs_remap` flag (with [`REMAP_COMPACT`]): build each compacted row in the launch's dynamic
/// shared memory (`4 * top_k` bytes) and store it as whole 16-byte vectors.
pub const REMAP_STAGED: u32 = 16;
/// `hs_remap` flag (plain rows, no compaction, `top_k` a multiple of 8): each thread takes two
/// 16-byte vectors of its row, the launch `top_k / 8` threads per row ([`plan::remap`] sets it
/// when the rows outnumber what the device holds at once).
pub const REMAP_PAIR: u32 = 32;
/// Largest dynamic shared memory the planner gives `hs_remap` for a staged compaction (rows of
/// more than a quarter of this many entries compact in place).
pub const REMAP_STAGE_MAX_BYTES: u32 = 16 * 1024;
/// Most threads per block of `hs_remap_wide` ([`Kernel::RemapWide`]).
pub const REMAP_WIDE_MAX_THREADS: u32 = 256;
/// Threads per block the planner gives `hs_remap_wide`: vLLM's programs of four warps.
pub const REMAP_WIDE_THREADS: u32 = 128;
/// Threads per block of `hs_resolve`.
pub const RESOLVE_THREADS: u32 = 1024;
/// Threads per block of `hs_gather_rows`.
pub const GATHER_THREADS: u32 = 128;
/// Plan entries per work item of `hs_gather_rows`.
pub const GATHER_ROWS: u32 = 16;
/// Most layers one `hs_gather_rows` launch carries (more are split over several launches).
pub const GATHER_MAX_LAYERS: usize = 16;
/// 16-byte loads each thread of an `hs_resolve_gather` launch keeps in flight while it copies its
/// request's misses (`HS_FUSED_GATHER_UNROLL`: few enough registers for the resolver's bound).
pub const FUSED_GATHER_UNROLL: u32 = 4;
/// Threads per block of `hs_copy_pages` and `hs_copy_rows`.
pub const COPY_THREADS: u32 = 256;
/// Threads per block of `hs_invalidate`.
pub const INVALIDATE_THREADS: u32 = 256;
/// Threads per block of `hs_indexer_backup`.
pub const INDEXER_THREADS: u32 = 256;
/// Threads of `hs_indexer_backup` that copy one row together (a block takes
/// `INDEXER_THREADS / INDEXER_GROUP` rows at a time).
pub const INDEXER_GROUP: u32 = 32;
/// Threads per block of `hs_compressed_slot_mapping`.
pub const SLOT_THREADS: u32 = 256;
/// Threads per block of `hs_write_table` and `hs_reset_hot_state`.
pub const TABLE_THREADS: u32 = 256;
/// `hs_copy_rows` direction: device pool → host pool.
pub const DIRECTION_DEVICE_TO_HOST: u32 = 0;
/// `hs_copy_rows` direction: host pool → device pool.
pub const DIRECTION_HOST_TO_DEVICE: u32 = 1;

/// The type of one kernel parameter, in the order the kernel declares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// A device pointer (8 bytes; may be null where the kernel's docs say so).
    Ptr,
    /// `int32_t`.
    I32,
    /// `uint32_t`.
    U32,
    /// `uint64_t`.
    U64,
    /// [`GatherLayers`] by value (1296 bytes, 8-byte aligned).
    GatherLayers,
}

impl Param {
    /// Size in bytes of the parameter as passed.
    pub const fn size(self) -> usize {
        match self {
            Param::Ptr | Param::U64 => 8,
            Param::I32 | Param::U32 => 4,
            Param::GatherLayers => core::mem::size_of::<GatherLayers>(),
        }
    }

    /// Alignment in bytes of the parameter as passed.
    pub const fn align(self) -> usize {
        match self {
            Param::Ptr | Param::U64 | Param::GatherLayers => 8,
            Param::I32 | Param::U32 => 4,
        }
    }
}

/// A named parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamedParam {
    /// The parameter's name in the source.
    pub name: &'static str,
    /// Its type.
    pub ty: Param,
}

/// Everything needed to launch one kernel: symbol, parameters in order, block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelAbi {
    /// The `extern "C"` symbol.
    pub name: &'static str,
    /// Parameters in declaration order.
    pub params: &'static [NamedParam],
    /// Threads per block (one dimension) the kernel is written for: exactly this many, or, with
    /// [`KernelAbi::variable_block`], at most this many.
    pub block_threads: u32,
    /// The kernel runs with any block of a multiple of 64 threads (whole warps and wavefronts)
    /// up to [`KernelAbi::block_threads`] (the planner chooses).
    pub variable_block: bool,
}

/// Every kernel of the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `hs_remap`: grid `(num_tokens)`, block [`plan::remap_threads`] (at most
    /// [`REMAP_MAX_THREADS`]). `flags` is a set of `REMAP_*`. `stats` is the address of the
    /// call's stats slot (`hisparse_core::ops::stats`: four `u32` words) or null.
    Remap,
    /// `hs_resolve`: grid `(num_tokens)`, block [`RESOLVE_THREADS`], dynamic shared memory
    /// [`resolve_shared_bytes`]. `workspace` (`Wanted[workspace_entries]`) and
    /// `workspace_counter` ([`WORKSPACE_COUNTER_BYTES`]: zero before the first launch, left zero
    /// by every launch) back requests whose table does not
    /// fit `smem_table_entries` (a power of two, or 0); see [`resolve_workspace_entries`].
    /// With [`RESOLVE_GLOBAL_STATE`] set in `smem_table_entries` (global-state mode), the
    /// per-request LRU copy, partition and bitmap come from the workspace as well
    /// ([`resolve_state_entries`] entries per resolving block, bump-allocated before that block's
    /// table), the low 31 bits are the shared table capacity, the dynamic shared memory is
    /// [`resolve_global_shared_bytes`] and the workspace [`resolve_global_workspace_entries`].
    /// `stats` is the address of the call's stats slot (`hisparse_core::ops::stats`: four `u32`
    /// words) or null; an empty batch with stats is a grid of one block.
    Resolve,
    /// `hs_gather_rows`: grid `(any, 1, layers.count)`, block [`GATHER_THREADS`]; blocks walk
    /// work items of [`GATHER_ROWS`] plan entries grid-stride ([`plan::gather`]). `host` is the
    /// device address of the mapped pinned host pool.
    GatherRows,
    /// `hs_copy_pages`: 1-D grid (any size), block [`COPY_THREADS`]. `jobs`: `PageJob[num_layers]`,
    /// `pairs`: `Pair[num_pairs]`, both in device memory. Destination ranges of one launch must be
    /// disjoint from each other and from every source range.
    CopyPages,
    /// `hs_copy_rows`: 1-D grid (any size), block [`COPY_THREADS`]. `layers`:
    /// `LayerPairAbi[num_layers]`, `spans`: `Span[num_spans]`, in device memory. Same overlap rule
    /// as [`Kernel::CopyPages`].
    CopyRows,
    /// `hs_invalidate`: 1-D grid (any size), block [`INVALIDATE_THREADS`]. `total` = `R * N`.
    Invalidate,
    /// `hs_compressed_slot_mapping`: grid `(ceil(num_tokens / SLOT_THREADS))`, block
    /// [`SLOT_THREADS`].
    CompressedSlotMapping,
    /// `hs_write_table`: 1-D grid (any size), block [`TABLE_THREADS`]. `writes`:
    /// `TableWriteAbi[num_writes]` in device memory, indices strictly increasing (unique).
    WriteTable,
    /// `hs_reset_hot_state`: 1-D grid (any size), block [`TABLE_THREADS`]. `rows`:
    /// `u32[num_rows]` in device memory (repeats allowed).
    ResetHotState,
    /// `hs_resolve_gather`: [`Kernel::Resolve`] (same block, shared memory, workspace and
    /// parameters), then, in the same launch, the gather of each resolved request's misses into
    /// `device` for the first `layers.count` layers (at most [`GATHER_MAX_LAYERS`]), as
    /// [`Kernel::GatherRows`] would with the miss plan. `host` is the device address of the
    /// mapped pinned host pool. Grid `(num_tokens)`: each resolving block copies its request's
    /// misses.
    ResolveGather,
    /// `hs_remap_modes`: [`Kernel::Remap`] (same grid, block, dynamic shared memory and flags)
    /// with the modes of `hisparse_core::ops::remap::remap_modes`: a prefill workspace
    /// (`prefill_req_id` and `workspace_starts`, null with `prefill_requests` 0 when off) and a
    /// decode-context-parallel split (`dcp_size` 0 when off). A separate kernel, so the plain
    /// remap's code is untouched.
    RemapModes,
    /// `hs_indexer_backup`: 1-D grid (any size), block [`INDEXER_THREADS`]. `layers`:
    /// `LayerPairAbi[num_layers]` in device memory; `device` (read) and `host` (written, the
    /// mapped indexer host cache) are the pools. Rows move in 16-byte chunks where every part
    /// allows, else in 4-byte words (`hisparse_core::ops::indexer_backup`).
    IndexerBackup,
    /// `hs_remap_wide`: [`Kernel::Remap`]'s parameters for a plain remap (no counts or
    /// compaction: `counts` unused, `flags` only [`REMAP_HAS_MAP`]) with one top-k entry a
    /// thread: grid `(ceil(top_k / block), num_tokens)` (`num_tokens` at most 65,535), block at
    /// most [`REMAP_WIDE_MAX_THREADS`] ([`plan::remap_layout`] picks it for few plain rows).
    RemapWide,
}

macro_rules! params {
    ($($name:ident: $ty:ident),* $(,)?) => {
        &[$(NamedParam { name: stringify!($name), ty: Param::$ty }),*]
    };
}

const REMAP_PARAMS: &[NamedParam] = params![
    req_id: Ptr, block_table: Ptr, topk: Ptr, idx_mapping: Ptr, out: Ptr, counts: Ptr, stats: Ptr,
    num_tokens: U32, top_k: U32, table_rows: U32, max_blocks: U32, block_size: U32,
    block_stride_rows: U32, idx_mapping_len: U32, flags: U32,
];
const RESOLVE_PARAMS: &[NamedParam] = params![
    req_id: Ptr, topk: Ptr, resident_table: Ptr, host_table: Ptr, hot_table: Ptr, slot_host_rows: Ptr,
    lru: Ptr, indices: Ptr, valid_counts: Ptr, hit_counts: Ptr, miss_counts: Ptr, miss_src: Ptr,
    miss_dst: Ptr, workspace: Ptr, workspace_counter: Ptr, workspace_entries: U32,
    smem_table_entries: U32, num_tokens: U32, top_k: U32, num_requests: U32, max_pages: U32,
    block_size: U32, hot_slots: U32, attention_block_stride: U32, host_num_blocks: U32,
    idx_mapping: Ptr, num_state_rows: U32, stats: Ptr,
];
const GATHER_PARAMS: &[NamedParam] = params![
    plan_src: Ptr, plan_dst: Ptr, plan_counts: Ptr, host: Ptr, device: Ptr, num_tokens: U32,
    top_k: U32, layers: GatherLayers, walk: U32,
];
const COPY_PAGES_PARAMS: &[NamedParam] = params![
    jobs: Ptr, num_layers: U32, pairs: Ptr, num_pairs: U32, src: Ptr, dst: Ptr,
];
const COPY_ROWS_PARAMS: &[NamedParam] = params![
    layers: Ptr, num_layers: U32, spans: Ptr, num_spans: U32, direction: U32, host: Ptr,
    device: Ptr,
];
const INVALIDATE_PARAMS: &[NamedParam] = params![
    ranges: Ptr, num_ranges: U32, slot_host_rows: Ptr, total: U64,
];
const SLOT_PARAMS: &[NamedParam] = params![
    positions: Ptr, slot_mapping: Ptr, table_row: Ptr, block_table: Ptr, out: Ptr,
    num_tokens: U32, ratio: U32, block_size: U32, table_rows: U32, max_blocks: U32,
];
const WRITE_TABLE_PARAMS: &[NamedParam] = params![
    writes: Ptr, num_writes: U32, table: Ptr, table_len: U32,
];
const RESET_HOT_PARAMS: &[NamedParam] = params![
    rows: Ptr, num_rows: U32, slot_host_rows: Ptr, lru: Ptr, num_requests: U32, hot_slots: U32,
];
const REMAP_MODES_PARAMS: &[NamedParam] = params![
    req_id: Ptr, block_table: Ptr, topk: Ptr, idx_mapping: Ptr, out: Ptr, counts: Ptr, stats: Ptr,
    prefill_req_id: Ptr, workspace_starts: Ptr, num_tokens: U32, top_k: U32, table_rows: U32,
    max_blocks: U32, block_size: U32, block_stride_rows: U32, idx_mapping_len: U32, flags: U32,
    prefill_requests: U32, dcp_size: U32, dcp_rank: U32, dcp_interleave: U32,
];
const INDEXER_BACKUP_PARAMS: &[NamedParam] = params![
    device_slots: Ptr, host_slots: Ptr, num_tokens: U32, layers: Ptr, num_layers: U32, device: Ptr,
    host: Ptr,
];
const RESOLVE_GATHER_PARAMS: &[NamedParam] = params![
    req_id: Ptr, topk: Ptr, resident_table: Ptr, host_table: Ptr, hot_table: Ptr, slot_host_rows: Ptr,
    lru: Ptr, indices: Ptr, valid_counts: Ptr, hit_counts: Ptr, miss_counts: Ptr, miss_src: Ptr,
    miss_dst: Ptr, workspace: Ptr, workspace_counter: Ptr, workspace_entries: U32,
    smem_table_entries: U32, num_tokens: U32, top_k: U32, num_requests: U32, max_pages: U32,
    block_size: U32, hot_slots: U32, attention_block_stride: U32, host_num_blocks: U32,
    idx_mapping: Ptr, num_state_rows: U32, stats: Ptr, host: Ptr, device: Ptr,
    layers: GatherLayers,
];

impl Kernel {
    /// Every kernel, in source order.
    pub const ALL: [Kernel; 13] = [
        Kernel::Remap,
        Kernel::Resolve,
        Kernel::GatherRows,
        Kernel::CopyPages,
        Kernel::CopyRows,
        Kernel::Invalidate,
        Kernel::CompressedSlotMapping,
        Kernel::WriteTable,
        Kernel::ResetHotState,
        Kernel::ResolveGather,
        Kernel::RemapModes,
        Kernel::IndexerBackup,
        Kernel::RemapWide,
    ];

    /// The resolver kernels whose occupancy `plan::Target::resolve_blocks_per_multiprocessor`
    /// is (the smallest of theirs): a backend asks its driver about each when it loads them.
    pub const RESOLVERS: [Kernel; 2] = [Kernel::Resolve, Kernel::ResolveGather];

    /// Symbol, parameters and block size.
    pub const fn abi(self) -> KernelAbi {
        let (name, params, block_threads) = match self {
            Kernel::Remap => ("hs_remap", REMAP_PARAMS, REMAP_MAX_THREADS),
            Kernel::Resolve => ("hs_resolve", RESOLVE_PARAMS, RESOLVE_THREADS),
            Kernel::GatherRows => ("hs_gather_rows", GATHER_PARAMS, GATHER_THREADS),
            Kernel::CopyPages => ("hs_copy_pages", COPY_PAGES_PARAMS, COPY_THREADS),
            Kernel::CopyRows => ("hs_copy_rows", COPY_ROWS_PARAMS, COPY_THREADS),
            Kernel::Invalidate => ("hs_invalidate", INVALIDATE_PARAMS, INVALIDATE_THREADS),
            Kernel::CompressedSlotMapping => {
                ("hs_compressed_slot_mapping", SLOT_PARAMS, SLOT_THREADS)
            }
            Kernel::WriteTable => ("hs_write_table", WRITE_TABLE_PARAMS, TABLE_THREADS),
            Kernel::ResetHotState => ("hs_reset_hot_state", RESET_HOT_PARAMS, TABLE_THREADS),
            Kernel::ResolveGather => ("hs_resolve_gather", RESOLVE_GATHER_PARAMS, RESOLVE_THREADS),
            Kernel::RemapModes => ("hs_remap_modes", REMAP_MODES_PARAMS, REMAP_MAX_THREADS),
            Kernel::IndexerBackup => ("hs_indexer_backup", INDEXER_BACKUP_PARAMS, INDEXER_THREADS),
            Kernel::RemapWide => ("hs_remap_wide", REMAP_PARAMS, REMAP_WIDE_MAX_THREADS),
        };
        KernelAbi {
            name,
            params,
            block_threads,
            variable_block: matches!(self, Kernel::Remap | Kernel::RemapModes | Kernel::RemapWide),
        }
    }

    /// The `extern "C"` symbol.
    pub const fn name(self) -> &'static str {
        self.abi().name
    }

    /// Whether launches of the kernel may ask for more dynamic shared memory than a device gives
    /// without opting in (48 KiB on CUDA): the resolvers, whose shared state and table the
    /// planner sizes up to the device's per-block maximum. A backend raises the limit of these
    /// when it loads them.
    pub const fn large_dynamic_shared(self) -> bool {
        matches!(self, Kernel::Resolve | Kernel::ResolveGather)
    }
}

/// One layer's pages in one pool: `struct hs_layout` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct Layout {
    /// Byte offset of block 0's page.
    pub base: u64,
    /// Bytes between consecutive blocks' pages.
    pub block_stride: u64,
    /// Blocks in the pool.
    pub num_blocks: u32,
    /// Rows per page.
    pub block_size: u32,
    /// Bytes per row.
    pub row_bytes: u32,
    /// Value bytes per row.
    pub value_bytes: u32,
    /// Divisor turning a flat row into `(block, offset)`.
    pub index_stride_rows: u32,
    /// Bytes per access of a row's scale part: 16, 8 or 4 ([`scale_word`]; the kernels read any
    /// other value as 16).
    pub scale_word: u32,
}

/// Bytes per access the kernels copy a row's scale part of `layout` with: 16 when it is a
/// multiple of 16 (every contiguous row, and split rows such as 640 + 16), else 8 when a multiple
/// of 8 (DeepSeek V4's 576 + 8), else 4 (its indexer's 128 + 4). A scale part starts at
/// `page + block_size * value_bytes + offset * scale_bytes`, so with 16-byte aligned pages every
/// word is aligned to its size. The one rule of the kernels' chunking: the planners put it in
/// every [`Layout`] they pass, the kernels branch on it once per layer.
pub const fn scale_word(layout: &PageLayout) -> u32 {
    let scale = layout.row_bytes.wrapping_sub(layout.value_bytes);
    if scale.is_multiple_of(16) {
        16
    } else if scale.is_multiple_of(8) {
        8
    } else {
        4
    }
}

impl From<&PageLayout> for Layout {
    fn from(l: &PageLayout) -> Self {
        Layout {
            base: l.base,
            block_stride: l.block_stride,
            num_blocks: l.num_blocks,
            block_size: l.block_size,
            row_bytes: l.row_bytes,
            value_bytes: l.value_bytes,
            index_stride_rows: l.index_stride_rows,
            scale_word: scale_word(l),
        }
    }
}

/// A layer in both pools: `struct hs_layer_pair` (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct LayerPairAbi {
    /// Layout in the pinned host pool.
    pub host: Layout,
    /// Layout in the device pool.
    pub device: Layout,
}

impl From<&LayerPair> for LayerPairAbi {
    fn from(l: &LayerPair) -> Self {
        LayerPairAbi {
            host: (&l.host).into(),
            device: (&l.device).into(),
        }
    }
}

/// The layers of one gather launch, passed by value: `struct hs_gather_layers` (1296 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct GatherLayers {
    /// Layers used (`1..=GATHER_MAX_LAYERS`).
    pub count: u32,
    /// Padding (0).
    pub pad: [u32; 3],
    /// The layers; entries beyond `count` are ignored.
    pub layer: [LayerPairAbi; GATHER_MAX_LAYERS],
}

impl GatherLayers {
    /// Packs up to [`GATHER_MAX_LAYERS`] layers (extra layers are ignored: split first).
    pub fn new(layers: &[LayerPair]) -> Self {
        let mut g = GatherLayers {
            count: layers.len().min(GATHER_MAX_LAYERS) as u32,
            pad: [0; 3],
            layer: [LayerPairAbi::default(); GATHER_MAX_LAYERS],
        };
        for (d, s) in g.layer.iter_mut().zip(layers) {
            *d = s.into();
        }
        g
    }
}

/// One layer of a whole-page copy: `struct hs_page_job` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct PageJob {
    /// Byte offset of block 0's page in the source buffer.
    pub src_base: u64,
    /// Bytes between source pages.
    pub src_stride: u64,
    /// Byte offset of block 0's page in the destination buffer.
    pub dst_base: u64,
    /// Bytes between destination pages.
    pub dst_stride: u64,
    /// Bytes per page (a multiple of 4: the last `page_bytes % 16` bytes move as 4-byte words).
    pub page_bytes: u64,
}

/// A source block and a destination block: `struct hs_pair` (8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct Pair {
    /// Source block.
    pub src: u32,
    /// Destination block.
    pub dst: u32,
}

/// A row span: `struct hs_span` (16 bytes), same fields as `hisparse_core::ops::RowSpan`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct Span {
    /// Device block.
    pub device_block: u32,
    /// Host block.
    pub host_block: u32,
    /// First row in the page.
    pub first_row: u32,
    /// Rows.
    pub num_rows: u32,
}

/// One sparse table write: `struct hs_table_write` (8 bytes), the fields of
/// `hisparse_core::ops::TableWrite`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct TableWriteAbi {
    /// Element index into the table.
    pub index: u32,
    /// The value written.
    pub value: i32,
}

impl From<&TableWrite> for TableWriteAbi {
    fn from(w: &TableWrite) -> Self {
        TableWriteAbi {
            index: w.index,
            value: w.value,
        }
    }
}

/// One entry of the resolver's wanted-row table: `struct hs_wanted` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct Wanted {
    /// Flat host row, or -1.
    pub key: i32,
    /// First entry ordinal.
    pub first_entry: u32,
    /// First LRU position caching the row.
    pub first_lru: u32,
    /// Slot given to the row.
    pub slot: u32,
}

const _: () = {
    assert!(INDEXER_THREADS.is_multiple_of(INDEXER_GROUP));
    assert!(core::mem::size_of::<Layout>() == 40);
    assert!(core::mem::size_of::<LayerPairAbi>() == 80);
    assert!(core::mem::size_of::<GatherLayers>() == 1296);
    assert!(core::mem::align_of::<GatherLayers>() == 8);
    assert!(core::mem::size_of::<PageJob>() == 40);
    assert!(core::mem::size_of::<Pair>() == 8);
    assert!(core::mem::size_of::<Span>() == 16);
    assert!(core::mem::size_of::<Wanted>() == 16);
    assert!(core::mem::size_of::<TableWriteAbi>() == 8);
};

const fn align16(x: u64) -> u64 {
    (x + 15) & !15
}

/// Hot-table entries of the resolving request `hs_resolve` stages in shared memory (the first
/// `4 * RESOLVE_HOT_STAGE` bytes of its dynamic shared memory; a request with more hot blocks
/// reads them from global memory).
pub const RESOLVE_HOT_STAGE: u32 = 1024;

/// Bytes of one request's resolver state for `hot_slots` slots: the LRU copy, its inverse and
/// the partition (`u16[N]` each), the permutation and hit bitmaps (`N` bits each), each part
/// 16-byte aligned (`hs_resolve_state_bytes` in the source).
pub const fn resolve_state_bytes(hot_slots: u32) -> u64 {
    let n = hot_slots as u64;
    3 * align16(2 * n) + 2 * align16(4 * n.div_ceil(32))
}

/// Dynamic shared memory of `hs_resolve` for `hot_slots` slots and a shared wanted-row table of
/// `table_entries` entries: the hot stage ([`RESOLVE_HOT_STAGE`] entries of 4 bytes), the state
/// ([`resolve_state_bytes`]), then the table (16 bytes per entry).
pub const fn resolve_shared_bytes(hot_slots: u32, table_entries: u32) -> u64 {
    4 * RESOLVE_HOT_STAGE as u64 + resolve_state_bytes(hot_slots) + 16 * table_entries as u64
}

/// Flag bit of `hs_resolve`'s `smem_table_entries` selecting global-state mode: each resolving
/// block keeps its LRU copy, partition and bitmap in the workspace instead of shared memory
/// (`HS_RESOLVE_GLOBAL_STATE` in the source). For `hot_slots` whose [`resolve_shared_bytes`]
/// `(hot_slots, 0)` exceeds the device's shared memory per block.
pub const RESOLVE_GLOBAL_STATE: u32 = 1 << 31;

/// 16-byte workspace entries one resolving block takes for its state in global-state mode:
/// `resolve_state_bytes(hot_slots) / 16` (a multiple of 16 bytes).
pub const fn resolve_state_entries(hot_slots: u32) -> u64 {
    resolve_state_bytes(hot_slots) / 16
}

/// Dynamic shared memory of `hs_resolve` in global-state mode: the hot stage and the shared
/// wanted-row table of `table_entries` entries.
pub const fn resolve_global_shared_bytes(table_entries: u32) -> u64 {
    4 * RESOLVE_HOT_STAGE as u64 + 16 * table_entries as u64
}

/// 16-byte workspace entries `hs_resolve` needs in global-state mode: the state of at most
/// `min(num_tokens, num_requests)` resolving blocks (one per distinct request) plus, when a
/// request's wanted-row table may not fit the shared table (`tables_in_workspace`), the tables'
/// [`resolve_workspace_entries`].
pub const fn resolve_global_workspace_entries(
    num_tokens: u32,
    top_k: u32,
    num_requests: u32,
    hot_slots: u32,
    tables_in_workspace: bool,
) -> u64 {
    let blocks = if num_tokens < num_requests {
        num_tokens
    } else {
        num_requests
    };
    let tables = if tables_in_workspace {
        resolve_workspace_entries(num_tokens, top_k)
    } else {
        0
    };
    blocks as u64 * resolve_state_entries(hot_slots) + tables
}

/// Static shared memory of `hs_resolve` and `hs_resolve_gather` (scan scratch for two sums and a
/// few words), an upper bound.
pub const RESOLVE_STATIC_SHARED_BYTES: u64 = 4 * 128 + 4 * 8;

/// Bytes of a stream's resolver counters (`u32` words, the `workspace_counter` of the
/// resolvers): the bump allocator of a launch, the blocks finished, the most entries one launch
/// took (word [`WORKSPACE_HIGH_WATER_WORD`], a diagnostic) and one unused word. They must be
/// zero before the first launch that uses them; every launch leaves all but the diagnostic zero
/// (its last block to finish resets them), so a backend clears them once, when it makes the
/// stream.
pub const WORKSPACE_COUNTER_BYTES: u64 = 16;

/// Index of the `u32` word of the workspace counters that holds the most entries one launch
/// took.
pub const WORKSPACE_HIGH_WATER_WORD: usize = 2;

/// 16-byte table entries the global wanted-row workspace needs so that every request of a launch
/// of `num_tokens × top_k` entries finds room: `4 * num_tokens * top_k + 16 * num_tokens`.
pub const fn resolve_workspace_entries(num_tokens: u32, top_k: u32) -> u64 {
    4 * num_tokens as u64 * top_k as u64 + 16 * num_tokens as u64
}

/// Shared table entries the planner reserves for a launch of `num_tokens` rows of `top_k`
/// entries, when they fit: the table the whole launch could need, and at least a quarter-full
/// table for one row (the resolver's decode path probes less the emptier its table is).
pub const fn resolve_table_goal(num_tokens: u32, top_k: u32) -> u64 {
    let needed = resolve_table_entries(num_tokens as u64 * top_k as u64);
    let one_row = resolve_table_entries(2 * top_k as u64);
    if needed > one_row { needed } else { one_row }
}

/// Table entries a request of `entries` top-k entries needs (`max(16, next_pow2(2 * entries))`).
pub const fn resolve_table_entries(entries: u64) -> u64 {
    let need = 2 * entries;
    if need <= 16 {
        16
    } else {
        need.next_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel of the ABI table is defined in the source with the same parameter names in the
    /// same order.
    #[test]
    fn abi_table_matches_source() {
        for k in Kernel::ALL {
            let abi = k.abi();
            let needle = format!(" {}(", abi.name);
            let at = COMMON_SOURCE
                .find(&needle)
                .unwrap_or_else(|| panic!("{} not in source", abi.name));
            let rest = &COMMON_SOURCE[at + needle.len()..];
            let sig = &rest[..rest.find(')').expect("closing paren")];
            let names: Vec<&str> = sig
                .split(',')
                .map(|p| {
                    p.trim()
                        .rsplit(|c: char| c.is_whitespace() || c == '*')
                        .next()
                        .unwrap_or("")
                })
                .collect();
            let expected: Vec<&str> = abi.params.iter().map(|p| p.name).collect();
            assert_eq!(names, expected, "parameters of {}", abi.name);
            for p in abi.params {
                let decl = sig
                    .split(',')
                    .map(str::trim)
                    .find(|d| d.ends_with(p.name))
                    .expect("declared");
                let ok = match p.ty {
                    Param::Ptr => decl.contains('*'),
                    Param::U32 => decl.starts_with("u32 "),
                    Param::I32 => decl.starts_with("i32 "),
                    Param::U64 => decl.starts_with("u64 "),
                    Param::GatherLayers => decl.starts_with("hs_gather_layers "),
                };
                assert!(ok, "{}: `{decl}` is not {:?}", abi.name, p.ty);
            }
        }
    }

    #[test]
    fn block_sizes_and_limits_match_source() {
        for (name, value) in [
            ("HS_REMAP_MAX_THREADS", REMAP_MAX_THREADS),
            ("HS_RESOLVE_THREADS", RESOLVE_THREADS),
            ("HS_GATHER_THREADS", GATHER_THREADS),
            ("HS_GATHER_ROWS", GATHER_ROWS),
            ("HS_GATHER_MAX_LAYERS", GATHER_MAX_LAYERS as u32),
            ("HS_COPY_THREADS", COPY_THREADS),
            ("HS_INVALIDATE_THREADS", INVALIDATE_THREADS),
            ("HS_SLOT_THREADS", SLOT_THREADS),
            ("HS_TABLE_THREADS", TABLE_THREADS),
            ("HS_REMAP_HAS_MAP", REMAP_HAS_MAP),
            ("HS_REMAP_COUNTS", REMAP_COUNTS),
            ("HS_REMAP_COMPACT", REMAP_COMPACT),
            ("HS_REMAP_STAGED", REMAP_STAGED),
            ("HS_REMAP_PAIR", REMAP_PAIR),
            ("HS_RESOLVE_HOT_STAGE", RESOLVE_HOT_STAGE),
            ("HS_FUSED_GATHER_UNROLL", FUSED_GATHER_UNROLL),
        ] {
            let line = format!("#define {name} {value}");
            assert!(
                COMMON_SOURCE
                    .lines()
                    .any(|l| l.trim_end() == line || l.trim_end() == format!("{line}u")),
                "`{line}` not in source"
            );
        }
    }

    #[test]
    fn sources_are_prelude_plus_common() {
        assert_eq!(CUDA_SOURCE, format!("{CUDA_PRELUDE}{COMMON_SOURCE}"));
        assert_eq!(HIP_SOURCE, format!("{HIP_PRELUDE}{COMMON_SOURCE}"));
    }

    #[test]
    fn resolve_sizes() {
        assert_eq!(resolve_table_entries(2048), 4096);
        assert_eq!(resolve_table_entries(1), 16);
        assert_eq!(resolve_state_bytes(4096), 3 * 8192 + 2 * 512);
        assert_eq!(resolve_shared_bytes(4096, 0), 4096 + 3 * 8192 + 2 * 512);
        assert_eq!(resolve_shared_bytes(3, 16), 4096 + 5 * 16 + 256);
        // 32768 slots: 3 x 64 KiB + 8 KiB of state, over AMD's 64 KiB per block.
        assert_eq!(resolve_state_bytes(32_768), 3 * 65_536 + 2 * 4096);
        assert_eq!(resolve_state_entries(32_768), (3 * 65_536 + 2 * 4096) / 16);
        assert_eq!(resolve_state_entries(3), 5);
        assert_eq!(resolve_global_shared_bytes(0), 4096);
        assert_eq!(resolve_global_shared_bytes(1024), 4096 + 16_384);
        // One state per distinct request: min(num_tokens, num_requests) blocks.
        assert_eq!(
            resolve_global_workspace_entries(4, 64, 2, 32_768, false),
            2 * resolve_state_entries(32_768)
        );
        assert_eq!(
            resolve_global_workspace_entries(2, 64, 8, 4096, true),
            2 * resolve_state_entries(4096) + resolve_workspace_entries(2, 64)
        );
        assert!(COMMON_SOURCE.contains(&format!(
            "#define HS_RESOLVE_GLOBAL_STATE {RESOLVE_GLOBAL_STATE:#x}u"
        )));
    }
}
