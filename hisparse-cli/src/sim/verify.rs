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

use super::forward::row_owner;
use super::kv;
use crate::error::{CliError, CliResult};

/// One index group's read of one step, kept for verification.
pub struct ReadOut {
    /// The index group.
    pub group: usize,
    /// (request uid, rows that exist) per token row.
    pub rows: Vec<(u64, u32)>,
    /// The top-k the read was asked for (`T × K`).
    pub topk: Vec<i32>,
    /// The row indices it returned (`T × K`).
    pub indices: Vec<i32>,
}

/// What verification found so far.
#[derive(Clone, Debug, Default)]
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
                dev.download(pool, first * bpb, &mut self.pool_copy[first * bpb..end * bpb])
                    .map_err(|e| {
                        CliError::device("downloading the device pool for verification", e)
                    })?;
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
