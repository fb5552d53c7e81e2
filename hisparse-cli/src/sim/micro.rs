//! A decode step's per-layer calls cut into micro-batches (`simulate --micro-batches N`): each
//! index group's call becomes N calls, each over whole requests with its own state rows
//! ([`TopK::state_rows`]), on a side stream the rank lends its runtime, which the runtime orders
//! `end_step` after — how an engine lets one micro-batch's swap-in cross the bus while other
//! work runs (the contract's section 7, *Micro-batches*). Calls over
//! disjoint requests write what one call over all of them writes, so the simulation's reads,
//! verification and counters are those of one call per group (but for the call counts).

use std::ops::Range;

use hisparse_core::Device;
use hisparse_runtime::{Indices, Runtime, StreamId, TopK};

use super::rank::{DecodeRow, rt_err};
use crate::error::{CliError, CliResult};

/// One micro-batch's own device arrays.
struct Part<D: Device> {
    /// Per index group: its top-k input and its row indices out.
    topk: Vec<D::Buffer>,
    rows: Vec<D::Buffer>,
    /// The state row of each of its token rows.
    state_rows: D::Buffer,
}

/// The micro-batches of one rank: their arrays and the side stream their calls run on.
pub struct MicroBatches<D: Device> {
    parts: Vec<Part<D>>,
    side: StreamId,
    /// Entries of a token row's top-k.
    top_k: usize,
    /// The token rows of each micro-batch of the open step.
    ranges: Vec<Range<usize>>,
}

/// Cuts `rows` into at most `n` runs of whole requests (a request's rows are adjacent), each
/// near `rows.len() / n` long, none empty.
pub fn split(rows: &[DecodeRow], n: usize) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    for i in 1..=n {
        let mut end = (rows.len() * i / n).max(start);
        // Move the cut past the rest of the request it falls in.
        while end > start && end < rows.len() && rows[end].slot == rows[end - 1].slot {
            end += 1;
        }
        if i == n {
            end = rows.len();
        }
        if end > start {
            out.push(start..end);
            start = end;
        }
    }
    out
}

impl<D: Device> MicroBatches<D> {
    /// `n` micro-batches of up to `max_rows` token rows of top-k `top_k` over `groups` index
    /// groups, and a side stream lent to `rt`.
    pub fn new(
        rt: &mut Runtime<D>,
        n: usize,
        groups: usize,
        max_rows: usize,
        top_k: usize,
    ) -> CliResult<Self> {
        let alloc = |rt: &Runtime<D>, words: usize| {
            rt.device()
                .alloc((words * 4).max(4))
                .map_err(|e| CliError::device("allocating micro-batch buffers", e))
        };
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let mut topk = Vec::with_capacity(groups);
            let mut rows = Vec::with_capacity(groups);
            for _ in 0..groups {
                topk.push(alloc(rt, max_rows * top_k)?);
                rows.push(alloc(rt, max_rows * top_k)?);
            }
            parts.push(Part {
                topk,
                rows,
                state_rows: alloc(rt, max_rows)?,
            });
        }
        let stream = rt
            .device()
            .create_stream()
            .map_err(|e| CliError::device("creating the micro-batches' stream", e))?;
        let side = rt.adopt_stream(stream).map_err(rt_err)?;
        Ok(MicroBatches {
            parts,
            side,
            top_k,
            ranges: Vec::new(),
        })
    }

    /// The step's per-layer calls over `decode`'s rows as micro-batches: `topk[g]` holds group
    /// `g`'s top-k of every row, in row order. Enqueued on the side stream.
    pub fn call(
        &mut self,
        rt: &mut Runtime<D>,
        decode: &[DecodeRow],
        topk: &[Vec<i32>],
    ) -> CliResult<()> {
        let top_k = self.top_k;
        self.ranges = split(decode, self.parts.len());
        for (part, range) in self.parts.iter_mut().zip(&self.ranges) {
            let state: Vec<i32> = decode[range.clone()]
                .iter()
                .map(|r| r.slot as i32)
                .collect();
            rt.device()
                .upload_i32(&mut part.state_rows, 0, &state)
                .map_err(|e| CliError::device("uploading micro-batch state rows", e))?;
            for (g, sel) in topk.iter().enumerate() {
                rt.device()
                    .upload_i32(
                        &mut part.topk[g],
                        0,
                        &sel[range.start * top_k..range.end * top_k],
                    )
                    .map_err(|e| CliError::device("uploading micro-batch top-k", e))?;
                let input = TopK {
                    positions: &part.topk[g],
                    num_tokens: range.len() as u32,
                    state_rows: Some(&part.state_rows),
                };
                rt.decode(hisparse_runtime::LayerCall {
                    group: g,
                    swap: hisparse_runtime::Swap::IndexGroup,
                    topk: input,
                    out: Indices {
                        rows: &mut part.rows[g],
                        counts: None,
                    },
                    on: Some(self.side),
                })
                .map_err(rt_err)?;
            }
        }
        // No join here: the runtime orders end_step (and any later resolve on another stream)
        // after the last resolve of the step.
        Ok(())
    }

    /// Group `g`'s row indices of the step's rows, micro-batch by micro-batch, into `out`
    /// (a top-k's worth per row), once the step's work completed.
    pub fn download(&self, rt: &Runtime<D>, g: usize, out: &mut [i32]) -> CliResult<()> {
        let top_k = self.top_k;
        for (part, range) in self.parts.iter().zip(&self.ranges) {
            rt.device()
                .download_i32(
                    &part.rows[g],
                    0,
                    &mut out[range.start * top_k..range.end * top_k],
                )
                .map_err(|e| CliError::device("downloading micro-batch row indices", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(slots: &[u32]) -> Vec<DecodeRow> {
        slots
            .iter()
            .map(|&slot| DecodeRow {
                slot,
                uid: u64::from(slot),
                seq_len: 1,
                rejected: (0, 0),
            })
            .collect()
    }

    #[test]
    fn cuts_fall_between_requests_and_cover_every_row() {
        for (slots, n, want) in [
            (&[0, 1, 2, 3][..], 2, &[(0, 2), (2, 4)][..]),
            (&[0, 0, 1, 1, 2, 2][..], 2, &[(0, 4), (4, 6)][..]),
            (&[0, 0, 0, 1][..], 2, &[(0, 3), (3, 4)][..]),
            (&[0, 0, 0, 0][..], 3, &[(0, 4)][..]),
            (&[0, 1, 2][..], 4, &[(0, 1), (1, 2), (2, 3)][..]),
            (&[][..], 2, &[][..]),
        ] {
            let got: Vec<(usize, usize)> = split(&rows(slots), n)
                .iter()
                .map(|r| (r.start, r.end))
                .collect();
            assert_eq!(got, want, "{slots:?} in {n}");
        }
    }
}
