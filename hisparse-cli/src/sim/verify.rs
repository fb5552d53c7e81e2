//! Byte-for-byte verification of what attention reads.
//!
//! After a step's device work completed, every output row index of every index group is checked:
//! a valid top-k token must map to a row whose bytes equal the synthetic row of (request, layer,
//! token) in every layer of the group (leader and followers), and a token that does not exist
//! must map to `-1`. The device pool is downloaded only where the step's indices point (runs of
//! consecutive blocks), off the timed path.

use hisparse_core::Device;
use hisparse_core::layout::KvCacheConfig;
use hisparse_core::ops::LayerPair;

use super::forward::{IndexerKeys, row_owner};
use super::kv;
use crate::error::{CliError, CliResult};

/// One index group's read of one step, kept for verification.
pub struct ReadOut {
    /// The index group.
    pub group: usize,
    /// (request uid, rows that exist) per token row.
    pub rows: Vec<(u64, u32)>,
    /// Per token row: the rows its request's rejected speculative tokens wrote this step
    /// (empty ranges when none, or no entry at all).
    pub rejected: Vec<std::ops::Range<u32>>,
    /// The top-k the read was asked for (`T × K`).
    pub topk: Vec<i32>,
    /// The row indices it returned (`T × K`).
    pub indices: Vec<i32>,
}

/// What verification found so far.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Verified {
    /// Rows checked byte for byte (one per layer per valid top-k entry).
    pub rows: u64,
    /// Rows whose bytes differ, or that resolved to `-1` although the token exists, or to a row
    /// although it does not.
    pub mismatched: u64,
    /// The first mismatch, described.
    pub first_mismatch: Option<String>,
}

/// Checks reads against the synthetic rows.
pub struct Verifier {
    /// Per index group: its layer pairs and model layers (leader first).
    groups: Vec<(Vec<LayerPair>, Vec<u32>)>,
    top_k: usize,
    stride: i64,
    bytes_per_block: usize,
    shared_rows: u32,
    /// Host copy of the device pool; only blocks a step reads are refreshed.
    pool_copy: Vec<u8>,
    /// The totals.
    pub verified: Verified,
}

impl Verifier {
    /// A verifier for `kv`'s index groups; rows below `shared_rows` are the shared prefix.
    pub fn new(kv: &KvCacheConfig, shared_rows: u32) -> CliResult<Self> {
        let groups = (0..kv.index_groups.len())
            .map(|g| {
                kv.index_group_pairs(g)
                    .map(|p| (p, kv.index_groups[g].layers.clone()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CliError::failed(e.to_string()))?;
        Ok(Verifier {
            groups,
            top_k: kv.config.top_k as usize,
            stride: i64::from(kv.attention_block_stride),
            bytes_per_block: kv.bytes_per_block as usize,
            shared_rows,
            pool_copy: Vec::new(),
            verified: Verified::default(),
        })
    }

    /// Checks `reads` against the device pool `pool` (whose work has completed); returns the
    /// rows verified by this call.
    pub fn check<D: Device>(
        &mut self,
        dev: &D,
        pool: &D::Buffer,
        reads: &[ReadOut],
    ) -> CliResult<u64> {
        if reads.is_empty() {
            return Ok(0);
        }
        use hisparse_core::ops::BufferLen;
        let bpb = self.bytes_per_block;
        self.pool_copy.resize(pool.byte_len() as usize, 0);
        let mut blocks: Vec<usize> = reads
            .iter()
            .flat_map(|o| o.indices.iter())
            .filter(|&&i| i >= 0)
            .map(|&i| (i64::from(i) / self.stride) as usize)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let (first, end) = (blocks[i], blocks[j - 1] + 1);
            if end * bpb <= self.pool_copy.len() {
                dev.download(
                    pool,
                    first * bpb,
                    &mut self.pool_copy[first * bpb..end * bpb],
                )
                .map_err(|e| CliError::device("downloading the device pool for verification", e))?;
            }
            i = j;
        }
        let pool = &self.pool_copy;
        let (k, stride, shared) = (self.top_k, self.stride, self.shared_rows);
        let groups = &self.groups;
        // Split the reads over the cores; each part tallies its own counts.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let parts: Vec<Tally> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|part| {
                    sc.spawn(move || {
                        let mut t = Tally::default();
                        for out in reads.iter().skip(part).step_by(threads) {
                            let (pairs, layers) = &groups[out.group];
                            check_read(out, pairs, layers, k, stride, pool, shared, &mut t);
                        }
                        t
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let mut verified = 0;
        for t in parts {
            verified += t.verified;
            self.verified.mismatched += t.mismatched;
            if self.verified.first_mismatch.is_none() {
                self.verified.first_mismatch = t.first;
            }
        }
        self.verified.rows += verified;
        Ok(verified)
    }
}

/// Verification counts of one part of a step's reads.
#[derive(Default)]
struct Tally {
    verified: u64,
    mismatched: u64,
    first: Option<String>,
}

impl Tally {
    fn bad(&mut self, rows: u64, what: impl FnOnce() -> String) {
        self.mismatched += rows;
        if self.first.is_none() {
            self.first = Some(what());
        }
    }
}

/// Checks one group's read: every valid token's row, in every layer of the group.
#[allow(clippy::too_many_arguments)]
fn check_read(
    out: &ReadOut,
    pairs: &[LayerPair],
    layer_ids: &[u32],
    k: usize,
    stride: i64,
    pool: &[u8],
    shared_rows: u32,
    t: &mut Tally,
) {
    let layers = layer_ids.len() as u64;
    for (row, &(uid, seq_len)) in out.rows.iter().enumerate() {
        for j in 0..k {
            let tok = out.topk[row * k + j];
            let idx = out.indices[row * k + j];
            let exists = tok >= 0 && (tok as u32) < seq_len;
            if !exists {
                if idx != -1 {
                    t.bad(layers, || {
                        format!(
                            "index group {} request {uid}: token {tok} does not exist but maps to row {idx}",
                            out.group
                        )
                    });
                }
                continue;
            }
            if idx < 0 {
                t.bad(layers, || {
                    format!(
                        "index group {} request {uid}: token {tok} (context {seq_len}) resolved to -1",
                        out.group
                    )
                });
                continue;
            }
            for (pair, &layer) in pairs.iter().zip(layer_ids) {
                t.verified += 1;
                let ok = pair.device.locate(i64::from(idx)).is_some_and(|(b, o)| {
                    let owner = row_owner(uid, tok as u32, shared_rows);
                    let seed = kv::row_seed(owner, layer, tok as u32);
                    let seed = match out.rejected.get(row) {
                        Some(r) if r.contains(&(tok as u32)) => kv::rejected_seed(seed),
                        _ => seed,
                    };
                    let [(v0, vl), (s0, sl)] = pair.device.row_parts(b, o);
                    let vb = pair.device.value_bytes as usize;
                    let part = |a: u64, l: u64| pool.get(a as usize..(a + l) as usize);
                    part(v0, vl).is_some_and(|p| kv::matches(seed, 0, p))
                        && (sl == 0 || part(s0, sl).is_some_and(|p| kv::matches(seed, vb, p)))
                });
                if !ok {
                    t.bad(1, || {
                        format!(
                            "layer {layer} request {uid}: token {tok} read from row {idx} (block {}) holds other bytes",
                            i64::from(idx) / stride
                        )
                    });
                }
            }
        }
    }
}

/// Checks indexer keys where a request reads them back: on the GPU in the indexer blocks of a
/// context it did not compute (a prefix hit, an import), and in the indexer host cache after a
/// backup. Keys are checked byte for byte, value and scale part of every indexer layer.
pub struct IndexerVerifier {
    /// The synthetic keys.
    pub keys: IndexerKeys,
    /// Indexer rows checked (one per layer per row) and mismatched.
    pub verified: Verified,
    want: Vec<u8>,
    got: Vec<u8>,
}

impl IndexerVerifier {
    /// A verifier of `keys`.
    pub fn new(keys: IndexerKeys) -> Self {
        IndexerVerifier {
            keys,
            verified: Verified::default(),
            want: Vec::new(),
            got: Vec::new(),
        }
    }

    /// Checks indexer rows `rows` of request `uid` in the device pool through its indexer
    /// block table `table` (page → GPU block).
    pub fn check_device<D: Device>(
        &mut self,
        dev: &D,
        pool: &D::Buffer,
        uid: u64,
        rows: std::ops::Range<u32>,
        table: &[i32],
    ) -> CliResult<()> {
        let rpp = self.keys.rows_per_page;
        for li in 0..self.keys.layers.len() {
            let (layer, pair) = self.keys.layers[li];
            for row in rows.clone() {
                let block = table.get((row / rpp) as usize).copied().unwrap_or(0);
                let ok = block > 0 && {
                    let parts = pair.device.row_parts(block as u32, row % rpp);
                    self.got.clear();
                    for (at, len) in parts {
                        let end = self.got.len();
                        self.got.resize(end + len as usize, 0);
                        dev.download(pool, at as usize, &mut self.got[end..])
                            .map_err(|e| CliError::device("downloading indexer keys", e))?;
                    }
                    self.same(uid, layer, row, pair.device.row_bytes)
                };
                self.tally(ok, || {
                    format!(
                        "layer {layer} request {uid}: indexer row {row} on the GPU (block {block}) holds other bytes"
                    )
                });
            }
        }
        Ok(())
    }

    /// Checks the indexer rows of backup `span` of request `uid`'s page `page` in the indexer
    /// host cache `cache` (after the backup completed).
    pub fn check_host<D: Device>(
        &mut self,
        dev: &D,
        cache: &D::HostBuffer,
        uid: u64,
        page: u32,
        span: hisparse_core::ops::RowSpan,
    ) -> CliResult<()> {
        let rpp = self.keys.rows_per_page;
        for li in 0..self.keys.layers.len() {
            let (layer, pair) = self.keys.layers[li];
            for r in span.first_row..span.first_row + span.num_rows {
                let row = page * rpp + r;
                self.got.clear();
                for (at, len) in pair.host.row_parts(span.host_block, r) {
                    let end = self.got.len();
                    self.got.resize(end + len as usize, 0);
                    dev.read_pinned(cache, at as usize, &mut self.got[end..])
                        .map_err(|e| CliError::device("reading the indexer host cache", e))?;
                }
                let ok = self.same(uid, layer, row, pair.host.row_bytes);
                self.tally(ok, || {
                    format!(
                        "layer {layer} request {uid}: indexer row {row} backed up to host block {} holds other bytes",
                        span.host_block
                    )
                });
            }
        }
        Ok(())
    }

    /// The step's indexer work before its reads, on `rt` (its before-forward work done):
    /// checks the keys of the context every started request did not compute (a prefix hit's,
    /// an import's: `0..first_token`) where it reads them, on the GPU, then writes the keys its
    /// tokens compute (the forward pass's indexer writes).
    pub fn forward<D: Device>(
        &mut self,
        rt: &mut hisparse_runtime::Runtime<D>,
        cmd: &hisparse_core::coordinator::OffloadCommand,
    ) -> CliResult<()> {
        for sr in &cmd.scheduled {
            let table = rt.indexer_row(sr.slot).unwrap_or(&[]).to_vec();
            if cmd.started.contains(&sr.slot) && sr.first_token > 0 {
                let rows = self.keys.rows_of(0..sr.first_token);
                self.check_device(rt.device(), &rt.pools().device, sr.id, rows, &table)?;
            }
            let rows = self
                .keys
                .rows_of(sr.first_token..sr.first_token + sr.num_tokens);
            let (dev, pools) = rt.device_and_pools_mut();
            self.keys
                .write_device(dev, &mut pools.device, sr.id, rows, &table)?;
        }
        Ok(())
    }

    /// After the step's copies completed: checks every indexer row `cmd` backed up, in the
    /// indexer host cache, against the keys of the request whose page it is (found through
    /// the scheduled requests' host and indexer tables).
    pub fn check_backups<D: Device>(
        &mut self,
        rt: &hisparse_runtime::Runtime<D>,
        cmd: &hisparse_core::coordinator::OffloadCommand,
    ) -> CliResult<()> {
        let Some(cache) = rt.indexer_host_cache() else {
            return Ok(());
        };
        for span in &cmd.indexer_backups {
            let owner = cmd.scheduled.iter().find_map(|sr| {
                let (host, ix) = (rt.host_row(sr.slot)?, rt.indexer_row(sr.slot)?);
                let page = host.iter().position(|&h| h == span.host_block as i32)?;
                (ix.get(page) == Some(&(span.device_block as i32))).then_some((sr.id, page))
            });
            match owner {
                Some((uid, page)) => self.check_host(rt.device(), cache, uid, page as u32, *span)?,
                None => self.tally(false, || {
                    format!(
                        "an indexer backup of GPU block {} to host block {} belongs to no scheduled request",
                        span.device_block, span.host_block
                    )
                }),
            }
        }
        Ok(())
    }

    /// Whether the bytes read (`got`) are indexer row `row` of `uid` in `layer`.
    fn same(&mut self, uid: u64, layer: u32, row: u32, row_bytes: u32) -> bool {
        self.keys
            .row_bytes(uid, layer, row, row_bytes as usize, &mut self.want);
        self.got == self.want
    }

    fn tally(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.verified.rows += 1;
        if !ok {
            self.verified.mismatched += 1;
            if self.verified.first_mismatch.is_none() {
                self.verified.first_mismatch = Some(what());
            }
        }
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;
    use crate::sim::forward::Forward;
    use hisparse_backend_cpu::CpuDevice;
    use hisparse_core::config::HiSparseConfig;
    use hisparse_core::layout::{LayoutInput, plan_layout};
    use hisparse_core::model::{LayerSpec, ModelSpec};

    /// One index group of a leader and a follower: 64 B rows, 16-token blocks, top-k 4.
    fn layout() -> KvCacheConfig {
        let layers = [
            LayerSpec::sparse_leader(64, 32),
            LayerSpec::sparse_follower(64),
        ];
        let model = ModelSpec {
            name: "tiny",
            block_tokens: 16,
            top_k: 4,
            layers: &layers,
        };
        let mut cfg = HiSparseConfig::new(4, 64 * 64 * 2 * 64);
        cfg.device_buffer_size = Some(16);
        plan_layout(&LayoutInput::new(&model, &cfg, 64 * 4096, 64)).unwrap()
    }

    /// Writes request 7's rows 0..32 into blocks 3 and 4 (pages 0 and 1) and returns the pool.
    fn written(kv: &KvCacheConfig, dev: &CpuDevice) -> hisparse_backend_cpu::CpuBuffer {
        let mut pool = dev.alloc(kv.gpu_pool_bytes() as usize).unwrap();
        let mut fwd = Forward::new(kv, 0).unwrap();
        fwd.write(dev, &mut pool, 7, 0..32, 30..32, |_, p| Some(3 + p as i32))
            .unwrap();
        pool
    }

    fn read(topk: Vec<i32>, indices: Vec<i32>) -> ReadOut {
        ReadOut {
            group: 0,
            rows: vec![(7, 32)],
            // The one token row's rows 30 and 31 were written by rejected speculative tokens.
            rejected: vec![std::ops::Range { start: 30, end: 32 }],
            topk,
            indices,
        }
    }

    #[test]
    fn rows_where_the_forward_pass_wrote_them_verify_in_every_layer() {
        let kv = layout();
        let dev = CpuDevice::new();
        let pool = written(&kv, &dev);
        let s = kv.attention_block_stride as i32;
        let mut v = Verifier::new(&kv, 0).unwrap();
        // Tokens 1 and 17 (page 0 row 1, page 1 row 1); token 40 does not exist; padding -1.
        let r = read(vec![1, 17, 40, -1], vec![3 * s + 1, 4 * s + 1, -1, -1]);
        assert_eq!(v.check(&dev, &pool, &[r]).unwrap(), 4);
        assert_eq!(v.verified.mismatched, 0, "{:?}", v.verified.first_mismatch);
    }

    #[test]
    fn a_wrong_row_a_missing_row_and_a_row_for_nothing_are_each_caught() {
        let kv = layout();
        let dev = CpuDevice::new();
        let pool = written(&kv, &dev);
        let s = kv.attention_block_stride as i32;
        for (topk, idx, what) in [
            (
                vec![1, -1, -1, -1],
                vec![3 * s + 2, -1, -1, -1],
                "holds other bytes",
            ),
            (vec![1, -1, -1, -1], vec![-1, -1, -1, -1], "resolved to -1"),
            (
                vec![40, -1, -1, -1],
                vec![3 * s, -1, -1, -1],
                "does not exist",
            ),
        ] {
            let mut v = Verifier::new(&kv, 0).unwrap();
            v.check(&dev, &pool, &[read(topk, idx)]).unwrap();
            assert!(v.verified.mismatched > 0, "{what} not caught");
            let first = v.verified.first_mismatch.clone().unwrap();
            assert!(first.contains(what), "{first}");
        }
    }

    /// A row written by a rejected speculative token matches only while the read expects it
    /// (the step that wrote it); a later read of it — a rollback that failed to let the
    /// replacing token rewrite it — is a mismatch.
    #[test]
    fn rows_of_rejected_tokens_are_told_apart() {
        let kv = layout();
        let dev = CpuDevice::new();
        let pool = written(&kv, &dev);
        let s = kv.attention_block_stride as i32;
        let mut v = Verifier::new(&kv, 0).unwrap();
        let r = read(
            vec![30, 31, 29, -1],
            vec![4 * s + 14, 4 * s + 15, 4 * s + 13, -1],
        );
        v.check(&dev, &pool, &[r]).unwrap();
        assert_eq!(v.verified.mismatched, 0, "{:?}", v.verified.first_mismatch);
        let mut later = read(vec![30, -1, -1, -1], vec![4 * s + 14, -1, -1, -1]);
        later.rejected.clear();
        v.check(&dev, &pool, &[later]).unwrap();
        assert!(v.verified.mismatched > 0);
    }
}
