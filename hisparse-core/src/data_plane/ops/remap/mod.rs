//! Index remap for the fully-resident path (contract §5.1): top-k token positions → physical rows.
//!
//! Per token row `t` and column `j`, with `tok = topk[t][j]`:
//! * the request is `req_id[t]`; with `idx_mapping`, the block-table row is
//!   `idx_mapping[req_id[t]]`, otherwise `req_id[t]` itself. A request id or mapped row that is
//!   negative or out of range makes the whole token row padding (all `-1`, count 0);
//! * `tok < 0`, or `tok / block_size` outside `[0, max_blocks)` → `-1`;
//! * a negative block-table entry → `-1`;
//! * otherwise `block_table[row][tok / block_size] * block_stride_rows + tok % block_size`,
//!   or `-1` if that does not fit an `i32` ([`super::physical_row`]).
//!
//! With `write_counts`, `counts[t]` = number of entries of row `t` that are not `-1`. With
//! `compact`, each output row holds its valid entries first, in column order, then `-1`. With a
//! `stats` buffer, the call adds the valid entries of all its rows and one call to slot
//! [`RemapDesc::stats_slot`] ([`crate::ops::stats`]), whether or not `write_counts` is set.
//!
//! # Modes ([`RemapModesDesc`], [`remap_modes`])
//!
//! Two modes of the original remap kernel, each optional:
//! * **decode context parallel** ([`DcpSplit`]: `size`, `rank`, `interleave`): the KV of a
//!   request is spread over `size` ranks in runs of `interleave` tokens — token `tok` belongs to
//!   rank `(tok / interleave) % size` and is stored there at local index
//!   `(tok / (size * interleave)) * interleave + tok % interleave`. On rank `rank`, a token of
//!   another rank maps to `-1`; one of its own maps through the block table by its local index;
//! * **prefill workspace** (`prefill_requests = Some(P)`): `prefill_req_id[t]` (`-1` = a decode
//!   row) names the prefill request of row `t`, whose context was gathered into a contiguous
//!   workspace starting at row `workspace_starts[prefill_req_id[t]]`: entry `tok` maps to
//!   `workspace_starts[p] + tok` (no block table, no context-parallel split: the workspace holds
//!   the whole context). A negative `tok`, a negative start or a row beyond `i32` → `-1`; a
//!   `prefill_req_id` at or beyond `P` makes the row padding (all `-1`, count 0).
//!
//! Counts and compaction apply to both modes as to the plain remap.
//!
//! # Files
//!
//! This file holds the plain [`remap`]; `modes.rs` the context-parallel and workspace modes.

use super::stats::{CallStats, check_stats};

use super::{BufferLen, I32_BYTES, in_range, mul, need, need_declared, nonzero, physical_row};

use crate::error::{OpError, OpName};

const OP: OpName = OpName::Remap;

/// Shape of one remap call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemapDesc {
    /// Token rows `T` (may be 0: an empty batch does nothing).
    pub num_tokens: u32,
    /// Top-k width `K` (columns of `topk` and `out`).
    pub top_k: u32,
    /// Rows of the block table.
    pub table_rows: u32,
    /// Columns of the block table (`M`, blocks per request).
    pub max_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Rows between consecutive blocks in the physical view (≥ `block_size`).
    pub block_stride_rows: u32,
    /// Entries of `idx_mapping`, or `None` when `req_id` indexes the block table directly.
    pub idx_mapping_len: Option<u32>,
    /// Write per-row valid counts.
    pub write_counts: bool,
    /// Move valid entries to the front of each row.
    pub compact: bool,
    /// The slot of [`RemapArgs::stats`] the call adds to ([`crate::ops::stats`]); not read without
    /// a stats buffer.
    pub stats_slot: u32,
}

/// Buffers of a remap call. `B` is a device buffer type (or a slice for the reference).
#[derive(Debug)]
pub struct RemapArgs<'a, B: ?Sized> {
    /// `i32[T]` request id per token row (`-1` = padding).
    pub req_id: &'a B,
    /// `i32[table_rows][max_blocks]` physical block ids.
    pub block_table: &'a B,
    /// `i32[T][K]` token positions.
    pub topk: &'a B,
    /// `i32[idx_mapping_len]` request id → block-table row, when the descriptor has one.
    pub idx_mapping: Option<&'a B>,
    /// `i32[T][K]` output physical rows.
    pub out: &'a mut B,
    /// `i32[T]` output valid counts, when `write_counts`.
    pub counts: Option<&'a mut B>,
    /// `u32[4 * n]` decode-path counters (`n > stats_slot`): the call adds its valid entries
    /// and one call to slot `stats_slot` ([`crate::ops::stats`]). `None`: nothing is counted.
    pub stats: Option<&'a mut B>,
}

impl RemapDesc {
    /// Checks the descriptor on its own.
    pub fn validate(&self) -> Result<(), OpError> {
        nonzero(OP, "top_k", self.top_k.into())?;
        nonzero(OP, "table_rows", self.table_rows.into())?;
        nonzero(OP, "max_blocks", self.max_blocks.into())?;
        nonzero(OP, "block_size", self.block_size.into())?;
        in_range(
            OP,
            "block_stride_rows",
            self.block_stride_rows.into(),
            self.block_size.into(),
            i32::MAX as u64,
        )?;
        if let Some(n) = self.idx_mapping_len {
            nonzero(OP, "idx_mapping_len", n.into())?;
        }
        mul(OP, "topk", self.num_tokens.into(), self.top_k.into())?;
        Ok(())
    }

    /// Checks the descriptor and every buffer's size. Call before touching memory.
    pub fn check<B: BufferLen + ?Sized>(&self, args: &RemapArgs<'_, B>) -> Result<(), OpError> {
        self.validate()?;
        let t = u64::from(self.num_tokens);
        let tk = t * u64::from(self.top_k);
        need(OP, "req_id", args.req_id.byte_len(), t, I32_BYTES)?;
        let table = mul(
            OP,
            "block_table",
            self.table_rows.into(),
            self.max_blocks.into(),
        )?;
        need(
            OP,
            "block_table",
            args.block_table.byte_len(),
            table,
            I32_BYTES,
        )?;
        need(OP, "topk", args.topk.byte_len(), tk, I32_BYTES)?;
        need(OP, "out", args.out.byte_len(), tk, I32_BYTES)?;
        need_declared(
            OP,
            "idx_mapping",
            args.idx_mapping.map(|m| m.byte_len()),
            self.idx_mapping_len.map(u64::from),
            I32_BYTES,
            "idx_mapping (given)",
            "idx_mapping_len (declared)",
        )?;
        match (self.write_counts, &args.counts) {
            (true, Some(c)) => need(OP, "counts", c.byte_len(), t, I32_BYTES)?,
            (false, None) => {}
            (want, _) => {
                return Err(OpError::Mismatch {
                    op: OP,
                    field: "counts (given)",
                    value: u64::from(!want),
                    expected_field: "write_counts",
                    expected: u64::from(want),
                });
            }
        }
        check_stats(
            OP,
            args.stats.as_ref().map(|s| s.byte_len()),
            self.stats_slot,
        )
    }

    /// Block-table row of token row `req`, or `None` for padding.
    #[inline]
    pub fn table_row(&self, req: i32, idx_mapping: Option<&[i32]>) -> Option<usize> {
        let req = usize::try_from(req).ok()?;
        let row = match idx_mapping {
            Some(map) => {
                if req >= self.idx_mapping_len? as usize {
                    return None;
                }
                usize::try_from(*map.get(req)?).ok()?
            }
            None => req,
        };
        (row < self.table_rows as usize).then_some(row)
    }

    /// The physical row of token `tok` in block-table row `row` (`-1` if invalid, including
    /// a zero `block_size` and an entry beyond `block_table`).
    #[inline]
    pub fn map_token(&self, block_table: &[i32], row: usize, tok: i32) -> i32 {
        if tok < 0 || self.block_size == 0 {
            return -1;
        }
        let (bs, m) = (self.block_size as i64, self.max_blocks as usize);
        let block_col = (tok as i64 / bs) as usize;
        if block_col >= m {
            return -1;
        }
        let Some(&block) = row
            .checked_mul(m)
            .and_then(|start| start.checked_add(block_col))
            .and_then(|i| block_table.get(i))
        else {
            return -1;
        };
        physical_row(block, self.block_stride_rows, (tok as i64 % bs) as u32)
    }
}

/// Writes one token row's rows (`-1` = none) into `out_row`: in place, or moved to the front
/// with `-1` after them (`compact`); returns how many are not `-1`. The one rule every remap
/// mode writes its rows by (the reference's and a backend's own loop alike).
pub fn fill_remap_row(
    out_row: &mut [i32],
    compact: bool,
    rows: impl Iterator<Item = i32>,
) -> usize {
    let mut valid = 0usize;
    for (j, v) in rows.enumerate() {
        if compact {
            if v != -1 {
                out_row[valid] = v;
                valid += 1;
            }
        } else {
            out_row[j] = v;
            valid += usize::from(v != -1);
        }
    }
    if compact {
        out_row[valid..].fill(-1);
    }
    valid
}

/// Reference remap over plain slices. Checks shapes first; writes nothing on error.
pub fn remap(desc: &RemapDesc, args: RemapArgs<'_, [i32]>) -> Result<(), OpError> {
    desc.check(&args)?;
    let RemapArgs {
        req_id,
        block_table,
        topk,
        idx_mapping,
        out,
        mut counts,
        stats,
    } = args;
    let k = desc.top_k as usize;
    let mut valid_total = 0u32;
    for t in 0..desc.num_tokens as usize {
        let out_row = &mut out[t * k..(t + 1) * k];
        let row = desc.table_row(req_id[t], idx_mapping);
        let valid = fill_remap_row(
            out_row,
            desc.compact,
            topk[t * k..(t + 1) * k].iter().map(|&tok| match row {
                Some(row) => desc.map_token(block_table, row, tok),
                None => -1,
            }),
        );
        if let Some(c) = counts.as_deref_mut() {
            c[t] = valid as i32;
        }
        valid_total = valid_total.wrapping_add(valid as u32);
    }
    if let Some(stats) = stats {
        CallStats::of_remap(valid_total).add_to(stats, desc.stats_slot);
    }
    Ok(())
}

mod modes;

pub use modes::{DcpSplit, RemapModesArgs, RemapModesDesc, map_decode_token, remap_modes};

#[cfg(test)]
mod tests;
