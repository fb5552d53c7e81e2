//! Index remap for the fully-resident path (SPEC §5.1): top-k token positions → physical rows.
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
//! [`RemapDesc::stats_slot`] ([`super::stats`]), whether or not `write_counts` is set.
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
    /// The slot of [`RemapArgs::stats`] the call adds to ([`super::stats`]); not read without
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
    /// and one call to slot `stats_slot` ([`super::stats`]). `None`: nothing is counted.
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
        let mut valid = 0usize;
        for j in 0..k {
            let v = match row {
                Some(row) => desc.map_token(block_table, row, topk[t * k + j]),
                None => -1,
            };
            if desc.compact {
                if v != -1 {
                    out_row[valid] = v;
                    valid += 1;
                }
            } else {
                out_row[j] = v;
                valid += usize::from(v != -1);
            }
        }
        if desc.compact {
            out_row[valid..].fill(-1);
        }
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

/// Decode-context-parallel split: which rank stores a token, and where (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DcpSplit {
    /// Ranks the context is spread over (`dcp_size`, ≥ 1).
    pub size: u32,
    /// This rank (`dcp_rank`, `< size`).
    pub rank: u32,
    /// Consecutive tokens one rank stores before the next rank's (`dcp_interleave`, ≥ 1).
    pub interleave: u32,
}

impl DcpSplit {
    /// The local index of token `tok` on this rank, or `None` when another rank stores it (or
    /// the split is one [`RemapModesDesc::validate`] refuses).
    #[inline]
    pub const fn local(&self, tok: u32) -> Option<u32> {
        if self.size == 0 || self.interleave == 0 {
            return None;
        }
        let run = tok / self.interleave;
        if run % self.size != self.rank {
            return None;
        }
        Some((run / self.size) * self.interleave + tok % self.interleave)
    }

    fn validate(&self) -> Result<(), OpError> {
        nonzero(OP, "dcp.size", self.size.into())?;
        nonzero(OP, "dcp.interleave", self.interleave.into())?;
        in_range(
            OP,
            "dcp.rank",
            self.rank.into(),
            0,
            u64::from(self.size) - 1,
        )
    }
}

/// A remap with the optional modes of the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemapModesDesc {
    /// The plain remap's shape.
    pub remap: RemapDesc,
    /// Decode context parallelism (decode rows only).
    pub dcp: Option<DcpSplit>,
    /// Prefill workspace: `Some(P)` = `workspace_starts` has `P` entries and `prefill_req_id`
    /// tags every token row.
    pub prefill_requests: Option<u32>,
}

/// Buffers of a [`remap_modes`] call.
#[derive(Debug)]
pub struct RemapModesArgs<'a, B: ?Sized> {
    /// The plain remap's buffers.
    pub remap: RemapArgs<'a, B>,
    /// `i32[T]` prefill request of each token row (`-1` = decode row), with a workspace.
    pub prefill_req_id: Option<&'a B>,
    /// `i32[P]` first workspace row of each prefill request, with a workspace.
    pub workspace_starts: Option<&'a B>,
}

impl RemapModesDesc {
    /// The plain remap: no mode.
    pub const fn plain(remap: RemapDesc) -> Self {
        RemapModesDesc {
            remap,
            dcp: None,
            prefill_requests: None,
        }
    }

    /// Whether a mode is on.
    pub const fn has_modes(&self) -> bool {
        self.dcp.is_some() || self.prefill_requests.is_some()
    }

    /// The name of the first mode that is on (`"dcp"`, `"prefill_workspace"`), for a
    /// backend's [`OpError::Unsupported`].
    pub const fn feature(&self) -> &'static str {
        if self.dcp.is_some() {
            "dcp"
        } else if self.prefill_requests.is_some() {
            "prefill_workspace"
        } else {
            "remap"
        }
    }

    /// Checks the descriptor on its own.
    pub fn validate(&self) -> Result<(), OpError> {
        self.remap.validate()?;
        if let Some(d) = self.dcp {
            d.validate()?;
        }
        if let Some(p) = self.prefill_requests {
            nonzero(OP, "prefill_requests", p.into())?;
        }
        Ok(())
    }

    /// Checks the descriptor and every buffer's size. Call before touching memory.
    pub fn check<B: BufferLen + ?Sized>(&self, a: &RemapModesArgs<'_, B>) -> Result<(), OpError> {
        self.validate()?;
        self.remap.check(&a.remap)?;
        let t = u64::from(self.remap.num_tokens);
        match (self.prefill_requests, a.prefill_req_id, a.workspace_starts) {
            (Some(p), Some(ids), Some(starts)) => {
                need(OP, "prefill_req_id", ids.byte_len(), t, I32_BYTES)?;
                need(
                    OP,
                    "workspace_starts",
                    starts.byte_len(),
                    p.into(),
                    I32_BYTES,
                )
            }
            (None, None, None) => Ok(()),
            (Some(_), _, _) => Err(OpError::BufferTooSmall {
                op: OP,
                buffer: if a.prefill_req_id.is_none() {
                    "prefill_req_id"
                } else {
                    "workspace_starts"
                },
                needed: I32_BYTES,
                actual: 0,
            }),
            (None, _, _) => Err(OpError::Mismatch {
                op: OP,
                field: "prefill workspace buffers (given)",
                value: 1,
                expected_field: "prefill_requests (declared)",
                expected: 0,
            }),
        }
    }
}

/// The output of a prefill-workspace entry (see the module docs).
#[inline]
fn workspace_row(start: i32, tok: i32) -> i32 {
    if tok < 0 || start < 0 {
        return -1;
    }
    i32::try_from(i64::from(start) + i64::from(tok)).unwrap_or(-1)
}

/// The output of entry `tok` of a decode row of block-table row `row` (see the module docs).
#[inline]
pub fn map_decode_token(desc: &RemapModesDesc, block_table: &[i32], row: usize, tok: i32) -> i32 {
    match (desc.dcp, u32::try_from(tok)) {
        (_, Err(_)) => -1,
        (None, Ok(_)) => desc.remap.map_token(block_table, row, tok),
        (Some(d), Ok(t)) => match d.local(t).and_then(|l| i32::try_from(l).ok()) {
            Some(local) => desc.remap.map_token(block_table, row, local),
            None => -1,
        },
    }
}

/// Reference remap with modes over plain slices. Checks shapes first; writes nothing on error.
pub fn remap_modes(desc: &RemapModesDesc, args: RemapModesArgs<'_, [i32]>) -> Result<(), OpError> {
    desc.check(&args)?;
    let RemapModesArgs {
        remap:
            RemapArgs {
                req_id,
                block_table,
                topk,
                idx_mapping,
                out,
                mut counts,
                stats,
            },
        prefill_req_id,
        workspace_starts,
    } = args;
    let d = &desc.remap;
    let k = d.top_k as usize;
    let mut valid_total = 0u32;
    for t in 0..d.num_tokens as usize {
        let out_row = &mut out[t * k..(t + 1) * k];
        // Which rule maps this row: a prefill workspace start, a block-table row, or padding.
        enum Rule {
            Workspace(i32),
            Table(usize),
            Padding,
        }
        let prefill = prefill_req_id.map_or(-1, |ids| ids[t]);
        let rule = if prefill >= 0 {
            match (desc.prefill_requests, workspace_starts) {
                (Some(p), Some(starts)) if (prefill as u32) < p => {
                    Rule::Workspace(starts[prefill as usize])
                }
                _ => Rule::Padding,
            }
        } else {
            match d.table_row(req_id[t], idx_mapping) {
                Some(row) => Rule::Table(row),
                None => Rule::Padding,
            }
        };
        let mut valid = 0usize;
        for j in 0..k {
            let tok = topk[t * k + j];
            let v = match rule {
                Rule::Workspace(start) => workspace_row(start, tok),
                Rule::Table(row) => map_decode_token(desc, block_table, row, tok),
                Rule::Padding => -1,
            };
            if d.compact {
                if v != -1 {
                    out_row[valid] = v;
                    valid += 1;
                }
            } else {
                out_row[j] = v;
                valid += usize::from(v != -1);
            }
        }
        if d.compact {
            out_row[valid..].fill(-1);
        }
        if let Some(c) = counts.as_deref_mut() {
            c[t] = valid as i32;
        }
        valid_total = valid_total.wrapping_add(valid as u32);
    }
    if let Some(stats) = stats {
        CallStats::of_remap(valid_total).add_to(stats, d.stats_slot);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> RemapDesc {
        RemapDesc {
            num_tokens: 2,
            top_k: 4,
            table_rows: 2,
            max_blocks: 2,
            block_size: 4,
            block_stride_rows: 10,
            idx_mapping_len: None,
            write_counts: true,
            compact: false,
            stats_slot: 0,
        }
    }

    #[test]
    fn maps_and_marks_invalid() {
        let d = desc();
        let table = [3, 5, 7, -1];
        let topk = [0, 5, -1, 8, 1, 4, 2, 3];
        let mut out = [0; 8];
        let mut counts = [0; 2];
        remap(
            &d,
            RemapArgs {
                req_id: &[0, 1],
                block_table: &table,
                topk: &topk,
                idx_mapping: None,
                out: &mut out,
                counts: Some(&mut counts),
                stats: None,
            },
        )
        .unwrap();
        // row 0: tok 0 -> 3*10+0, tok 5 -> 5*10+1, -1, tok 8 -> block 2 out of range
        // row 1: tok 1 -> 7*10+1, tok 4 -> block -1 -> -1, tok 2 -> 72, tok 3 -> 73
        assert_eq!(out, [30, 51, -1, -1, 71, -1, 72, 73]);
        assert_eq!(counts, [2, 3]);
    }

    #[test]
    fn stats_count_valid_entries_with_or_without_counts() {
        let topk = [0, 5, -1, 8, 1, 4, 2, 3];
        let mut stats = [0, 0, 0, 0, 5, 6, -3, -1];
        /// A remap of `desc` adding to `stats`, with per-row counts when it writes them.
        fn call(d: &RemapDesc, topk: &[i32], stats: &mut [i32]) -> Result<(), OpError> {
            let t = d.num_tokens as usize;
            let mut counts = [0; 2];
            remap(
                d,
                RemapArgs {
                    req_id: &[0, 1][..t],
                    block_table: &[3, 5, 7, -1],
                    topk,
                    idx_mapping: None,
                    out: &mut [0; 8][..4 * t],
                    counts: d.write_counts.then_some(&mut counts[..t]),
                    stats: Some(stats),
                },
            )
        }
        for write_counts in [false, true] {
            let d = RemapDesc {
                write_counts,
                stats_slot: 1,
                ..desc()
            };
            call(&d, &topk, &mut stats).unwrap();
        }
        // 5 valid entries per call, twice: the valid word wraps at the first call.
        assert_eq!(stats, [0, 0, 0, 0, 5, 6, 7, 1]);
        // An empty batch counts the call; a buffer without the slot is refused.
        let empty = RemapDesc {
            num_tokens: 0,
            stats_slot: 0,
            ..desc()
        };
        call(&empty, &[], &mut stats).unwrap();
        assert_eq!(stats[..4], [0, 0, 0, 1]);
        let e = call(
            &RemapDesc {
                stats_slot: 2,
                ..empty
            },
            &[],
            &mut stats,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            OpError::BufferTooSmall {
                buffer: "stats",
                needed: 48,
                ..
            }
        ));
    }

    #[test]
    fn compacts_and_maps_through_idx_mapping() {
        let d = RemapDesc {
            idx_mapping_len: Some(3),
            compact: true,
            ..desc()
        };
        let table = [3, 5, 7, 9];
        let topk = [-1, 5, -7, 0, 0, 1, 2, 3];
        let mut out = [0; 8];
        let mut counts = [0; 2];
        remap(
            &d,
            RemapArgs {
                req_id: &[2, 0],
                block_table: &table,
                topk: &topk,
                idx_mapping: Some(&[1, 0, -1]),
                out: &mut out,
                counts: Some(&mut counts),
                stats: None,
            },
        )
        .unwrap();
        // req 2 maps to -1 → padding; req 0 maps to row 1.
        assert_eq!(out, [-1, -1, -1, -1, 70, 71, 72, 73]);
        assert_eq!(counts, [0, 4]);
    }

    #[test]
    fn rejects_short_buffers_and_bad_stride() {
        let d = desc();
        let mut out = [0; 7];
        let err = remap(
            &d,
            RemapArgs {
                req_id: &[0, 1],
                block_table: &[0; 4],
                topk: &[0; 8],
                idx_mapping: None,
                out: &mut out,
                counts: Some(&mut [0; 2]),
                stats: None,
            },
        )
        .unwrap_err();
        assert!(matches!(
            err,
            OpError::BufferTooSmall {
                buffer: "out",
                needed: 32,
                actual: 28,
                ..
            }
        ));
        let bad = RemapDesc {
            block_stride_rows: 3,
            ..desc()
        };
        assert!(matches!(
            bad.validate(),
            Err(OpError::OutOfRange {
                field: "block_stride_rows",
                ..
            })
        ));
    }

    #[test]
    fn overflowing_physical_row_is_invalid() {
        let d = RemapDesc {
            block_stride_rows: 1 << 20,
            num_tokens: 1,
            table_rows: 1,
            ..desc()
        };
        let mut out = [0; 4];
        remap(
            &d,
            RemapArgs {
                req_id: &[0],
                block_table: &[1 << 12, 1],
                topk: &[0, 4, 5, 1],
                idx_mapping: None,
                out: &mut out,
                counts: Some(&mut [0]),
                stats: None,
            },
        )
        .unwrap();
        assert_eq!(out, [-1, 1 << 20, (1 << 20) + 1, -1]);
    }

    #[test]
    fn dcp_split_deinterleaves() {
        // size 2, interleave 2: tokens 0,1 → rank 0 (local 0,1); 2,3 → rank 1 (0,1);
        // 4,5 → rank 0 (2,3).
        let r0 = DcpSplit {
            size: 2,
            rank: 0,
            interleave: 2,
        };
        let r1 = DcpSplit { rank: 1, ..r0 };
        let l0: std::vec::Vec<Option<u32>> = (0..8).map(|t| r0.local(t)).collect();
        let l1: std::vec::Vec<Option<u32>> = (0..8).map(|t| r1.local(t)).collect();
        assert_eq!(
            l0,
            [Some(0), Some(1), None, None, Some(2), Some(3), None, None]
        );
        assert_eq!(
            l1,
            [None, None, Some(0), Some(1), None, None, Some(2), Some(3)]
        );
        // Every token is stored by exactly one rank, at distinct local indices.
        for size in 1..5u32 {
            for interleave in 1..4u32 {
                let mut seen = std::vec![std::vec::Vec::new(); size as usize];
                for t in 0..100u32 {
                    let owners: std::vec::Vec<u32> = (0..size)
                        .filter(|&rank| {
                            DcpSplit {
                                size,
                                rank,
                                interleave,
                            }
                            .local(t)
                            .is_some()
                        })
                        .collect();
                    assert_eq!(owners.len(), 1);
                    let rank = owners[0];
                    seen[rank as usize].push(
                        DcpSplit {
                            size,
                            rank,
                            interleave,
                        }
                        .local(t)
                        .unwrap(),
                    );
                }
                for s in seen {
                    assert!(s.windows(2).all(|w| w[1] == w[0] + 1));
                }
            }
        }
    }

    #[test]
    fn dcp_and_workspace_modes() {
        let d = RemapModesDesc {
            remap: RemapDesc {
                num_tokens: 3,
                compact: false,
                ..desc()
            },
            dcp: Some(DcpSplit {
                size: 2,
                rank: 1,
                interleave: 1,
            }),
            prefill_requests: Some(2),
        };
        // Table row 0: blocks 3, 5 (block size 4, stride 10).
        let table = [3, 5, 7, -1];
        let topk = [1, 2, 3, 7, 0, 5, -1, 2147483647, 0, 1, 2, 3];
        let mut out = [0; 12];
        let mut counts = [0; 3];
        remap_modes(
            &d,
            RemapModesArgs {
                remap: RemapArgs {
                    req_id: &[0, 1, 0],
                    block_table: &table,
                    topk: &topk,
                    idx_mapping: None,
                    out: &mut out,
                    counts: Some(&mut counts),
                    stats: None,
                },
                // Row 0 decodes; row 1 is prefill request 0 (workspace from row 100); row 2
                // names prefill request 5, beyond the 2 given: padding.
                prefill_req_id: Some(&[-1, 0, 5]),
                workspace_starts: Some(&[100, 200]),
            },
        )
        .unwrap();
        // Rank 1 of 2 holds the odd tokens: 1 → local 0 → 30; 3 → local 1 → 31; 7 → local 3
        // → 33; 2 is rank 0's.
        assert_eq!(&out[..4], &[30, -1, 31, 33]);
        assert_eq!(&out[4..8], &[100, 105, -1, -1]);
        assert_eq!(&out[8..], &[-1; 4]);
        assert_eq!(counts, [3, 2, 0]);
        // Without modes it is the plain remap.
        let plain = RemapModesDesc::plain(RemapDesc {
            num_tokens: 2,
            ..desc()
        });
        let mut a = [0; 8];
        let mut b = [0; 8];
        let topk = [0, 5, -1, 8, 1, 4, 2, 3];
        let args = |out| RemapArgs {
            req_id: &[0, 1][..],
            block_table: &table[..],
            topk: &topk[..],
            idx_mapping: None,
            out,
            counts: None,
            stats: None,
        };
        let plain_desc = RemapDesc {
            write_counts: false,
            ..plain.remap
        };
        let plain = RemapModesDesc::plain(plain_desc);
        remap(&plain_desc, args(&mut a)).unwrap();
        remap_modes(
            &plain,
            RemapModesArgs {
                remap: args(&mut b),
                prefill_req_id: None,
                workspace_starts: None,
            },
        )
        .unwrap();
        assert_eq!(a, b);
        // Bad splits and missing buffers are refused.
        let bad = RemapModesDesc {
            dcp: Some(DcpSplit {
                size: 2,
                rank: 2,
                interleave: 1,
            }),
            prefill_requests: None,
            ..d
        };
        assert!(matches!(
            bad.validate(),
            Err(OpError::OutOfRange {
                field: "dcp.rank",
                ..
            })
        ));
        assert_eq!(bad.feature(), "dcp");
        let mut out = [0; 12];
        let e = remap_modes(
            &d,
            RemapModesArgs {
                remap: RemapArgs {
                    req_id: &[0, 1, 0],
                    block_table: &table,
                    topk: &[0; 12],
                    idx_mapping: None,
                    out: &mut out,
                    counts: Some(&mut [0; 3]),
                    stats: None,
                },
                prefill_req_id: None,
                workspace_starts: Some(&[0, 0]),
            },
        );
        assert!(matches!(
            e,
            Err(OpError::BufferTooSmall {
                buffer: "prefill_req_id",
                ..
            })
        ));
    }
}
