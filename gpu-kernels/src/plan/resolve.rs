//! The resolver's planner: its shared wanted-row table, global-state mode and workspace.

use hisparse_core::ops::ResolveDesc;

use super::{
    Launch, Plan, PlanError, Target, geometry, limit, nothing_to_launch, stats_slot_address,
};
use crate::args::Args;
use crate::{
    Kernel, RESOLVE_GLOBAL_STATE, RESOLVE_STATIC_SHARED_BYTES, RESOLVE_THREADS,
    resolve_global_shared_bytes, resolve_global_workspace_entries, resolve_shared_bytes,
    resolve_table_entries, resolve_table_goal, resolve_workspace_entries,
};

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
/// the launch could need (all its rows one request). A block's share is the per-block maximum,
/// split between the blocks one multiprocessor runs together: as many as the rows leave for
/// each multiprocessor (one block per row), no more than the kernel's registers and threads
/// allow ([`Target::resolve_blocks_per_multiprocessor`]; halving the table for a second block
/// that cannot run beside the first would only lengthen every probe). Requests whose table does
/// not fit take it from the workspace.
pub fn resolve_shape(t: &Target, d: &ResolveDesc, force_global: bool) -> ResolveShape {
    let per_block = t
        .shared_per_block
        .saturating_sub(RESOLVE_STATIC_SHARED_BYTES);
    let together = u64::from(
        d.num_tokens
            .div_ceil(t.multiprocessors.max(1))
            .min(t.resolve_blocks_per_multiprocessor)
            .max(1),
    );
    let share = per_block
        .min((t.shared_per_multiprocessor / together).saturating_sub(RESOLVE_STATIC_SHARED_BYTES));
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
