//! Planners of the small operations: invalidation, the compressed slot mapping, table writes and
//! hot-state resets.

use hisparse_core::ops::{
    HotResetDesc, InvalidateDesc, SlotMappingDesc, TableWrite, TableWriteDesc,
};

use super::{Launch, PartKind, Plan, PlanError, Target, limit, stride_grid};
use crate::args::Args;
use crate::{INVALIDATE_THREADS, Kernel, SLOT_THREADS, TABLE_THREADS, TableWriteAbi};

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
