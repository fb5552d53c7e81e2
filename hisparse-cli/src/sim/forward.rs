//! The simulated forward pass: writes the synthetic KV rows of the tokens a step computes into
//! the request's resident pages, in every sparse layer, as a model's attention layers would.
//! This is the model's work, not HiSparse's: it is not counted as device time.

use std::ops::Range;

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::PageLayout;

use super::kv;
use crate::error::{CliError, CliResult};

/// The synthetic identity of row `pos` of request `uid` when the first `shared_rows` rows are a
/// prefix every request shares (synthetic request id 0), as a real prefix's KV would be.
pub fn row_owner(uid: u64, pos: u32, shared_rows: u32) -> u64 {
    if pos < shared_rows { 0 } else { uid }
}

/// Writes synthetic rows into the device pool.
pub struct Forward {
    /// Per bucket: (model layer, device layout) of its layers, in group order.
    buckets: Vec<Vec<(u32, PageLayout)>>,
    block_size: u32,
    row_bytes: usize,
    shared_rows: u32,
    values: Vec<u8>,
    scales: Vec<u8>,
}

impl Forward {
    /// A forward pass over `kv`'s sparse layers; rows below `shared_rows` are the shared prefix.
    pub fn new(kv: &KvCacheConfig, shared_rows: u32) -> CliResult<Self> {
        let buckets = (0..kv.num_buckets)
            .map(|b| {
                kv.groups[kv.resident_group(b)]
                    .layers
                    .iter()
                    .map(|l| kv.device_layout(l.layer).map(|d| (l.layer, d)))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::failed(e.to_string()))?;
        Ok(Forward {
            buckets,
            block_size: kv.block_size,
            row_bytes: kv.row_bytes as usize,
            shared_rows,
            values: Vec::new(),
            scales: Vec::new(),
        })
    }

    /// Rows below this are the shared prefix's (synthetic request 0).
    pub fn shared_rows(&self) -> u32 {
        self.shared_rows
    }

    /// Writes rows `positions` of request `uid` into its resident pages
    /// (`block_of(bucket, page)` = GPU block) in every sparse layer; rows in `rejected` are
    /// written by rejected speculative tokens ([`kv::rejected_seed`]).
    pub fn write<D: Device>(
        &mut self,
        dev: &D,
        pool: &mut D::Buffer,
        uid: u64,
        positions: Range<u32>,
        rejected: Range<u32>,
        block_of: impl Fn(u32, u32) -> Option<i32>,
    ) -> CliResult<()> {
        let bs = self.block_size;
        let mut p = positions.start;
        while p < positions.end {
            let page = p / bs;
            let end = positions.end.min((page + 1) * bs);
            let rows = p % bs..(end - 1) % bs + 1;
            for b in 0..self.buckets.len() {
                let Some(block) = block_of(b as u32, page).filter(|&x| x > 0) else {
                    return Err(CliError::failed(format!(
                        "simulation: request {uid} page {page} has no resident block in bucket {b} to write into"
                    )));
                };
                for li in 0..self.buckets[b].len() {
                    let (layer, l) = self.buckets[b][li];
                    self.write_layer_rows(
                        dev,
                        pool,
                        uid,
                        (layer, &l),
                        block as u32,
                        page,
                        rows.clone(),
                        &rejected,
                    )?;
                }
            }
            p = end;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_layer_rows<D: Device>(
        &mut self,
        dev: &D,
        pool: &mut D::Buffer,
        uid: u64,
        (layer, l): (u32, &PageLayout),
        block: u32,
        page: u32,
        rows: Range<u32>,
        rejected: &Range<u32>,
    ) -> CliResult<()> {
        let vb = l.value_bytes as usize;
        let sb = self.row_bytes - vb;
        let n = (rows.end - rows.start) as usize;
        let pos0 = page * l.block_size;
        // Value parts of consecutive rows are contiguous, and so are scale parts.
        self.values.clear();
        self.values.resize(n * vb, 0);
        self.scales.clear();
        self.scales.resize(n * sb, 0);
        for (i, r) in rows.clone().enumerate() {
            let pos = pos0 + r;
            let seed = kv::row_seed(row_owner(uid, pos, self.shared_rows), layer, pos);
            let seed = if rejected.contains(&pos) {
                kv::rejected_seed(seed)
            } else {
                seed
            };
            kv::fill(seed, 0, &mut self.values[i * vb..(i + 1) * vb]);
            if sb > 0 {
                kv::fill(seed, vb, &mut self.scales[i * sb..(i + 1) * sb]);
            }
        }
        let [(voff, _), (soff, _)] = l.row_parts(block, rows.start);
        dev.upload(pool, voff as usize, &self.values)
            .and_then(|()| {
                if sb > 0 {
                    dev.upload(pool, soff as usize, &self.scales)
                } else {
                    Ok(())
                }
            })
            .map_err(|e| CliError::device("writing KV rows", e))
    }
}
