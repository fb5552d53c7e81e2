//! The remap's two other modes: a decode-context-parallel de-interleave ([`DcpSplit`]) and
//! prefill rows into a gathered workspace ([`RemapModesDesc`], [`remap_modes`]).

use super::{OP, RemapArgs, RemapDesc, fill_remap_row};
use crate::error::OpError;
use crate::ops::stats::CallStats;
use crate::ops::{BufferLen, I32_BYTES, in_range, need, nonzero};

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
        let valid = fill_remap_row(
            out_row,
            d.compact,
            topk[t * k..(t + 1) * k].iter().map(|&tok| match rule {
                Rule::Workspace(start) => workspace_row(start, tok),
                Rule::Table(row) => map_decode_token(desc, block_table, row, tok),
                Rule::Padding => -1,
            }),
        );
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
