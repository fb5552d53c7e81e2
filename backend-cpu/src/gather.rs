//! The row gather (miss plan → hot rows), tuned for the CPU.
//!
//! Same rules as [`hisparse_core::ops::copy::gather_rows`]; this version hoists everything that
//! does not depend on the row out of the loop, allocates nothing, copies each row part with one
//! `copy_from_slice`, and issues prefetch hints for the rows [`AHEAD`] plan entries on (source
//! lines for reading, destination lines for writing). Random 656-byte rows are latency-bound:
//! without the hints the core keeps too few cache misses in flight (measured: the hints take the
//! gather from about 50% to 80-130% of a large memcpy on the development machine; see
//! `docs/PERF.md`). The descriptor has been checked by the caller, so every layout lies inside
//! its buffer and `locate` keeps every row inside its layout.

use hisparse_core::ops::{GatherDesc, PageLayout};

use crate::aligned::{prefetch_read, prefetch_write};

/// Plan entries between a row's prefetch hints and its copy.
const AHEAD: usize = 8;

/// A layout with its per-row constants precomputed.
#[derive(Clone, Copy)]
struct Rows {
    base: usize,
    block_stride: usize,
    num_blocks: u32,
    block_size: u32,
    index_stride: u32,
    /// `log2(index_stride)` when it is a power of two (the usual case): a shift instead of a
    /// division per row.
    index_shift: Option<u32>,
    value_bytes: usize,
    scale_bytes: usize,
    /// Offset of the scale part inside a page (`block_size * value_bytes`).
    scale_base: usize,
}

impl Rows {
    fn new(l: &PageLayout) -> Self {
        Rows {
            base: l.base as usize,
            block_stride: l.block_stride as usize,
            num_blocks: l.num_blocks,
            block_size: l.block_size,
            index_stride: l.index_stride_rows,
            index_shift: l
                .index_stride_rows
                .is_power_of_two()
                .then(|| l.index_stride_rows.trailing_zeros()),
            value_bytes: l.value_bytes as usize,
            scale_bytes: (l.row_bytes - l.value_bytes) as usize,
            scale_base: l.block_size as usize * l.value_bytes as usize,
        }
    }

    /// Byte offset of the page holding flat row `row` and the row's offset in it, or `None`
    /// outside the pool (same rule as [`PageLayout::locate`]).
    #[inline(always)]
    fn locate(&self, row: i32) -> Option<(usize, usize)> {
        let row = u32::try_from(row).ok()?;
        let (block, offset) = match self.index_shift {
            Some(shift) => (row >> shift, row & (self.index_stride - 1)),
            None => (row / self.index_stride, row % self.index_stride),
        };
        if block >= self.num_blocks || offset >= self.block_size {
            return None;
        }
        Some((
            self.base + block as usize * self.block_stride,
            offset as usize,
        ))
    }
}

/// Executes the plan of `desc` for every layer. `desc` must have been checked against these
/// buffers.
pub(crate) fn gather_rows(
    desc: &GatherDesc<'_>,
    plan_src: &[i32],
    plan_dst: &[i32],
    plan_counts: &[i32],
    host: &[u8],
    device: &mut [u8],
) {
    let k = desc.top_k as usize;
    let t_count = desc.num_tokens as usize;
    for layer in desc.layers {
        let (h, d) = (Rows::new(&layer.host), Rows::new(&layer.device));
        let split = h.scale_bytes != 0;
        for t in 0..t_count {
            let n = plan_counts[t].clamp(0, desc.top_k as i32) as usize;
            let srcs = &plan_src[t * k..t * k + n];
            let dsts = &plan_dst[t * k..t * k + n];
            for (i, (&s, &dd)) in srcs.iter().zip(dsts).enumerate() {
                if let Some((spage, soff)) = srcs.get(i + AHEAD).and_then(|&r| h.locate(r)) {
                    let sv = spage + soff * h.value_bytes;
                    prefetch_read(&host[sv..sv + h.value_bytes]);
                }
                if let Some((dpage, doff)) = dsts.get(i + AHEAD).and_then(|&r| d.locate(r)) {
                    let dv = dpage + doff * d.value_bytes;
                    prefetch_write(&device[dv..dv + d.value_bytes]);
                }
                let Some((dpage, doff)) = d.locate(dd) else {
                    continue;
                };
                let dv = dpage + doff * d.value_bytes;
                let ds = dpage + d.scale_base + doff * d.scale_bytes;
                match h.locate(s) {
                    Some((spage, soff)) => {
                        let sv = spage + soff * h.value_bytes;
                        device[dv..dv + h.value_bytes]
                            .copy_from_slice(&host[sv..sv + h.value_bytes]);
                        if split {
                            let ss = spage + h.scale_base + soff * h.scale_bytes;
                            device[ds..ds + h.scale_bytes]
                                .copy_from_slice(&host[ss..ss + h.scale_bytes]);
                        }
                    }
                    None => {
                        device[dv..dv + d.value_bytes].fill(0);
                        if split {
                            device[ds..ds + d.scale_bytes].fill(0);
                        }
                    }
                }
            }
        }
    }
}
