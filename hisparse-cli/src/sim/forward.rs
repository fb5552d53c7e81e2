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

/// The synthetic indexer keys of a layout's indexer layers: what the forward pass writes into
/// the request's indexer blocks, what an importer writes into the indexer host cache, and what
/// verification expects wherever a key is read back (on the GPU after a prefix hit or an
/// import, in the host cache after a backup).
pub struct IndexerKeys {
    /// (model layer, device and host layouts) of every indexer layer.
    pub layers: Vec<(u32, hisparse_core::ops::LayerPair)>,
    /// Indexer rows per page.
    pub rows_per_page: u32,
    /// Tokens per indexer row (a token at `p` writes row `p / R` when `(p + 1) % R == 0`).
    pub tokens_per_row: u32,
    /// Indexer rows below this are the shared prefix's (synthetic request 0).
    pub shared_rows: u32,
}

/// Layers' keys are told apart from their KV rows by this bit of the layer in the seed.
const INDEXER_SEED_LAYER: u32 = 1 << 31;

impl IndexerKeys {
    /// The keys of `kv`'s indexer layers (`None` without one); the first `shared_tokens` tokens
    /// are the shared prefix.
    pub fn new(kv: &KvCacheConfig, shared_tokens: u32) -> CliResult<Option<Self>> {
        let layers = kv.indexer_layer_pairs();
        let Some(&(_, first)) = layers.first() else {
            return Ok(None);
        };
        let rows_per_page = first.device.block_size;
        let tokens_per_row = (kv.block_tokens / rows_per_page.max(1)).max(1);
        Ok(Some(IndexerKeys {
            layers,
            rows_per_page,
            tokens_per_row,
            shared_rows: shared_tokens / tokens_per_row,
        }))
    }

    /// The indexer rows tokens `tokens` write.
    pub fn rows_of(&self, tokens: Range<u32>) -> Range<u32> {
        tokens.start / self.tokens_per_row..tokens.end / self.tokens_per_row
    }

    /// The seed of indexer row `row` of request `uid` in model layer `layer`.
    pub fn seed(&self, uid: u64, layer: u32, row: u32) -> u64 {
        kv::row_seed(
            row_owner(uid, row, self.shared_rows),
            layer | INDEXER_SEED_LAYER,
            row,
        )
    }

    /// The bytes of indexer row `row` of `uid` in `layer` (value part, then scale part), into
    /// `out` (resized to the row). Indexer rows are multiples of 4 bytes, not of 8: the row's
    /// words are made for the row rounded up, and cut.
    pub fn row_bytes(&self, uid: u64, layer: u32, row: u32, row_bytes: usize, out: &mut Vec<u8>) {
        out.clear();
        out.resize(row_bytes.next_multiple_of(8), 0);
        kv::fill(self.seed(uid, layer, row), 0, out);
        out.truncate(row_bytes);
    }

    /// Calls `write(offset, bytes)` for each part (values, then scales) of indexer rows `rows`
    /// of request `uid` in every indexer layer, laid out by `side` (a layer pair's device or
    /// host layout), page `p` in block `block_of(p)` (`None`: the row has nowhere to go).
    fn for_each_part(
        &self,
        side: fn(&hisparse_core::ops::LayerPair) -> hisparse_core::ops::PageLayout,
        uid: u64,
        rows: Range<u32>,
        block_of: impl Fn(u32) -> Option<u32>,
        mut write: impl FnMut(u64, &[u8]) -> CliResult<()>,
    ) -> CliResult<()> {
        let mut buf = Vec::new();
        for (layer, pair) in &self.layers {
            let l = side(pair);
            for row in rows.clone() {
                let Some(block) = block_of(row / self.rows_per_page) else {
                    return Err(CliError::failed(format!(
                        "simulation: request {uid} indexer row {row} has no block to write into"
                    )));
                };
                self.row_bytes(uid, *layer, row, l.row_bytes as usize, &mut buf);
                let [(v, vl), (s, sl)] = l.row_parts(block, row % self.rows_per_page);
                let (values, scales) = buf.split_at(vl as usize);
                write(v, values)?;
                if sl > 0 {
                    write(s, scales)?;
                }
            }
        }
        Ok(())
    }

    /// Writes indexer rows `rows` of request `uid` into the device pool through its indexer
    /// block table `table` (page → GPU block), in every indexer layer: the forward pass's
    /// indexer writes.
    pub fn write_device<D: Device>(
        &self,
        dev: &D,
        pool: &mut D::Buffer,
        uid: u64,
        rows: Range<u32>,
        table: &[i32],
    ) -> CliResult<()> {
        let block_of = |p: u32| {
            let b = table.get(p as usize).copied().filter(|&b| b > 0)?;
            u32::try_from(b).ok()
        };
        self.for_each_part(
            |p| p.device,
            uid,
            rows,
            block_of,
            |at, bytes| {
                dev.upload(pool, at as usize, bytes)
                    .map_err(|e| CliError::device("writing indexer keys", e))
            },
        )
    }

    /// Writes indexer rows `rows` of request `uid` into the indexer host cache `cache`, page
    /// `p` into host block `host_blocks[p]`: a prefill node's transfer of an imported request's
    /// keys.
    pub fn write_host<D: Device>(
        &self,
        dev: &D,
        cache: &mut D::HostBuffer,
        uid: u64,
        rows: Range<u32>,
        host_blocks: &[u32],
    ) -> CliResult<()> {
        let block_of = |p: u32| host_blocks.get(p as usize).copied();
        self.for_each_part(
            |p| p.host,
            uid,
            rows,
            block_of,
            |at, bytes| {
                dev.write_pinned(cache, at as usize, bytes)
                    .map_err(|e| CliError::device("writing imported indexer keys", e))
            },
        )
    }
}
