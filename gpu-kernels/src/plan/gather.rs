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

// Resolve and gather in one launch

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
