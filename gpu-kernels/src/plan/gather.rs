//! Planners of the gather of a miss plan (`hs_gather_rows`) and of the fused resolve-and-gather
//! (`hs_resolve_gather`).

use hisparse_core::ops::{GatherDesc, LayerPair, ResolveDesc};

use super::resolve::{ResolveAddrs, resolve};
use super::{Launch, Plan, PlanError, Target, check_layers, check_pool, limit};
use crate::args::Args;
use crate::{GATHER_MAX_LAYERS, GATHER_ROWS, GATHER_THREADS, GatherLayers, Kernel};

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

/// How `hs_gather_rows` takes its work items (the kernel's `walk` argument). Every walk copies
/// the same rows; they differ in which rows are read at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GatherWalk {
    /// The production rule, [`gather_in_order`]: rows in order when a layer's host pages spread
    /// beyond [`GATHER_LOCAL_SPAN`], else every row at once.
    #[default]
    Auto,
    /// Every row's first chunk first: all rows in flight at once (the fastest over a host pool
    /// whose address translations the host keeps cached).
    AllRows,
    /// Rows in order, [`GATHER_ROWS_IN_FLIGHT`] at once sharing [`GATHER_IN_ORDER_BLOCKS`]
    /// blocks.
    InOrder,
}

/// The host span (bytes from a layer's first host page to the end of its last) beyond which
/// random rows read from every request at once stall on the host's address translation. Measured
/// on the H200's host (`kernel-lab/host-translation/sysmem_gather.cu`, 656-byte rows): 0.73–0.84×
/// of bulk H2D from 0.7 GiB, 0.50–0.58× from 3 GiB, 0.35× from 48 GiB; rows inside one 1 GiB
/// window of the 48 GiB pool 0.60–0.83×, inside 4 GiB 0.47–0.52×.
pub const GATHER_LOCAL_SPAN: u64 = 1 << 30;

/// Token rows an in-order gather reads at once ([`GatherWalk::InOrder`]). A decode request's
/// misses of one layer lie in its own host pages (one window of tens of MiB): a few windows at a
/// time keep the host's translations cached (the H200 host: rows in groups of 53 inside 21 MiB
/// windows of a 48 GiB pool, walked in order by 256 warps, 0.76× of bulk H2D against 0.42× for
/// every row at once).
pub const GATHER_ROWS_IN_FLIGHT: u32 = 4;

/// Blocks of an in-order gather per layer, shared out among the token rows read at once (32
/// blocks of [`GATHER_ROWS`]-entry items: 512 plan entries in flight, however few rows the
/// launch has).
pub const GATHER_IN_ORDER_BLOCKS: u32 = 32;

/// The in-order walk of `num_tokens` token rows: (blocks per row, the grid's x), at most
/// [`GATHER_ROWS_IN_FLIGHT`] rows at once sharing [`GATHER_IN_ORDER_BLOCKS`] blocks.
pub fn gather_in_order_grid(num_tokens: u32) -> (u32, u32) {
    let rows = num_tokens.clamp(1, GATHER_ROWS_IN_FLIGHT);
    let per_row = GATHER_IN_ORDER_BLOCKS / rows;
    (per_row, per_row * rows)
}

/// Bytes from a layer's first host page to the end of its last.
fn host_span(l: &LayerPair) -> u64 {
    let h = &l.host;
    u64::from(h.num_blocks.saturating_sub(1)) * h.block_stride + h.page_bytes()
}

/// Whether a gather over `layers` walks its rows in order: [`GatherWalk::InOrder`], or
/// [`GatherWalk::Auto`] with some layer's host pages spread beyond [`GATHER_LOCAL_SPAN`]. The
/// swap-in of such layers is also the resolve then the in-order gather rather than the fused
/// launch ([`swap_in_fused`]), whose blocks copy every request's misses at once.
pub fn gather_in_order(layers: &[LayerPair], walk: GatherWalk) -> bool {
    match walk {
        GatherWalk::Auto => layers.iter().any(|l| host_span(l) > GATHER_LOCAL_SPAN),
        GatherWalk::AllRows => false,
        GatherWalk::InOrder => true,
    }
}

/// `hs_gather_rows`: a persistent grid per chunk of at most [`GATHER_MAX_LAYERS`] layers (grid z),
/// each block walking work items of [`GATHER_ROWS`] plan entries. Every row at once: first
/// entries of every row first, the grid holding every item at once when the device can, else
/// filling the device. Rows in order ([`gather_in_order`]): [`gather_in_order_grid`], at most
/// [`GATHER_ROWS_IN_FLIGHT`] groups sharing [`GATHER_IN_ORDER_BLOCKS`] blocks per layer.
pub fn gather(
    t: &Target,
    d: &GatherDesc<'_>,
    a: &GatherAddrs,
    walk: GatherWalk,
) -> Result<Plan, PlanError> {
    if d.num_tokens == 0 || d.layers.is_empty() {
        return Ok(Plan::empty());
    }
    let items = u64::from(d.top_k.div_ceil(GATHER_ROWS)) * u64::from(d.num_tokens);
    limit("gather num_tokens * top_k / 16", items, u32::MAX.into())?;
    check_layers(d.layers)?;
    check_pool("gather host pool address", a.host)?;
    check_pool("gather device pool address", a.device)?;
    let in_order = gather_in_order(d.layers, walk);
    let mut plan = Plan::empty();
    for chunk in d.layers.chunks(GATHER_MAX_LAYERS) {
        let (grid_x, walk_arg) = if in_order {
            let (per_row, grid) = gather_in_order_grid(d.num_tokens);
            (grid, per_row)
        } else {
            let resident = u64::from(t.multiprocessors.max(1)) * GATHER_BLOCKS_PER_MULTIPROCESSOR;
            let per_layer = (resident / chunk.len() as u64).max(1);
            (items.min(per_layer).max(1) as u32, 0)
        };
        let mut args = Args::default();
        args.ptr(a.plan_src)
            .ptr(a.plan_dst)
            .ptr(a.plan_counts)
            .ptr(a.host)
            .ptr(a.device)
            .u32(d.num_tokens)
            .u32(d.top_k)
            .gather_layers(&GatherLayers::new(chunk))
            .u32(walk_arg);
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

// Resolve and gather in one launch

/// Token rows from which the production swap-in is one [`resolve_gather`] launch; below, it is
/// [`resolve`] then [`gather`] (the backends' `Device::resolve_and_gather`). A fused launch copies
/// with one block per token row: with few rows too few blocks keep the bus busy. Measured on an
/// H200 (`cuda_bench`, 2048 × 9.1 % misses): 1 request 40.3 µs fused against 29.0 µs for the
/// pair; 64 requests 191.3 against 198.8 µs; 256 requests 695.2 against 726.7 µs.
pub const FUSED_MIN_ROWS: u32 = 64;

/// Whether the production swap-in of `d` over `layers` is one fused launch: from
/// [`FUSED_MIN_ROWS`] token rows, unless the gather walks its rows in order
/// ([`gather_in_order`]; then the resolve and the in-order gather).
pub fn swap_in_fused(d: &ResolveDesc, layers: &[LayerPair], walk: GatherWalk) -> bool {
    d.num_tokens >= FUSED_MIN_ROWS && !gather_in_order(layers, walk)
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
            GatherWalk::Auto,
        )?;
        plan.launches.extend(more.launches);
    }
    Ok(plan)
}
